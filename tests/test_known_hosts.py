"""known_hosts read as OpenSSH reads it: for port 22 it looks up the bare host, so a
`[host]:22` entry (what some tools write) is not a match — for ssh as for specfleet — and
is never reported as a changed key."""

import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from tests.fleet import _add_node, _wait_listening, start_fleet, stop_fleet

ADDRESS = "127.0.9.1"


def _port22_free() -> bool:
    s = socket.socket()
    try:
        s.bind((ADDRESS, 22))
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture(scope="module")
def node22():
    if not _port22_free():
        pytest.skip(f"{ADDRESS}:22 is taken")
    f = start_fleet(0, sys.executable)
    try:
        n = _add_node(f, 22, ADDRESS, 22)
        _wait_listening(ADDRESS, 22)
        key = f.known_hosts.read_text().split(None, 1)[1]  # "ssh-ed25519 AAAA…"
        yield f, n, key
    finally:
        stop_fleet(f)


def facts(f, n, known, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    n22: {{ansible_host: {ADDRESS}, ansible_user: {n.user}, "
                   f"ansible_ssh_private_key_file: {f.client_key}}}\n")
    return CliRunner().invoke(main, ["fleet", "facts", "-i", str(inv), "--known-hosts",
                                     str(known), "--failed-hosts-file", str(tmp_path / "r"),
                                     "--db", f"sqlite:///{tmp_path / 's.db'}"])


def openssh(f, n, known) -> int:
    return subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                           "-o", f"UserKnownHostsFile={known}", "-o",
                           "GlobalKnownHostsFile=/dev/null", "-i", str(f.client_key),
                           f"{n.user}@{ADDRESS}", "true"], capture_output=True).returncode


def test_bracketed_port_22_entry_is_unknown_not_a_changed_key(node22, tmp_path):
    f, n, key = node22
    known = tmp_path / "known_hosts"
    known.write_text(f"[{ADDRESS}]:22 {key}")
    assert openssh(f, n, known) == 255  # OpenSSH does not use it either
    r = facts(f, n, known, tmp_path)
    assert r.exit_code == 1
    assert "man-in-the-middle" not in r.output
    assert "host key not verifiable" in r.output
    assert f"lists it as [{ADDRESS}]:22, which OpenSSH does not use for port 22: write " \
        f"that entry as {ADDRESS}" in r.output
    known.write_text(f"{ADDRESS} {key}")  # as the hint says
    assert openssh(f, n, known) == 0
    r = facts(f, n, known, tmp_path)
    assert r.exit_code == 0, r.output


def test_a_different_key_under_the_bare_name_is_still_refused(node22, tmp_path):
    f, n, key = node22
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(tmp_path / "k")], check=True)
    assert other.returncode == 0
    known = tmp_path / "known_hosts"
    known.write_text(f"{ADDRESS} " + " ".join((tmp_path / "k.pub").read_text().split()[:2])
                     + "\n")
    r = facts(f, n, known, tmp_path)
    assert r.exit_code == 1 and "possible man-in-the-middle" in r.output


def test_without_a_known_hosts_file_the_message_says_so_and_accept_new_creates_it(fleet,
                                                                                   tmp_path):
    """A fresh machine has no ~/.ssh/known_hosts: not "No such file or directory", but
    which file and how to trust the node; --accept-new-host-keys creates it."""
    import json

    from click.testing import CliRunner

    from orchestrator.cli import main

    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    known = tmp_path / "fresh" / ".ssh" / "known_hosts"
    args = ["fleet", "facts", "-i", str(inv), "--limit", "node1", "--known-hosts", str(known),
            "--db", f"sqlite:///{tmp_path / 's.db'}", "--failed-hosts-file",
            str(tmp_path / "retry")]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{known} does not exist, so no host key is trusted yet" in r.output
    assert "ssh-keyscan -p" in r.output and "--accept-new-host-keys" in r.output
    r = CliRunner().invoke(main, [*args, "--accept-new-host-keys", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"] == "1 hosts: 1 ok, 0 failed, 0 unreachable"
    assert known.is_file() and f"[{fleet.nodes[0].address}]:{fleet.nodes[0].port}" in \
        known.read_text()
    # and from then on the recorded key is checked strictly, without the flag
    assert CliRunner().invoke(main, args).exit_code == 0
