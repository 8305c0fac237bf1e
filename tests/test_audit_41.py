"""Audit 41 of three changes on main, as a hostile node, a careless user and a statistician:
a plain test per guard that held, a strict xfail per finding (severity, what was measured).

1. ``agent.__main__.own_compile_dir``: on Linux the agent's TMPDIR is a folder of its
   user's alone (``specfleet-<uid>`` in the temp folder it has; findings 3-6 fixed).
2. ``Sampler.mark`` holds ``_taking`` across read and append (sample order is time order).
3. ``through_noise.baseline_at``: the rules and the ladder read one baseline for a pick
   decided through the noise, planted through the real ingest (tests/history.py)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agent.__main__ import own_compile_dir
from agent.lock import machine_lock_path
from agent.telemetry.sampler import AFTER_WAIT_S, Sampler
from orchestrator.review.rules import load_rules
from orchestrator.review.through_noise import baseline_at
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.blas import openblas
from tests.history import C, night, week_nights
from tests.history import config_values as V
from tests.store_templates import fresh_sqlite
from tests.test_through_noise import _reason, lognormal
from tests.test_weekly_review import NOW, W20

ROOT = Path(__file__).resolve().parents[1]
NOBODY, NO_PASSWD = 65534, 47111  # the second uid has no passwd entry (a bare container)
as_other_user = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs the agent as another user (root and util-linux setpriv on Linux)")
OWN = ("from agent.__main__ import own_compile_dir; import os; "
       "print(own_compile_dir(), os.environ.get('TMPDIR'), sep='\\n')")
KERNEL = ("import mlx.core as mx; f = mx.compile(lambda x, y: (x * y + 4.125).exp() - x); "
          "mx.eval(f(mx.array([1.0, 2.0]), mx.array([3.0, 4.0]))); print('compiled')")


def _as(uid: int, code: list[str], env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("HOME", "TMPDIR")}
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           sys.executable, *code], capture_output=True, text=True, cwd=ROOT,
                          env={**base, **openblas(), **env}, timeout=60)


@pytest.fixture
def linux_home(tmp_path, monkeypatch):
    """own_compile_dir in this process as on Linux, the user's temp folder a fresh one
    (shared, as /tmp is: 1777); the TMPDIR it sets is put back after the test."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("SPECFLEET_MACHINE_LOCK")
    return shared


# -- 1. own_compile_dir ------------------------------------------------------------------

@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_off_linux_it_touches_neither_tmpdir_nor_home(tmp_path, monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TMPDIR", "/var/folders/xy/T/")
    assert own_compile_dir() is None
    assert os.environ["TMPDIR"] == "/var/folders/xy/T/" and not list(tmp_path.iterdir())


def _alone(folder: Path) -> bool:
    """A real folder (no symlink) of this user's, closed to others."""
    st = folder.lstat()
    return folder.is_dir() and not folder.is_symlink() and st.st_uid == os.geteuid() \
        and st.st_mode & 0o077 == 0


def test_on_linux_a_private_folder_and_the_machine_lock_stays_in_tmp(linux_home):
    got = own_compile_dir()
    assert got == linux_home / f"specfleet-{os.geteuid()}" and os.environ["TMPDIR"] == str(got)
    assert got.stat().st_mode & 0o777 == 0o700
    assert tempfile.gettempdir() == str(got)
    # the machine-wide lock is shared by every user: it must not follow TMPDIR
    assert machine_lock_path() == Path("/tmp/specfleet-machine.lock")
    assert own_compile_dir() == got  # a second call finds it as the first left it


def test_a_file_where_the_folder_goes_gets_a_fresh_folder(linux_home):
    (linux_home / f"specfleet-{os.geteuid()}").write_text("not a folder")
    got = own_compile_dir()
    assert got is not None and got.parent == linux_home and _alone(got)
    assert os.environ["TMPDIR"] == str(got)


@as_other_user
def test_no_home_at_all_still_answers_version(place):
    """A uid with no passwd entry and HOME unset (a bare container): `agent version`
    answers (the folder needs no home)."""
    v = _as(NO_PASSWD, ["-m", "agent", "version"], {"TMPDIR": str(place / "t")})
    assert v.returncode == 0 and "agent_version" in v.stdout, v.stderr[-300:]


@as_other_user
def test_a_folder_left_by_another_user_is_not_taken_as_its_own(place):
    """specfleet-65534 made by root (0700) in a shared temp folder, as a squatter or `sudo`
    would leave it: nobody's agent makes a fresh folder and compiles its kernel there."""
    shared = place / "t"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / f"specfleet-{NOBODY}").mkdir(mode=0o700)  # root's
    p = _as(NOBODY, ["-c", f"{OWN}; {KERNEL}"], {"TMPDIR": str(shared)})
    assert p.returncode == 0 and "compiled" in p.stdout, (p.stdout, p.stderr[-300:])
    got = Path(p.stdout.split("\n")[0])
    assert got.parent == shared and got.name.startswith(f"specfleet-{NOBODY}-")
    assert got.stat().st_uid == NOBODY and list((got / "mlx").rglob("*.so"))


