"""A missing reading is never a clean one: each source hidden in turn on this Linux machine
(psutil unimportable, /proc or /sys covered by an empty tmpfs in a private mount namespace)
makes the window name the reading and the run "unverified: <reading>", with how to get it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.telemetry.sampler import (
    DARWIN_ONLY,
    READINGS,
    summarise_window,
    unreliable_reasons,
)

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, sys, time
sys.modules["psutil"] = None  # unimportable, as on a node whose env lacks it
from agent.telemetry import read_snapshot, summarise_window, unreliable_reasons
a = read_snapshot(); time.sleep(0.3); b = read_snapshot()
t = summarise_window([a, b])
print(json.dumps({"unavailable": t["readings_unavailable"], "reasons": unreliable_reasons(t)}))
"""

needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or sys.platform != "linux",
    reason="hiding /proc needs root and unshare (CI runs as root)")


def probe(*hidden: str) -> dict:
    mounts = " && ".join(f"mount -t tmpfs none {h}" for h in hidden) or "true"
    cmd = ["unshare", "-m", "sh", "-c", f'{mounts} && exec "$0" -c "$1"', sys.executable, PROBE]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@needs_unshare
def test_nothing_hidden_but_psutil_still_reads_everything_from_proc():
    got = probe()
    assert not {"contention", "memory", "swap", "power"} & set(got["unavailable"])
    assert not any(r.startswith("unverified") for r in got["reasons"])


@needs_unshare
def test_no_psutil_and_no_proc_is_unverified_contention_memory_swap():
    got = probe("/proc")
    assert got["unavailable"][:3] == ["contention", "memory", "swap"]
    reasons = [r for r in got["reasons"] if r.startswith("unverified")]
    assert [r.split(" (")[0] for r in reasons] == ["unverified: contention", "unverified: memory",
                                                   "unverified: swap"]
    assert "psutil" in reasons[0] and "plan lock" in reasons[0]  # how to get it


@needs_unshare
def test_no_sys_is_unverified_power():
    got = probe("/sys")
    assert "power" in got["unavailable"] and "contention" not in got["unavailable"]
    assert any(r.startswith("unverified: power (") for r in got["reasons"])


def span(reading: dict) -> list[dict]:
    """A window of two readings one CPU-second of capacity apart (enough to judge)."""
    return [reading, {**reading, "cpu_total_s": reading["cpu_total_s"] + 1.0}]


def test_known_answers_for_planted_windows():
    full = {"cpu_total_s": 1.0, "cpu_busy_s": 0.1, "own_cpu_s": 0.1, "rss_bytes": 1,
            "swap_in_bytes_total": 0, "thermal_throttled": False, "power_source": "ac"}
    assert summarise_window(span(full))["readings_unavailable"] == []
    # the counters read, but over no time at all: too short to judge, never clean
    assert summarise_window([full, full])["readings_unavailable"] == ["contention window"]
    no_thermal = {k: v for k, v in full.items() if k != "thermal_throttled"}
    t = summarise_window(span(no_thermal))
    assert t["readings_unavailable"] == ["thermal"]
    assert unreliable_reasons(t)[0].startswith("unverified: thermal (")
    # a Linux VM: no kernel thermal interface at all is listed, but not a verdict on the run
    vm = {**no_thermal, "thermal_source": "none"}
    t = summarise_window(span(vm))
    assert t["readings_unavailable"] == ["thermal"] and unreliable_reasons(t) == []
    # a runtime the agent did not start: contention is not judged by design, not missing
    theirs = {**full, "own_cpu_s": None, "cpu_unaccounted": True}
    assert summarise_window(span(theirs))["readings_unavailable"] == []
    # ... but a runtime it started whose CPU it could not read is
    ours = {**full, "own_cpu_s": None}
    assert summarise_window(span(ours))["readings_unavailable"] == ["contention"]
    assert summarise_window([])["readings_unavailable"] == [
        r for r in READINGS if r not in ("low power mode", "memory pressure")]


