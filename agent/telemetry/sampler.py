"""Background sampling of machine state and what a generation saw of it."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from ..protocol import TELEMETRY_KEYS, trial_contention_text
from . import darwin, linux, macos
from .cpu import (
    CAUSE_KEYS,
    MIN_CAPACITY_S,
    ControllerCpu,
    cpu_shares,
    machine_cpu,
    process_cpu,
    taken_share,
)

# What each telemetry sample in a run's window carries (besides "ts"); the store keeps
# one column per key, so this is part of the controller/agent contract.
SAMPLE_KEYS = TELEMETRY_KEYS
PRESSURE_ORDER = {None: -1, "normal": 0, "warn": 1, "critical": 2}
REPLAY_ENV = "SPECFLEET_TELEMETRY_REPLAY"
# How far back a reading may lie and still stand in for a window too short to judge
# contention on its own (a 16-token generation can take 50 ms: five clock ticks)
CONTEXT_LOOKBACK_S = 5.0


# How long a window too short to judge, with no reading before it that suffices, may wait
# for a reading just after it (the job's first run: a 24-token generation of a tiny pair)
AFTER_WAIT_S = 0.5


class Window(list):
    """A run's samples, plus ``before``: the latest earlier reading from which the counters
    span enough capacity to judge contention when the run itself was too short to; else
    ``after``: a reading taken just after it for the same reason."""

    before: dict | None = None
    after: dict | None = None


def _rss_bytes(pid: int | None = None) -> int | None:
    """Resident memory of this process, or of ``pid`` and its children (a runtime the
    agent started may be a wrapper around the process that holds the model)."""
    try:
        import psutil  # optional on nodes; the only way to read current RSS on macOS

        try:
            proc = psutil.Process(pid)
            procs = [proc] + (proc.children(recursive=True) if pid else [])
            return sum(p.memory_info().rss for p in procs)
        except psutil.Error:
            return None
    except ImportError:
        pass
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    usage = darwin.rusage(pid or os.getpid())  # macOS without psutil: proc_pid_rusage
    return usage[1] if usage else None


def _replay_reader(folder: Path):
    """macOS readings from captured outputs (``therm.txt``, ``batt.txt``, …) in a folder."""

    def outputs(name: str) -> str:
        p = folder / f"{name}.txt"
        return p.read_text() if p.exists() else ""

    # thermal_pressure.txt holds the notify state (an integer): an Apple silicon capture
    level = folder / "thermal_pressure.txt"
    if level.exists():
        return lambda: macos.read(outputs, apple_silicon=True,
                                  thermal_state=lambda: macos.parse_notify_state(level.read_text()))
    return lambda: macos.read(outputs, apple_silicon=False)


def read_snapshot() -> dict:
    """One reading of the machine with a timestamp and this process's RSS."""
    replay = os.environ.get(REPLAY_ENV)
    if replay:
        snap = _replay_reader(Path(replay))()
        snap["source"] = "replay"
    elif sys.platform == "darwin":
        snap = macos.read()
        snap["source"] = "macos"
    else:
        snap = linux.read()
        snap["source"] = "linux"
    snap["ts"] = time.time()
    snap["rss_bytes"] = _rss_bytes()
    cpu = machine_cpu()  # cumulative counters: a window's share is exact at any interval
    snap["cpu_busy_s"], snap["cpu_total_s"], snap["cpu_steal_s"] = cpu or (None, None, None)
    snap["own_cpu_s"] = process_cpu()
    return snap


