"""Interrupting is safe and explained: Ctrl-C names the sweep and the commands to follow or
stop it; `sweep --stop` ends the agents, stores what they wrote and frees the nodes; a
lease left by a controller that is gone is reclaimed, and says so."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import NodeLease, Sweep
from tests.controller import (
    agent_running,
    hold_sweep,
    journal,
    journal_path,
    signal_mid_sweep,
    specfleet,
    stored_events,
    sweep_id_from,
    wait_for,
)
from tests.locks import make_lock


def test_ctrl_c_names_the_sweep_and_stop_ends_its_agent_and_frees_the_node(fleet, model_pair,
                                                                          tmp_path):
    node = fleet.nodes[0]
    lock = make_lock(tmp_path, model_pair, widths=(2, 3, 4), max_tokens=96, repetitions=6,
                     use=("code", "memo"),
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    url = f"sqlite:///{tmp_path / 's.db'}"
    log = tmp_path / "controller.log"
    common = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", url]
    p = specfleet("sweep", str(lock), "--limit", node.name, *common, log=log)
    try:
        sid = sweep_id_from(log)
        assert signal_mid_sweep(p, journal_path(node, sid), sid)[0] == 130
    finally:
        p.kill()
    text = log.read_text()
    assert "Traceback" not in text and "Aborted" not in text
    assert f"interrupted: sweep {sid} goes on on the nodes" in text
    assert f"follow it again: specfleet sweep --attach {sid} -i {inv} --db {url}" in text
    assert f"stop it:         specfleet sweep --stop {sid} -i {inv} --db {url}" in text
    assert agent_running(node), "Ctrl-C must leave the detached agent measuring"
    r = CliRunner().invoke(main, ["sweep", "--stop", sid, "--limit", node.name, *common])
    assert r.exit_code == 0, r.output
    assert f"{node.name}" in r.output and "stopped: agent (pid" in r.output
    assert f"`specfleet sweep --resume {sid} -i {inv} --db {url}` measures what is missing" \
        in r.output  # the hint runs as written: -i and --db as given
    assert not agent_running(node)
    # nothing it measured is lost: every journaled event is in the store
    assert len(stored_events(url, sid, node.name)) == len(journal(node, sid))
    store = open_store(url)
    with store.engine.connect() as c:
        assert c.execute(select(NodeLease).where(NodeLease.node == node.name)).first() is None
        assert c.execute(select(Sweep.status).where(Sweep.id == sid)).scalar() == "stopped"
    free = CliRunner().invoke(main, ["doctor", "--limit", node.name, "-i", str(inv),
                                     "--known-hosts", str(fleet.known_hosts)])
    assert "no other benchmark holds the node" in free.output, free.output
    # stopping it again is harmless and says what it is
    again = CliRunner().invoke(main, ["sweep", "--stop", sid, "--limit", node.name, *common])
    assert again.exit_code == 0 and "Traceback" not in again.output


def test_a_lease_left_by_a_controller_that_is_gone_is_reclaimed_with_a_message(
        model_pair, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid of this machine that no longer runs
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    now = datetime.now(timezone.utc)
    holder = f"{socket.gethostname()}:{gone.pid}:dead01"
    with store.engine.begin() as c:
        c.execute(NodeLease.__table__.insert().values(
            node="local", holder=holder, sweep_id="0123456789ab", acquired_at=now,
            expires_at=now + timedelta(hours=1)))
    inv = tmp_path / "local.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    lock = make_lock(tmp_path, model_pair, max_tokens=8,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db", url])
    assert r.exit_code == 0, r.output
    assert (f"reclaimed the node's lease from controller {holder} (sweep 0123456789ab), "
            "which is no longer running") in r.output


def test_stop_signals_only_this_sweeps_agent_and_is_recorded_as_stopped(model_pair, tmp_path):
    """A stored PID that names another process (a recycled PID, an edited lease) is refused
    with a line that says so, and that process lives; the real agent is then stopped and
    the sweep recorded as `stopped`, not failed."""
    from sqlalchemy import update

    from orchestrator.store.models import SweepNode

    lock = make_lock(tmp_path, model_pair, widths=(2, 3), max_tokens=64, repetitions=6)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    common = ["-i", str(inv), "--db", url, "--failed-hosts-file", str(tmp_path / "retry")]
    log = tmp_path / "controller.log"
    p = specfleet("sweep", str(lock), *common, log=log)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        sid = sweep_id_from(log)
        store = open_store(url)

        def agent_pid():
            with store.engine.connect() as c:
                return c.execute(select(SweepNode.pid).where(SweepNode.sweep_id == sid)).scalar()

        jf = tmp_path / "node" / "jobs" / f"{sid}.events.jsonl"
        wait_for(lambda: jf.is_file() and '"type":"generation"' in jf.read_text(),
                 what="a journaled generation")
        real = agent_pid()
        os.kill(real, signal.SIGSTOP)  # held, so it cannot finish while the test strikes
        # Ctrl-C returns at once though the held agent's follower would wait for it forever
        # (Python 3.11's Process.wait() waits for every pipe: the follower's group is ended)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130
        with store.engine.begin() as c:
            c.execute(update(SweepNode).where(SweepNode.sweep_id == sid).values(
                pid=bystander.pid))  # the edited lease
        r = CliRunner().invoke(main, ["sweep", "--stop", sid, *common])
        assert r.exit_code == 1, r.output
        assert f"refused to signal pid {bystander.pid}: it is not this sweep's agent" in r.output
        assert "'sleep 300'" in r.output and "Nothing was signalled" in r.output
        assert "its nodes are free" not in r.output
        assert bystander.poll() is None, "an unrelated process was signalled"
        with store.engine.connect() as c:
            assert c.execute(select(Sweep.status).where(Sweep.id == sid)).scalar() != "stopped"
        with store.engine.begin() as c:
            c.execute(update(SweepNode).where(SweepNode.sweep_id == sid).values(
                pid=real, state="running"))
        os.kill(real, signal.SIGCONT)
        r = CliRunner().invoke(main, ["sweep", "--stop", sid, *common])
        assert r.exit_code == 0 and "stopped: agent (pid" in r.output, r.output
        with store.engine.connect() as c:
            assert c.execute(select(Sweep.status).where(Sweep.id == sid)).scalar() == "stopped"
    finally:
        p.kill()
        bystander.kill()


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _lookalike(job: str, journal: str) -> tuple[subprocess.Popen, int]:
    """A process group led by a process whose command line names JOB and JOURNAL as an
    agent's does, with a second member (as a runtime the agent started)."""
    leader = subprocess.Popen(
        ["setsid", "sh", "-c", f'sleep 600 & exec {sys.executable} -c "import time; '
         f'time.sleep(600)" -m agent run "$0" --journal "$1" --lock x', job, journal])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = subprocess.run(["pgrep", "-g", str(leader.pid)], capture_output=True,
                              text=True).stdout.split()
        if len(kids) >= 2:
            return leader, len(kids)
        time.sleep(0.1)
    raise AssertionError("the look-alike group did not start")


