"""A busy desktop as a profile: a bounded co-tenant load beside the measurement, named in
every run's identity, compared with the idle node, and always gone when the agent is."""

import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.fleet.inventory import load_inventory
from orchestrator.review.report import write_review
from orchestrator.review.rules import load_rules
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from orchestrator.store.models import Event, Run
from orchestrator.sweep.dispatch import SweepOptions, start_sweep
from orchestrator.sweep.lock import load_lock, write_lock
from orchestrator.sweep.plan import load_plan
from tests.browser import dump_dom
from tests.controller import kill_agent, specfleet, sweep_id_from, wait_for
from tests.locks import plan_text

ROOT = Path(__file__).resolve().parents[1]
LOOSE = "  cv_threshold: 1.0\n  contention_threshold: 1.0"


def _cotenants(user: str | None = None) -> list[str]:
    args = ["pgrep", "-f", "agent/cotenant.py"] + (["-u", user] if user else [])
    return subprocess.run(args, capture_output=True, text=True).stdout.split()


def _busy_sweep(fleet, model_pair, tmp_path, *, disk=False, **plan):
    """A sweep with a co-tenant load on the fleet's first node, started as users start one,
    once its load and CPU worker run; returns (process, inventory, store url, log)."""
    node = fleet.nodes[0]
    path = tmp_path / "plan.yml"
    path.write_text(plan_text(model_pair, **plan, extra=LOOSE + "\nbackground:\n  memory_mb:"
                              " 64\n  cpu_workers: 1" + ("\n  disk_mb_s: 2" if disk else "")))
    lock = write_lock(load_plan(path), lambda m: None)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    url = f"sqlite:///{tmp_path / 's.db'}"
    log = tmp_path / "c.log"
    p = specfleet("sweep", str(lock), "--limit", node.name, "-i", str(inv), "--known-hosts",
                  str(fleet.known_hosts), "--db", url, log=log)
    try:
        sweep_id_from(log)
        wait_for(lambda: len(_cotenants(node.user)) >= 2, timeout=60,
                 what="the co-tenant and its CPU worker")
    except BaseException:
        p.kill()
        p.wait()
        raise
    return p, inv, url, log


def test_a_bad_profile_is_refused_at_lock_with_its_line(model_pair, tmp_path):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, extra=LOOSE + "\nbackground:\n  memory_mb: -1"))
    with pytest.raises(ConfigError) as e:
        write_lock(load_plan(plan), lambda m: None)
    assert "background.memory_mb: an integer from 0 to 262144, got -1" in str(e.value)
    assert e.value.line == plan.read_text().splitlines().index("background:") + 1


