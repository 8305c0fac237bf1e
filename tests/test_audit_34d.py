"""Audit 34d: the fixes of audit 34c (per-cell record checks, the instrument's interval of
the median, quantise refusal, the lock's record comparison) attacked with inputs written
here: counts no builder writes, readings no node should send, records re-serialised. A
strict xfail names what is wrong today, measured; a plain test is a guard that held (or one
fixed by this audit: said in its docstring)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from orchestrator.calibration_record import CALIBRATION_FILE
from orchestrator.errors import ConfigError
from orchestrator.instrument import judge, node_reading
from orchestrator.review.record_holds import identity_holds, judge_acceptance

FP, DFP = "sha256:" + "a" * 64, "sha256:" + "b" * 64
PERTURBED = {"expected_acceptance": 0.8, "fingerprint": FP, "draft_fingerprint": DFP,
             "construction": {"layers": 16, "noise_scale": 0.01},
             "measured": {"cells": [{"workload": "code", "num_draft_tokens": 4,
                                     "acceptance": 0.8, "drafted_tokens": 400}]}}


# --- the record's cells -------------------------------------------------------------------

def test_a_record_with_cells_for_some_widths_leaves_the_others_unverified():
    """Guard held: a run at a width the record has no cell for is unverified, never judged
    against another width's cell (nor the record's pooled number)."""
    assert judge_acceptance(PERTURBED, "code", 4, 0.8, 400) == (None, None)
    miss, why = judge_acceptance(PERTURBED, "code", 2, 0.2, 400)
    assert miss is None and "no acceptance for code at width 2" in why


@pytest.mark.parametrize("drafted", [0, -5, float("nan"), True, "400", None])
def test_a_cell_whose_drafted_count_is_no_count_is_no_bound(drafted):
    """Guard held: a cell drafting 0, a negative, NaN, a flag or text is left out:
    unverified, never a bound (and never a crash)."""
    rec = json.loads(json.dumps(PERTURBED))
    rec["measured"]["cells"][0]["drafted_tokens"] = drafted
    miss, why = judge_acceptance(rec, "code", 4, 0.1, 400)
    assert miss is None and why


def test_a_cell_with_a_huge_drafted_count_is_judged_not_crashed():
    """Fixed by this audit (record_holds._count): a record cell drafting 10**400 tokens (a
    count no builder writes, but the record is a file anyone can edit and the lock copies
    it) raised OverflowError in the binomial bound, taking the weekly page down with it.
    Counts past 10**15 are no count now: the run is unverified."""
    rec = json.loads(json.dumps(PERTURBED))
    rec["measured"]["cells"][0]["drafted_tokens"] = 10 ** 400
    miss, why = judge_acceptance(rec, "code", 4, 0.8, 400)
    assert miss is None and why
    assert judge_acceptance(PERTURBED, "code", 4, 0.8, 10 ** 400) == (None, None)
    assert judge_acceptance(PERTURBED, "code", 4, 0.3, 10 ** 400)[0]  # still judged


def test_a_night_exactly_on_the_tolerance_edge_holds_and_just_past_it_misses():
    """Guard held: an exact pair's night at 0.95 (1.0 − 0.05, 0.05 not exact in binary)
    holds; 0.9499 misses."""
    exact = {"expected_acceptance": 1.0}
    assert judge_acceptance(exact, "code", 4, 0.95, 100) == (None, None)
    assert judge_acceptance(exact, "code", 4, 0.9499, 100)[0]


def _nights(tmp_path, acceptance):
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night, week_nights
    from tests.store_templates import fresh_sqlite

    lock = lock_doc("cal", {"target": {"fingerprint": FP, "calibration": {
        "expected_acceptance": 1.0, "fingerprint": FP, "draft_fingerprint": DFP,
        "construction": {"layers": 16, "noise_scale": 0.0}}}, "draft": {"fingerprint": DFP}})
    monday = datetime(2026, 3, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "n.db"))
    for at in week_nights(monday, 3):
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", lock=lock,
              identity={"target_fingerprint": FP, "draft_fingerprint": DFP},
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=acceptance,
                                                         jitter=0.0)})
    return analyse(store, "2026-W10", load_rules(), now=monday + timedelta(days=6))


@pytest.mark.parametrize("acceptance", [-0.25, -1.0, 1.5])
def test_a_node_reporting_an_acceptance_that_is_no_rate_is_judged_stale(tmp_path,
                                                                        acceptance):
    """Fixed by this audit (record_holds.drafted_estimate): the store takes a run whose
    acceptance is −0.25 (NaN and inf are refused at its decode boundary, but the range is
    not checked), and at width 4 the drafted-token estimate divided by zero
    (−0.25 × 4 + 1), so the whole weekly analysis raised ZeroDivisionError. The estimate
    clamps the rate now, and a night off its record's 1.0 is stale."""
    a = _nights(tmp_path, acceptance)
    [s] = a["series"]
    assert len(s["calibration"]["no_longer_holds"]) == 3, s["calibration"]


