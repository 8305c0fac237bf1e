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
