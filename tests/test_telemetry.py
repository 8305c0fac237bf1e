"""Telemetry parsers on real captured macOS output, and the Linux readers on this machine."""

from pathlib import Path

import pytest

from agent.telemetry import linux, macos
from agent.telemetry.sampler import Sampler, read_snapshot, summarise_window, unreliable_reasons

DATA = Path(__file__).parent / "data" / "macos"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_pmset_therm_apple_silicon_reports_nothing_recorded():
    t = macos.parse_pmset_therm(text("pmset_therm_apple_silicon.txt"))
    assert t == {"cpu_speed_limit_pct": None, "cpu_scheduler_limit_pct": None,
                 "thermal_warning_level": 0, "thermal_throttled": False}


def test_pmset_therm_intel_throttled_and_nominal():
    hot = macos.parse_pmset_therm(text("pmset_therm_intel_throttled.txt"))
    assert hot["cpu_speed_limit_pct"] == 28 and hot["cpu_scheduler_limit_pct"] == 40
    assert hot["thermal_throttled"] is True
    cool = macos.parse_pmset_therm(text("pmset_therm_intel_nominal.txt"))
    assert cool["cpu_speed_limit_pct"] == 100 and cool["thermal_throttled"] is False
    assert macos.parse_pmset_therm("")["thermal_throttled"] is None  # command unavailable


@pytest.mark.parametrize("name,source,pct,state", [
    ("pmset_batt_on_battery.txt", "battery", 95, "discharging"),
    ("pmset_batt_ac_not_charging.txt", "ac", 88, "AC attached"),
    ("pmset_batt_desktop.txt", "ac", None, None),
])
def test_pmset_batt(name, source, pct, state):
    assert macos.parse_pmset_batt(text(name)) == {
        "power_source": source, "battery_percent": pct, "battery_state": state}


def test_low_power_mode_from_pmset_g():
    assert macos.parse_pmset_g(text("pmset_g_apple_silicon.txt")) == {"low_power_mode": False}
    assert macos.parse_pmset_g(text("pmset_g_intel.txt")) == {"low_power_mode": None}
    on = text("pmset_g_apple_silicon.txt").replace("powermode            0",
                                                    "powermode            1")
    assert macos.parse_pmset_g(on) == {"low_power_mode": True}


def test_swapusage_in_both_decimal_conventions():
    assert macos.parse_swapusage(text("sysctl_swapusage.txt")) == {
        "swap_total_bytes": 4096 * 2**20, "swap_used_bytes": int(2743.5 * 2**20)}
    assert macos.parse_swapusage(text("sysctl_swapusage_decimal_comma.txt")) == {
        "swap_total_bytes": 1024 * 2**20, "swap_used_bytes": int(379.25 * 2**20)}


def test_vm_stat_counters_use_the_page_size_in_the_header():
    v = macos.parse_vm_stat(text("vm_stat_intel.txt"))
    assert v["page_size"] == 4096
    assert v["swap_in_bytes_total"] == 0
    assert v["page_in_bytes_total"] == 280307 * 4096
    apple = text("vm_stat_intel.txt").replace("page size of 4096", "page size of 16384")
    assert macos.parse_vm_stat(apple)["page_in_bytes_total"] == 280307 * 16384


def test_pressure_level():
    assert macos.parse_pressure_level(text("sysctl_pressure_level.txt")) == {
        "memory_pressure": "normal", "memory_pressure_level": 1}
    assert macos.parse_pressure_level("kern.memorystatus_vm_pressure_level: 4")[
        "memory_pressure"] == "critical"


def test_replayed_macos_reading_marks_battery_and_throttling(tmp_path, monkeypatch):
    for src, dst in [("pmset_therm_intel_throttled.txt", "therm"),
                     ("pmset_batt_on_battery.txt", "batt"), ("pmset_g_apple_silicon.txt", "pmset"),
                     ("sysctl_swapusage.txt", "swapusage"), ("vm_stat_intel.txt", "vm_stat"),
                     ("sysctl_pressure_level.txt", "pressure")]:
        (tmp_path / f"{dst}.txt").write_text(text(src))
    monkeypatch.setenv("SPECFLEET_TELEMETRY_REPLAY", str(tmp_path))
    snap = read_snapshot()
    assert snap["source"] == "replay" and snap["power_source"] == "battery"
    summary = summarise_window([snap, read_snapshot()])
    # two readings microseconds apart: contention cannot be judged over them (said so)
    assert [r for r in unreliable_reasons(summary)
            if not r.startswith("unverified: contention window")] == [
        "thermal throttling (CPU speed limit 28%)", "ran on battery"]


