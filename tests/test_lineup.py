"""Draft lineups: one target, several drafts and draft tiers, locked, swept in one job with
each pair beside its own baseline, stored per pair, and walked as the fallback ladder."""

from __future__ import annotations

import json
import shutil
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
from orchestrator.store.models import Event, Measurement, Run
from orchestrator.sweep.dispatch import SweepOptions, start_sweep
from orchestrator.sweep.lock import load_lock, write_lock
from orchestrator.sweep.plan import load_plan
from orchestrator.tiers import quantize
from tests.browser import dump_dom
from tests.locks import plan_text
from tests.store_templates import fresh_sqlite

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiers(model_pair, tmp_path_factory) -> Path:
    """The demo pair plus the draft's 4-bit tier, made with mlx_lm.convert."""
    d = tmp_path_factory.mktemp("lineup")
    shutil.copytree(model_pair, d / "pair")
    quantize(d / "pair" / "draft", d / "pair" / "draft-4bit", 4)
    return d / "pair"


def _lineup_plan(folder: Path, pair: Path, drafts: list[str], **kw) -> Path:
    text = plan_text(pair, **kw).replace(
        f"  draft: {pair / 'draft'}", "  draft: [" + ", ".join(str(pair / d) for d in drafts)
        + "]")
    plan = folder / "plan.yml"
    plan.write_text(text)
    return plan


def test_a_lineup_locks_every_pair_and_refuses_a_foreign_draft_with_its_line(tiers, tmp_path):
    plan = _lineup_plan(tmp_path, tiers, ["draft", "draft-4bit"])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["lineup"] == [["target", "draft"], ["target", "draft-2"]]
    lock = json.loads((tmp_path / "plan.lock.json").read_text())
    assert lock["models"]["draft-2"]["tier"]["tier"] == "4-bit g64"
    assert lock["models"]["draft-2"]["path"] == str(tiers / "draft-4bit")
    assert lock["job"]["lineup"] == [["target", "draft"], ["target", "draft-2"]]
    # the lock names every folder: editing the 4-bit tier's weights is caught like any other
    (tiers / "draft-4bit" / "config.json").write_text(
        (tiers / "draft-4bit" / "config.json").read_text() + " ")
    try:
        r = CliRunner().invoke(main, ["plan", "check", str(tmp_path / "plan.lock.json")])
        assert r.exit_code == 1 and "draft-2 weights changed: config.json" in r.output
    finally:
        (tiers / "draft-4bit" / "config.json").write_text(
            (tiers / "draft-4bit" / "config.json").read_text()[:-1])
    # one draft of the list has another vocabulary: refused at lock, with the plan's line
    foreign = tmp_path / "foreign"
    shutil.copytree(tiers / "draft", foreign)
    tok = json.loads((foreign / "tokenizer.json").read_text())
    tok["model"]["vocab"]["zzz-new"] = len(tok["model"]["vocab"])
    (foreign / "tokenizer.json").write_text(json.dumps(tok))
    plan = _lineup_plan(tmp_path, tiers, ["draft", str(foreign)])
    with pytest.raises(ConfigError) as e:
        load_plan(plan)
    line = next(i for i, x in enumerate(plan.read_text().splitlines(), 1) if "draft:" in x)
    assert e.value.line == line and f"models.draft: {foreign} does not share" in str(e.value)
    assert "1 token(s) only in the draft: 'zzz-new'" in str(e.value)
    # a folder listed twice, and a lineup with an http engine, are refused too
    plan = _lineup_plan(tmp_path, tiers, ["draft", "draft"])
    with pytest.raises(ConfigError, match="is listed twice"):
        load_plan(plan)


