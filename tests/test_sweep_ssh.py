"""The controller drives real agents on real sshd nodes; one node is unreachable."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement, NodeOutcome, Run, TelemetrySample
from tests.controller import journal as _node_journal  # a node's journal, as the agent wrote it
from tests.locks import make_lock

SWEEP_ARGS = ["--no-provision"]


@pytest.fixture(scope="module")
def ssh_sweep(fleet, model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    inv = d / "hosts.yml"
    inv.write_text(fleet.inventory_yaml(extra_hosts={
        "ghost": {"ansible_host": "127.0.1.99", "ansible_port": 9, "ansible_user": "nobody"}}))
    db = f"sqlite:///{d / 'store.db'}"
    failed = d / "failed.txt"
    # about transport and outcomes: a busy machine's runs still count (else "unreliable")
    lock = make_lock(d, model_pair, use=("code", "memo"), widths=(2, 4), max_tokens=48,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    result = CliRunner().invoke(main, [
        "sweep", str(lock), "-i", str(inv), "--known-hosts",
        str(fleet.known_hosts), "--db", db, "--failed-hosts-file", str(failed), "--json",
        *SWEEP_ARGS])
    return result, db, failed, inv


def test_unreachable_node_is_named_and_others_are_kept(ssh_sweep, fleet):
    result, db, failed, _ = ssh_sweep
    assert result.exit_code == 1, result.output
    out = json.loads(result.stdout)
    by_host = {o["host"]: o for o in out["outcomes"]}
    assert by_host["ghost"]["status"] == "unreachable"
    assert "127.0.1.99:9" in by_host["ghost"]["detail"]
    assert by_host["node1"]["status"] == by_host["node2"]["status"] == "ok"
    assert out["status"] == "partial"
    assert failed.read_text() == "ghost\n"
    store = open_store(db)
    with store.engine.connect() as c:
        per_node = dict(c.execute(select(Measurement.node, func.count())
                                  .group_by(Measurement.node)).all())
        configs = dict(c.execute(select(Run.node, func.count()).group_by(Run.node)).all())
        samples = c.scalar(select(func.count()).select_from(TelemetrySample))
        ident = c.execute(select(Run.mlx_lm_version, Run.target_fingerprint)).first()
        outcomes = dict(c.execute(select(NodeOutcome.node, NodeOutcome.status)).all())
    assert per_node == {"node1": 8, "node2": 8}  # 2 workloads × 2 widths × (baseline, spec)
    assert configs == {"node1": 6, "node2": 6}  # per workload: baseline + 2 widths
    assert samples >= 2 * 8 * 2  # every generation brought its telemetry window (≥2 readings)
    assert ident[0] == "0.32.2" and ident[1].startswith("sha256:")
    assert outcomes == {"node1": "ok", "node2": "ok", "ghost": "unreachable"}


def test_store_holds_exactly_the_node_journals(ssh_sweep, fleet):
    result, db, _, _ = ssh_sweep
    sweep_id = json.loads(result.stdout)["sweep_id"]
    store = open_store(db)
    for node in fleet.nodes:
        journal = _node_journal(node, sweep_id)
        with store.engine.connect() as c:
            stored = list(c.execute(select(Event.payload).where(Event.node == node.name)
                                    .order_by(Event.seq)).scalars())
        assert stored == journal
        assert journal[-1]["type"] == "job_finished"
        gens = [e for e in journal if e["type"] == "generation"]
        assert all(g["exact_match"] for g in gens if g["mode"] == "speculative")


def test_agent_runs_as_the_node_user(ssh_sweep, fleet):
    result, *_ = ssh_sweep
    sweep_id = json.loads(result.stdout)["sweep_id"]
    for node in fleet.nodes:
        started = _node_journal(node, sweep_id)[0]
        assert started["type"] == "job_started"
        job = node.home / ".specfleet" / "jobs" / f"{sweep_id}.json"
        assert Path(job).stat().st_uid != 0
        # weights were pushed into the node's own content-addressed folder
        models = json.loads(job.read_text())["models"]
        assert models["target"]["path"].startswith(str(node.home))


def test_unknown_host_key_is_unreachable_not_trusted(fleet, model_pair, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    empty_known = tmp_path / "known_hosts"
    empty_known.write_text("")
    lock = make_lock(tmp_path, model_pair)
    result = CliRunner().invoke(main, [
        "sweep", str(lock), "-i", str(inv), "--limit", "node1",
        "--known-hosts", str(empty_known), "--db", f"sqlite:///{tmp_path / 's.db'}",
        "--failed-hosts-file", str(tmp_path / "retry"), *SWEEP_ARGS])
    assert result.exit_code == 1
    assert "node1" in result.output and "unreachable" in result.output
    assert "host key not verifiable" in result.output


def test_sweep_into_postgresql(fleet, model_pair, tmp_path, pg_url):
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    lock = make_lock(tmp_path, model_pair, widths=(3,))
    args = ["sweep", str(lock), "-i", str(inv), "--limit", "node2", "--no-provision",
            "--known-hosts", str(fleet.known_hosts), "--db", pg_url, "--json",
            "--failed-hosts-file", str(tmp_path / "retry")]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    sweep_id = json.loads(first.stdout)["sweep_id"]
    store = open_store(pg_url)
    journal = _node_journal(fleet.nodes[1], sweep_id)
    # ingesting the node's journal again (a reconnecting controller) adds nothing
    assert store.ingest(sweep_id, "node2", journal) == 0
    with store.engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(Event)
                        .where(Event.sweep_id == sweep_id)) == len(journal)
        assert c.scalar(select(func.count()).select_from(Measurement)) == 2


def test_a_plan_can_soak_instead_of_sweep(fleet, model_pair, tmp_path):
    """`soak:` in a plan: the node decodes back to back for the duration, the controller
    shows throttled progress and the verdict, and the sweep's review has a Soak table."""
    from orchestrator.review.sweep_page import render_review
    from tests.browser import dump_dom

    lock = make_lock(tmp_path, model_pair, max_tokens=32, extra="\n".join([
        "soak:", "  duration_s: 4", "  num_draft_tokens: 2", "  workload: code"]))
    assert json.loads(lock.read_text())["job"]["mode"] == "soak"
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(main, [
        "sweep", str(lock), "-i", str(inv), "--limit", "node1", "--known-hosts",
        str(fleet.known_hosts), "--db", url, "--no-provision",
        "--failed-hosts-file", str(tmp_path / "retry"), "--json"])
    assert r.exit_code == 0, r.output
    sid = json.loads(r.stdout)["sweep_id"]
    # the first sample's elapsed seconds: 0 on a quiet host, more on a busy one
    assert re.search(r"\[node1\] soak +\d+s #1 ", r.stderr) and "[node1] soak pass: " in r.stderr
    store = open_store(url)
    with store.engine.connect() as c:
        kinds = [k for (k,) in c.execute(select(Event.type).where(Event.sweep_id == sid))]
    assert kinds.count("soak_sample") >= 3 and kinds.count("soak_result") == 1
    assert "generation" not in kinds
    dom = dump_dom(render_review(store, tmp_path / "review.html", sid))
    assert 'id="soak"' in dom and '<tr data-node="node1"><td>node1</td><td class="good">pass' in dom
