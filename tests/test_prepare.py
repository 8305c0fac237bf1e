"""Privileged preparation through fabric, with real sudo on real sshd nodes."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import main

PASSWORD = "correct horse battery"


@pytest.fixture
def sudo_node(fleet):
    """Node 2's user may sudo with a password, and its specfleet root needs sudo to create."""
    n = fleet.nodes[1]
    subprocess.run(["chpasswd"], input=f"{n.user}:{PASSWORD}\n", text=True, check=True)
    rule = Path(f"/etc/sudoers.d/specfleet-test-{n.user}")
    rule.write_text(f"{n.user} ALL=(ALL) ALL\n")
    rule.chmod(0o440)
    root = Path(f"/opt/specfleet-test-{os.urandom(3).hex()}/bench")
    yield n, root
    rule.unlink()
    shutil.rmtree(root.parent, ignore_errors=True)
    subprocess.run(["usermod", "-p", "*", n.user], check=True)


def run(fleet, tmp_path, root, *args, password=PASSWORD, known=None):
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml().replace(
        "  vars:\n", f"  vars:\n    specfleet_root: {root}\n"))
    return CliRunner().invoke(main, [
        "node", "prepare", "-i", str(inv), "--limit", "node2", "--known-hosts",
        str(known or fleet.known_hosts), "--failed-hosts-file", str(tmp_path / "retry"),
        "--ask-become-pass", *args], input=password + "\n")


def test_check_then_prepare_then_nothing_left(fleet, sudo_node, tmp_path):
    n, root = sudo_node
    check = run(fleet, tmp_path, root, "--check", "--json")
    assert check.exit_code == 0, check.output
    steps = json.loads(check.stdout)["outcomes"][0]["value"]
    assert [s["state"] for s in steps] == ["skipped (not macOS)", "would change"]
    assert steps[1]["step"] == f"create {root} owned by {n.user}"
    assert not root.exists()  # --check changed nothing
    done = run(fleet, tmp_path, root, "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["outcomes"][0]["value"][1]["state"] == "changed"
    assert root.is_dir() and root.owner() == n.user
    again = run(fleet, tmp_path, root, "--json")
    assert json.loads(again.stdout)["outcomes"][0]["value"][1]["state"] == "ok"


def test_wrong_become_password_is_a_failed_host(fleet, sudo_node, tmp_path):
    n, root = sudo_node
    r = run(fleet, tmp_path, root, password="wrong")
    assert r.exit_code == 1
    assert "node2" in r.output and "sudo refused the password" in r.output
    assert not root.exists()


def test_fabric_refuses_unknown_host_keys(fleet, sudo_node, tmp_path):
    n, root = sudo_node
    known = tmp_path / "known_hosts"
    known.write_text("")
    r = run(fleet, tmp_path, root, "--check", known=known)
    assert r.exit_code == 1
    assert "unreachable" in r.output and "fabric's accept-any is disabled" in r.output
    assert known.read_text() == ""  # nothing was trusted behind our back
