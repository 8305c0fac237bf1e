"""Shared fixtures: the model pair, a real sshd fleet, a real PostgreSQL database."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from tests import blas, store_templates
from tests.fleet import add_netns_node, start_fleet, stop_fleet
from tests.machine import cpu_ticks

# Property tests draw the same examples on every run (`make test`, CI): a run's result is the
# code's, not the draw's (a CI run once failed on an example later runs did not draw again).
# SPECFLEET_HYPOTHESIS=explore draws new ones on each run, for a bug hunt.
hypothesis_settings.register_profile("repeatable", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
hypothesis_settings.load_profile("explore" if os.environ.get("SPECFLEET_HYPOTHESIS") == "explore"
                         else "repeatable")



def pytest_runtest_setup(item):
    """The module ``random`` is seeded by the test's id before its fixtures run: planting
    helpers that jitter with it (tests.history.config_values) then plant the same numbers
    on every run, whichever worker and whatever order. Unseeded, a CI run once failed on a
    planted acceptance of 0.6 that its three jittered repetitions put at 0.59."""
    random.seed(item.nodeid)


# Tests run in parallel workers: each worker process is a machine of its own for local
# agents, also in module-scoped fixtures that run before the per-test lock below.
os.environ["SPECFLEET_MACHINE_LOCK"] = str(
    Path(tempfile.gettempdir()) / f"specfleet-test-machine-{os.getpid()}.lock")


@pytest.fixture(autouse=True)
def machine_lock(tmp_path, monkeypatch):
    """Each test is a machine of its own for local agents: an agent a test leaves running
    must not hold the next test's machine-wide lock (/tmp/specfleet-machine.lock)."""
    path = tmp_path / "machine.lock"
    monkeypatch.setenv("SPECFLEET_MACHINE_LOCK", str(path))
    # a specfleet.toml in the checkout (`make demo` writes one) must not steer the tests
    monkeypatch.setenv("SPECFLEET_CONFIG", "none")
    return path


@pytest.fixture
def default_blas(monkeypatch):
    """Local agents compute with mlx's own BLAS even under `make test`'s OpenBLAS preload
    (tests/blas.py): for a test whose checks depend on relative speeds."""
    for key in blas.VARS:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture(scope="session")