@pytest.mark.parametrize("how", ["symlink to a shared folder", "world-writable"])
def test_the_folder_it_compiles_into_is_its_users_alone(linux_home, tmp_path, how):
    own = linux_home / f"specfleet-{os.geteuid()}"
    if how == "world-writable":
        own.mkdir()
        own.chmod(0o777)
    else:
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        os.chown(shared, NOBODY, NOBODY)
        own.symlink_to(shared)
    got = own_compile_dir()
    assert got is not None and _alone(got) and os.environ["TMPDIR"] == str(got)
    assert not list((tmp_path / "shared").glob("*")) if how != "world-writable" else True


def test_a_cotenant_leaves_nothing_in_the_agents_temp_folder(tmp_path, monkeypatch):
    """The co-tenant load inherits the agent's temp folder; the agent's SIGTERM ends it
    (os._exit, which skips cleanup): its scratch file (up to the profile's disk_mb_s a
    second) is removed first."""
    from agent.cotenant import CoTenant

    own = tmp_path / "own-tmp"
    own.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(own))

    class Quiet:
        def emit(self, *a, **k):
            pass

    with CoTenant({"disk_mb_s": 2}, Quiet(), max_s=60):
        end = time.monotonic() + 5
        while time.monotonic() < end and not list(own.glob("specfleet-cotenant-*/io.bin")):
            time.sleep(0.05)
        assert list(own.glob("specfleet-cotenant-*/io.bin")), "the load never wrote"
    time.sleep(0.3)
    left = {str(p.relative_to(own)): p.stat().st_size for p in own.rglob("*") if p.is_file()}
    assert not list(own.iterdir()), left


# -- 2. Sampler: one reading at a time ----------------------------------------------------

def _reader(thread_s: float, main_s: float = 0.0, counters: bool = False):
    """Readings that take ``thread_s`` in the sampler's thread, ``main_s`` elsewhere;
    ``counters``: CPU counters that never advance (a run too short to judge)."""
    def read() -> dict:
        t = time.time()
        time.sleep(thread_s if threading.current_thread().name == "telemetry" else main_s)
        snap = {"ts": t}
        if counters:
            snap.update(cpu_total_s=100.0, cpu_busy_s=10.0, own_cpu_s=1.0)
        return snap
    return read


def _bounded(fn, limit_s: float):
    """fn() in a thread: (result, seconds), or a failure instead of a hung suite."""
    out: dict = {}

    def body():
        t = time.monotonic()
        out["v"] = fn()
        out["s"] = time.monotonic() - t

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"still waiting after {limit_s} s: a deadlock"
    return out["v"], out["s"]


def test_a_slow_thread_reading_delays_a_mark_by_one_reading_at_most():
    """The bound, measured: a mark waits at most for the reading in flight (here 0.3 s;
    0.4 ms for read_snapshot on this Linux VM, on macOS four pmset/sysctl commands, each
    cut at 5 s). The start mark comes before the generation's clock starts, so the wait
    delays the run, never its numbers."""
    delays = []
    with Sampler(interval=0.05, reader=_reader(0.3)) as s:
        for i in range(6):
            time.sleep(0.07 * i % 0.3)
            t = time.monotonic()
            s.mark()
            delays.append(time.monotonic() - t)
    ts = [x["ts"] for x in s.samples]
    assert ts == sorted(ts) and max(delays) < 0.3 + 0.2, delays  # never two readings
    assert max(delays) > 0.1, "no mark met a reading in flight: the test planted nothing"