class Sampler:
    """Reads the machine every ``interval`` seconds in a daemon thread."""

    def __init__(self, interval: float = 0.5, reader=read_snapshot):
        self.interval, self.reader = interval, reader
        self.samples: list[dict] = []
        self._lock = threading.Lock()
        # one reading at a time, appended before the next is taken: a reading's index is
        # its order in time (on a loaded host the thread's reading, taken just before a
        # run's start mark but appended after it, landed inside the run's window)
        self._taking = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pid: int | None = None  # whose RSS the readings carry (None: this process)
        self.accounted = True  # is all the CPU doing our work ours to count?
        self.controller: ControllerCpu | None = None  # the controller, when on this node

    def watch(self, pid: int | None, accounted: bool = True) -> None:
        """Read the RSS of ``pid`` (a runtime the agent started) instead of the agent's, and
        count its CPU as ours. ``accounted=False``: the work runs where we cannot count it
        (a runtime someone else started), so contention is not judged."""
        self.pid, self.accounted = pid, accounted

    def watch_controller(self, pid: int | None) -> None:
        """Count the CPU of the controller's process ``pid`` (and its journal followers)
        apart from other processes': the job names it when the node is the controller's
        own machine. A pid no process of this machine has reads None (counted as others)."""
        self.controller = ControllerCpu(pid) if pid else None

    def __enter__(self):
        # a reading now: the job's first run, often shorter than the counters can judge,
        # has one from before it to be judged from (the thread's first is an interval away)
        self.mark()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.mark()

    def mark(self) -> int:
        """Take a reading now; return its index (use as a window boundary)."""
        with self._taking:
            return self._take()

    def _take(self) -> int:
        snap = self.reader()
        snap["watched"] = (self.pid, self.accounted)  # whose CPU "own" counts
        if self.controller is not None:
            snap["controller_cpu_s"] = self.controller.cpu()
        if self.pid:
            snap["rss_bytes"] = _rss_bytes(self.pid)
            theirs = process_cpu(self.pid)
            own = snap.get("own_cpu_s")
            snap["own_cpu_s"] = None if theirs is None or own is None else own + theirs
        if not self.accounted:
            snap["own_cpu_s"] = None
            snap["cpu_unaccounted"] = True  # contention not judged by design, not missing
        with self._lock:
            self.samples.append(snap)
            return len(self.samples) - 1

    def window(self, start: int, end: int) -> Window:
        w = self._window(start, end)
        own = _capacity(w[0], w[-1]) if len(w) >= 2 else None
        if own is not None and own < MIN_CAPACITY_S and w.before is None:
            # nothing before it suffices (the job's first run, or one after a runtime
            # switch): a co-tenant busy during a 50 ms run is busy just after it too
            deadline = time.monotonic() + AFTER_WAIT_S
            while time.monotonic() < deadline:
                time.sleep(0.02)
                snap = self._reading()
                if snap.get("watched") != w[-1].get("watched"):
                    break
                if (_capacity(w[0], snap) or 0) >= MIN_CAPACITY_S:
                    w.after = snap
                    break
        return w

    def _reading(self) -> dict:
        i = self.mark()
        with self._lock:
            return self.samples[i]

    def _window(self, start: int, end: int) -> Window:
        with self._lock:
            w = Window(self.samples[start:end + 1])
            own = _capacity(w[0], w[-1]) if len(w) >= 2 else None
            if own is not None and own < MIN_CAPACITY_S:
                for s in reversed(self.samples[:start]):  # the nearest one that suffices
                    # only readings of the same work: own CPU counted the same way (a
                    # switch to another runtime's process changes what "ours" sums)
                    if w[-1]["ts"] - s.get("ts", 0) > CONTEXT_LOOKBACK_S \
                            or s.get("watched") != w[-1].get("watched"):
                        break
                    if (_capacity(s, w[-1]) or 0) >= MIN_CAPACITY_S:
                        w.before = s
                        break
            return w


def _capacity(first: dict, last: dict) -> float | None:
    try:
        return last["cpu_total_s"] - first["cpu_total_s"]
    except (KeyError, TypeError):
        return None


def _shares(samples: list[dict]) -> dict | None:
    """Contention over the window, by cause; a window too short to judge is judged from the
    reading before it (``Window.before``): a co-tenant busy just before a 50 ms run was busy
    then."""
    if len(samples) < 2:
        return None
    shares = cpu_shares(samples[0], samples[-1])
    before = getattr(samples, "before", None)
    if shares is None and before is not None:
        shares = cpu_shares(before, samples[-1])
    after = getattr(samples, "after", None)
    if shares is None and after is not None:
        shares = cpu_shares(samples[0], after)
    return shares


