"""The weekly review with a calibration pair beside a real one (planted nights): marked,
never pooled, out of the policy unless asked, and provisional with its count of nights."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.rules import load_rules
from orchestrator.review.verdict import MIN_RUNS, decide, policy
from orchestrator.review.weekly import DEFAULT_GATES, analyse
from orchestrator.store import open_store
from tests.history import config_values, ingest_lines, lock_doc, night, week_nights
from tests.store_templates import fresh_sqlite

WEEK = "2026-W10"
MONDAY = datetime(2026, 3, 2, tzinfo=timezone.utc)
CAL_FP = "sha256:" + "c" * 64
CAL_LOCK = {"models": {"target": {"fingerprint": CAL_FP, "calibration": {
    "expected_acceptance": 1.0, "construction": {"layers": 32},
    "draft_fingerprint": "sha256:" + "d" * 64}}, "draft": {"fingerprint": "sha256:" + "d" * 64}}}


def _plant(store, nights: int) -> None:
    """Per night: the calibration pair (2.4x at width 4, 2.0x at 2, acceptance 1.0) and a
    real pair that loses at every width (0.7x, 0.6x), each in a sweep of its own (as the demo
    sweeps them); the calibration sweep's lock marks its target."""
    lock = lock_doc("demo-calibration", CAL_LOCK["models"])
    for at in week_nights(MONDAY, nights):
        common = dict(node="mac-a", chip="Apple M2", workload="code")
        sid = night(store, at, pair="grown-32 (calibration) / draft", **common,
                    identity={"target_fingerprint": CAL_FP}, lock=lock,
                    configs={("baseline", 0): config_values(40.0),
                             ("speculative", 2): config_values(80.0, acceptance=1.0),
                             ("speculative", 4): config_values(96.0, acceptance=1.0)})
        ingest_lines(store, sid, "mac-a", [{
            "type": "notice", "message": "adaptive: num_draft_tokens=2 stops repeating: "
            "slower than the best", "variant": "speculative", "workload": "code",
            "adaptive": True}], 0.0)
        real = night(store, at + timedelta(minutes=5), pair="target / draft", **common,
              configs={("baseline", 0): config_values(300.0),
                       ("speculative", 2): config_values(210.0, acceptance=0.6),
                       ("speculative", 4): config_values(180.0, acceptance=0.5)})
        ingest_lines(store, real, "mac-a", [{"type": "notice", "message": "a real pair's "
                                             "notice", "workload": "code"}], 0.0)


def _review(tmp_path, nights: int) -> dict:
    store = open_store(fresh_sqlite(tmp_path / 'r.db'))
    _plant(store, nights)
    a = analyse(store, WEEK, load_rules(), now=MONDAY + timedelta(days=6))
    return {s["series"]["model_pair"]: s for s in a["series"]} | {"_a": a}