def test_the_stop_script_signals_only_an_agent_at_least_as_old_as_its_job(tmp_path):
    """The script as the node's /bin/sh (dash here) runs it: a PID whose process started
    after the agent's job_started is refused, as is one naming another journal; a real one
    under a path with glob characters ends with its whole process group."""
    from orchestrator.sweep.stopping import stop_script

    job = str(tmp_path / "b[1]*" / "jobs" / "s1.json")
    journal = str(tmp_path / "b[1]*" / "jobs" / "s1.events.jsonl")
    leader, members = _lookalike(job, journal)
    try:
        assert members == 2
        time.sleep(1.2)
        run = lambda script: subprocess.run(["/bin/sh", "-c", script], capture_output=True,  # noqa: E731
                                            text=True, timeout=30).stdout.strip()
        # the agent said it started two seconds ago: this process is older, but a
        # job_started in the past hour before it was born means a recycled PID
        assert run(stop_script(leader.pid, job, journal, time.time() - 3600)).startswith(
            "too-young")
        assert run(stop_script(leader.pid, job, journal + "x", time.time())).startswith(
            "not-ours")
        assert leader.poll() is None
        assert run(stop_script(leader.pid, job, journal, time.time())) == "stopped"
        leader.wait(10)
        time.sleep(0.5)
        left = [p for p in subprocess.run(["pgrep", "-g", str(leader.pid)],
                                          capture_output=True, text=True).stdout.split()
                if _state(int(p)) not in ("Z", None)]  # an unreaped zombie has ended
        assert left == [], "the agent's process group outlived --stop"
    finally:
        subprocess.run(["pkill", "-KILL", "-g", str(leader.pid)], capture_output=True)


