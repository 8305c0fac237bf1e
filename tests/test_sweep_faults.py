"""Store and controller faults: two controllers, store down at start, PostgreSQL restarted
mid-sweep, the controller's disk full."""

import os
import signal
import subprocess

from sqlalchemy import create_engine, inspect

from tests.controller import (
    hold_sweep,
    journal,
    journal_path,
    journaled_generations,
    json_from_log,
    specfleet,
    stored_events,
    stored_generations,
    sweep_id_from,
    wait_for,
)
from tests.locks import make_lock


def args(fleet, inv, url, tmp_path, limit="node1", retry="retry"):
    return ["-i", str(inv), "--limit", limit, "--known-hosts", str(fleet.known_hosts),
            "--db", url, "--no-provision", "--failed-hosts-file", str(tmp_path / retry)]


def test_two_controllers_never_benchmark_the_same_node(fleet, model_pair, tmp_path, pg_url):
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2, max_tokens=64)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    a = specfleet("sweep", str(lock), *args(fleet, inv, pg_url, tmp_path, retry="ra"),
                  "--json", log=tmp_path / "a.log")
    b = specfleet("sweep", str(lock), *args(fleet, inv, pg_url, tmp_path, retry="rb"),
                  "--json", log=tmp_path / "b.log")
    codes = sorted([a.wait(timeout=300), b.wait(timeout=300)])
    assert codes == [0, 1]
    logs = [(tmp_path / n).read_text() for n in ("a.log", "b.log")]
    loser = next(x for x in logs if '"status": "failed"' in x)
    assert "node busy: leased by " in loser and " for sweep " in loser
    winner = next(x for x in logs if x is not loser)
    sid = json_from_log(winner)["sweep_id"]
    assert stored_events(pg_url, sid, "node1") == journal(fleet.nodes[0], sid)


def test_store_unreachable_at_start_writes_nothing(fleet, model_pair, tmp_path):
    lock = make_lock(tmp_path, model_pair)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    jobs = fleet.nodes[0].home / ".specfleet" / "jobs"
    before = set(jobs.iterdir()) if jobs.exists() else set()
    p = specfleet("sweep", str(lock), *args(fleet, inv, "postgresql+psycopg://postgres@"
                                             "127.0.0.1:1/nowhere", tmp_path),
                  log=tmp_path / "c.log")
    assert p.wait(timeout=60) == 1
    out = (tmp_path / "c.log").read_text()
    assert out.strip().splitlines()[-1].startswith(
        "Error: cannot open store postgresql+psycopg://postgres@127.0.0.1:1/nowhere:")
    after = set(jobs.iterdir()) if jobs.exists() else set()
    assert after == before  # no node was touched


def _sweep_under_way(fleet, model_pair, tmp_path, pg_url):
    """A sweep of node1 into PostgreSQL, two generations in and its agent held (SIGSTOP,
    see ``_hold_at``): (controller, sweep id, log, inventory)."""
    # 12 short generations: held, the agent has work left whatever this machine's speed
    # (18 generations of 96 tokens used to buy that: 3x the CPU)
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=3, max_tokens=32)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    log = tmp_path / "c.log"
    ctl = specfleet("sweep", str(lock), *args(fleet, inv, pg_url, tmp_path), log=log)
    sid = sweep_id_from(log)
    _hold_at(fleet, sid, 2)
    try:
        wait_for(lambda: stored_generations(pg_url, sid, "node1") >= 2,
                 what="first generations")
    except AssertionError:
        hold_sweep(sid, signal.SIGCONT)
        raise
    return ctl, sid, log, inv


def _hold_at(fleet, sid: str, generations: int) -> None:
    """Hold the sweep's agent once node1's journal has ``generations``; it must have work
    left (the test releases it after its fault, so its next events meet the fault)."""
    path = journal_path(fleet.nodes[0], sid)
    wait_for(lambda: journaled_generations(fleet.nodes[0], sid) >= generations,
             what=f"{generations} generations in {path}")
    assert hold_sweep(sid), f"no agent of sweep {sid} to hold"
    assert '"type":"job_finished"' not in path.read_text(errors="replace"), \
        "the sweep ended before its agent was held: plan more generations"


