"""Inventories as Ansible reads them: ranges, value types, folders, JSON, vault, subscripts,
ungrouped, several -i; and, where ansible-inventory is installed, the same hosts, groups
and merged variables as its --list output for every inventory under tests/data."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.fleet.inventory import load_inventory

DATA = Path(__file__).parent / "data" / "inventories"
VAULT_PASS = DATA / "vault-password.txt"
SOURCES = ["lab", "ranges/hosts.ini", "mixed", "lab-listed.json", "mixed-listed.json"]
ANSIBLE = shutil.which("ansible-inventory") or str(Path(sys.executable).with_name(
    "ansible-inventory"))
HAVE_ANSIBLE = Path(ANSIBLE).exists()


def hosts(src, **kw):
    inv = load_inventory(DATA / src, VAULT_PASS, **kw)
    return inv, {h.name: h for h in inv.hosts}


def test_ranges_with_steps_letters_and_ports():
    inv, h = hosts("ranges/hosts.ini")
    assert [n for n in h if n.startswith("mac0")] == ["mac01", "mac03", "mac05", "mac07",
                                                        "mac09"]
    assert inv.groups["macs"][-3:] == ["mac-xa", "mac-xb", "mac-xc"]
    assert inv.groups["db"] == ["db-a", "db-c", "db-e", "db-z"]
    assert h["db-c"].port == 5432 and h["jump.example.net"].port == 2201
    assert h["jump.example.net"].address == "jump.example.net"


def test_values_are_typed_as_ansible_types_them():
    _, h = hosts("ranges/hosts.ini")
    v = h["mac03"].vars
    # [g:vars]: literals are read, everything else stays text
    assert v["keep_awake"] == "yes" and v["verbose"] == "true"
    assert v["bench_retries"] == 3 and v["strict"] is False and v["warmup_s"] == 4.5
    assert v["specfleet_chip"] == "M2 Ultra" and v["owner"] == "platform team"
    # host lines: Python literals
    assert v["specfleet_labels"] == ["odd", "rack-a"]
    d = h["db-a"].vars
    assert d["pool"] == [1, 2] and d["flags"] == {"ro": True}
    assert h["db-z"].vars["numbers"] == [1, 2] and h["db-z"].vars["empty"] is None


def test_ansible_python_interpreter_is_the_nodes_python():
    _, h = hosts("ranges/hosts.ini")
    assert h["mac01"].python == "/opt/homebrew/bin/python3"
    _, m = hosts("mixed")
    assert m["cpu-node-2"].python == "/usr/bin/python3.11"
    assert m["cpu-node-1"].python == "python3"


def test_a_folder_of_yaml_and_ini_with_vault_values():
    inv, h = hosts("mixed")
    assert sorted(h) == ["cpu-node-1", "cpu-node-2", "mini-1", "mini-2", "mini-3",
                         "studio-a"]
    assert h["mini-2"].user == "bench-runner"  # group_vars/macs/secrets.yml, vaulted
    assert h["studio-a"].vars["specfleet_chip"] == "M4 Max" and h["studio-a"].port == 2222
    assert set(inv.groups["everything"]) == set(h)


def test_vault_without_a_password_names_the_variable(monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    with pytest.raises(ConfigError, match=r"secrets.yml:2: host mini-1: ansible_user is "
                                          r"vault-encrypted and no vault password was given"):
        load_inventory(DATA / "mixed")
    bad = DATA.parent / "inventories" / "lab" / "hosts.ini"  # any file: a wrong password
    wrong = Path(__file__).parents[1] / "orchestrator" / "demo_models" / "pair" / "BUILD.json"
    with pytest.raises(ConfigError, match=r"does not decrypt it \(HMAC mismatch\)"):
        load_inventory(DATA / "mixed", wrong)
    r = CliRunner().invoke(main, ["inventory", "list", "-i", str(DATA / "mixed")])
    assert r.exit_code == 1 and "vault-encrypted" in r.output and "Traceback" not in r.output
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(VAULT_PASS))
    assert load_inventory(DATA / "mixed").hosts and bad.exists()


@pytest.mark.parametrize("pattern,expected", [
    ("macs[0]", ["mac01"]),
    ("macs[-1]", ["mac-xc"]),
    ("macs[0:1]", ["mac01", "mac03"]),       # Ansible's end is inclusive
    ("macs[6:]", ["mac-xb", "mac-xc"]),
    ("db[1:2]:macs[0]", ["mac01", "db-c", "db-e"]),
    ("ungrouped", ["bastion", "jump.example.net"]),
    ("studio:!macs[1:]", ["mac01", "db-a", "db-c", "db-e", "db-z"]),
])
def test_subscripts_and_ungrouped_select_what_ansible_selects(pattern, expected):
    inv, _ = hosts("ranges/hosts.ini")
    assert sorted(h.name for h in inv.select(pattern)) == sorted(expected)


def test_a_subscript_past_the_end_is_an_error_not_an_empty_selection():
    inv, _ = hosts("ranges/hosts.ini")
    with pytest.raises(ConfigError, match=r"macs\[40\]'.*matches 8 host\(s\); there is no "
                                          r"index 40"):
        inv.select("macs[40]")


def test_several_inventories_merge(tmp_path):
    inv = load_inventory([DATA / "lab", DATA / "ranges" / "hosts.ini"], VAULT_PASS)
    names = {h.name for h in inv.hosts}
    assert {"mac-studio-01", "mac05", "db-z"} <= names
    r = CliRunner().invoke(main, ["inventory", "list", "-i", str(DATA / "lab"), "-i",
                                  str(DATA / "ranges" / "hosts.ini"), "--limit",
                                  "studio[0]:mini", "--json"])
    assert r.exit_code == 0, r.output
    # both define `studio`: its own hosts (lab's) come before its children's (ranges')
    assert [x["name"] for x in json.loads(r.output)] == [
        "mac-mini-01", "mac-mini-02", "mac-mini-03", "mac-studio-01"]


def _ansible(src: str) -> dict:
    if src.endswith(".json"):  # already what ansible-inventory --list printed
        return json.loads((DATA / src).read_text())
    out = subprocess.run([ANSIBLE, "-i", str(DATA / src), "--list", "--vault-password-file",
                          str(VAULT_PASS)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _unvault(v):
    if isinstance(v, dict) and set(v) == {"__ansible_vault"}:
        return subprocess.run([str(Path(ANSIBLE).with_name("ansible-vault")), "decrypt",
                               "--vault-password-file", str(VAULT_PASS), "--output", "-"],
                              input=v["__ansible_vault"], capture_output=True, text=True,
                              check=True).stdout
    return v


@pytest.mark.skipif(not HAVE_ANSIBLE, reason="ansible-inventory is not installed")
@pytest.mark.parametrize("src", SOURCES)
def test_same_hosts_groups_and_vars_as_ansible_inventory(src):
    want = _ansible(src)
    inv, h = hosts(src)
    groups = {g: b for g, b in want.items() if g != "_meta"}

    def descendants(g, seen=()):
        b = groups.get(g, {})
        out = set(b.get("hosts", []))
        for c in b.get("children", []):
            if c not in seen:
                out |= descendants(c, seen + (g,))
        return out

    all_hosts = descendants("all")
    assert set(h) == all_hosts
    for g in groups:
        assert set(inv.groups.get(g, [])) == descendants(g), g
    extra = {g for g, members in inv.groups.items() if members and g not in groups}
    assert not extra, f"groups Ansible does not have: {extra}"
    hostvars = want["_meta"]["hostvars"]
    for name in all_hosts:
        theirs = {k: _unvault(v) for k, v in hostvars.get(name, {}).items()}
        assert h[name].vars == theirs, name


@pytest.mark.skipif(not HAVE_ANSIBLE, reason="ansible is not installed")
@pytest.mark.parametrize("pattern", ["macs[0]", "macs[-1]", "macs[0:1]", "macs[6:]",
                                     "studio[0]", "studio[2:3]:!db-c", "db[1:2]:ungrouped",
                                     "mac0*:&macs[1:]", "~db-[ae]", "all:!studio"])
def test_patterns_select_what_ansible_lists(pattern):
    out = subprocess.run([str(Path(ANSIBLE).with_name("ansible")), pattern, "-i",
                          str(DATA / "ranges" / "hosts.ini"), "--list-hosts"],
                         capture_output=True, text=True, check=True).stdout
    theirs = {ln.strip() for ln in out.splitlines()[1:] if ln.strip()}
    inv, _ = hosts("ranges/hosts.ini")
    assert {h.name for h in inv.select(pattern)} == theirs
