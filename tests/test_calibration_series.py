"""A calibration series is its own series, marked on every page (issue 34): a calibration
target swept under a real pair's very names is never pooled with it (the record its sweep's
lock stored is part of the series' key), and a calibration series whose record no longer
holds (the target's weights changed, a night's acceptance missed the record) is marked
stale wherever it is named and switched on nowhere. Stores are planted through the real
ingest (tests.history); every expected number is the planted one."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import uuid
from datetime import timedelta

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.calibration import CALIBRATION_FILE, calibrate
from orchestrator.cli import main
from orchestrator.review.compare import as_text, compare
from orchestrator.review.report import write_review
from orchestrator.review.rules import load_rules
from orchestrator.review.site import write_site
from orchestrator.review.verdict import policy
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import config_values, lock_doc, night, week_nights
from tests.store_templates import fresh_sqlite
from tests.test_calibration_review import CAL_FP, CAL_LOCK, MONDAY, WEEK

PAIR = "target / draft"  # both pairs' name: nothing in it says which is the instrument
NOW = MONDAY + timedelta(days=6)
QUIET = dict(log=lambda m: None)


def _cal_lock(expected: float = 1.0) -> dict:
    models = json.loads(json.dumps(CAL_LOCK["models"]))
    models["target"]["calibration"]["expected_acceptance"] = expected
    if expected < 1.0:  # a perturbed record: what the builder measured on code at width 4
        models["target"]["calibration"]["measured"] = {"cells": [{
            "workload": "code", "prompt_sha256": "p" * 64, "num_draft_tokens": 4,
            "drafted_tokens": 66, "accepted_tokens": round(66 * expected),
            "acceptance": expected}]}
    return lock_doc(f"cal-{expected}", models)


def _cal_night(store, at, *, acceptance=1.0, expected=1.0, target_fp=CAL_FP, pair=PAIR):
    """The calibration pair's night: 40 tok/s autoregressive, 96 at width 4 (2.4x)."""
    night(store, at, node="mac-a", chip="Apple M2", workload="code", pair=pair,
          identity={"target_fingerprint": target_fp}, lock=_cal_lock(expected),
          configs={("baseline", 0): config_values(40.0),
                   # within 0.4%: a planted 0.60 reads 0.60 to two places (at 1% three
                   # repetitions' median could read 0.59, and a CI run failed on it)
                   ("speculative", 4): config_values(96.0, acceptance=acceptance,
                                                     jitter=0.004)})


def _real_night(store, at):
    """The real pair's night: 300 tok/s autoregressive, 180 at width 4 (0.6x)."""
    night(store, at, node="mac-a", chip="Apple M2", workload="code", pair=PAIR,
          configs={("baseline", 0): config_values(300.0),
                   ("speculative", 4): config_values(180.0, acceptance=0.5)})


def _store(tmp_path, name="s.db", nights=3, **cal):
    store = open_store(fresh_sqlite(tmp_path / name))
    for at in week_nights(MONDAY, nights):
        _cal_night(store, at, **cal)
        _real_night(store, at + timedelta(minutes=5))
    return store


def _baseline(s: dict) -> float:
    return next(c["decode_p50"] for c in s["configs"] if c["mode"] == "baseline")


# --- one name, two series --------------------------------------------------------------

@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.booleans(), min_size=2, max_size=6).filter(
    lambda o: any(o) and not all(o)))
def test_any_order_of_same_named_nights_gives_two_series_with_their_own_numbers(tmp_path,
                                                                                 order):
    """Whatever the order the two pairs' nights come in (True: the calibration pair's),
    the week has exactly two series: the calibration one marked, with its planted 40 tok/s
    baseline and every one of its nights; the real one unmarked, with 300 and its own."""
    store = open_store(fresh_sqlite(tmp_path / f"{uuid.uuid4().hex}.db"))
    for i, cal in enumerate(order):
        at = MONDAY + timedelta(hours=2 + 20 * i)
        (_cal_night if cal else _real_night)(store, at)
    a = analyse(store, WEEK, load_rules(), now=NOW)
    by = {bool(s["series"].get("calibration")): s for s in a["series"]}
    assert len(a["series"]) == 2 and set(by) == {True, False}
    assert by[True]["calibration"] and not by[False]["calibration"]
    assert by[True]["series"]["model_pair"] == by[False]["series"]["model_pair"] == PAIR
    assert _baseline(by[True]) == pytest.approx(40.0, rel=0.02)
    assert _baseline(by[False]) == pytest.approx(300.0, rel=0.02)
    runs = {k: next(c["runs"] for c in s["configs"] if c["mode"] == "baseline")
            for k, s in by.items()}
    # one run (config summary) a night, every night in its own pair's series (a store of
    # its own per example: Hypothesis may draw an order twice)
    assert runs == {True: sum(order), False: len(order) - sum(order)}