def test_postgresql_restarted_mid_sweep(fleet, model_pair, tmp_path, private_pg):
    pg_url, restart = private_pg  # a server of its own: the shared one serves other tests
    ctl, sid, log, _ = _sweep_under_way(fleet, model_pair, tmp_path, pg_url)
    try:
        restart()  # while the agent is held: its next events meet the restarted server
    finally:
        hold_sweep(sid, signal.SIGCONT)
    assert ctl.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert stored_events(pg_url, sid, "node1") == journal(fleet.nodes[0], sid)


def test_postgresql_restarted_during_a_resume(fleet, model_pair, tmp_path, private_pg):
    """An audit saw `--resume` stop with "terminating connection due to administrator
    command" while PostgreSQL restarted; every path that writes the store must ride it out."""
    from tests.controller import kill_agent, signal_mid_sweep

    pg_url, restart = private_pg
    ctl, sid, _, inv = _sweep_under_way(fleet, model_pair, tmp_path, pg_url)
    # (signal_mid_sweep holds the held agent again, and releases it after the signal)
    assert signal_mid_sweep(ctl, journal_path(fleet.nodes[0], sid), sid)[0] == 130
    kill_agent(fleet.nodes[0])  # the agent died too: --resume restarts it
    journaled = journaled_generations(fleet.nodes[0], sid)
    res = specfleet("sweep", "--resume", sid, *args(fleet, inv, pg_url, tmp_path, retry="r2"),
                    log=tmp_path / "r.log")
    before = stored_generations(pg_url, sid, "node1")
    _hold_at(fleet, sid, journaled + 1)
    try:
        wait_for(lambda: stored_generations(pg_url, sid, "node1") > before,
                 what="resumed work")
        restart()  # while the resumed agent is held: its next events meet the new server
    finally:
        hold_sweep(sid, signal.SIGCONT)
    assert res.wait(timeout=300) == 0, (tmp_path / "r.log").read_text()[-3000:]
    assert "Traceback" not in (tmp_path / "r.log").read_text()
    assert stored_events(pg_url, sid, "node1") == journal(fleet.nodes[0], sid)


def _schema_then(tmp_path, small, url: str, free_kb: int) -> None:
    """A tmpfs at ``small`` holding the migrated store ``url``, then ``free_kb`` left."""
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], check=True)
    assert specfleet("db", "upgrade", "--db", url, log=tmp_path / "u.log").wait(60) == 0
    st = os.statvfs(small)
    size = (st.f_blocks - st.f_bfree) * st.f_frsize + free_kb * 1024
    subprocess.run(["mount", "-o", f"remount,size={size}", str(small)], check=True)