def shared_dir():
    """A world-readable scratch folder: sshd node users must read the models in it."""
    d = Path(tempfile.mkdtemp(prefix="specfleet-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def place():
    """A world-traversable folder of the test's own (pytest's tmp_path is root's 0700): a
    test that runs something as another user keeps its files here."""
    d = Path(tempfile.mkdtemp(prefix="specfleet-place-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def model_pair(shared_dir) -> Path:
    from orchestrator.demo_models import build_demo_models

    out = shared_dir / "models"
    record = build_demo_models(out, log=lambda m: None)
    assert record["reused"], "the committed pair should match its build key on this machine"
    for p in out.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


@pytest.fixture(scope="session")
def fleet():
    f = start_fleet(2, sys.executable)
    try:
        # The node users must be able to run the agent's interpreter (the project venv).
        probe = subprocess.run(["su", "-s", "/bin/sh", f.nodes[0].user, "-c",
                                f"{sys.executable} -c 'import mlx_lm'"],
                               capture_output=True, text=True)
        assert probe.returncode == 0, (
            f"node users cannot run {sys.executable}: {probe.stderr.strip()} "
            "(clone the project into a world-readable folder)")
        yield f
    finally:
        stop_fleet(f)


@pytest.fixture(scope="session")
def big_fleet():
    """Ten sshd nodes for fan-out behaviour (no model work on them)."""
    f = start_fleet(10, sys.executable)
    try:
        yield f
    finally:
        stop_fleet(f)


@pytest.fixture(scope="session")
def netns_fleet():
    """One node behind a veth pair in its own network namespace: its link can be cut."""
    f = start_fleet(0, sys.executable)
    try:
        add_netns_node(f, 1)
        yield f
    finally:
        stop_fleet(f)


@pytest.fixture(scope="session")
def pg_databases():
    """This worker's PostgreSQL databases at head (tests/store_templates.py)."""
    pool = store_templates.PgDatabases()
    yield pool
    pool.close()


@pytest.fixture
def pg_url(pg_databases):
    """A fresh PostgreSQL database at head, of this test's own, set aside afterwards."""
    name = pg_databases.take()
    yield store_templates.PG_BASE + name
    pg_databases.give_back(name)


@pytest.fixture
def empty_pg_url():
    """A fresh, empty PostgreSQL database (no tables: for the tests of migrating itself),
    dropped afterwards."""
    name = store_templates.new_pg_database()
    yield store_templates.PG_BASE + name
    store_templates.drop_pg_database(name)


class PrivatePG:
    """A PostgreSQL server of a test's own (initdb, a free loopback port): the tests that stop
    or restart PostgreSQL mid-sweep leave the shared server up for every other test."""

    def __init__(self) -> None:
        import glob
        import socket

        # the newest installed server (numerically: 9 < 15)
        self.bin = max(glob.glob("/usr/lib/postgresql/*/bin"),
                       key=lambda b: int(Path(b).parent.name))
        self.dir = Path(tempfile.mkdtemp(prefix="specfleet-pg-"))
        shutil.chown(self.dir, "postgres")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._ctl(f"{self.bin}/initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U",
                  "postgres", "--no-sync", "-E", "UTF8")

    def _ctl(self, *args: str) -> None:
        subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", " ".join(args)],
                       check=True, capture_output=True)

    def pg_ctl(self, action: str, *extra: str) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._ctl(f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-o", f"'{opts}'", "-l",
                  f"{self.dir}/log", "-w", *extra, action)

    def start(self) -> None:
        self.pg_ctl("start")

    def stop(self) -> None:
        self.pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self.pg_ctl("restart", "-m", "fast")

    def remove(self) -> None:
        self._ctl(f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-w", "-m", "immediate",
                  "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_pg_server():
    """A running PrivatePG; stopped and removed afterwards."""
    server = PrivatePG()
    server.start()
    try:
        yield server
    finally:
        try:
            server.remove()
        except subprocess.CalledProcessError:  # the test left it stopped
            shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
def private_pg(private_pg_server):
    """(url, restart) of a PrivatePG, for the tests that restart PostgreSQL mid-sweep."""
    return private_pg_server.url, private_pg_server.restart


@pytest.fixture
def sqlite_url(tmp_path):
    """A fresh SQLite store at head (a copy of one migrated per worker)."""
    return store_templates.fresh_sqlite(tmp_path / "store.db")


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request):
    """A fresh store at head, on SQLite and on PostgreSQL."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_any_url(request, tmp_path):
    """A URL with no store behind it yet (SQLite) or an empty database (PostgreSQL): for the
    tests of migrating itself."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("empty_pg_url")


# Modules that take 20 s or more, longest first: with one module per worker (--dist
# loadscope, so module fixtures run once), a long module started last would hold the whole
# run up after every other worker is done. Ranked by the CPU each used run alone (its
# process tree's cgroup CPU, `bench/module_cpu.py`, on a host loaded 4-12x by other work;
# 2026-11-28, all 135 modules 1,505 CPU-s, each paying its own collection and fleet), a
# module that mostly waits by its wall time: the store outages first (44 CPU-s, ~125 s
# alone, ~105 s in CI), the demo's example ~75 (its calibration sweep stops later on a busy
# host), the --help and README examples and sweep lifecycle ~45-50, store faults 40, first
# provision 35, lint (mypy: 37 on an empty cache, 4 on a warm one), the hostile property
# and agent faults ~29, the load measures (5 CPU-s but ~80 s of waiting), then 15-25 each.
SLOW_FIRST = ("test_store_outage.py", "test_demo_example.py", "test_help_examples.py",
              "test_docs.py", "test_sweep_lifecycle.py", "test_sweep_faults.py",
              "test_provision.py", "test_lint.py", "test_hostile_lines.py",
              "test_agent_faults.py", "test_load_measures.py", "test_lineup.py",
              "test_wheel_install.py", "test_machine_lock.py", "test_audit_a.py",
              "test_weekly_review.py", "test_calibration.py", "test_sweep_ssh.py",
              "test_audit_28e.py", "test_review.py", "test_ledger_glue.py", "test_audit_34n.py",
              "test_pages.py", "test_audit_34c.py", "test_ledger.py", "test_measurements.py",
              "test_http_sweep.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


def pytest_sessionfinish(session, exitstatus):
    """An agent a test left detached (a killed controller's, by design) must not run on
    into the `alone` tests that judge timing: at the end of the run, the controller process
    ends every agent still running from this run's temporary folders."""
    if hasattr(session.config, "workerinput"):
        return
    try:
        base = str(session.config._tmp_path_factory.getbasetemp())  # the run's tmp_path root
    except Exception:  # no temporary folder was made: no agent was started from one
        return
    import signal

    ended = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        # base + "/": pytest-3 must not end pytest-30's agents (runs share /tmp/pytest-of-USER)
        if base + "/" in text and " run " in text and "agent" in text:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                ended += 1
            except OSError:
                pass
    session.config._agents_ended = ended


def pytest_sessionstart(session):
    session.config._cpu_at_start = cpu_ticks()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How busy the machine was during the run, so a slow run explains itself: CPU used
    (this run's and anything else's), idle, and what the hypervisor took (steal: a noisy
    neighbour on the host, invisible to `top`)."""
    start, end = getattr(config, "_cpu_at_start", None), cpu_ticks()
    if hasattr(config, "workerinput") or not start or not end:
        return
    d = [b - a for a, b in zip(start, end)]
    hz = os.sysconf("SC_CLK_TCK")
    busy, idle, steal = (d[0] + d[1] + d[2] + d[5] + d[6]) / hz, (d[3] + d[4]) / hz, d[7] / hz
    total = busy + idle + steal
    if not total:
        return
    if getattr(config, "_agents_ended", 0):
        terminalreporter.write_line(f"ended {config._agents_ended} agent(s) that tests had "
                                    "left running")
    terminalreporter.write_line(
        f"CPU during this run: {busy:.0f} s busy, {idle:.0f} s idle, {steal:.0f} s stolen by "
        f"the host ({steal / total:.0%} of {os.cpu_count()} CPUs' time)")
