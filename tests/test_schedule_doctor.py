"""`doctor --schedule`: what a nightly started with no terminal and no login needs, checked
with real keys (ssh-keygen) in a scratch home."""

import subprocess

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.fleet.inventory import Host
from orchestrator.fleet.schedule_checks import lingering, ssh_without_tty, tcc_protected


def keygen(path, passphrase=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)],
                   check=True)


def test_a_passphrase_key_fails_and_a_free_key_passes(tmp_path):
    home = tmp_path / "home"
    mac = Host(name="mac-a", address="10.0.0.2")
    keygen(home / ".ssh" / "id_ed25519", "hunter22")
    (c,) = ssh_without_tty([mac], home)
    assert c.status == "FAIL" and "need(s) a passphrase" in c.detail and "mac-a" in c.detail
    assert "ssh-keygen -t ed25519 -N ''" in c.fix
    free = tmp_path / "nightly_key"
    keygen(free)
    named = Host(name="mac-b", address="10.0.0.3", key_file=str(free))
    c1, c2 = ssh_without_tty([mac, named], home)
    assert (c1.status, c2.status) == ("FAIL", "ok") and str(free) in c2.detail
    (c,) = ssh_without_tty([Host(name="mac-c", address="10.0.0.4")], tmp_path / "nokeys")
    assert c.status == "FAIL" and "no private key found" in c.detail
    assert ssh_without_tty([Host(name="local", address="localhost", connection="local")],
                           home)[0].status == "ok"


def test_an_identity_agent_socket_that_outlives_the_login_passes(tmp_path):
    import socket

    home = tmp_path / "h"
    (home / ".ssh").mkdir(parents=True)
    sock_path = tmp_path / "agent.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        (home / ".ssh" / "config").write_text(f"Host *\n  IdentityAgent {sock_path}\n")
        (c,) = ssh_without_tty([Host(name="mac-a", address="10.0.0.2")], home)
        assert c.status == "ok" and "IdentityAgent" in c.detail
        (home / ".ssh" / "config").write_text("Host *\n  IdentityAgent $SSH_AUTH_SOCK\n")
        (c,) = ssh_without_tty([Host(name="mac-a", address="10.0.0.2")], home)
        assert c.status == "FAIL"  # the login's agent is not there at 02:00
    finally:
        s.close()


def test_tcc_protected_folders_warn_on_macos(tmp_path):
    home = tmp_path
    (home / "Documents" / "lab").mkdir(parents=True)
    (home / "lab").mkdir()
    (c,) = tcc_protected([home / "Documents" / "lab" / "plan.lock.json"], home, "darwin")
    assert c.status == "warn" and "~/Documents" in c.detail and "Full Disk Access" in c.detail
    assert tcc_protected([home / "lab"], home, "darwin")[0].status == "ok"
    assert tcc_protected([home / "Documents" / "lab"], home, "linux") == []


def test_systemd_timers_need_lingering(tmp_path):
    (c,) = lingering("systemd", "ann", tmp_path)
    assert c.status == "warn" and c.fix == "sudo loginctl enable-linger ann"
    (tmp_path / "ann").touch()
    assert lingering("systemd", "ann", tmp_path)[0].status == "ok"
    assert lingering("launchd", "ann", tmp_path) == []


def test_doctor_schedule_adds_the_controllers_night_row(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local: {ansible_connection: local}\n")
    r = CliRunner().invoke(main, ["doctor", "-i", str(inv), "--schedule", "--json"])
    import json

    out = json.loads(r.output)
    assert out["schedule"]["section"] == "schedule (this controller, at night)"
    assert [c["name"] for c in out["schedule"]["checks"]][0] == "tty-free"
    # F10: the schedule section is not a node: one host is one node
    assert [n["node"] for n in out["nodes"]] == ["local"]
    said = CliRunner().invoke(main, ["doctor", "-i", str(inv), "--schedule"])
    assert "schedule (this controller, at night)" in said.output
    assert "1 node(s): " in said.output and "2 node(s)" not in said.output, said.output
    assert ("schedule: ready for a nightly" in said.output) == (out["schedule"]["failing"]
                                                                is False)