def test_linux_readings_on_this_machine():
    snap = linux.read()
    assert snap["swap_total_bytes"] is not None and snap["swap_total_bytes"] >= 0
    assert snap["swap_in_bytes_total"] is not None
    assert snap["memory_pressure"] in ("normal", "warn", "critical", None)
    assert linux.parse_psi("some avg10=12.50 avg60=1.00 avg300=0.10 total=1\n"
                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") == {
        "memory_pressure": "warn", "memory_stall_pct": 12.5}


def test_window_summary_counts_swap_ins_during_the_window():
    samples = [{"swap_in_bytes_total": 1000, "swap_used_bytes": 10, "rss_bytes": 5,
                "memory_pressure": "normal"},
               {"swap_in_bytes_total": 1000, "swap_used_bytes": 20, "rss_bytes": 9,
                "memory_pressure": "warn"},
               {"swap_in_bytes_total": 5096, "swap_used_bytes": 15, "rss_bytes": 7,
                "memory_pressure": "normal"}]
    s = summarise_window(samples)
    assert s["swap_in_bytes"] == 4096 and s["rss_peak_bytes"] == 9
    assert s["swap_used_before_bytes"] == 10 and s["swap_used_after_bytes"] == 15
    assert s["memory_pressure"] == "warn"
    # these planted samples carry no CPU, thermal or power reading: those are named too
    assert s["readings_unavailable"] == ["contention", "thermal", "power"]
    assert [r for r in unreliable_reasons(s) if not r.startswith("unverified: ")] == [
        "swapped in 4096 bytes"]


def test_critical_memory_pressure_sets_a_generation_aside(tmp_path, monkeypatch):
    """macOS says it in kern.memorystatus_vm_pressure_level (4 = critical, as captured)."""
    for src, dst in [("pmset_therm_apple_silicon.txt", "therm"),
                     ("pmset_batt_desktop.txt", "batt"), ("pmset_g_apple_silicon.txt", "pmset"),
                     ("sysctl_swapusage.txt", "swapusage"), ("vm_stat_intel.txt", "vm_stat")]:
        (tmp_path / f"{dst}.txt").write_text(text(src))
    (tmp_path / "pressure.txt").write_text("kern.memorystatus_vm_pressure_level: 4\n")
    monkeypatch.setenv("SPECFLEET_TELEMETRY_REPLAY", str(tmp_path))
    summary = summarise_window([read_snapshot(), read_snapshot()])
    assert summary["memory_pressure"] == "critical"
    assert "memory pressure critical" in unreliable_reasons(summary)
    assert unreliable_reasons({"memory_pressure": "warn"}) == []


def test_readings_keep_the_order_they_were_taken_in():
    """A reading the thread is slow to finish (its time taken, then 150 ms: a loaded host)
    is appended before a mark taken meanwhile, so a run's window never holds a reading from
    before its start (a full parallel suite once caught them out of order)."""
    import threading
    import time

    def reader():
        snap = {"ts": time.time()}
        if threading.current_thread().name == "telemetry":
            time.sleep(0.15)
        return snap

    with Sampler(interval=0.05, reader=reader) as s:
        time.sleep(0.1)  # the thread is mid-reading
        start = s.mark()
        time.sleep(0.2)
        end = s.mark()
    ts = [x["ts"] for x in s.samples]
    assert len(ts) >= 4 and ts == sorted(ts)
    assert all(x["ts"] >= s.samples[start]["ts"] for x in s.window(start, end))


def test_sampler_samples_in_the_background():
    import time

    with Sampler(interval=0.05) as s:
        start = s.mark()
        time.sleep(0.3)
        end = s.mark()
    window = s.window(start, end)
    assert len(window) >= 4  # two marks plus background readings
    assert window == sorted(window, key=lambda x: x["ts"])
