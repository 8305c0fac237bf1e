"""Every number carries its reliability: a run the store flags unreliable (a CV of 61%, a
throttled night) is shown and counted, but never feeds a headline speedup, a verdict, a
signal, a regression or a repro answer; the page says what was set aside and why."""

import random
from datetime import datetime, timedelta, timezone

from orchestrator.review.report import write_review
from orchestrator.review.repro import compare, sweep_values, verdict
from orchestrator.review.rules import load_rules
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.history import config_values as V
from tests.history import new_sweep, night, week_nights
from tests.store_templates import fresh_sqlite

W20 = datetime(2026, 5, 11, tzinfo=timezone.utc)
NOW = W20 + timedelta(days=6, hours=12)
CV = "decode tok/s CV 61% ≥ 10%: rerun with more repetitions or check the node for " \
     "background load"
COMMON = dict(node="mac-01", chip="Apple M2 Max", pair="llama-8b/llama-1b")


def test_a_config_whose_every_run_is_unreliable_feeds_no_headline(tmp_path):
    rng = random.Random(3)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    for at in week_nights(W20):
        sid = night(store, at, workload="code", **COMMON,
                    configs={("baseline", 0): V(400, rng=rng),
                             ("speculative", 2): V(440, acceptance=0.7, rng=rng)})
        # the same sweep's width-3 runs spread wildly: flagged by the agent's CV check
        night(store, at, workload="code", **COMMON, sweep_id=sid, unreliable=CV,
              configs={("speculative", 3): V(492, acceptance=0.8, rng=rng)})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    (s,) = a["series"]
    k3 = next(c for c in s["configs"] if c["k"] == 3)
    assert k3["set_aside"] and k3["speedup"] is None
    assert k3["classification"] == "set aside: every run unreliable"
    assert k3["unreliable"] == 7 and k3["runs"] == 7 and CV in k3["unreliable_reasons"]
    # the headline is the reliable width 2 (1.10×), not the unreliable 1.23×
    assert s["metrics"]["best_k"] == 2 and abs(s["metrics"]["best_speedup"] - 1.1) < 0.03
    assert 3 not in s["speedup_by_k"]
    assert s["set_aside"] == [{"config": "speculative k=3", "runs": 7, "of": 7,
                               "reasons": [CV]}]
    assert a["counts"]["set_aside_runs"] == 7
    html = write_review(store, tmp_path / "weekly.html", week="2026-W20", now=NOW,
                        formats=("html", "md"))
    text = dump_dom(html["html"])
    assert "7 of 7 runs (" + CV in text and "Set aside as unreliable" in text
    assert "(7 set aside as unreliable)" in text
    assert "1.23×" not in text and "1.23" not in html["md"].read_text()


def test_unreliable_runs_beside_reliable_ones_are_counted_not_averaged(tmp_path):
    rng = random.Random(4)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    nights = week_nights(W20)
    for i, at in enumerate(nights):
        bad = i in (2, 5)  # two nights on a busy machine measured a 3× "speedup"
        night(store, at, workload="code", **COMMON, unreliable=CV if bad else None,
              configs={("baseline", 0): V(400, rng=rng),
                       ("speculative", 3): V(1200 if bad else 440, acceptance=0.7, rng=rng)})
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    k3 = next(c for c in s["configs"] if c["k"] == 3)
    assert not k3["set_aside"] and k3["runs"] == 7 and k3["unreliable"] == 2
    assert abs(k3["speedup"] - 1.1) < 0.03 and abs(s["metrics"]["best_speedup"] - 1.1) < 0.03
    assert {x["config"]: x["runs"] for x in s["set_aside"]} == {"baseline": 2,
                                                                  "speculative k=3": 2}


def test_repro_never_calls_unreliable_runs_reproducible(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    at = W20 + timedelta(hours=2)
    sid = new_sweep(store, at)
    rng = random.Random(5)
    for node in ("mac-01", "mac-02"):
        night(store, at, workload="code", node=node, chip="Apple M2 Max",
              pair="llama-8b/llama-1b", sweep_id=sid,
              configs={("baseline", 0): V(400, rng=rng),
                       ("speculative", 3): V(440, acceptance=0.7, rng=rng)})
    per_node, idents, set_aside = sweep_values(store, sid)
    report = {**compare(per_node, idents), "set_aside": set_aside, "not_ok": []}
    assert verdict(report) == "reproducible" and report["checked"] == 5
    # the same two nodes, but one of them ran contended: agreement proves nothing there
    sid = new_sweep(store, at)
    night(store, at, workload="code", node="mac-01", chip="Apple M2 Max",
          pair="llama-8b/llama-1b", sweep_id=sid,
          configs={("baseline", 0): V(400, rng=rng), ("speculative", 3): V(440, rng=rng)})
    night(store, at, workload="code", node="mac-02", chip="Apple M2 Max",
          pair="llama-8b/llama-1b", sweep_id=sid, unreliable=CV,
          configs={("baseline", 0): V(400, rng=rng), ("speculative", 3): V(440, rng=rng)})
    per_node, idents, set_aside = sweep_values(store, sid)
    assert "mac-02" not in per_node
    assert [(x["node"], x["config"]) for x in set_aside] == [
        ("mac-02", "code baseline"), ("mac-02", "code speculative k=3")]
    report = {**compare(per_node, idents), "set_aside": set_aside, "not_ok": []}
    assert verdict(report) == ("inconclusive: 2 runs set aside as unreliable (rerun on quiet "
                               "nodes)")


def test_the_sweep_page_concludes_only_from_reliable_trials(model_pair, tmp_path):
    """A real sweep on this machine, then the node's flags as a contended Mac would send
    them: width 3's repetitions spread (CV), and one width-2 trial ran throttled."""
    import json

    from orchestrator.review.sweep_page import render_review
    from orchestrator.sweep.jobspec import build_job
    from tests.test_agent import run_agent

    job = build_job(model_pair, ["code"], max_tokens=24)
    job["workloads"], job["knobs"], job["repetitions"] = job["workloads"][:1], {
        "num_draft_tokens": [2, 3]}, 2
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 0, proc.stderr
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    throttled = None
    for e in ev:
        e["unreliable"] = False if "unreliable" in e else None
        if e["type"] == "config_summary":
            e["unreliable_reasons"] = [CV] if e["num_draft_tokens"] == 3 else []
            e["unreliable"] = e["num_draft_tokens"] == 3
        if e["type"] == "generation":
            e["unreliable_reasons"] = []
            if e["num_draft_tokens"] == 2 and e["repetition"] == 0:
                e["unreliable"], e["unreliable_reasons"] = True, ["thermal throttling"]
                e["decode_tok_s"], throttled = 9999.0, e
        if e.get("unreliable") is None:
            e.pop("unreliable", None)
    assert throttled is not None
    kept = next(e for e in ev if e["type"] == "generation" and e["num_draft_tokens"] == 2
                and e["repetition"] == 1 and e["mode"] == "speculative")
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    sid = new_sweep(store, datetime.now(timezone.utc))
    store.ingest(sid, "local", ev)
    text = dump_dom(render_review(store, tmp_path / "review.html", sid))
    assert "set aside, no speedup: " + CV in text
    assert "draft width 3 at" not in text  # never the headline, whatever its speed
    # width 2's median is its one sound trial, not the throttled 9999 tok/s
    assert f"{kept['decode_tok_s']:.1f}" in text and "9999.0" not in text
    assert "1/2: thermal throttling" in text
    assert "1 speculative row set aside as unreliable." in text
