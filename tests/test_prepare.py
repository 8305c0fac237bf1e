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


DATA = Path(__file__).parent / "data" / "macos"


def test_mac_power_steps_from_captured_pmset():
    """Low Power Mode on, Power Nap on (captured on Apple silicon): both steps needed, with
    the exact commands; an Intel-era MacBook without lowpowermode gets a note, not a step."""
    from orchestrator.fleet.prepare import mac_power_steps, parse_pmset_custom

    lpm = (DATA / "pmset_custom_apple_silicon_lpm.txt").read_text()
    blocks = parse_pmset_custom(lpm)
    assert blocks["AC Power"]["Sleep On Power Button"] == "1"
    assert blocks["AC Power"]["hibernatefile"] == "/var/vm/sleepimage"
    awake, low = mac_power_steps(lpm)
    assert awake["needed"] and awake["command"] == "pmset -c sleep 0 disksleep 0 powernap 0"
    assert low["needed"] and low["command"] == "pmset -a lowpowermode 0"
    done = lpm.replace("lowpowermode         1", "lowpowermode         0").replace(
        "powernap             1", "powernap             0")
    assert [s["needed"] for s in mac_power_steps(done)] == [False, False]
    old = (DATA / "pmset_custom_macbook.txt").read_text()
    awake, low = mac_power_steps(old)
    assert awake["needed"]  # AC disksleep 10, powernap 1
    assert not low["needed"] and "no lowpowermode" in low["note"]


def test_hostile_inventory_values_run_nothing(fleet, tmp_path):
    """Values that would break out of the quoting under `sudo sh -c` are refused before
    anything connects; a hostile address only fails to connect."""
    n = fleet.nodes[1]
    marker = n.home / "x"
    for var, value in (("specfleet_root", "~/sf' ; touch ~/x ; echo '"),
                       ("specfleet_root", "~/sf$(touch ~/x)"),
                       ("specfleet_become_user", "bob; touch ~/x")):
        inv = tmp_path / "hosts.yml"
        inv.write_text(fleet.inventory_yaml().replace(
            "  vars:\n", f"  vars:\n    {var}: {json.dumps(value)}\n"))
        r = CliRunner().invoke(main, [
            "node", "prepare", "-i", str(inv), "--limit", "node2", "--known-hosts",
            str(fleet.known_hosts), "--failed-hosts-file", str(tmp_path / "retry")])
        assert r.exit_code == 1, r.output
        assert "node2" in r.output and "nothing was run" in r.output
        assert not marker.exists()
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    evil: {ansible_host: \"127.0.0.1;touch /tmp/sf-pwned\","
                   " ansible_port: 9}\n")
    r = CliRunner().invoke(main, ["node", "prepare", "-i", str(inv), "--known-hosts",
                                  str(fleet.known_hosts), "--failed-hosts-file",
                                  str(tmp_path / "retry")])
    assert r.exit_code == 1 and "unreachable" in r.output
    assert not Path("/tmp/sf-pwned").exists()


def test_local_connection_hosts_are_prepared_on_the_controller(tmp_path):
    root = tmp_path / "local root" / "bench"
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n"
                   f"      specfleet_root: {json.dumps(str(root))}\n")
    base = ["node", "prepare", "-i", str(inv), "--failed-hosts-file", str(tmp_path / "retry")]
    check = CliRunner().invoke(main, [*base, "--check"])
    assert check.exit_code == 0, check.output
    assert f"would change           create {root} owned by" in check.output
    assert f"would run: sudo sh -c 'mkdir -p '\"'\"'{root}'\"'\"'" in check.output
    assert not root.exists()
    done = CliRunner().invoke(main, [*base, "--json"])
    assert done.exit_code == 0, done.output
    assert root.is_dir()
