"""A busy desktop, on purpose: a bounded co-tenant load beside the measurement.

``python -m agent.cotenant '{"memory_mb": 512, "cpu_workers": 1, "disk_mb_s": 20}' PARENT
DEADLINE`` holds ``memory_mb`` resident (a page touched every second, so it stays resident
and pressures the models' memory), keeps ``cpu_workers`` processes busy and writes then
reads a scratch file at ``disk_mb_s``. It ends, whatever happens to the agent:

- when its parent (the agent) is gone: every process checks five times a second, so a
  ``kill -9`` of the agent ends the load within a fraction of a second;
- when its parent has been stopped (SIGSTOP, ``kill -STOP``, a debugger) for
  ``HELD_S`` seconds: a held agent measures nothing, and its load must not hold memory and
  a core for hours meanwhile;
- at the deadline (epoch seconds), whatever its parent does;
- on SIGTERM (the agent stopping it), with its workers: they are in its process group.

Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

PAGE = 4096
LIMITS = {"memory_mb": 262144, "cpu_workers": 64, "disk_mb_s": 4000}
HELD_S = 5.0        # a parent stopped this long ends the load
MEMORY_SHORT = 0.9  # resident memory below this share of memory_mb: the load fell short
CPU_SHORT = 0.5     # CPU below this share of cpu_workers cores: the load fell short
CPU_WINDOW_S = 1.0  # the shortest window a CPU share is judged over (tick granularity)
READY_S = 20.0      # how long a job waits for its load to hold its memory before measuring


def _orphaned(parent: int, deadline: float) -> bool:
    return os.getppid() != parent or time.time() > deadline


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` ("T": stopped), or None when it cannot be
    read: psutil (macOS and Linux), else /proc (Linux), else ``ps -o stat=``."""
    try:
        import psutil

        try:
            st = psutil.Process(pid).status()
        except psutil.Error:
            return None
        return "T" if st in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else st[:1]
    except ImportError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        pass
    import subprocess

    try:
        out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                             text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[:1].upper() or None


def _watch(parent: int, deadline: float, held_s: float = HELD_S) -> None:
    """Exit this process as soon as the agent is gone, has been stopped for ``held_s``, or
    the deadline passed."""
    def loop():
        held_since = None
        tick = 0
        while not _orphaned(parent, deadline):
            time.sleep(0.2)
            tick += 1
            if tick % 5:
                continue  # the state once a second: `ps` may be a process to start
            if process_state(parent) in ("T", "t"):
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since >= held_s:
                    break
            else:
                held_since = None
        os._exit(0)
    threading.Thread(target=loop, daemon=True).start()


def _cpu(me: int, deadline: float) -> None:
    _watch(me, deadline)
    x = 0
    while True:  # pure interpreter work: one core busy
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _disk(rate_mb_s: float, folder: str, stop: threading.Event) -> None:
    chunk = os.urandom(1 << 20)
    path = os.path.join(folder, "io.bin")
    while not stop.is_set():
        t = time.monotonic()
        with open(path, "wb") as f:
            for _ in range(max(1, int(rate_mb_s))):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        stop.wait(max(0.0, 1.0 - (time.monotonic() - t)))


WORKER_FAILED = 3  # exit status: a load thread failed (its scratch folder gone, disk full)


def _load_thread(target, *args) -> threading.Thread:
    """A load thread whose failure ends the co-tenant: a process that lives on without its
    load would be judged a busy node (``shortfall`` sees only exits, memory and CPU)."""
    def body():
        try:
            target(*args)
        except BaseException:
            os._exit(WORKER_FAILED)  # the CPU workers follow: they watch this process
    return threading.Thread(target=body, daemon=True)


