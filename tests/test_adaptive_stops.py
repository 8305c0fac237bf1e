"""The adaptive sweep's stops as the pages show them (planted notices, as the agent journals
them): which config stopped, after how many of the plan's repetitions, and why; a stop on
the winner ("settled as the best") marked as such, on the sweep page and the weekly review."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.adaptive_stops import adaptive_stops, pair_words, what_words
from orchestrator.review.report import write_review
from orchestrator.review.sweep_page import render_review
from orchestrator.store import open_store
from tests.history import config_values, ingest_lines, lock_doc, night
from tests.store_templates import fresh_sqlite

WEEK = "2026-W10"
MONDAY = datetime(2026, 3, 2, tzinfo=timezone.utc)
CAL = {"target": {"fingerprint": "sha256:" + "c" * 64, "calibration": {
    "expected_acceptance": 1.0, "construction": {"layers": 16, "noise_scale": 0.0},
    "draft_fingerprint": "sha256:" + "d" * 64}}, "draft": {"fingerprint": "sha256:" + "d" * 64}}
SLOWER = ("adaptive: num_draft_tokens=2 stops repeating: slower than the best with 90% "
          "confidence after 5 paired repetitions (median 0.712x the best's)")
BEST = ("adaptive: num_draft_tokens=4 stops repeating: settled as the best: faster than its "
        "baseline beyond the tolerance with 90% confidence after 5 repetitions, every other "
        "candidate slower")


def _notice(message: str, repetitions: int) -> dict:
    return {"type": "notice", "message": message, "variant": "target+draft",
            "workload": "code", "adaptive": True, "repetitions": repetitions}


def _store(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    lock = lock_doc("demo-calibration", CAL) | {"job": {"repetitions": 6}}
    sid = night(store, MONDAY + timedelta(hours=1), node="local", chip="Apple M2",
                workload="code", pair="grown-16 (calibration) / draft",
                identity={"target_fingerprint": CAL["target"]["fingerprint"]}, lock=lock,
                configs={("baseline", 0): config_values(30.0),
                         ("speculative", 2): config_values(45.0, acceptance=1.0),
                         ("speculative", 4): config_values(66.0, acceptance=1.0)})
    ingest_lines(store, sid, "local", [_notice(SLOWER, 5), _notice(BEST, 5),
                                       {"type": "notice", "message": "not adaptive"}], 0.0)
    return store, sid


def test_each_stop_says_after_how_many_of_the_plans_repetitions_and_the_winner_is_marked(
        tmp_path):
    store, sid = _store(tmp_path)
    stops = adaptive_stops(store, [sid])
    assert [(t["what"], t["after"], t["of"], t["best"]) for t in stops] == [
        ("num_draft_tokens=2", 5, 6, False), ("num_draft_tokens=4", 5, 6, True)]
    assert stops[1]["text"] == ("draft width 4 stopped after 5 of 6 repetitions: settled "
                                "as the best: faster than its baseline beyond the tolerance "
                                "with 90% confidence after 5 repetitions, every other "
                                "candidate slower")
    best = ('<li data-best="yes" data-calibration="yes">local · calibration pair (an '
            "instrument, not a model) · target+draft · workload <code>code</code>: <b>"
            "draft width 4 stopped after 5 of 6 repetitions: settled as the best")
    sweep_page = render_review(store, tmp_path / "sweep.html", sid).read_text()
    weekly = write_review(store, tmp_path / "review.html", week=WEEK, formats=("html",),
                          now=MONDAY + timedelta(days=6))["html"].read_text()
    for html in (sweep_page, weekly):
        # a stop is said once, in the stops' list: not again, raw, among the notices
        assert "stops repeating: " not in html and "not adaptive" in html
        listed = html.split('<ul id="adaptive-stops">')[1].split("</ul>")[0]
        assert listed.count("<li") == 2 and best in listed
        assert ('<li data-best="no" data-calibration="yes">local · calibration pair (an '
                "instrument, not a model) · target+draft · workload <code>code</code>: "
                "draft width 2 stopped after 5 of 6 repetitions: slower than the best"
                ) in listed


@settings(max_examples=40, deadline=None)
@given(what=st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters=":"),
                    min_size=1, max_size=20),
       why=st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), max_size=60),
       after=st.integers(1, 50),
       best=st.booleans())
def test_any_stop_reads_back_its_config_count_and_reason(what, why, after, best):
    """Whatever the agent wrote: the config and reason read back as written, the count is
    the notice's, and a stop is the winner's exactly when its reason says settled as best."""
    import tempfile
    from pathlib import Path

    reason = ("settled as the best: " if best else "slower than the best: ") + why
    with tempfile.TemporaryDirectory() as d:
        store = open_store(fresh_sqlite(Path(d) / "s.db"))
        sid = night(store, MONDAY, node="n", chip="Apple M2", workload="code",
                    pair="t / d", lock=lock_doc("p", {}) | {"job": {"repetitions": 60}},
                    configs={("baseline", 0): config_values(30.0)})
        ingest_lines(store, sid, "n", [_notice(f"adaptive: {what} stops repeating: {reason}",
                                               after)], 0.0)
        (t,) = adaptive_stops(store, [sid])
    assert (t["what"], t["why"], t["after"], t["of"], t["best"]) == (what, reason, after, 60,
                                                                     best)
    assert t["text"] == f"{what_words(what)} stopped after {after} of 60 repetitions: {reason}"


def test_a_stopped_config_is_said_in_words():
    """The demo's stops once read "speculative@target+draft · … num_draft_tokens=1 stopped"."""
    assert [what_words(w) for w in ("num_draft_tokens=4", "kv_bits=8", "temperature=0.7",
                                    "draft-8bit", "x")] == [
        "draft width 4", "kv bits 8", "temperature 0.7", "draft-8bit", "x"]
    assert [pair_words(v) for v in ("speculative@target+draft", "target+draft", None)] == [
        "target+draft", "target+draft", None]