def test_a_node_reporting_no_target_fingerprint_leaves_the_series_unverified():
    """Fixed by this audit (record_holds.identity_holds): a node that reported no target
    fingerprint was silently clean (a missing draft fingerprint was already said); the
    target the record's acceptance is for was never checked. It is said now."""
    stale, unverified = identity_holds(PERTURBED, {"draft_fingerprint": DFP})
    assert not stale and any("target fingerprint" in u for u in unverified), unverified


# --- the instrument check's rounds --------------------------------------------------------

def _reply(ratios: list[float]) -> dict:
    import statistics

    s = sorted(ratios)
    m = statistics.median(s)
    return {"costs": {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {"5": 30.0}},
            "overhead": {"ratio": 1.0},
            "speed": {"4": {"rounds": len(s), "predicted": 2.0, "measured": 2.0 * m,
                            "ratio": m, "spread": [s[len(s) // 4], s[3 * len(s) // 4]],
                            "ratios": ratios}}}


def _gens():
    return [{"mode": m, "num_draft_tokens": k, "decode_tok_s": v, "drafted_tokens": d,
             "accepted_tokens": d, "token_ids": [1, 2], "workload": "code"}
            for m, k, v, d in (("baseline", 0, 40.0, 0), ("speculative", 4, 80.0, 8))]


def test_a_node_reporting_thousands_of_rounds_is_judged_not_crashed():
    """Fixed by this audit (agent.stats.median_interval): a node replying 2000 rounds
    (``--rounds 2000``, or a hostile node) raised OverflowError (2.0 × a 600-digit binomial
    sum), so ``specfleet calibrate`` failed for every node; and the coverage sums were
    recomputed per j (0.65 s at 1000 rounds, quadratic). The interval is found in one pass
    now, and 2000 tight rounds around 1.0 are ok."""
    import time

    ratios = [1.0 + (i % 21 - 10) * 1e-3 for i in range(2000)]
    value, problem = node_reading(_reply(ratios))
    assert value is not None, problem
    t = time.perf_counter()
    check = judge("mac-a", _gens(), value["costs"], value["overhead"], value["speed"])
    assert time.perf_counter() - t < 2.0
    assert check.status == "ok", check.line


@pytest.mark.parametrize("bad", [[1.0] * 4 + [math.nan], [1.0] * 4 + [-1.0],
                                 [1.0] * 4 + [0.0], [1.0] * 4 + ["1.0"], [1.0] * 4 + [True],
                                 [1.0] * 4 + [math.inf]])
def test_a_nodes_ratios_that_are_not_positive_numbers_are_refused(bad):
    """Guard held: per-round ratios holding NaN, a negative, zero, text, a flag or inf are
    refused as unreadable, never judged."""
    r = _reply([1.0] * 5)
    r["speed"]["4"]["ratios"] = bad
    value, problem = node_reading(r)
    assert value is None and "unreadable reply" in problem, problem


def test_a_median_exactly_on_the_edge_with_a_clear_interval_is_ok():
    """Guard held: rounds whose interval is [0.9, 1.1] exactly (the tolerance's edges,
    neither exact in binary) are ok."""
    value, _ = node_reading(_reply([0.9, 0.9, 1.0, 1.1, 1.1]))
    check = judge("mac-a", _gens(), value["costs"], value["overhead"], value["speed"])
    assert check.status == "ok", check.line


# --- quantising through another path ------------------------------------------------------

def test_quantising_a_calibration_target_through_the_library_is_refused(tmp_path):
    """Fixed by this audit (tiers.quantize): the refusal sat only in the CLI command, so
    ``orchestrator.tiers.quantize`` (the function the demo and any script call) would
    convert a calibration target into an unmarked tier that locks as a real model. It
    refuses now, before mlx-lm is asked anything."""
    from orchestrator.tiers import quantize

    src = tmp_path / "cal"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / CALIBRATION_FILE).write_text("{}")
    with pytest.raises(ConfigError, match="calibration target"):
        quantize(src, tmp_path / "out", 4)
    assert not (tmp_path / "out").exists()


# --- the lock's record against the folder's -----------------------------------------------

def _differs(tmp_path: Path, locked: dict, text: str) -> str | None:
    from orchestrator.sweep.lock import _record_differs

    (tmp_path / CALIBRATION_FILE).write_text(text)
    return _record_differs({"calibration": locked}, tmp_path)


def test_a_record_differing_only_in_key_order_or_float_spelling_is_not_refused(tmp_path):
    """Guard held: the folder's record re-serialised (keys reordered, 1.0 as 1, 0.8 as
    8e-1, indented) is the one locked."""
    text = json.dumps(PERTURBED, indent=4, sort_keys=True)[::1]
    text = text.replace('"expected_acceptance": 0.8', '"expected_acceptance": 8e-1') \
        .replace('"layers": 16', '"layers": 16.0')
    reordered = dict(reversed(list(json.loads(text).items())))
    assert _differs(tmp_path, PERTURBED, json.dumps(reordered)) is None
    assert _differs(tmp_path, PERTURBED, text) is None


def test_a_record_holding_nan_is_still_the_one_locked(tmp_path):
    """Guard held (by json's one NaN constant, compared by identity first): a record with
    NaN in a field the builder does not check is not refused as "not the one locked"."""
    rec = json.loads(json.dumps(PERTURBED))
    rec["measured"]["cells"][0]["acceptance"] = math.nan
    assert _differs(tmp_path, json.loads(json.dumps(rec)), json.dumps(rec)) is None


def test_a_record_whose_one_value_changed_is_refused(tmp_path):
    """Guard held: the same record with one cell's acceptance edited is refused."""
    rec = json.loads(json.dumps(PERTURBED))
    rec["measured"]["cells"][0]["acceptance"] = 0.81
    assert "not the one locked" in _differs(tmp_path, PERTURBED, json.dumps(rec))


# --- the pages' labels --------------------------------------------------------------------

def _review(tmp_path: Path, acceptance: float, identity: dict) -> dict[str, str]:
    from orchestrator.review.report import write_review
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night, week_nights
    from tests.store_templates import fresh_sqlite

    lock = lock_doc("cal", {"target": {"fingerprint": FP, "calibration": {
        "expected_acceptance": 1.0, "fingerprint": FP, "draft_fingerprint": DFP,
        "construction": {"layers": 16, "noise_scale": 0.0}}}, "draft": {"fingerprint": DFP}})
    monday = datetime(2026, 3, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "p.db"))
    for at in week_nights(monday, 3):
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", lock=lock, identity=identity,
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=acceptance,
                                                         jitter=0.0)})
    paths = write_review(store, tmp_path / "out", week="2026-W10", formats=("md", "json"),
                         now=monday + timedelta(days=6))
    return {k: Path(p).read_text() for k, p in paths.items()}