def test_controller_disk_full_then_attach(fleet, model_pair, tmp_path):
    small = tmp_path / "small"
    url = f"sqlite:///{small / 'store.db'}"
    try:
        # The schema first, then 160 kB left: the 28 events of 3 repetitions of 64 tokens need
        # ~116 kB in the database and as much again in its WAL (measured: the disk fills after
        # ~6 generations), so it fills mid-sweep however the ingest batches them. A fixed
        # 640 kB filled on a slow host (many small commits) and never on a fast one.
        _schema_then(tmp_path, small, url, 160)
        lock = make_lock(tmp_path, model_pair, widths=(2, 3, 4), repetitions=3, max_tokens=64)
        inv = tmp_path / "hosts.yml"
        inv.write_text(fleet.inventory_yaml())
        log = tmp_path / "c.log"
        ctl = specfleet("sweep", str(lock), *args(fleet, inv, url, tmp_path), "--json",
                        log=log)
        assert ctl.wait(timeout=300) == 1
        out = log.read_text()
        assert "out of disk space" in out and "--attach" in out
        sid = sweep_id_from(log)
        stored = stored_events(url, sid, "node1")
        j = journal(fleet.nodes[0], sid)
        assert stored == j[:len(stored)]  # what was stored is intact
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        att = specfleet("sweep", "--attach", sid, *args(fleet, inv, url, tmp_path),
                        log=tmp_path / "a.log")
        assert att.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-3000:]
        whole = journal(fleet.nodes[0], sid)
        assert len(stored) < len(whole)  # the disk filled mid-sweep: the attach had work
        assert stored_events(url, sid, "node1") == whole
        assert "runs" in inspect(create_engine(url)).get_table_names()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_controller_disk_full_before_the_sweep_starts(fleet, model_pair, tmp_path):
    """Full before anything is dispatched: one clear line, no traceback, no node touched."""
    small = tmp_path / "tiny"
    small.mkdir()
    # too small for the migrated schema (which then rolls back as one transaction)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(small)], check=True)
    try:
        lock = make_lock(tmp_path, model_pair)
        inv = tmp_path / "hosts.yml"
        inv.write_text(fleet.inventory_yaml())
        jobs = fleet.nodes[0].home / ".specfleet" / "jobs"
        before = set(jobs.iterdir()) if jobs.exists() else set()
        p = specfleet("sweep", str(lock), *args(fleet, inv, f"sqlite:///{small / 's.db'}",
                                                 tmp_path), log=tmp_path / "c.log")
        assert p.wait(timeout=60) == 1
        out = (tmp_path / "c.log").read_text()
        assert "Traceback" not in out
        assert out.strip().splitlines()[-1].startswith(
            "Error: the store is out of disk space (database or disk is full); nothing "
            "stored so far is lost")
        assert "sweep" not in out.split("Error:")[0]  # no sweep was started
        assert (set(jobs.iterdir()) if jobs.exists() else set()) == before
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_controller_disk_full_before_any_agent_starts(fleet, model_pair, tmp_path):
    """The schema fits, the node's lease (or its placement) does not: once an "internal
    error … please report it", twice over (releasing the lease failed too); now the
    store's own line, and the next step is a new start (no agent ran: --attach has nothing
    to read)."""
    small = tmp_path / "lease"
    url = f"sqlite:///{small / 's.db'}"
    try:
        _schema_then(tmp_path, small, url, 64)
        inv = tmp_path / "hosts.yml"
        inv.write_text(fleet.inventory_yaml())
        jobs = fleet.nodes[0].home / ".specfleet" / "jobs"
        before = set(jobs.glob("*.events.jsonl"))
        p = specfleet("sweep", str(make_lock(tmp_path, model_pair)),
                      *args(fleet, inv, url, tmp_path), log=tmp_path / "c.log")
        assert p.wait(timeout=60) == 1
        out = (tmp_path / "c.log").read_text()
        assert "internal error" not in out and "Traceback" not in out, out
        assert ("node1 failed: the controller's store is out of disk space" in out
                and "start the sweep again (no agent was started on this node" in out), out
        assert set(jobs.glob("*.events.jsonl")) == before  # no agent ran: no journal
        # the space back, an --attach as the outcome line's first words suggest: it says
        # there is nothing to pick up (was "--limit selects none of the nodes … ran on ()")
        subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True)
        att = specfleet("sweep", "--attach", sweep_id_from(tmp_path / "c.log"),
                        *args(fleet, inv, url, tmp_path), log=tmp_path / "a.log")
        assert att.wait(timeout=60) == 1
        said = (tmp_path / "a.log").read_text()
        assert "never placed a job on a node: nothing was measured" in said, said
        assert "start the sweep again" in said and "Traceback" not in said
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_model_folder_without_weights_is_refused_at_lock_and_at_sweep(model_pair, tmp_path):
    """Once locked fine and then failed with a traceback, the sweep left `running`."""
    import shutil

    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.store import open_store

    pair = tmp_path / "pair"
    shutil.copytree(model_pair, pair)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("weights come later")
    plan = tmp_path / "plan.yml"
    from tests.locks import plan_text

    plan.write_text(plan_text(pair).replace(f"target: {pair / 'target'}", f"target: {empty}"))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    line = next(i for i, ln in enumerate(plan.read_text().splitlines(), 1) if "target:" in ln)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"{plan}:{line}: models.target: {empty} has no weights (*.safetensors) and " \
           "config.json; point it at an MLX model folder" in r.output
    # a lock made while the folder held the model, whose weights then went away
    lock = make_lock(tmp_path, pair, name="ok.yml")
    for f in (pair / "target").iterdir():
        f.unlink()
    url = f"sqlite:///{tmp_path / 's.db'}"
    inv = tmp_path / "local.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db", url,
                                  "--no-provision", "--failed-hosts-file",
                                  str(tmp_path / "retry")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "the lock no longer matches: target" in r.output and "Re-lock" in r.output
    store = open_store(url)  # refused before a sweep record was made: nothing left running
    assert store.latest_sweep_id() is None