def test_one_night_gives_each_decision_provisional_with_its_count(tmp_path):
    by = _review(tmp_path, 1)
    cal, real = by["grown-32 (calibration) / draft"], by["target / draft"]
    assert cal["calibration"]["expected_acceptance"] == 1.0 and real["calibration"] is None
    assert cal["verdict"]["decision"] == "production candidate" and cal["verdict"]["k"] == 4
    assert cal["verdict"]["text"] == ("calibration pair (an instrument, not a model): "
                                      "production candidate at draft width 4, provisional: "
                                      "1 of 3 nights")
    assert real["verdict"]["text"] == ("keep autoregressive: no draft width is faster than "
                                       "the baseline, provisional: 1 of 3 nights")
    # the calibration sweep's adaptive stop is marked, in the stops' list (not again among
    # the notices); the real pair's notice is not marked
    marks = {n["message"]: n["calibration"] for n in by["_a"]["notices"]}
    assert marks == {"a real pair's notice": False}
    assert [(t["text"], t["calibration"]) for t in by["_a"]["adaptive_stops"]] == [
        ("draft width 2 stopped early: slower than the best", True)]
    # the policy leaves the instrument out unless asked, and says what is provisional
    p = policy(by["_a"])
    assert [s["model_pair"] for s in p["series"]] == ["target / draft"]
    assert p["series"][0]["provisional"] == {"nights": 1, "needed": 3}
    asked = {s["model_pair"]: s for s in policy(by["_a"], calibration=True)["series"]}
    c = asked["grown-32 (calibration) / draft"]
    # asked in, the instrument's one-night candidate is switched on, with its marker (a
    # real pair's one night switches nothing on: audit 27, below and test_audit_27_stats)
    assert c["calibration"] is True and c["speculation"] is True
    assert c["num_draft_tokens"] == 4 and c["provisional"] == {"nights": 1, "needed": 3}
    assert "candidate" not in c
    r = asked["target / draft"]
    assert r["speculation"] is False and r["provisional"] == {"nights": 1, "needed": 3}
    # what the review page says the policy would do if asked: that series only
    from orchestrator.review.report import calibration_policy

    assert calibration_policy(by["_a"]) == [c]


def test_three_nights_are_no_longer_provisional(tmp_path):
    by = _review(tmp_path, 3)
    v = by["grown-32 (calibration) / draft"]["verdict"]
    assert v["decision"] == "production candidate" and "provisional" not in v
    assert v["text"].endswith("production candidate at draft width 4")
    assert "provisional" not in by["target / draft"]["verdict"]["text"]


def _section(runs: int, speedups: dict[int, float]) -> dict:
    def cfg(mode, k, sp):
        passed = sp >= 1.16
        return {"mode": mode, "k": k, "runs": runs, "unreliable": 0, "set_aside": False,
                "speedup": sp, "exact": True, "classification":
                "production candidate" if mode == "speculative" and passed else
                "not a candidate", "gates": {} if mode == "baseline" else
                {"speedup": {"value": sp, "passed": passed}}}
    return {"series": {"chip": "Apple M2"}, "identity": {}, "gates": DEFAULT_GATES,
            "signals": [],
        "configs": [cfg("baseline", 0, 1.0)] + [cfg("speculative", k, s)
                                                 for k, s in speedups.items()]}


@settings(max_examples=200, deadline=None)
@given(runs=st.integers(1, 6),
       speedups=st.dictionaries(st.sampled_from([2, 3, 4, 6]),
                                st.floats(0.3, 3.0, allow_nan=False), min_size=1))
def test_any_series_gets_the_same_decision_provisional_only_below_the_nights_needed(
        runs, speedups):
    """Whatever the numbers: fewer nights than needed change only the mark (with the
    count), never the decision or its width."""
    v = decide(_section(runs, speedups))
    full = decide(_section(MIN_RUNS, speedups))
    assert (v["decision"], v["k"]) == (full["decision"], full["k"])
    assert v["decision"] != "needs more data"
    if runs < MIN_RUNS:
        assert v["text"] == full["text"] + f", provisional: {runs} of {MIN_RUNS} nights"
    else:
        assert v["text"] == full["text"] and "provisional" not in v