def test_a_stale_pairs_markdown_and_json_say_stale_and_why(tmp_path):
    """Guard held: an exact pair measuring 0.50 on three nights is marked "calibration
    pair, stale" in its row with the nights that missed, and its JSON holds them under
    no_longer_holds."""
    out = _review(tmp_path, 0.5, {"target_fingerprint": FP, "draft_fingerprint": DFP})
    assert "calibration pair" in out["md"] and "stale" in out["md"]
    assert "measured acceptance 0.50 on code at width 4" in out["md"]
    assert "measured its known win" not in out["md"]  # the headline: page.headline
    [s] = json.loads(out["json"])["series"]
    assert len(s["calibration"]["no_longer_holds"]) == 3


def test_a_pair_whose_node_hid_its_target_is_marked_unverified_on_the_page(tmp_path):
    """Fixed by this audit (identity_holds): with no target fingerprint reported, the page
    called the pair a plain, clean calibration pair; it says unverified, and why, now."""
    out = _review(tmp_path, 1.0, {"target_fingerprint": None, "draft_fingerprint": DFP})
    assert "unverified" in out["md"] and "no target fingerprint" in out["md"], out["md"]


def test_a_stale_pairs_headline_does_not_call_its_win_known(tmp_path):
    """Fixed by this audit (page.headline): a pair measuring 1.0 on a node whose target is
    not the record's (sha256:ttt…, the record's sha256:aaa…) is "calibration pair, stale"
    in its row, yet the headline above said "the calibration pair measured its known win".
    It says the pair is stale now."""
    out = _review(tmp_path, 1.0, {"draft_fingerprint": DFP})
    assert "calibration pair, stale" in out["md"]
    assert "measured its known win" not in out["md"]
    assert "the calibration pair is stale" in out["md"]