def test_on_a_mac_low_power_mode_and_memory_pressure_must_be_read(monkeypatch):
    """macOS always reports both (pmset -g, kern.memorystatus_vm_pressure_level): a window
    without one is unverified there, naming it; on Linux, which often has neither, it is not
    judged."""
    mac = {"cpu_total_s": 1.0, "cpu_busy_s": 0.1, "own_cpu_s": 0.1, "rss_bytes": 1,
           "swap_in_bytes_total": 0, "thermal_throttled": False, "power_source": "ac"}
    assert summarise_window(span(mac))["readings_unavailable"] == []  # Linux: not judged
    monkeypatch.setattr(sys, "platform", "darwin")
    t = summarise_window(span(mac))
    assert t["readings_unavailable"] == ["low power mode", "memory pressure"]
    assert [r.split(" (")[0] for r in unreliable_reasons(t)] == [
        "unverified: low power mode", "unverified: memory pressure"]
    read = {**mac, "low_power_mode": False, "memory_pressure": "normal"}
    assert summarise_window(span(read))["readings_unavailable"] == []


KEYS = ["cpu_total_s", "rss_bytes", "swap_in_bytes_total", "swap_used_bytes",
        "thermal_throttled", "power_source"]


@given(st.lists(st.fixed_dictionaries({}, optional={k: st.just(1) for k in KEYS}),
                min_size=1, max_size=4))
def test_a_reading_is_unavailable_exactly_when_no_sample_carries_it(samples):
    samples = [{**s, "own_cpu_s": 1.0} for s in samples]
    t = summarise_window(samples)
    for name, (keys, _) in READINGS.items():
        # on Linux the Mac-only readings are not judged (this runs on Linux)
        carried = any(k in s for s in samples for k in keys) or (
            name in DARWIN_ONLY and sys.platform != "darwin")
        assert (name in t["readings_unavailable"]) == (not carried), name
        assert any(r.startswith(f"unverified: {name} (") for r in unreliable_reasons(t)) \
            == (not carried)


def test_the_weekly_verdict_names_the_missing_reading_and_how_to_get_it():
    """A set-aside run's "unverified: swap (…)" becomes a caveat naming the reading and the
    fix; it is not mistaken for a run that swapped."""
    from orchestrator.review.verdict import _shaky

    reason = unreliable_reasons({"readings_unavailable": ["swap"]})[0]
    section = {"set_aside": [{"reasons": [reason]}]}
    assert _shaky(section) == [
        "some runs this week could not read swap — no swap counters: vm_stat / sysctl "
        "vm.swapusage on macOS, /proc/vmstat and /proc/meminfo on Linux (set aside as "
        "unverified)"]
    section = {"set_aside": [{"reasons": [reason, "swapped in 4096 bytes"]}]}
    assert _shaky(section)[0] == "the node swapped during some runs this week (set aside)"


@needs_unshare
def test_the_agent_with_no_psutil_and_no_proc_marks_every_generation_unverified(tmp_path,
                                                                                 model_pair):
    """The agent as the controller runs it, in a mount namespace where /proc is an empty
    tmpfs and psutil cannot be imported: it still measures, and no generation passes as
    clean: each is unreliable with 'unverified: contention' and 'unverified: memory'."""
    from orchestrator.sweep.jobspec import build_job

    job = build_job(model_pair, ["code"], max_tokens=16, draft_widths=[2])
    job.update(cv_threshold=1.0)  # only the missing readings are under test
    (tmp_path / "job.json").write_text(json.dumps(job))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['psutil'] = None\n")
    journal = tmp_path / "j.jsonl"
    agent = [sys.executable, "-m", "agent", "run", str(tmp_path / "job.json"), "--journal",
             str(journal), "--lock", str(tmp_path / "agent.lock"), "--cache-dir",
             str(tmp_path / "cache"), "--quiet"]
    script = 'mount -t tmpfs none /proc && exec "$@"'
    out = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *agent], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    gens = [e for e in map(json.loads, journal.read_text().splitlines())
            if e["type"] == "generation"]
    assert gens
    for g in gens:
        assert g["unreliable"] and g["rss_peak_bytes"] is None
        assert g["readings_unavailable"][:2] == ["contention", "memory"]
        assert {r.split(" (")[0] for r in g["unreliable_reasons"]} >= {
            "unverified: contention", "unverified: memory"}
