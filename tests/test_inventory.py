import pytest

from orchestrator.errors import ConfigError
from orchestrator.fleet.inventory import load_inventory

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_example_inventory_has_groups_and_vars():
    inv = load_inventory(ROOT / "orchestrator" / "inventory" / "example.yml")
    hosts = {h.name: h for h in inv.hosts}
    assert hosts["mac-mini-07"].port == 2222
    assert hosts["mac-mini-07"].user == "bench"  # inherited from all: vars
    assert hosts["mac-studio-01"].python == "/opt/specfleet/venv/bin/python"
    assert "lab" in hosts["mac-studio-01"].groups
    assert [h.name for h in inv.select("mac-mini-07")] == ["mac-mini-07"]
    assert len(inv.select("lab")) == 2


def test_local_inventory_is_one_local_node():
    inv = load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml")
    assert [h.is_local for h in inv.hosts] == [True]


def test_missing_inventory_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inventory(tmp_path / "nope.yml")
    assert str(e.value) == f"{tmp_path / 'nope.yml'}: file not found"


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_host: [1, 2\n    b: {}\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert str(e.value).startswith(f"{p}:5: invalid YAML")


def test_unknown_specfleet_variable_names_the_line(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n"
                 "      specfleet_pyhton: /usr/bin/python3\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert str(e.value) == (f"{p}:5: host a: unknown variable 'specfleet_pyhton' "
                            "(did you mean specfleet_python?)")


def test_bad_port_and_duplicate_key(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_port: ssh\n")
    with pytest.raises(ConfigError, match=r":4: host a: ansible_port must be a port number"):
        load_inventory(p)
    p.write_text("all:\n  hosts:\n    a: {}\n    a: {}\n")
    with pytest.raises(ConfigError, match=r":4: duplicate key 'a'"):
        load_inventory(p)


def test_unknown_limit_is_an_error():
    inv = load_inventory(ROOT / "orchestrator" / "inventory" / "example.yml")
    with pytest.raises(ConfigError, match="unknown hosts or groups: nosuch"):
        inv.select("nosuch")


LAB = ROOT / "tests" / "data" / "inventories" / "lab"


def test_ini_inventory_with_ranges_children_and_vars_folders():
    inv = load_inventory(LAB)
    h = {x.name: x for x in inv.hosts}
    assert sorted(h) == ["bastion-mac", "mac-mini-01", "mac-mini-02", "mac-mini-03",
                         "mac-studio-01", "mac-studio-02"]
    assert h["bastion-mac"].is_local
    # group vars: all < benchmark (parent) < mini (child); inline host vars win over groups
    assert h["mac-mini-01"].user == "ci" and h["mac-studio-01"].user == "bench"
    assert h["mac-mini-02"].root == "/opt/specfleet"
    assert h["mac-mini-02"].vars["specfleet_chip"] == "M2 Pro"
    assert h["mac-mini-02"].key_file == "~/.ssh/lab_ed25519"
    assert h["mac-studio-01"].vars["specfleet_memory_bandwidth_gbs"] == 800
    # host_vars files (plain and folder) win over everything
    assert h["mac-mini-03"].port == 2200 and h["mac-mini-03"].vars["specfleet_labels"] == [
        "hot-rack"]
    assert h["mac-studio-02"].address == "10.20.1.12" and h["mac-studio-02"].port == 2222
    assert set(h["mac-mini-01"].groups) >= {"all", "benchmark", "mini"}


@pytest.mark.parametrize("pattern,expected", [
    ("studio", ["mac-studio-01", "mac-studio-02"]),
    ("studio:mac-mini-01", ["mac-mini-01", "mac-studio-01", "mac-studio-02"]),
    ("benchmark:!studio", ["mac-mini-01", "mac-mini-02", "mac-mini-03"]),
    ("benchmark:&studio", ["mac-studio-01", "mac-studio-02"]),
    ("mac-mini-0*", ["mac-mini-01", "mac-mini-02", "mac-mini-03"]),
    ("~studio-0[2]", ["mac-studio-02"]),
    ("all:!benchmark", ["bastion-mac"]),
    ("!mini", ["bastion-mac", "mac-studio-01", "mac-studio-02"]),
])
def test_host_patterns(pattern, expected):
    got = [h.name for h in load_inventory(LAB).select(pattern)]
    assert sorted(got) == expected


def test_limit_from_a_failed_hosts_file(tmp_path):
    failed = tmp_path / "failed.txt"
    failed.write_text("mac-mini-02\nmac-studio-01\n")
    got = [h.name for h in load_inventory(LAB).select(f"@{failed}")]
    assert sorted(got) == ["mac-mini-02", "mac-studio-01"]
    with pytest.raises(ConfigError, match=r"--limit file: No such file"):
        load_inventory(LAB).select(f"@{tmp_path / 'none'}")


def test_unknown_variable_in_a_host_vars_file_names_that_file(tmp_path):
    import shutil

    lab = tmp_path / "lab"
    shutil.copytree(LAB, lab)
    (lab / "host_vars" / "mac-mini-01.yml").write_text("ansible_port: 22\nspecfleet_rot: /x\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(lab)
    assert str(e.value) == (f"{lab / 'host_vars' / 'mac-mini-01.yml'}:2: host mac-mini-01: "
                            "unknown variable 'specfleet_rot' (did you mean specfleet_root?)")


def test_duplicate_hosts_are_errors(tmp_path):
    ini = tmp_path / "hosts.ini"
    ini.write_text("[a]\nmac1 ansible_host=10.0.0.1\nmac2\nmac1\n")
    with pytest.raises(ConfigError, match=r"hosts.ini:4: duplicate host 'mac1' in \[a\] "
                                          r"\(first on line 2\)"):
        load_inventory(ini)
    yml = tmp_path / "hosts.yml"
    yml.write_text("all:\n  children:\n    a:\n      hosts:\n        m1: {ansible_port: 22}\n"
                   "    b:\n      hosts:\n        m1: {ansible_port: 2222}\n")
    with pytest.raises(ConfigError, match=r"hosts.yml:8: host m1 is defined twice with "
                                          r"variables \(group a line 5, group b line 8\)"):
        load_inventory(yml)
    # listing a host in a second group without variables is normal Ansible
    yml.write_text("all:\n  children:\n    a:\n      hosts:\n        m1: {ansible_port: 22}\n"
                   "    b:\n      hosts:\n        m1:\n")
    assert load_inventory(yml).select("a:&b")[0].name == "m1"


def test_inventory_list_cli_json():
    import json

    from click.testing import CliRunner

    from orchestrator.cli import main

    r = CliRunner().invoke(main, ["inventory", "list", "-i", str(LAB), "--limit", "mini",
                                  "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert [x["name"] for x in rows] == ["mac-mini-01", "mac-mini-02", "mac-mini-03"]
    assert rows[2]["port"] == 2200


def test_plan_labels_select_hosts_and_a_label_nobody_has_is_an_error(tmp_path, model_pair):
    import json as _json

    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.fleet.inventory import with_labels
    from tests.locks import make_lock

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n"
                   "    m1: {ansible_host: 10.0.0.1, specfleet_labels: [m4-max, studio]}\n"
                   "    m2: {ansible_host: 10.0.0.2, specfleet_labels: 'm2-ultra, studio'}\n"
                   "    m3: {ansible_host: 10.0.0.3}\n")
    hosts = load_inventory(inv).select(None)
    assert [h.name for h in with_labels(hosts, ["studio"])] == ["m1", "m2"]
    assert [h.name for h in with_labels(hosts, ["studio", "m2-ultra"])] == ["m2"]
    assert with_labels(hosts, []) == hosts
    # through a sweep: refused before any node is contacted, naming what the hosts carry
    lock = make_lock(tmp_path, model_pair, extra="nodes:\n  labels: [m3-pro]")
    assert _json.loads(lock.read_text())["nodes"]["labels"] == ["m3-pro"]
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db",
                                  f"sqlite:///{tmp_path / 's.db'}", "--no-provision"])
    assert r.exit_code == 1
    assert "nodes.labels: no selected host carries all of the labels m3-pro " \
           "(specfleet_labels of the hosts: m1: m4-max, studio; m2: m2-ultra, studio; " \
           "m3: none)" in r.output
    assert not (tmp_path / "s.db").exists()