def test_every_review_format_marks_the_calibration_series_and_only_it(tmp_path):
    store = _store(tmp_path)
    written = write_review(store, tmp_path / "out", week=WEEK, now=NOW,
                           formats=("html", "md", "json"))
    html = written["html"].read_text()
    labels = re.findall(r'<h3 class="series"><span class="label" title="([^"]*)">([^<]*)<',
                        html)
    assert len(labels) == 2
    assert sorted("calibration pair" in full and "calibration pair" in short
                  for full, short in labels) == [False, True]
    rows = re.findall(r'<tr data-decision="([^"]*)"><td><span class="label" title="([^"]*)"',
                      html)
    assert sorted(rows) == [("keep autoregressive", f"Apple M2 · {PAIR} · code · short · "
                             "mlx-lm"),
                            ("production candidate", f"Apple M2 · {PAIR} · code · short · "
                             "mlx-lm · calibration pair")]
    md = written["md"].read_text()
    # the page's short names (what every series shares is said once, in its header)
    heads = md.split("## Series")[1].splitlines()
    assert sorted(h for h in heads if h.startswith("### ")) == [
        "### code", "### code · calibration pair"]
    table = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| code")]
    assert sorted(table) == ["| code", "| code · calibration pair"]
    doc = json.loads(written["json"].read_text())
    marks = sorted((bool(s["series"].get("calibration")), bool(s["calibration"]),
                    all(c["otel"].get("specfleet.calibration") for c in s["configs"]))
                   for s in doc["series"])
    assert marks == [(False, False, False), (True, True, True)]


def test_the_policy_names_the_calibration_entry_apart_from_the_real_one(tmp_path):
    a = analyse(_store(tmp_path), WEEK, load_rules(), now=NOW)
    assert [p["series"] for p in policy(a)["series"]] == [
        f"Apple M2 / {PAIR} / code / short / mlx-lm"]
    asked = {p["series"]: p for p in policy(a, calibration=True)["series"]}
    cal = asked[f"Apple M2 / {PAIR} / code / short / mlx-lm / calibration"]
    real = asked[f"Apple M2 / {PAIR} / code / short / mlx-lm"]
    assert cal["calibration"] is True and cal["speculation"] is True
    assert "calibration" not in real and real["speculation"] is False


def test_the_site_has_one_row_and_one_page_per_series_each_with_its_own_levels(tmp_path):
    index = write_site(_store(tmp_path), tmp_path / "site", week=WEEK, now=NOW)
    html = index.read_text()
    rows = html.split('<tr data-label="')[1:]
    assert len(rows) == 2
    cal = [r for r in rows if "data-calibration" in r.split(">")[0]]
    real = [r for r in rows if "data-calibration" not in r.split(">")[0]]
    assert len(cal) == len(real) == 1
    assert 'data-calibration="yes"' in cal[0] and "calibration pair" in cal[0]
    assert "calibration" not in real[0].split("</tr>")[0]
    # each series' page holds its own pair's three nightly baseline levels (40, 300 tok/s)
    for r, level in ((cal[0], 40.0), (real[0], 300.0)):
        text = (tmp_path / "site" / re.search(r'href="([^"]+)"', r).group(1)).read_text()
        base = text.split('id="baseline"')[1].split("</section>")[0]
        nights = [float(v) for v in re.findall(r"<tr><td>[0-9-]+</td><td>([0-9.]+)</td>",
                                               base)]
        assert len(nights) == 3 and statistics.median(nights) == pytest.approx(level, rel=0.03)
        assert ("calibration pair" in text) is (level == 40.0)


