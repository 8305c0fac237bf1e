"""--accept-new-host-keys decides as OpenSSH's StrictHostKeyChecking=accept-new does
(issue 30, item 3): for each known_hosts case below, the real `ssh` client and specfleet
connect to the same sshd node, and both must accept, or both refuse."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess

import pytest
from click.testing import CliRunner

from orchestrator.cli import main


def _pub(path) -> str:
    return " ".join(path.read_text().split()[:2])


def _hashed(name: str) -> str:
    salt = b"0123456789abcdef0123"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("other", "ca"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
                       check=True)
    return d


def _cases(addr: str, port: int, key: str, other: str, ca: str) -> dict[str, str]:
    me = f"[{addr}]:{port}"
    return {
        "empty file": "",
        "the right key": f"{me} {key}\n",
        "a changed key": f"{me} {other}\n",
        "the right key, revoked": f"@revoked {me} {key}\n{me} {key}\n",
        "only a revocation of the right key": f"@revoked * {key}\n",
        "another key revoked, the right key known": f"@revoked * {other}\n{me} {key}\n",
        "hashed entry, right key": f"{_hashed(me)} {key}\n",
        "hashed entry, changed key": f"{_hashed(me)} {other}\n",
        "wildcard pattern, changed key": f"[{addr.rsplit('.', 1)[0]}.*]:{port} {other}\n",
        "negated pattern excludes the node": f"{me},!{addr} {other}\n",
        "pattern without the port": f"{addr} {other}\n",
        "a CA for the host, no plain key": f"@cert-authority {me} {ca}\n",
        "a comment and a garbled line, then the right key":
            f"# note\nthis is not a key line\n{me} {key}\n",
        "the right key under a second name on the same line": f"mac-x,{me} {key}\n",
        "another host's changed key only": f"[{addr}]:{port + 1} {other}\n",
        # OpenSSH reads a marker up to the line's first space: with tabs only, no marker
        "a tab-separated revocation, then the right key":
            f"@revoked\t{me}\t{key}\n{me} {key}\n",
        "a tab-separated revocation with no space at all":
            f"@revoked\t{me}\t{key.replace(' ', chr(9))}\n{me} {key}\n",
    }


def _openssh_accepts(fleet, node, known) -> bool:
    r = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=accept-new", "-o", "CheckHostIP=no",
                        "-o", f"UserKnownHostsFile={known}", "-o",
                        "GlobalKnownHostsFile=/dev/null", "-i", str(fleet.client_key),
                        "-p", str(node.port), f"{node.user}@{node.address}", "true"],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def _specfleet_accepts(fleet, node, known, tmp_path) -> tuple[bool, str]:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    n:\n      ansible_host: {node.address}\n"
                   f"      ansible_port: {node.port}\n      ansible_user: {node.user}\n"
                   f"      ansible_ssh_private_key_file: {fleet.client_key}\n")
    r = CliRunner().invoke(main, ["fleet", "facts", "-i", str(inv), "--known-hosts",
                                  str(known), "--accept-new-host-keys", "--failed-hosts-file",
                                  str(tmp_path / "retry"), "--db",
                                  f"sqlite:///{tmp_path / 's.db'}"])
    return r.exit_code == 0, r.output


def test_accept_new_decides_as_openssh(fleet, keys, tmp_path):
    node = fleet.nodes[0]
    key = next(line.split(None, 1)[1].strip() for line in fleet.known_hosts.read_text()
               .splitlines() if line.startswith(f"[{node.address}]:{node.port} "))
    cases = _cases(node.address, node.port, key, _pub(keys / "other.pub"),
                   _pub(keys / "ca.pub"))
    got, want = {}, {}
    said_by = {}
    for name, text in cases.items():
        a, b = tmp_path / "ssh_known", tmp_path / "sf_known"
        a.write_text(text)
        b.write_text(text)
        want[name] = _openssh_accepts(fleet, node, a)
        got[name], said = _specfleet_accepts(fleet, node, b, tmp_path)
        said_by[name] = said
        if got[name] and not text.count(key):  # accepted as new: recorded once
            assert b.read_text().count(key) == 1
    assert {k: v for k, v in got.items() if v != want[k]} == {}, (want, said_by)
    for name, said in said_by.items():  # a refusal says why, in one line per node
        assert got[name] or ("Traceback" not in said and "host key" in said), (name, said)
    for name in ("the right key, revoked", "only a revocation of the right key"):
        assert "marked @revoked in" in said_by[name], said_by[name]
    assert "possible man-in-the-middle" in said_by["negated pattern excludes the node"]
    assert sum(want.values()) >= 4 and sum(not v for v in want.values()) >= 4  # both kinds


def test_a_node_reached_by_an_ssh_config_alias_is_known_by_its_real_name(fleet, keys,
                                                                          tmp_path):
    """The audit's case: ssh_config names the node `aliasnode` (HostName, Port); its key
    is in known_hosts under the real address. A changed key there is refused by ssh, so by
    specfleet too; a key listed only under the alias does not make the node known."""
    node = fleet.nodes[0]
    key = next(line.split(None, 1)[1].strip() for line in fleet.known_hosts.read_text()
               .splitlines() if line.startswith(f"[{node.address}]:{node.port} "))
    other = _pub(keys / "other.pub")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host aliasnode\n  HostName {node.address}\n  Port {node.port}\n")
    real = f"[{node.address}]:{node.port}"
    cases = {"changed key under the real name": f"{real} {other}\n",
             "right key under the real name": f"{real} {key}\n",
             "right key under the alias only": f"[aliasnode]:{node.port} {key}\n"}
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    n:\n      ansible_host: aliasnode\n"
                   f"      ansible_user: {node.user}\n"
                   f"      ansible_ssh_private_key_file: {fleet.client_key}\n")
    for name, text in cases.items():
        a, b = tmp_path / "ssh_known", tmp_path / "sf_known"
        a.write_text(text)
        b.write_text(text)
        ssh = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o",
                              "StrictHostKeyChecking=accept-new", "-o", "CheckHostIP=no",
                              "-o", f"UserKnownHostsFile={a}", "-o",
                              "GlobalKnownHostsFile=/dev/null", "-i", str(fleet.client_key),
                              "-l", node.user, "aliasnode", "true"],
                             capture_output=True, text=True, timeout=30).returncode == 0
        r = CliRunner().invoke(main, ["fleet", "facts", "-i", str(inv), "--known-hosts",
                                      str(b), "--accept-new-host-keys", "--ssh-config",
                                      str(cfg), "--failed-hosts-file", str(tmp_path / "retry"),
                                      "--db", f"sqlite:///{tmp_path / 's.db'}"])
        assert (r.exit_code == 0) == ssh, (name, ssh, r.output)
        if r.exit_code == 0 and text.count(key) == 0 or name.endswith("alias only"):
            # recorded as ssh records it: under the real name
            assert b.read_text().count(f"{real} {key.split()[0]}") == 1, b.read_text()


def test_hashed_names_match_as_openssh_hashes_them():
    """OpenSSH lowercases a name before hashing it: LocalHost finds [localhost]'s entry."""
    from orchestrator.fleet.known_hosts import names_match

    assert names_match(_hashed("[localhost]:2222"), "[LocalHost]:2222")
    assert not names_match(_hashed("[localhost]:2222"), "[localhost]:2223")