@pytest.mark.alone  # judges the 2 s a detach may take
@pytest.mark.parametrize("signals,inherited", [
    (("SIGINT",), "default"), (("SIGTERM",), "default"), (("SIGINT", "SIGINT"), "default"),
    (("SIGTERM", "SIGINT"), "default"), (("SIGINT",), "ignored")],
    ids=["sigint", "sigterm", "second-ctrl-c", "term-then-int", "sigint-ignored-by-the-shell"])
def test_a_signal_from_kill_detaches_within_2s_and_nothing_is_lost(model_pair, tmp_path,
                                                                    signals, inherited):
    """`kill -INT PID` / `kill -TERM PID` (not the terminal's Ctrl-C: only the controller
    gets it) detach within 2 s with the --attach/--stop hint (exit 130 / 143); a second
    signal during the detach is a clean exit; `cmd &` in a script (SIGINT inherited as
    ignored) is detached too. The agent goes on, and --attach stores all it journaled."""
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), max_tokens=48, repetitions=4,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    common = ["-i", str(inv), "--db", url, "--failed-hosts-file", str(tmp_path / "retry")]
    log = tmp_path / "controller.log"

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a non-interactive `&` does

    with open(log, "ab") as out:
        p = subprocess.Popen([sys.executable, "-c", "from orchestrator.cli import main; main()",
                              "sweep", str(lock), *common], stdout=out, stderr=out,
                             preexec_fn=ignore_sigint if inherited == "ignored" else None)
    try:
        sid = sweep_id_from(log)
        jf = tmp_path / "node" / "jobs" / f"{sid}.events.jsonl"
        first, *more = (getattr(signal, s) for s in signals)
        wait_for(lambda: jf.is_file() and '"type":"generation"' in jf.read_text(),
                 what="a journaled generation")
        assert hold_sweep(sid), "no agent to hold"  # it cannot finish while we strike
        t0 = time.monotonic()
        p.send_signal(first)
        for s in more:
            time.sleep(0.05)  # during the detach
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(s)
        status = p.wait(30)
        took = time.monotonic() - t0
        hold_sweep(sid, signal.SIGCONT)
    finally:
        p.kill()
    text = log.read_text()
    assert status == {signal.SIGINT: 130, signal.SIGTERM: 143}[first], text
    assert took <= 2.0, f"the detach took {took:.2f} s"
    assert "Traceback" not in text and "RuntimeError" not in text and "Event loop" not in text
    said = "interrupted" if first == signal.SIGINT else "controller ended by SIGTERM"
    assert f"{said}: sweep {sid} goes on on the nodes" in text, text
    assert f"follow it again: specfleet sweep --attach {sid} {' '.join(common[:4])}" in text
    assert f"stop it:         specfleet sweep --stop {sid} {' '.join(common[:4])}" in text
    store = open_store(url)
    with store.engine.connect() as c:  # the agents go on: the sweep is not over
        assert c.execute(select(Sweep.status).where(Sweep.id == sid)).scalar() == "running"
    att = specfleet("sweep", "--attach", sid, *common, log=tmp_path / "attach.log")
    assert att.wait(300) == 0, (tmp_path / "attach.log").read_text()[-2000:]
    events = stored_events(url, sid, "local")
    assert events == [json.loads(x) for x in jf.read_text().splitlines()]
    assert events[-1]["type"] == "job_finished"