@pytest.mark.alone  # judges timing: other tests' load scatters it
def test_a_real_agents_stop_on_its_winner_reads_on_both_pages(model_pair, tmp_path):
    """The agent's own adaptive sweep over runtimes with fixed token timing (planted: 6, 4
    and 9 ms a token; 12 repetitions, ±10%): the fast one is settled as the best after
    fewer rounds than the plan's 12, the slow one known slower. Its notices, as journaled,
    read on the sweep page and the review (Chromium) as stops after N of 12 repetitions,
    the winner's marked, N the rounds the agent measured."""
    import json

    from orchestrator.sweep.jobspec import build_job
    from tests.browser import dump_dom
    from tests.test_agent import run_agent
    from tests.test_load import planted

    job = build_job(model_pair, ["code"], max_tokens=24)
    job["workloads"] = job["workloads"][:1]
    job["engine"] = {"type": "http", "runtime": "planted", "ready_timeout_s": 30,
                     "variants": [planted("plain", "correct", 6),
                                  planted("fast", "correct", 4, True),
                                  {**planted("slow", "correct", 9, True), "name": "slow"}]}
    job.update(knobs={}, repetitions=12, quality_tasks=[], cv_threshold=1.0,
               contention_threshold=1.0, adaptive={"tolerance": 0.10})
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    notices = [{k: e[k] for k in ("type", "message", "variant", "workload", "adaptive",
                                  "repetitions")}
               for e in ev if e["type"] == "notice" and e.get("adaptive")]
    runs = {n["variant"]: sum(1 for e in ev if e["type"] == "generation"
                              and e.get("variant") == n["variant"]) for n in notices}
    best = [n for n in notices if "settled as the best" in n["message"]]
    assert [n["variant"] for n in best] == ["fast"] and best[0]["repetitions"] < 12, notices

    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    sid = night(store, MONDAY + timedelta(hours=1), node="local", chip="Apple M2",
                workload="code", pair="t / d",
                lock=lock_doc("planted", {}) | {"job": {"repetitions": 12}},
                configs={("baseline", 0): config_values(30.0)})
    ingest_lines(store, sid, "local", notices, 0.0)
    n = best[0]["repetitions"]
    assert n <= runs["fast"]  # a stop counts reliable rounds; an unreliable one ran too
    line = ('<li data-best="yes">local · fast · workload <code>code</code>: <b>fast stopped '
            f"after {n} of 12 repetitions: settled as the best: faster than its baseline")
    for html in (render_review(store, tmp_path / "sweep.html", sid),
                 write_review(store, tmp_path / "review.html", week=WEEK, formats=("html",),
                              now=MONDAY + timedelta(days=6))["html"]):
        listed = dump_dom(html).split('<ul id="adaptive-stops">')[1].split("</ul>")[0]
        assert line in listed and listed.count("<li") == len(notices), listed


def test_the_sweeps_own_line_says_a_stop_in_words():
    """The demo's terminal once printed "[local] adaptive: num_draft_tokens=1 stops
    repeating: …" beside pages that say "draft width 1"."""
    import io

    from orchestrator.sweep.progress import StderrProgress

    out = io.StringIO()
    show = StderrProgress(out)
    show("local", {"type": "notice", "adaptive": True, "message": SLOWER})
    show("local", {"type": "notice", "adaptive": True, "message": "adaptive: odd words"})
    assert out.getvalue().splitlines() == [
        "[local] adaptive: draft width 2 stops repeating: " + SLOWER.split(": ", 2)[2],
        "[local] adaptive: odd words"]