def test_compare_never_pools_a_calibration_pair_with_a_real_pair_of_its_name(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / "c.db"))
    for week_start in (MONDAY - timedelta(days=7), MONDAY):
        _cal_night(store, week_start + timedelta(hours=2))
        _real_night(store, week_start + timedelta(hours=2, minutes=5))
    c = compare(store, "2026-W09", "2026-W10")
    spec = [r for r in c["rows"] if r["config"] == "speculative k=4"
            and r["metric"] == "decode_tok_s"]
    assert len(spec) == 2
    by = {bool(r.get("calibration")): r for r in spec}
    assert by[True]["calibration"] == ["A", "B"]
    assert by[True]["a"] == pytest.approx(96.0, rel=0.05)
    assert by[False]["a"] == pytest.approx(180.0, rel=0.05)
    marked = [line for line in as_text(c).splitlines() if "calibration pair: A/B" in line]
    assert len(marked) == sum(1 for r in c["rows"] if r.get("calibration"))


# --- a calibration series whose record no longer holds ----------------------------------

@pytest.mark.parametrize("case", ["drift", "fingerprint"])
def test_a_series_whose_record_no_longer_holds_is_marked_stale_and_never_switched_on(
        tmp_path, case):
    """Planted: an exact pair (expected acceptance 1.0) measuring 0.60; or a node whose
    target weights are not the record's. Every page says the record no longer holds,
    and, asked into the policy, the series is not switched on early."""
    kw = {"drift": dict(acceptance=0.6),
          "fingerprint": dict(target_fp="sha256:" + "e" * 64)}[case]
    store = _store(tmp_path, nights=1, **kw)
    a = analyse(store, WEEK, load_rules(), now=NOW)
    [cal] = [s for s in a["series"] if s["calibration"]]
    [why] = cal["calibration"]["no_longer_holds"]
    [at] = week_nights(MONDAY, 1)
    assert why == {"drift": f"the night of {at.date().isoformat()} (mac-a) measured acceptance "
                            "0.60 on code at width 4, off the record's 1.00 by more than 0.05",
                   "fingerprint": f"the target's fingerprint changed ({'c' * 12} in the "
                                  f"record, {'e' * 12} measured)"}[case]
    assert cal["verdict"]["text"].startswith(
        f"calibration pair (an instrument, not a model; stale: its record no longer holds: "
        f"{why}): ")
    [p] = [p for p in policy(a, calibration=True)["series"] if p.get("calibration")]
    assert p["speculation"] is False and p["calibration_stale"] == [why]
    written = write_review(store, tmp_path / "out", week=WEEK, now=NOW, formats=("md",))
    md = written["md"].read_text()  # the label marks it; its row says why
    assert "calibration pair, stale" in md and f"stale: its record no longer holds: {why}" in md
    html = write_site(store, tmp_path / "site", week=WEEK, now=NOW).read_text()
    [row] = [r for r in html.split('<tr data-label="')[1:] if "data-calibration" in
             r.split(">")[0]]
    assert row.split(">")[0].count('data-calibration="stale"') == 1
    assert "its record no longer holds" in row


def test_a_series_whose_record_holds_is_not_stale(tmp_path):
    """Acceptance 1.0 (planted with ±1% jitter) for an exact pair; 0.78 for a perturbed
    pair whose record says 0.80 on code at width 4 (and nothing is unverified)."""
    for name, kw in (("exact", {}), ("perturbed", dict(acceptance=0.78, expected=0.8))):
        a = analyse(_store(tmp_path, f"{name}.db", nights=1, **kw), WEEK, load_rules(),
                    now=NOW)
        [cal] = [s for s in a["series"] if s["calibration"]]
        assert "no_longer_holds" not in cal["calibration"], cal["calibration"]
        assert "unverified" not in cal["calibration"], cal["calibration"]
        assert "stale" not in cal["verdict"]["text"]


# --- plan lock: a calibration target without its own draft -----------------------------

def _plan(tmp_path, pair, drafts: list) -> tuple:
    from tests.locks import plan_text

    text = plan_text(pair).replace(f"  draft: {pair / 'draft'}",
                                   "  draft: " + (str(drafts[0]) if len(drafts) == 1
                                                  else "[" + ", ".join(map(str, drafts)) + "]"))
    plan = tmp_path / "plan.yml"
    plan.write_text(text)
    return plan, text.splitlines().index(f"  target: {pair / 'target'}") + 1