def test_a_short_runs_window_waits_no_longer_than_its_bound_and_never_deadlocks():
    """window() of a run too short to judge takes readings itself (``_reading`` → mark)
    while the thread reads slowly: it ends within AFTER_WAIT_S plus two readings."""
    with Sampler(interval=0.02, reader=_reader(0.2, 0.01, counters=True)) as s:
        start, end = s.mark(), s.mark()
        w, took = _bounded(lambda: s.window(start, end), 5.0)
    assert took < AFTER_WAIT_S + 2 * 0.2 + 0.2, took
    assert w.after is None and len(w) >= 2
    ts = [x["ts"] for x in s.samples]
    assert ts == sorted(ts)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_reading_that_raises_releases_the_lock():
    """The thread's reader raises while a mark waits for it: the lock is let go, the mark
    goes on and the context exits at once (the thread itself ends, as it did before)."""
    def read() -> dict:
        if threading.current_thread().name == "telemetry":
            time.sleep(0.2)
            raise OSError("a counter file vanished")
        return {"ts": time.time()}

    s = Sampler(interval=0.01, reader=read).__enter__()
    time.sleep(0.05)  # the thread is mid-reading, to raise
    i, took = _bounded(s.mark, 2.0)
    assert 0.05 < took < 0.4 and s.samples[i]["ts"] > s.samples[0]["ts"], took
    _, took = _bounded(lambda: s.__exit__(None, None, None), 2.0)
    assert took < 0.1


def test_exit_while_a_reading_is_in_flight_keeps_it_and_returns_after_it():
    with Sampler(interval=0.02, reader=_reader(0.4)) as s:
        time.sleep(0.1)  # the thread is mid-reading
        t = time.monotonic()
    took = time.monotonic() - t
    assert took < 0.4 + 0.2 and s._thread is not None and not s._thread.is_alive(), took
    ts = [x["ts"] for x in s.samples]
    assert len(ts) >= 2 and ts == sorted(ts)
    i, took = _bounded(s.mark, 1.0)  # a mark after the exit is not held by anything
    assert i == len(ts)


# -- 3. baseline_at: the baseline a pick through the noise is read beside ---------------

SPREAD = dict(unreliable=_reason(36), spread={"value": 0.36, "limit": 0.10})
BUSY = dict(unreliable="other processes took 60% of the CPU (limit 20%)")
SERIES = dict(node="ci-01", chip="Apple M2 Max", pair="target / draft", workload="code")


def _cfg(rng, rate: float, acc=None, mem: float = 1.0e9, swap_in: int = 0) -> dict:
    v = V(rate, reps=8, acceptance=acc, rng=rng, mem=mem, swap_in=swap_in)
    v["decode_tok_s"] = lognormal(rng, rate, 8)
    return v


def _series(tmp_path, sweeps) -> dict:
    """``sweeps``: (hours after the week's first night, night() kwargs, configs) each."""
    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    at = week_nights(W20, 1)[0] + timedelta(hours=1)
    for hours, kw, configs in sweeps:
        night(store, at + timedelta(hours=hours), **SERIES, **kw, configs=configs)
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    assert s["verdict"].get("through_noise") and s["verdict"]["k"] == 2, s["verdict"]
    return s


def _pick(rng, mem: float = 3.0e9) -> dict:
    return _cfg(rng, 200.0, 0.8, mem=mem, swap_in=64 << 20)


def test_a_baseline_noisy_on_two_nights_is_still_read(tmp_path):
    """Was high: a baseline set aside for its spread on two nights (36% and 22%) carries two
    reasons; the pick's memory beside it (3 GB against 1 GB, swapping in) went unread."""
    rng = random.Random(3)
    second = dict(unreliable=_reason(22), spread={"value": 0.22, "limit": 0.10})
    s = _series(tmp_path, [
        (0, SPREAD, {("baseline", 0): _cfg(rng, 100.0), ("speculative", 2): _pick(rng)}),
        (24, second, {("baseline", 0): _cfg(rng, 100.0), ("speculative", 2): _pick(rng)})])
    assert s["metrics"]["mem_increase"] == pytest.approx(2.0)
    assert "draft-memory" in {x["rule"] for x in s["signals"]}, s["signals"]


def test_a_contended_second_sweep_does_not_hide_the_memory(tmp_path):
    """Was medium: a second sweep that night set aside for contention added its reason to
    the baseline's, and the verdict's baseline (its spread-alone runs) went unread."""
    rng = random.Random(3)
    s = _series(tmp_path, [
        (0, SPREAD, {("baseline", 0): _cfg(rng, 100.0), ("speculative", 2): _pick(rng)}),
        (2, BUSY, {("baseline", 0): _cfg(rng, 100.0), ("speculative", 2): _pick(rng)})])
    assert s["metrics"]["mem_increase"] == pytest.approx(2.0)
    assert "draft-memory" in {x["rule"] for x in s["signals"]}, s["signals"]