def _too_short_to_judge(samples: list[dict], share: float | None) -> bool:
    """Counters were read, ours included, yet no share came out: the window (and any
    reading just before or after it) spanned too few clock ticks. Unverified, never clean."""
    if share is not None or len(samples) < 2:
        return False
    return all(s.get(k) is not None for s in (samples[0], samples[-1])
               for k in ("cpu_busy_s", "cpu_total_s", "own_cpu_s"))


def _delta(samples: list[dict], key: str) -> int | None:
    vals = [s[key] for s in samples if s.get(key) is not None]
    return vals[-1] - vals[0] if len(vals) >= 2 else (0 if vals else None)


def _any(samples: list[dict], key: str, value=True):
    vals = [s.get(key) for s in samples if s.get(key) is not None]
    return None if not vals else any(v == value for v in vals)


# Each reading a run relies on, the sample keys that carry it (any one measured is enough),
# and how to get it where it is missing: the text the review shows.
READINGS = {
    "contention": (("cpu_total_s",), "no CPU counters: the node's env needs psutil (plan lock "
                   "adds it to every node lock; re-lock and provision), or a readable /proc"),
    "memory": (("rss_bytes",), "no RSS: psutil in the node's env, /proc/PID/statm, or "
               "proc_pid_rusage on macOS"),
    "swap": (("swap_in_bytes_total", "swap_used_bytes"), "no swap counters: vm_stat / sysctl "
             "vm.swapusage on macOS, /proc/vmstat and /proc/meminfo on Linux"),
    "thermal": (("thermal_throttled", "throttle_events_total"), "no thermal state: the notify "
                "state com.apple.system.thermalpressurelevel (libSystem), pmset -g therm on "
                "Intel Macs"),
    "power": (("power_source",), "no power source: pmset -g batt on macOS, "
              "/sys/class/power_supply on Linux"),
    # macOS always has these (pmset -g, sysctl kern.memorystatus_vm_pressure_level): there a
    # window without them is unverified; Linux machines often lack both (no power profiles
    # daemon, no PSI), so there they are not judged, as a VM's missing thermal interface
    "low power mode": (("low_power_mode",), "no Low Power Mode state: pmset -g on macOS"),
    "memory pressure": (("memory_pressure",), "no memory pressure: sysctl "
                        "kern.memorystatus_vm_pressure_level on macOS"),
}
DARWIN_ONLY = ("low power mode", "memory pressure")
# not a reading of its own: the counters were there, the window too short for them
WINDOW_ONLY = {"contention window": ((), "the run took fewer clock ticks than contention can "
                                         "be judged from (0.2 CPU-seconds of capacity) and "
                                         "no reading just before or after it sufficed")}


def readings_unavailable(samples: list[dict]) -> list[str]:
    """The readings no sample in the window could take (a missing reading is never clean).
    Contention is not judged, by design, for a runtime the agent cannot count."""
    if not samples:
        return [r for r in READINGS if r not in DARWIN_ONLY or sys.platform == "darwin"]
    out = []
    for name, (keys, _) in READINGS.items():
        if name in DARWIN_ONLY and sys.platform != "darwin":
            continue
        if any(s.get(k) is not None for s in samples for k in keys):
            continue
        if name == "contention" and any(s.get("cpu_unaccounted") for s in samples):
            continue
        out.append(name)
    if "contention" not in out and not any(s.get("cpu_unaccounted") for s in samples) \
            and all(s.get("own_cpu_s") is None for s in samples):
        out.insert(0, "contention")  # the machine's counters, but not the runtime's own CPU
    return out