def test_policy_calibration_without_a_policy_is_refused(tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli import main

    r = CliRunner().invoke(main, ["review", "--out", str(tmp_path / "r.html"),
                                  "--policy-calibration", "--db",
                                  f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 2 and "--policy-calibration says what goes in the policy: give " \
        "--policy FILE too" in r.output


def test_a_calibration_series_without_a_decision_is_shown_off_in_the_policy_line(tmp_path):
    """A calibration night with no baseline (as on a contended demo: every run set aside)
    decides "needs more data"; the review still renders, and says the policy would keep
    speculation off for it (no provisional count: there is no decision to qualify)."""
    from orchestrator.review.report import calibration_policy, write_review

    store = open_store(fresh_sqlite(tmp_path / 'r.db'))
    night(store, MONDAY + timedelta(hours=1), node="mac-a", chip="Apple M2",
          workload="code", pair="grown-32 (calibration) / draft",
          identity={"target_fingerprint": CAL_FP},
          lock=lock_doc("demo-calibration", CAL_LOCK["models"]),
          configs={("speculative", 4): config_values(96.0, acceptance=1.0)})
    a = analyse(store, WEEK, load_rules(), now=MONDAY + timedelta(days=6))
    (p,) = calibration_policy(a)
    assert p["decision"] == "needs more data" and p["speculation"] is False
    assert "provisional" not in p
    html = write_review(store, tmp_path / "review.html", week=WEEK,
                        now=MONDAY + timedelta(days=6), formats=("html",))["html"]
    assert ('<span data-series="grown-32 (calibration) / draft" data-policy="off">grown-32 '
            "(calibration) / draft · code: speculation <b>off</b></span>.") in html.read_text()


def test_the_page_says_what_the_asked_policy_holds_and_what_it_would_unasked(tmp_path):
    """One planted night (2.4x at width 4, every gate passed): the page written beside a
    policy asked for the calibration series says it is on, with its nights; without the
    ask it says what the policy would hold, and that calibration stays out."""
    from orchestrator.review.report import write_review

    store = open_store(fresh_sqlite(tmp_path / 'r.db'))
    _plant(store, 1)
    now = MONDAY + timedelta(days=6)
    span = ('<span data-series="grown-32 (calibration) / draft" data-policy="on">grown-32 '
            "(calibration) / draft · code: speculation <b>on at draft width 4</b> "
            "(provisional: 1 of 3 nights)</span>.")
    for asked in (True, False):
        html = write_review(store, tmp_path / f"review-{asked}.html", week=WEEK, now=now,
                            formats=("html",), policy_calibration=asked)["html"].read_text()
        line = html.split('id="calibration-policy"')[1].split("</p>")[0]
        assert span in line
        assert f'data-asked="{"yes" if asked else "no"}"' in line
        assert ("are in the runtime policy, asked with" in line) is asked
        assert ("stay out of the runtime policy" in line) is not asked


_SERIES = {"chip": "Apple M2", "model_pair": "grown (calibration) / draft", "workload": "code",
           "context_bucket": "short", "engine": "mlx-lm"}


@settings(max_examples=200, deadline=None)
@given(runs=st.integers(1, 6), calibration=st.booleans(), asked=st.booleans(),
       speedups=st.dictionaries(st.sampled_from([2, 3, 4, 6]),
                                st.floats(0.3, 3.0, allow_nan=False), min_size=1))
def test_any_policy_switches_on_only_a_passing_config_and_marks_its_nights(
        runs, calibration, asked, speedups):
    """Whatever the numbers: a calibration series is in the policy only when asked; what
    is switched on passed every gate (the fastest that did); a real pair is switched on
    only on the nights needed; a calibration series asked in is switched on whatever its
    nights, and then carries their count when fewer than needed."""
    section = _section(runs, speedups) | {"series": _SERIES, "calibration": calibration}
    section["verdict"] = decide(section)
    a = {"gates": DEFAULT_GATES, "week": WEEK, "series": [section]}
    entries = policy(a, calibration=asked)["series"]
    if calibration and not asked:
        assert entries == []
        return
    (p,) = entries
    passing = {k: sp for k, sp in speedups.items() if sp >= 1.16}
    enough = runs >= MIN_RUNS
    assert p["speculation"] is (bool(passing) and (enough or calibration))
    if p["speculation"]:
        assert p["num_draft_tokens"] == max(passing, key=passing.__getitem__)
    assert p.get("provisional") == (None if enough else {"nights": runs, "needed": MIN_RUNS})
    # a provisional candidate left off is named; one switched on is not named twice
    assert ("candidate" in p) is (bool(passing) and not p["speculation"])
