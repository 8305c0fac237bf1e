"""Node facts: parsers on real captured macOS output; the whole command on real sshd nodes."""

import json
from pathlib import Path

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.fleet.facts import (
    parse_boottime,
    parse_df,
    parse_facts,
    parse_gpu_cores,
    parse_lock,
    parse_os_release,
    parse_sp_hardware,
    parse_sw_vers,
)
from orchestrator.fleet.inventory import Host
from orchestrator.store import open_store

MAC = Path(__file__).parent / "data" / "macos"


def cap(name: str) -> str:
    return (MAC / name).read_text()


def test_macos_parsers_on_captured_output():
    assert parse_sw_vers(cap("sw_vers.txt")) == {"os_name": "macOS", "os_version": "14.0",
                                                 "os_build": "23A344"}
    assert parse_sp_hardware(cap("system_profiler_hardware.txt")) == {
        "chip": "Apple M2 Pro", "hw_model": "Mac14,10", "cpu_cores": 12, "ram_bytes": 16 * 2**30}
    assert parse_gpu_cores(cap("system_profiler_displays.txt")) == 16
    # the CPU core count in SPHardwareDataType is not mistaken for GPU cores
    assert parse_gpu_cores(cap("system_profiler_hardware.txt")) is None
    assert parse_boottime(cap("sysctl_boottime.txt")) == 1232765114


def test_a_whole_macos_answer_parses():
    answer = "\n".join([
        "@@now", "1232851514", "@@hostname", "mac-studio-01", "@@uname", "Darwin 23.0.0 arm64",
        "@@sw_vers", cap("sw_vers.txt"), "@@brand", cap("sysctl_brand_string.txt"),
        "@@memsize", str(16 * 2**30), "@@sp_hardware", cap("system_profiler_hardware.txt"),
        "@@sp_displays", cap("system_profiler_displays.txt"),
        "@@df", "Filesystem 1024-blocks Used Available Capacity Mounted on",
        "/dev/disk3s5 971298980 68717056 875921296 8% /System/Volumes/Data",
        "@@python", "/opt/specfleet/py/bin/python3", "3.11.9",
        "@@batt", cap("pmset_batt_on_battery.txt"), "@@pmset", cap("pmset_g_apple_silicon.txt"),
        "@@therm", cap("pmset_therm_apple_silicon.txt"), "@@boottime", cap("sysctl_boottime.txt"),
        "@@lock", 'held {"job_id": "abc", "pid": 42, "started": "x"}'])
    f = parse_facts(answer, Host(name="m", address="m"))
    assert f["platform"] == "macos" and f["os_build"] == "23A344"
    assert f["chip"] == "Apple M1" and f["hw_model"] == "Mac14,10"
    assert f["ram_bytes"] == 16 * 2**30 and f["gpu_cores"] == 16
    assert f["disk_free_bytes"] == 875921296 * 1024
    assert f["python_version"] == "3.11.9" and f["python_error"] is None
    assert f["power_source"] == "battery" and f["battery_percent"] == 95
    assert f["low_power_mode"] is False and f["thermal_throttled"] is False
    assert f["uptime_s"] == 86400
    assert f["lock"] == {"held": True, "holder": {"job_id": "abc", "pid": 42, "started": "x"}}


def test_linux_parsers_on_this_machine():
    assert parse_os_release(Path("/etc/os-release").read_text())["os_name"]
    assert parse_df("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                    "/dev/vda 100 50 42 50% /\n") == 42 * 1024
    assert parse_lock("free") == {"held": False, "holder": None}


def test_fleet_facts_on_sshd_nodes_with_one_unreachable(fleet, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml(extra_hosts={
        "ghost": {"ansible_host": "127.0.1.99", "ansible_port": 9}}))
    db = f"sqlite:///{tmp_path / 's.db'}"
    retry = tmp_path / "retry"
    r = CliRunner().invoke(main, ["fleet", "facts", "-i", str(inv), "--known-hosts",
                                  str(fleet.known_hosts), "--db", db, "--failed-hosts-file",
                                  str(retry), "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    by = {o["host"]: o for o in out["outcomes"]}
    assert by["ghost"]["status"] == "unreachable" and retry.read_text() == "ghost\n"
    assert out["summary"] == "3 hosts: 2 ok, 0 failed, 1 unreachable"
    for n in fleet.nodes:
        f = by[n.name]["value"]
        assert f["platform"] == "linux" and f["hostname"]
        assert f["ram_bytes"] > 2**30 and f["disk_free_bytes"] > 0 and f["cpu_cores"] >= 1
        assert f["python_path"] == fleet.python and f["python_version"]
        assert f["lock"] == {"held": False, "holder": None}
    stored = open_store(db).latest_facts()
    assert set(stored) == {"node1", "node2"}
    # the retry file limits the next run to the host that failed
    r2 = CliRunner().invoke(main, ["fleet", "facts", "-i", str(inv), "--known-hosts",
                                   str(fleet.known_hosts), "--db", db, "--limit", f"@{retry}",
                                   "--failed-hosts-file", str(retry)])
    assert "1 hosts: 0 ok, 0 failed, 1 unreachable" in r2.output