def test_a_lineup_sweep_measures_each_pair_beside_its_own_baseline_and_walks_the_ladder(
        tiers, tmp_path, default_blas):  # the ladder weighs each tier's measured speed
    plan = _lineup_plan(tmp_path, tiers, ["draft", "draft-4bit"], widths=(2, 3),
                        max_tokens=24, quality=True,
                        extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    store = open_store(fresh_sqlite(tmp_path / 'lineup.db'))
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml").hosts]
    result = start_sweep(doc, hosts, store, opts=SweepOptions(provision=False))
    assert result.status == "ok", result.outcomes
    with store.engine.connect() as c:
        runs = c.execute(select(Run.pair, Run.mode, Run.num_draft_tokens, Run.draft_quant,
                                Run.model_pair, Run.trials)).all()
        gens = c.execute(select(Measurement.run_index, Measurement.pair, Measurement.mode,
                                Measurement.peak_mlx_memory_bytes)
                         .order_by(Measurement.run_index)).all()
        env = c.execute(select(Event.payload).where(Event.type == "environment_checked")
                        ).scalar_one()
    assert env["quantization"] == {"target": "unquantised", "draft": "unquantised",
                                   "draft-2": "4-bit g64"}
    # every pair has its own baseline and candidates; never pooled across pairs
    assert sorted((r.pair, r.mode, r.num_draft_tokens, r.draft_quant) for r in runs) == [
        ("target+draft", "baseline", 0, "unquantised"),
        ("target+draft", "speculative", 2, "unquantised"),
        ("target+draft", "speculative", 3, "unquantised"),
        ("target+draft-2", "baseline", 0, "4-bit g64"),
        ("target+draft-2", "speculative", 2, "4-bit g64"),
        ("target+draft-2", "speculative", 3, "4-bit g64")]
    assert {r.model_pair for r in runs} == {"pair/target / pair/draft", "pair/target / draft-4bit"}
    # interleaved: each candidate right after a baseline measured for the same pair
    for a, b in zip(gens[::2], gens[1::2]):
        assert (a.mode, b.mode) == ("baseline", "speculative") and a.pair == b.pair
    assert [g.pair for g in gens[1::2]][:2] == ["target+draft", "target+draft-2"]
    # a pair's memory is its own: the lighter tier's candidates peak lower
    peak = {p: max(g.peak_mlx_memory_bytes for g in gens if g.pair == p and
                   g.mode == "speculative") for p in ("target+draft", "target+draft-2")}
    assert peak["target+draft-2"] < peak["target+draft"] - 1_000_000
    a = analyse(store, None, load_rules(), change_points_too=False, regressions_too=False)
    assert sorted(s["series"]["model_pair"] for s in a["series"]) == [
        "pair/target / draft-4bit", "pair/target / pair/draft"]
    (ladder,) = a["ladders"]
    assert [(r["step"], r["draft_tier"], r["k"]) for r in ladder["rungs"]][:2] == [
        (0, "unquantised", 3), (1, "unquantised", 2)]
    assert [(r["step"], r["draft_tier"]) for r in ladder["rungs"]][2:] == [
        (2, "4-bit g64"), (3, None)]
    assert ladder["rungs"][2]["memory_saved"] > 1_000_000
    assert ladder["rungs"][ladder["stop"]]["passes"]
    assert ladder["provisional"] and ladder["text"].startswith("provisional")
    for s in a["series"]:
        assert s["verdict"]["ladder"]["step"] == ladder["rungs"][ladder["stop"]]["step"]
        assert "ladder: step" in s["verdict"]["text"]
    html = write_review(store, tmp_path / "review.html")["html"]
    dom = dump_dom(Path(html))
    assert dom.count('<table class="ladder"') == 1
    assert dom.count("<tr data-step=") == len(ladder["rungs"])
    assert "4-bit g64" in dom and "← stop" in dom


def test_the_ladder_stops_at_the_lighter_tier_that_passes_and_the_policy_names_it(tmp_path):
    """Planted week: the 16-bit draft fails its gates at width 4 and at width 3 (too slow:
    its own weight), the 4-bit tier passes at width 3 with less memory. The walk stops at
    step 2, the heavy series' graded fallback names the measured tier, the policy carries
    it; a target measured with one draft has no ladder."""
    import random

    from orchestrator.review.verdict import policy
    from tests.history import config_values as V
    from tests.history import night, week_nights
    from tests.test_weekly_review import NOW, W20

    rng = random.Random(3)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    common = dict(node="mac-01", chip="Apple M4", workload="code")
    for at in week_nights(W20, 4):
        sid = night(store, at, **common, pair="t / draft", lineup="target+draft", identity={
            "draft_quant": "unquantised", "draft_fingerprint": "sha256:" + "a" * 64},
            configs={("baseline", 0): V(100.0, mem=2.0e9, rng=rng),
                     ("speculative", 3): V(110.0, acceptance=0.7, mem=2.6e9, rng=rng),
                     ("speculative", 4): V(112.0, acceptance=0.6, mem=2.6e9, rng=rng)})
        night(store, at, **common, pair="t / draft-4bit", sweep_id=sid, lineup="target+draft-2",
              identity={
            "draft_quant": "4-bit g64", "draft_fingerprint": "sha256:" + "b" * 64},
            configs={("baseline", 0): V(100.0, mem=2.0e9, rng=rng),
                     ("speculative", 3): V(130.0, acceptance=0.65, mem=2.2e9, rng=rng)})
        night(store, at, node="mac-01", chip="Apple M4", workload="memo", pair="t / draft",
              sweep_id=sid, configs={("baseline", 0): V(100.0, rng=rng),
                                     ("speculative", 3): V(130.0, acceptance=0.7, rng=rng)})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    (ladder,) = a["ladders"]  # the memo target was measured with one draft: no ladder
    assert ladder["workload"] == "code" and not ladder["provisional"]
    assert [(r["step"], r["draft_tier"], r["k"], r["passes"]) for r in ladder["rungs"]] == [
        (0, "unquantised", 4, False), (1, "unquantised", 3, False), (2, "4-bit g64", 3, True),
        (3, None, None, True)]
    stop = ladder["rungs"][ladder["stop"]]
    assert stop["step"] == 2 and stop["memory_saved"] == pytest.approx(0.4e9)
    assert "speedup" in ladder["rungs"][0]["failed_gates"]
    heavy = next(s for s in a["series"] if s["series"]["model_pair"] == "t / draft")
    assert heavy["verdict"]["decision"] == "graded fallback"
    assert heavy["verdict"]["text"] == (
        "graded fallback, measured: ladder step 2 (lighter draft tier): 4-bit g64 draft at "
        f"width 3 passes every gate ({stop['speedup']:.2f}×), 400.0 MB less peak memory")
    light = next(s for s in a["series"] if s["series"]["model_pair"] == "t / draft-4bit")
    assert light["verdict"]["decision"] == "production candidate"
    assert light["verdict"]["text"].endswith("· ladder: step 2 (lighter draft tier)")
    entry = next(p for p in policy(a)["series"] if p["model_pair"] == "t / draft")
    step2 = next(x for x in entry["fallback"]["ladder"] if x["step"] == 2)
    assert step2["to"] == {"model_pair": "t / draft-4bit", "draft_tier": "4-bit g64",
                           "num_draft_tokens": 3}


def test_a_draft_free_method_takes_its_place_in_the_lineup(model_pair, tmp_path):
    """An http runtime's prompt-lookup variant (mlx-serve's per-request field) is a pair of
    its own: no draft weights in its identity, its own baseline beside it, a rung of the
    ladder below every draft tier."""
    from tests.test_http_sweep import _tool_runtime

    servers = [_tool_runtime(drop_short=False) for _ in range(3)]
    (_, plain, _), (_, draft, _), (_, pld, seen_pld) = servers
    engine = "\n".join([
        "engine:", "  type: http", "  api: chat", "  runtime: mlx-serve", "  variants:",
        f"    - {{name: plain, base_url: '{plain}'}}",
        f"    - {{name: draft, speculative: true, num_draft_tokens: 3, base_url: '{draft}'}}",
        f"    - {{name: pld, speculative: true, method: prompt-lookup, base_url: '{pld}',"
        " fields: {enable_pld: true}}"])
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=None, max_tokens=8,
                              extra="  cv_threshold: 1.0\n  contention_threshold: 1.0\n"
                              + engine))
    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    store = open_store(fresh_sqlite(tmp_path / 'free.db'))
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(ROOT / "orchestrator" / "inventory" / "local.yml").hosts]
    try:
        result = start_sweep(doc, hosts, store, opts=SweepOptions(provision=False))
    finally:
        for srv, _, _ in servers:
            srv.shutdown()
    assert result.status == "ok", result.outcomes
    assert all(r.get("enable_pld") is True for r in seen_pld) and seen_pld
    with store.engine.connect() as c:
        runs = c.execute(select(Run.pair, Run.mode, Run.model_pair, Run.draft_fingerprint,
                                Run.draft_quant)).all()
    free = sorted((r.mode, r.draft_fingerprint, r.draft_quant) for r in runs
                  if r.pair == "target+prompt-lookup")
    assert free == [("baseline", None, "no draft: prompt-lookup"),
                    ("speculative", None, "no draft: prompt-lookup")]
    assert {r.model_pair for r in runs if r.pair} == {"models/target / prompt-lookup"}
    assert all(r.draft_fingerprint == doc["models"]["draft"]["fingerprint"] for r in runs
               if r.pair is None)
    a = analyse(store, None, load_rules(), change_points_too=False, regressions_too=False)
    assert len(a["series"]) == 2
    (ladder,) = a["ladders"]
    assert [(r["step"], r["action"]) for r in ladder["rungs"]] == [
        (0, "current width"), (2, "draft-free method"), (3, "autoregressive only")]
    assert ladder["rungs"][1]["model_pair"] == "models/target / prompt-lookup"


def test_progress_names_each_pair_and_a_targets_own_quality_baseline():
    """The live progress line of a lineup's quality events: the pair, or the target alone
    for its baseline (stored as "target+None", never shown so)."""
    import io

    from orchestrator.sweep.dispatch import StderrProgress

    out = io.StringIO()
    progress = StderrProgress(out)
    for models, mode, k in (({"target": "target"}, "baseline", 0),
                            ({"target": "target", "draft": "draft-2"}, "speculative", 3)):
        progress("local", {"type": "quality", "mode": mode, "num_draft_tokens": k,
                           "models": models, "passed": 1, "tasks": 6})
    assert out.getvalue().splitlines() == [
        "[local] quality baseline k=0 target alone: 1/6 tasks passed",
        "[local] quality speculative k=3 target+draft-2: 1/6 tasks passed"]