@pytest.mark.parametrize("z_first", [True, False])
def test_two_baselines_at_one_sampling_memory_and_speedup_read_the_same_one(tmp_path, z_first):
    """Was low: two baselines at one sampling (an http job's two autoregressive variants,
    both set aside for spread): the verdict's speedup was judged against the first by run
    order (z-plain: 50 tok/s, 2.5 GB) while the memory read the first by key (a-plain:
    100 tok/s, 1 GB): +200% memory beside a 3.9x read against +20%. Now both read a-plain,
    whichever variant ran first: 2x and +200%."""
    rng, http = random.Random(3), {**SPREAD, "engine": "http"}
    z = (0 if z_first else 1, http,
         {C("baseline", 0, variant="z-plain"): _cfg(rng, 50.0, mem=2.5e9)})
    a = (1 if z_first else 0, http,
         {C("baseline", 0, variant="a-plain"): _cfg(rng, 100.0, mem=1.0e9),
          C("speculative", 2, variant="spec"): _pick(rng)})
    s = _series(tmp_path, [z, a] if z_first else [a, z])
    assert 1.6 < s["metrics"]["best_speedup"] < 2.5, s["metrics"]["best_speedup"]
    assert s["metrics"]["mem_increase"] == pytest.approx(3.0e9 / 1.0e9 - 1)


@pytest.mark.parametrize("z_first", [True, False])
def test_two_reliable_baselines_in_one_sweep_pair_every_reading_with_one(tmp_path, z_first):
    """Two reliable autoregressive variants at one sampling in one sweep: each run's speedup
    took whichever baseline came last in the sweep, the memory the first by key. Both
    read a-plain (100 tok/s, 1 GB) whatever the run order: 2x and +200%."""
    rng = random.Random(5)
    z = {C("baseline", 0, variant="z-plain"): _cfg(rng, 50.0, mem=2.5e9)}
    a = {C("baseline", 0, variant="a-plain"): _cfg(rng, 100.0, mem=1.0e9)}
    configs = {**z, **a} if z_first else {**a, **z}
    configs[C("speculative", 2, variant="spec")] = _cfg(rng, 200.0, 0.8, mem=3.0e9)
    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    night(store, week_nights(W20, 1)[0] + timedelta(hours=1), **SERIES, engine="http",
          configs=configs)
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    assert 1.6 < s["metrics"]["best_speedup"] < 2.5, s["metrics"]["best_speedup"]
    assert s["metrics"]["mem_increase"] == pytest.approx(3.0e9 / 1.0e9 - 1)


@pytest.mark.parametrize("pick_mem,advice", [(1.375e9, False), (1.5e9, True)])
def test_contended_and_other_sampling_baselines_are_never_read(tmp_path, pick_mem, advice):
    """Beside the spread-alone baseline (1.25 GB) the week holds a baseline variant set
    aside for contention (0.5 GB) and a reliable one at temperature 0.7 (0.5 GB). Read
    against its own, the pick's memory is +10% (under the rule's 12%: no advice) or +20%
    (advice); either other baseline would read +175% or +200% and always advise."""
    rng, http = random.Random(3), {**SPREAD, "engine": "http"}
    hot = (("temperature", 0.7),)
    s = _series(tmp_path, [
        (0, http, {C("baseline", 0, variant="a-plain"): _cfg(rng, 100.0, mem=1.25e9),
                   C("speculative", 2, variant="spec"): _pick(rng, pick_mem)}),
        (1, {**BUSY, "engine": "http"},
         {C("baseline", 0, variant="b-plain"): _cfg(rng, 100.0, mem=0.5e9)}),
        (2, {"engine": "http"},
         {C("baseline", 0, variant="a-plain", **dict(hot)): _cfg(rng, 100.0, mem=0.5e9)})])
    m = s["metrics"]
    assert m["best_through_noise"]
    assert m["mem_increase"] == pytest.approx(pick_mem / 1.25e9 - 1)
    assert m["mem_added_bytes"] == pytest.approx(pick_mem - 1.25e9)
    assert ("draft-memory" in {x["rule"] for x in s["signals"]}) is advice, s["signals"]


def test_without_a_verdict_through_the_noise_no_set_aside_baseline_is_read():
    """baseline_at by hand: a spread-alone baseline only where the verdict was decided
    through the noise; one set aside for contention, or at another sampling, never."""
    spread = {"mode": "baseline", "sampling": "greedy", "set_aside": True,
              "unreliable_reasons": [_reason(36)]}
    busy = {**spread, "unreliable_reasons": [BUSY["unreliable"]]}
    hot = {**spread, "sampling": "t0.7", "set_aside": False, "unreliable_reasons": []}
    through = {"verdict": {"through_noise": {"outcome": "pass"}}}
    assert baseline_at({"configs": [busy, spread, hot]}, "greedy") is None
    assert baseline_at({"configs": [busy, hot], **through}, "greedy") is None
    assert baseline_at({"configs": [busy, spread, hot], **through}, "greedy") is spread
    assert baseline_at({"configs": [busy, spread, hot], **through}, "t0.7") is hot
