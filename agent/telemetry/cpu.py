"""CPU time, machine-wide and ours: what others took while we measured, and who they were.

A generation measured while other processes keep the CPU busy measures them as much as the
model (an audit ran 96% CPU pressure and saw a verdict swing between 0.62× and 1.37×). The
counters are cumulative, so a window's share is exact whatever the sampling interval.
What was not ours is told apart by cause, since each has another remedy:

- other processes on the node: (Δ machine busy − Δ our CPU − Δ the controller's) / Δ capacity;
- the controller, when it runs on this node (a local demo): its process and its journal
  followers, counted only when the job names its pid (``Job.controller_pid``);
- the hypervisor's steal (Linux VMs, ``/proc/stat``'s 8th column): time our vCPUs were
  ready to run and the host ran something else. It is no process on the node; macOS has
  no such counter (psutil's ``cpu_times()`` there is user, nice, system, idle), so there
  it is None, not 0.
"""

from __future__ import annotations

import os
from typing import NamedTuple

MIN_CAPACITY_S = 0.2  # CPU-seconds of capacity a window needs (ticks are 10 ms)
# each cause of contention: its reading's key in a sample and its share's key in a result
CAUSE_KEYS = {"other": None, "controller": "controller_cpu_s", "steal": "cpu_steal_s"}


class CpuCounters(NamedTuple):
    """The machine's CPU seconds since boot, summed over every CPU."""

    busy_s: float           # running anything but idle, I/O wait and steal
    total_s: float          # the capacity: busy + idle + I/O wait + steal
    steal_s: float | None   # the hypervisor ran another guest (None: no such counter)


def _hz() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def parse_proc_stat(text: str | None, hz: float | None = None) -> CpuCounters | None:
    """The counters from ``/proc/stat``'s first line (user nice system idle iowait irq
    softirq steal …; guest time is inside user, so columns past steal are not added)."""
    for line in (text or "").splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu" and len(parts) >= 5:
            ticks = [int(x) for x in parts[1:9]]
            total = sum(ticks)
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
            # a kernel before 2.6.11 has no steal column: none taken, as far as it can tell
            steal = ticks[7] if len(ticks) > 7 else 0
            h = hz or _hz()
            return CpuCounters((total - idle - steal) / h, total / h, steal / h)
    return None


def parse_proc_pid_stat(text: str | None, hz: float | None = None) -> float | None:
    """CPU seconds (user + system) of one process from ``/proc/PID/stat``; the command name
    in parentheses may hold spaces, so fields are counted after its closing one."""
    if not text or ")" not in text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    try:
        return (int(rest[11]) + int(rest[12])) / (hz or _hz())  # utime, stime
    except (IndexError, ValueError):
        return None


def proc_start_ticks(text: str | None) -> int | None:
    """When a process started (clock ticks after boot, ``/proc/PID/stat``'s 22nd field):
    with its pid, what tells it from a later process given the same pid."""
    if not text or ")" not in text:
        return None
    rest = text.rsplit(")", 1)[1].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def counters_from_psutil(t) -> CpuCounters:
    """The counters from psutil's ``cpu_times()``: on macOS user, nice, system, idle (no
    steal: None); on Linux also iowait, irq, softirq, steal, guest and guest_nice."""
    total = sum(t)
    idle = t.idle + getattr(t, "iowait", 0.0)
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)  # inside user
    steal = getattr(t, "steal", None)  # Linux only: macOS's tuple has no such field
    return CpuCounters(total - guest - idle - (steal or 0.0), total - guest, steal)


def machine_cpu() -> CpuCounters | None:
    """The whole machine's CPU counters since boot, or None."""
    try:
        import psutil  # the way on macOS (host_processor_info); Linux has /proc too

        return counters_from_psutil(psutil.cpu_times())
    except ImportError:
        pass
    try:
        with open("/proc/stat") as f:
            return parse_proc_stat(f.read())
    except OSError:
        pass
    from . import darwin  # macOS without psutil: host_statistics (None elsewhere)

    cpu = darwin.machine_cpu()
    return CpuCounters(cpu[0], cpu[1], None) if cpu else None