@pytest.mark.alone  # idle must be idle: other tests' load would make both runs busy
def test_busy_runs_are_their_own_series_compared_with_idle_and_the_load_ends(model_pair,
                                                                            tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml").hosts]
    for name, extra in (("idle.yml", ""),
                        ("busy.yml", "\nbackground:\n  memory_mb: 256\n  cpu_workers: 1")):
        plan = tmp_path / name
        plan.write_text(plan_text(model_pair, max_tokens=24, repetitions=2, extra=LOOSE + extra))
        doc = load_lock(write_lock(load_plan(plan), lambda m: None))
        assert start_sweep(doc, hosts, store, opts=SweepOptions(provision=False)).ok
    assert not _cotenants(), "the co-tenant outlived its job"
    with store.engine.connect() as c:
        labels = set(c.execute(select(Run.background)).scalars())
        started = c.execute(select(Event.payload).where(
            Event.type == "background_started")).scalar_one()
    assert labels == {None, "busy: 256 MB + 1 CPU"}
    assert started["profile"] == {"memory_mb": 256, "cpu_workers": 1}
    a = analyse(store, None, load_rules(), change_points_too=False, regressions_too=False)
    assert sorted(s["series"]["engine"] for s in a["series"]) == [
        "mlx-lm", "mlx-lm · busy: 256 MB + 1 CPU"]
    (g,) = a["busy_vs_idle"]
    assert g["profile"] == "busy: 256 MB + 1 CPU"
    assert [r["config"] for r in g["rows"]][0] == "baseline"
    assert all(r["itl_p99_idle"] and r["itl_p99_busy"] for r in g["rows"])
    dom = dump_dom(Path(write_review(store, tmp_path / "review.html")["html"]))
    assert '<table id="busy-vs-idle">' in dom and "busy: 256 MB + 1 CPU" in dom


def test_the_load_is_gone_after_kill_9_of_the_agent_on_an_sshd_node(fleet, model_pair,
                                                                    tmp_path):
    node = fleet.nodes[0]
    p, inv, _, _ = _busy_sweep(fleet, model_pair, tmp_path, widths=(2, 3), max_tokens=96,
                               repetitions=6, disk=True)
    try:
        kill_agent(node)  # kill -9: no cleanup code runs in the agent
        deadline = time.monotonic() + 5
        while _cotenants(node.user) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _cotenants(node.user), "the co-tenant outlived a killed agent"
    finally:
        p.kill()
        p.wait()
    r = CliRunner().invoke(main, ["inventory", "list", "-i", str(inv)])
    assert r.exit_code == 0


@pytest.mark.alone  # a held agent's load must end within 10 s: other tests' load blurs that
def test_a_held_agent_ends_its_load_and_later_runs_are_not_labelled_busy(fleet, model_pair,
                                                                         tmp_path):
    """SIGSTOP the agent: its co-tenant ends within 10 s (it watches the agent's state, not
    only its existence); once the agent goes on, every run it measures is set aside as
    measured beside no load, never stored as a reliable busy run."""
    from orchestrator.store.models import Measurement
    from tests.controller import signal_agents

    node = fleet.nodes[0]
    p, _, url, log = _busy_sweep(fleet, model_pair, tmp_path, widths=(2,), max_tokens=24,
                                 repetitions=4)
    try:
        assert signal_agents(node, signal.SIGSTOP), "no agent to hold"
        held = time.monotonic()
        while _cotenants(node.user) and time.monotonic() - held < 15:
            time.sleep(0.2)
        gone_after = time.monotonic() - held
        signal_agents(node, signal.SIGCONT)
        assert not _cotenants(node.user), "the co-tenant outlived its held agent"
        assert gone_after <= 10, gone_after
        assert p.wait(300) == 0, log.read_text()[-3000:]
    finally:
        p.kill()
        p.wait()
    store = open_store(url)
    with store.engine.connect() as c:
        rows = c.execute(select(Measurement.unreliable,
                                Measurement.unreliable_reasons)).all()
    ended = [r for r in rows if any(x.startswith("co-tenant load ended")
                                    for x in r.unreliable_reasons or [])]
    assert ended, rows  # the runs after the hold
    assert all(r.unreliable for r in ended)
    assert "co-tenant load ended" in log.read_text() or ended


def test_a_load_that_cannot_start_sets_every_run_aside(model_pair, tmp_path):
    """memory_mb above what the node has: the co-tenant dies at once; the runs say so and
    are set aside, not labelled busy."""
    from orchestrator.store.models import Measurement

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml").hosts]
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=(2,), max_tokens=16, repetitions=2,
                              extra=LOOSE + "\nbackground:\n  memory_mb: 262144"))
    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    start_sweep(doc, hosts, store, opts=SweepOptions(provision=False))
    with store.engine.connect() as c:
        rows = c.execute(select(Measurement.unreliable, Measurement.unreliable_reasons)).all()
        notices = [e["message"] for e in c.execute(select(Event.payload).where(
            Event.type == "notice")).scalars()]
    assert rows and all(r.unreliable for r in rows), rows
    # a run measured while it was still dying finds it short of its memory; after, ended
    assert all(any(x.startswith(("co-tenant load ended (exit status", "co-tenant load short"))
                   for x in r.unreliable_reasons) for r in rows), rows
    assert any(x.startswith("co-tenant load ended") for x in rows[-1].unreliable_reasons)
    assert sum(m.startswith("co-tenant load ended") for m in notices) == 1, notices


def test_a_disk_load_that_fails_ends_the_cotenant(tmp_path, monkeypatch):
    """F7: the disk load's thread dies (its scratch folder removed under it) while the
    co-tenant would live on: the co-tenant ends, and shortfall says so, so the runs after it
    are not stored as reliable busy runs."""
    import shutil

    from agent.cotenant import CoTenant
    from agent.journal import Journal

    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_root))  # where the co-tenant's scratch goes
    with CoTenant({"disk_mb_s": 1}, Journal(tmp_path / "j.jsonl", echo=None)) as ct:
        wait_for(lambda: any(scratch_root.glob("specfleet-cotenant-*/io.bin")), 20,
                 "the disk load's scratch file")
        assert ct.shortfall() == []  # running as declared
        for d in scratch_root.glob("specfleet-cotenant-*"):
            shutil.rmtree(d)
        wait_for(lambda: ct.shortfall() != [], 10, "the co-tenant to end")
        assert ct.shortfall() == ["co-tenant load ended (exit status 3: a load thread "
                                  "failed): this run measured an idle node, not the "
                                  "declared load"]
    lines = (tmp_path / "j.jsonl").read_text()
    assert "a load thread failed" in lines  # the journal says it once, as a notice