def run(profile: dict, parent: int, deadline: float) -> None:
    _watch(parent, deadline)
    me = os.getpid()
    workers = []
    for _ in range(int(profile.get("cpu_workers", 0))):
        pid = os.fork()
        if pid == 0:
            _cpu(me, deadline)  # never returns
        workers.append(pid)

    scratch = tempfile.mkdtemp(prefix="specfleet-cotenant-")

    def stop(*_):
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # os._exit skips every cleanup: the scratch file (up to the profile's disk_mb_s a
        # second) would stay in the agent's temp folder after each job the agent ended
        shutil.rmtree(scratch, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    held = bytearray(int(profile.get("memory_mb", 0)) << 20)
    halt = threading.Event()
    if profile.get("disk_mb_s"):
        _load_thread(_disk, float(profile["disk_mb_s"]), scratch, halt).start()
    while not _orphaned(parent, deadline):
        for i in range(0, len(held), PAGE):  # touch every page: resident, not swapped
            held[i] = (held[i] + 1) & 0xFF
        time.sleep(1.0)
    halt.set()
    stop()


def _group_usage(pgid: int) -> tuple[int, float] | None:
    """(resident bytes, CPU seconds) of every process in a process group, or None when it
    cannot be read: psutil, else /proc."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        # the load's leader and the workers it forked (its group): not a scan of every
        # process on the machine, which this runs around each generation
        rss, cpu = 0, 0.0
        try:
            leader = psutil.Process(pgid)
            procs = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return 0, 0.0
        for p in procs:
            try:
                rss += p.memory_info().rss
                t = p.cpu_times()
                cpu += t.user + t.system
            except (psutil.Error, OSError):
                continue
        return rss, cpu
    if not os.path.isdir("/proc/self"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    rss, cpu = 0, 0.0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp, ...
            continue
        cpu += (int(fields[11]) + int(fields[12])) / tick
        rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return rss, cpu


class CoTenant:
    """Runs the profile beside a job: in its own process group (so stopping it stops its
    workers), bounded by a deadline, and ended by its own watch if the agent dies or is
    held. ``shortfall()`` says, around each generation, whether the load still runs as
    declared: a run measured beside a dead or weakened co-tenant is not a busy run."""

    def __init__(self, profile: dict, journal, max_s: float = 6 * 3600):
        self.profile, self.journal, self.max_s = profile, journal, max_s
        self.proc = None
        self._last: tuple[float, float] | None = None  # (wall, group CPU s) last judged
        self._cpu_verdict: str | None = None
        self._said: set[str] = set()

    def shortfall(self) -> list[str]:
        """Why runs measured now are not measured beside the declared load (empty: they
        are). Reasons start with "co-tenant": they set a run aside."""
        if self.proc is None:
            return []
        code = self.proc.poll()
        if code is not None:
            why = ": a load thread failed" if code == WORKER_FAILED else ""
            return self._say(f"co-tenant load ended (exit status {code}{why}): this run "
                             "measured an idle node, not the declared load")
        usage = _group_usage(self.proc.pid)
        if usage is None:
            return self._say("co-tenant load unverified: its memory and CPU cannot be read "
                             "here (install psutil)")
        rss, cpu = usage
        reasons = []
        want_mb = int(self.profile.get("memory_mb", 0))
        if want_mb and rss < MEMORY_SHORT * (want_mb << 20):
            reasons.append(f"co-tenant load short: {rss >> 20} MB resident of the "
                           f"{want_mb} MB declared")
        workers = int(self.profile.get("cpu_workers", 0))
        now = time.monotonic()
        if workers:
            if self._last is None:
                self._last = (now, cpu)
            elif now - self._last[0] >= CPU_WINDOW_S:
                share = (cpu - self._last[1]) / ((now - self._last[0]) * workers)
                self._cpu_verdict = None if share >= CPU_SHORT else (
                    f"co-tenant load short: its CPU workers ran {share:.0%} of "
                    f"{workers} core(s)")
                self._last = (now, cpu)
            if self._cpu_verdict:
                reasons.append(self._cpu_verdict)
        return self._say(*reasons)

    def _say(self, *reasons: str) -> list[str]:
        for r in reasons:  # the journal says each kind once; every run carries it
            kind = r.split(":")[0]
            if kind not in self._said:
                self._said.add(kind)
                self.journal.emit("notice", message=r)
        return list(reasons)

    def __enter__(self):
        import subprocess

        deadline = time.time() + self.max_s
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), json.dumps(self.profile),
             str(os.getpid()), str(deadline)], start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()
        self.journal.emit("background_started", pid=self.proc.pid, profile=self.profile,
                          deadline=round(deadline, 3))
        return self

    def _wait_ready(self, timeout_s: float = READY_S) -> None:
        """Measure only once the declared memory is resident (the load touches its pages
        in its first second): the first runs were otherwise measured beside part of it. A
        load that never gets there is not waited for longer: its runs say it fell short."""
        assert self.proc is not None
        want = int(self.profile.get("memory_mb", 0)) << 20
        end = time.monotonic() + timeout_s
        while want and time.monotonic() < end and self.proc.poll() is None:
            usage = _group_usage(self.proc.pid)
            if usage is None or usage[0] >= MEMORY_SHORT * want:
                return
            time.sleep(0.1)

    def __exit__(self, *exc):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(5)
        except ProcessLookupError:
            pass
        except Exception:  # did not end in time: no co-tenant outlives its job
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)
        # no event here: job_finished / job_failed must stay the journal's last line


def check_profile(profile) -> str | None:
    """Why a background profile is refused (None: it is fine)."""
    if not isinstance(profile, dict) or not profile:
        return "background: a mapping of memory_mb, cpu_workers, disk_mb_s, name"
    unknown = sorted(set(profile) - {*LIMITS, "name"})
    if unknown:
        return f"background: unknown key(s) {', '.join(unknown)}; known: " \
               f"{', '.join([*LIMITS, 'name'])}"
    for key, top in LIMITS.items():
        v = profile.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= top \
                or key != "disk_mb_s" and not isinstance(v, int):
            kind = "a number" if key == "disk_mb_s" else "an integer"
            return f"background.{key}: {kind} from 0 to {top}, got {v!r}"
    if not any(profile.get(k) for k in LIMITS):
        return "background: a profile that loads nothing (set memory_mb, cpu_workers or " \
               "disk_mb_s)"
    name = profile.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 32
                             or not name.isprintable()):
        return "background.name: a short label (1 to 32 printable characters)"
    return None


def profile_name(profile: dict) -> str:
    """The label a busy series carries: the plan's name, or what the load is."""
    if profile.get("name"):
        return str(profile["name"])
    parts = [f"{profile['memory_mb']} MB" if profile.get("memory_mb") else "",
             f"{profile['cpu_workers']} CPU" if profile.get("cpu_workers") else "",
             f"{profile['disk_mb_s']:g} MB/s disk" if profile.get("disk_mb_s") else ""]
    return "busy: " + " + ".join(p for p in parts if p)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