def summarise_window(samples: list[dict]) -> dict:
    """What the machine did between two marks, as flat fields for a generation event."""
    speed = [s["cpu_speed_limit_pct"] for s in samples if s.get("cpu_speed_limit_pct") is not None]
    swap = [s["swap_used_bytes"] for s in samples if s.get("swap_used_bytes") is not None]
    rss = [s["rss_bytes"] for s in samples if s.get("rss_bytes") is not None]
    sources = [s.get("power_source") for s in samples if s.get("power_source")]
    shares = _shares(samples)
    share = None if shares is None else shares["other"]
    unavailable = readings_unavailable(samples)
    if _too_short_to_judge(samples, share):
        unavailable.append("contention window")
    throttle_events = _delta(samples, "throttle_events_total")
    throttled = _any(samples, "thermal_throttled")
    if throttle_events:
        throttled = True
    return {
        "telemetry_samples": len(samples),
        "telemetry_source": samples[0].get("source") if samples else None,
        "thermal_throttled": throttled,
        "cpu_speed_limit_min_pct": min(speed) if speed else None,
        "power_source": "battery" if "battery" in sources else (sources[0] if sources else None),
        "low_power_mode": _any(samples, "low_power_mode"),
        "swap_used_before_bytes": swap[0] if swap else None,
        "swap_used_after_bytes": swap[-1] if swap else None,
        "swap_in_bytes": _delta(samples, "swap_in_bytes_total"),
        "memory_pressure": max((s.get("memory_pressure") for s in samples),
                               key=lambda p: PRESSURE_ORDER.get(p, -1), default=None),
        "rss_peak_bytes": max(rss) if rss else None,
        # shares of the machine's CPU taken from this run, by cause (events 1.10): other
        # processes; the controller, when the job names it and it runs here; the host's steal
        # (None: not read here, as on macOS, which has no steal counter)
        "cpu_other_share": share,
        "cpu_controller_share": None if shares is None else shares["controller"],
        "cpu_steal_share": None if shares is None else shares["steal"],
        "readings_unavailable": unavailable,
        "thermal_source": samples[0].get("thermal_source") if samples else None,
    }


def unreliable_reasons(t: dict, contention: float = 0.25) -> list[str]:
    """Why numbers measured in this window cannot be trusted (empty when they can).
    ``contention``: the share of CPU capacity other processes may take before it counts."""
    # A Linux kernel with no thermal interface at all (a VM: thermal_source "none") has
    # nothing any agent could read; its runs still list "thermal" as unavailable, but only a
    # source that exists and failed (a Mac's notify state, pmset) makes a run unverified.
    known = {**READINGS, **WINDOW_ONLY}
    reasons = [f"unverified: {name} ({known[name][1]})"
               for name in t.get("readings_unavailable") or () if name in known
               and not (name == "thermal" and t.get("thermal_source") == "none")]
    hit = contention_reading(t, contention)
    if hit:
        reasons.append(trial_contention_text(hit))
    if t.get("thermal_throttled"):
        limit = t.get("cpu_speed_limit_min_pct")
        reasons.append("thermal throttling" + (f" (CPU speed limit {limit}%)" if limit else ""))
    if t.get("power_source") == "battery":
        reasons.append("ran on battery")
    if t.get("low_power_mode"):
        reasons.append("low-power mode")
    if t.get("swap_in_bytes"):
        reasons.append(f"swapped in {t['swap_in_bytes']} bytes")
    if t.get("memory_pressure") == "critical":  # the OS is reclaiming memory from everyone
        reasons.append("memory pressure critical")
    return reasons


def contention_reading(t: dict, limit: float) -> dict | None:
    """A window's contention as fields when it sets the run aside (None when it does not):
    ``share``, all that was taken from the run, which the limit judges, and each cause's
    own (``other``, ``controller``, ``steal``: null where not read).

    Steal and the controller count toward the limit as other processes do: a host running
    another guest on our vCPUs, or the controller ingesting beside the agent, slows the
    trial just as much (a noisy neighbour is real contention for the measurement); what
    differs is the remedy, so the fields and the words name each cause apart."""
    shares = {k: t.get(f"cpu_{k}_share") for k in CAUSE_KEYS}
    share = taken_share(shares)
    if share is None or share < limit:
        return None
    return {"share": share, "limit": limit,
            **{k: v for k, v in shares.items() if v is not None}}