def process_cpu(pid: int | None = None) -> float | None:
    """CPU seconds used by this process (every thread), or by ``pid`` and its children."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        import psutil

        try:
            proc = psutil.Process(pid)
            return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])
        except psutil.Error:
            return None
    except ImportError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_proc_pid_stat(f.read())
    except OSError:
        pass
    from . import darwin  # macOS without psutil: proc_pid_rusage (None elsewhere)

    usage = darwin.rusage(pid)
    return usage[0] if usage else None


def _delta(first: dict, last: dict, key: str) -> float | None:
    a, b = first.get(key), last.get(key)
    return None if a is None or b is None else b - a


def cpu_shares(first: dict, last: dict) -> dict[str, float | None] | None:
    """Shares of the machine's CPU capacity taken from us between two readings, by cause
    (``CAUSE_KEYS``: other processes, the controller, the hypervisor's steal); a cause whose
    counter was not read is None (its CPU, if any, then counts as other processes'). None
    when a reading lacks the machine's counters or our own CPU, or spans too few ticks."""
    try:
        busy = last["cpu_busy_s"] - first["cpu_busy_s"]
        total = last["cpu_total_s"] - first["cpu_total_s"]
        own = last["own_cpu_s"] - first["own_cpu_s"]
    except (KeyError, TypeError):
        return None
    if total < MIN_CAPACITY_S:  # a few clock ticks: too coarse to judge
        return None
    # a follower that exited takes its CPU out of the controller's sum: never below 0
    ctl = _delta(first, last, "controller_cpu_s")
    ctl = None if ctl is None else max(0.0, ctl)
    steal = _delta(first, last, "cpu_steal_s")
    out = {"other": (busy - own - (ctl or 0.0)) / total,
           "controller": None if ctl is None else ctl / total,
           "steal": None if steal is None else steal / total}
    return {k: None if v is None else round(min(1.0, max(0.0, v)), 3) for k, v in out.items()}


def other_share(first: dict, last: dict) -> float | None:
    """Share of the machine's CPU capacity that other processes used between two readings
    (``cpu_busy_s``, ``cpu_total_s``, ``own_cpu_s``); None where a reading lacks one."""
    shares = cpu_shares(first, last)
    return None if shares is None else shares["other"]


def taken_share(shares: dict | None) -> float | None:
    """What was not ours, all causes together: what a trial is judged on."""
    if shares is None or shares.get("other") is None:
        return None
    return round(min(1.0, sum(shares.get(k) or 0.0 for k in CAUSE_KEYS)), 3)


class ControllerCpu:
    """The controller's CPU on this node: its process and the journal followers it started
    (``python -m agent follow``), when it runs here. A pid is only the controller's while
    the process that had it at the job's start runs: a later one given the same pid is not
    (its start time differs), and reads None, so its CPU counts as other processes'."""

    def __init__(self, pid: int):
        self.pid = pid
        self.started = self._started()

    def _started(self) -> float | None:
        if self.pid < 1:
            return None
        try:
            import psutil

            try:
                return psutil.Process(self.pid).create_time()
            except psutil.Error:
                return None
        except ImportError:
            pass
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                ticks = proc_start_ticks(f.read())
            return None if ticks is None else float(ticks)
        except OSError:
            return None

    def cpu(self) -> float | None:
        """CPU seconds of the controller and its followers, or None (gone, or not here)."""
        if self.started is None or self._started() != self.started:
            return None
        try:
            import psutil

            try:
                proc = psutil.Process(self.pid)
                mine = [proc, *(p for p in proc.children(recursive=True) if _follower(p))]
                return sum(sum(p.cpu_times()[:2]) for p in mine)
            except psutil.Error:
                return None
        except ImportError:
            pass
        return _proc_tree_cpu(self.pid)  # Linux without psutil (None elsewhere)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _proc_tree_cpu(pid: int) -> float | None:
    """From ``/proc``: the CPU of ``pid`` and of the followers among its descendants."""
    mine = parse_proc_pid_stat(_read(f"/proc/{pid}/stat"))
    if mine is None:
        return None
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return mine
    for n in names:
        argv = (_read(f"/proc/{n}/cmdline") or "").split("\0")
        if _is_follower(argv) and _descends(int(n), pid):
            mine += parse_proc_pid_stat(_read(f"/proc/{n}/stat")) or 0.0
    return mine


def _descends(pid: int, ancestor: int) -> bool:
    for _ in range(64):  # a process tree is not deeper than this in practice
        stat = _read(f"/proc/{pid}/stat")
        if not stat or ")" not in stat:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # ppid
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _follower(proc) -> bool:
    """A ``python -m agent follow`` process (not the hog a test or a user started)."""
    try:
        argv = proc.cmdline()
    except Exception:  # gone or not ours to read: not counted as the controller's
        return False
    return _is_follower(argv)


def _is_follower(argv: list[str]) -> bool:
    return any(argv[i:i + 3] == ["-m", "agent", "follow"] for i in range(len(argv)))