def _other_draft(model_pair, dst):
    """The draft with one config value changed: the same vocabulary, other weights'
    fingerprint (what a user's mix-up of drafts looks like)."""
    shutil.copytree(model_pair / "draft", dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-5) * 2
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_the_lock_refuses_a_calibration_target_paired_only_with_another_draft(model_pair,
                                                                             tmp_path):
    pair = tmp_path / "pair"
    shutil.copytree(model_pair / "draft", pair / "draft")
    record = calibrate(pair / "draft", pair / "target", layers=3, **QUIET)
    other = _other_draft(model_pair, tmp_path / "other")
    plan, line = _plan(tmp_path, pair, [other])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"{plan}:{line}: models.target: {pair / 'target'}/{CALIBRATION_FILE} does not " \
        f"hold: it was grown from the draft {record['draft_fingerprint']}, but the plan " \
        f"pairs it only with {other}" in r.output, r.output
    assert not list(tmp_path.glob("*.lock.json"))


def test_the_lock_marks_a_calibration_target_beside_its_own_draft_and_another(model_pair,
                                                                            tmp_path):
    """Its own draft and a lighter one (the demo's ladder): locked, the target marked."""
    from orchestrator.sweep.lock import load_lock

    pair = tmp_path / "pair"
    shutil.copytree(model_pair / "draft", pair / "draft")
    record = calibrate(pair / "draft", pair / "target", layers=3, **QUIET)
    plan, _ = _plan(tmp_path, pair, [pair / "draft", _other_draft(model_pair,
                                                                  tmp_path / "other")])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    doc = load_lock(plan.with_suffix(".lock.json"))
    assert doc["models"]["target"]["calibration"] == record


# --- a lineup: one calibration target beside a real one, in one sweep ---------------------

def _lineup_sweep(store) -> str:
    """One sweep whose lock marks ``target`` (grown) as a calibration target beside a real
    ``target-2``, both with the draft: config summaries and a generation per config."""
    from tests.history import generation, ingest_lines

    models = json.loads(json.dumps(CAL_LOCK["models"]))
    models["target-2"] = {"fingerprint": "sha256:" + "r" * 64}
    lock = lock_doc("lineup", models)
    at = MONDAY + timedelta(hours=2)
    common = dict(node="mac-a", chip="Apple M2", workload="code")
    sid = night(store, at, **common, pair="grown / draft", lineup="target+draft", lock=lock,
                identity={"target_fingerprint": CAL_FP},
                configs={("baseline", 0): config_values(40.0),
                         ("speculative", 4): config_values(96.0, acceptance=1.0)})
    night(store, at, **common, pair="real / draft", sweep_id=sid, lineup="target-2+draft",
          identity={"target_fingerprint": "sha256:" + "r" * 64},
          configs={("baseline", 0): config_values(300.0),
                   ("speculative", 4): config_values(180.0, acceptance=0.5)})
    ingest_lines(store, sid, "mac-a", [
        generation(mode, k, lineup=pair, decode_tok_s=v, **({"drafted_tokens": 8,
                                                             "accepted_tokens": 8}
                                                            if k else {}))
        for pair, base, spec in (("target+draft", 40.0, 96.0), ("target-2+draft", 300.0, 180.0))
        for mode, k, v in (("baseline", 0, base), ("speculative", 4, spec))], at.timestamp())
    return sid


def test_a_lineups_calibration_target_alone_is_marked_in_review_export_and_sweep_page(
        tmp_path):
    from orchestrator.export.points import Selection, read_points
    from orchestrator.review.sweep_page import review_data

    store = open_store(fresh_sqlite(tmp_path / "l.db"))
    sid = _lineup_sweep(store)
    a = analyse(store, WEEK, load_rules(), now=NOW)
    assert {s["series"]["model_pair"]: bool(s["calibration"]) for s in a["series"]} == {
        "grown / draft": True, "real / draft": False}
    _, points = read_points(store, Selection(sweep_ids=[sid]))
    marks = {(p.attributes.get("specfleet.pair"), p.attributes.get("specfleet.calibration"))
             for p in points}
    assert marks == {("target+draft", True), ("target-2+draft", None)}
    sections = {s["pair"]: s["calibration"] for s in review_data(store, sid)["sections"]}
    assert sections == {"grown / draft": True, "real / draft": False}
