"""Audit 41b: `compare`'s busy nights set aside from their side's level (5559cef, 35e42b9:
compare.night_ratio / _Busy / _side_variance, MIN_QUIET; busy_nights._centre, MIDDLE_FROM;
nightmemory.mean_gain_at), attacked as a statistician and as a hostile store.

Pairs are drawn as tests/test_audit_27b.py draws them (one node's two weeks, one stationary
AR(1) series of log levels, σ 5%, numpy, fixed seeds; ``_weeks``, ``_busy``, ``_score``
imported from there). Issue 27's targets: false claims (p < 0.01 and the interval off 1.0)
≤ 6%, the 95% interval covering the truth ≥ 93%. "Before" is the rule at 620eda9 (busy
nights read for φ only, never set aside from the level), measured on the same draws. A
strict xfail is a finding that fails today (its reason: severity, what was measured); a
plain test is a guard that held.
"""

from __future__ import annotations

import ast
import json
import math
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.compare import SIGNIFICANT_P, _busy_nights, night_ratio
from tests.test_audit_27b import BUSY, _ar1, _busy, _score, _weeks

ROOT = Path(__file__).resolve().parents[1]
W19 = datetime(2026, 5, 4, 2, tzinfo=timezone.utc)


def _rates(logs: np.ndarray) -> list[float]:
    return list(100 * np.exp(logs))


@cache
def _intermittent(factor: float, share: float = 0.3, n: int = 20, phi: float = 0.5,
                  pairs: int = 300, seed: int = 4101) -> dict[str, float]:
    """B ``factor``× on ``share`` of its ``n`` nights (a real property of the new version,
    e.g. a kernel that is slow on some prompts' nights), A quiet: the share of pairs the
    difference is claimed in, the interval covering the true ratio of geometric means,
    B's row marked (nights set aside), and the median ratio reported."""
    rng = np.random.default_rng(seed)
    a, b = _weeks(rng, pairs, n, phi)
    k = round(share * n)
    for row in b:
        row[rng.choice(n, k, replace=False)] += math.log(factor)
    truth = factor ** (k / n)
    found = covered = marked = 0
    ratios = []
    for la, lb in zip(a, b):
        r = night_ratio(_rates(la), _rates(lb))
        found += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= truth <= r["ci"][1]
        marked += bool(r.get("busy") and r["busy"][1])
        ratios.append(r["ratio"])
    return {"found": found / pairs, "covered": covered / pairs, "marked": marked / pairs,
            "ratio": float(np.median(ratios)), "truth": truth}


# -- 1. a real change that looks like busy nights ----------------------------------------------

def test_an_intermittent_regression_keeps_its_size():
    """Was medium: B 0.7x (or 1.3x) on 6 of its 20 nights, set aside as busy nights, read
    at the quiet level alone: 69.3% (85.7%) covered. Now the interval spans the reading
    with them kept as well (compare.night_ratio's ``all_nights``)."""
    for factor in (0.7, 1.3):
        got = _intermittent(factor)
        assert got["covered"] >= 0.93, (factor, got)


def test_an_intermittent_regression_is_marked_on_its_row():
    """Guard: where the 0.7x nights are set aside the row says so: B's busy nights listed on
    99.3% of pairs (≥ 95%); the 1.3x nights on 88.3%: a speed-up on some nights is set
    aside as a spike up too, not kept as a level. At half of B's nights slow nothing is set
    aside (they are the level) and the 0.837 is found in 61.3% of pairs, as at 620eda9."""
    assert _intermittent(0.7)["marked"] >= 0.95
    assert _intermittent(1.3)["marked"] >= 0.75
    half = _intermittent(0.7, share=0.5)
    assert half["found"] >= 0.55 and half["covered"] >= 0.93, half


# -- 2. where the marker could go missing --------------------------------------------------------

@pytest.fixture(scope="module")
def four_metrics(tmp_path_factory):
    """One node, twelve nights on mlx-lm 0.32.2 and twelve on 0.33.0 (two days between),
    φ 0.5, σ 3%, one busy night per metric on a night of its own: decode 0.7x on A's 4th
    night, ttft 1.5x on A's 6th, itl p95 1.5x on B's 4th, acceptance 0.7x on B's 7th; and a
    hostile night: A's 2nd decode 0.0 and A's 3rd ttft 0.0 (no positive rate: dropped by
    night_ratio, so busy indices must skip them to name the right night)."""
    from orchestrator.store import open_store
    from tests.history import config_values, night
    from tests.store_templates import fresh_sqlite

    url = fresh_sqlite(tmp_path_factory.mktemp("a41b") / "s.db")
    store = open_store(url)
    x = _ar1(np.random.default_rng(4120), 4, 24, 0.5, sd=0.03)
    base = {"decode_tok_s": 100.0, "ttft_ms": 50.0, "itl_p95_ms": 20.0, "acceptance_rate": 0.6}
    busy = {"decode_tok_s": (3, 0.7), "ttft_ms": (5, 1.5), "itl_p95_ms": (15, 1.5),
            "acceptance_rate": (18, 0.7)}
    vals = {}
    for (metric, (at, f)), row in zip(busy.items(), x):
        vals[metric] = base[metric] * np.exp(row)
        vals[metric][at] *= f
    vals["decode_tok_s"][1] = vals["ttft_ms"][2] = 0.0
    days = [d + (2 if d >= 12 else 0) for d in range(24)]
    for i, d in enumerate(days):
        night(store, W19 + timedelta(days=d), node="n1", chip="Apple M2 Max", pair="p",
              workload="code", identity={"mlx_lm_version": "0.32.2" if i < 12 else "0.33.0"},
              configs={("speculative", 3): config_values(
                  float(vals["decode_tok_s"][i]), 3, acceptance=float(vals["acceptance_rate"][i]),
                  ttft=float(vals["ttft_ms"][i]), itl_p95=float(vals["itl_p95_ms"][i]),
                  jitter=0.0)})
    want = {m: ("A" if at < 12 else "B", f"n1 {(W19 + timedelta(days=days[at])).date()}")
            for m, (at, _) in busy.items()}
    return url, want


def test_every_metrics_row_names_its_busy_night(four_metrics, tmp_path):
    """Guard: decode, ttft, itl p95 and acceptance rows each list their planted busy night in
    the JSON (`compare --json`), the text (the row's count and a BUSY NIGHTS SET ASIDE line)
    and the page ('(1 busy night in B set aside)', the nights in its title), past a night
    whose rate is 0 (the index into the positive nights maps to the right date)."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    url, want = four_metrics
    args = ["compare", "node=n1,mlx_lm_version=0.32.2", "node=n1,mlx_lm_version=0.33.0",
            "--db", url]
    rows = {r["metric"]: r for r in json.loads(
        CliRunner().invoke(main, [*args, "--json"]).stdout)["rows"]}
    text = CliRunner().invoke(main, args).stdout
    page = tmp_path / "c.html"
    CliRunner().invoke(main, [*args, "--out", str(page)])
    html = page.read_text()
    for metric, (side, label) in want.items():
        listed = rows[metric]["busy"][side]
        assert label in listed, (metric, rows[metric]["busy"])
        assert f"BUSY NIGHTS SET ASIDE {side} code speculative k=3 {metric}: {len(listed)} " \
               f"({', '.join(listed)})" in text, text
        n = len(listed)
        assert f"({n} busy night{'s' if n > 1 else ''} in {side} set aside)" in html
        assert f'title="{", ".join(listed)}: far off' in html


def test_only_compare_reads_memory_and_busy_nights():
    """Guard: night_ratio with memory on (the only path that sets busy nights aside) is
    called by compare alone; every other caller (through_noise's trials) passes
    memory=False, and compare's rows feed only the CLI (no export, otel, webhook or weekly
    review imports review.compare.compare): no row elsewhere can drop the marker."""
    for path in (ROOT / "orchestrator").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "night_ratio" \
                    and rel != "orchestrator/review/compare.py":
                kw = {k.arg: k.value for k in node.keywords}
                assert isinstance(kw.get("memory"), ast.Constant) \
                    and kw["memory"].value is False, (rel, node.lineno)
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("compare") \
                    and any(a.name == "compare" for a in node.names):
                assert rel == "orchestrator/cli/results.py", rel


def test_busy_indices_skip_nights_without_a_positive_rate():
    """Guard: nights of rate 0, NaN, inf or below zero are dropped by night_ratio and by
    compare._busy_nights alike, so the busy night (0.6x, night 9 of 14) is named, wherever
    the unrated nights fall before it."""
    rng = np.random.default_rng(4121)
    base = list(100 * np.exp(0.02 * rng.standard_normal(14)))
    base[9] *= 0.6
    b = list(100 * np.exp(0.02 * rng.standard_normal(14)))
    for bad in (0.0, math.nan, math.inf, -5.0):
        a = base[:3] + [bad] + base[3:6] + [bad] + base[6:]
        na = [(f"night {i}", v) for i, v in enumerate(a)]
        r = night_ratio(a, b)
        got = _busy_nights(r.get("busy"), na, [(f"b {i}", v) for i, v in enumerate(b)])
        assert got["A"] == [f"run night {a.index(base[9])}"], (bad, got)


# -- 3. edges ----------------------------------------------------------------------------------

def test_min_quiet_boundary_holds_the_targets():
    """Guard: one busy night in A, five and six nights a side (four quiet: its excess counted
    as noise, never marked: 0 of 60; five quiet: set aside, marked 46 and 57 of 60), φ 0 and
    0.9, 300 pairs (seed 4102): ≤ 1.0% false claims, ≥ 97.7% covered on both sides of
    MIN_QUIET."""
    rng = np.random.default_rng(4102)
    for n in (5, 6):
        for phi in (0.0, 0.9):
            a, b = _weeks(rng, 300, n, phi)
            _busy(rng, a, 1)
            marked = sum(bool(night_ratio(_rates(x), _rates(y)).get("busy"))
                         for x, y in zip(a[:60], b[:60]))
            claims, cover = _score(a, b)
            assert claims <= 0.06 and cover >= 0.93, (n, phi, claims, cover)
            assert (marked == 0) if n == 5 else (marked >= 30), (n, phi, marked)


def test_middle_from_boundary_holds_the_targets_on_quiet_nights():
    """Guard: no busy night, nine and ten nights a side (mean centring, middle-half
    centring), φ 0.9, 1,000 pairs (seed 4130): 3.0% / 2.7% false claims, 93.4% / 94.4%
    covered. Seeds 4130-4133, nine, ten and twelve nights: 91.9-94.7% covered (mean 93.5%),
    each within 0.2 points of 620eda9 on the same draws: the boundary moves nothing on
    quiet nights (5-7% of them mark a night busy there)."""
    for n in (9, 10):
        claims, cover = _score(*_weeks(np.random.default_rng(4130), 1000, n, 0.9))
        assert claims <= 0.06 and cover >= 0.93, (n, claims, cover)


def test_a_busy_week_of_twelve_nights_is_covered():
    """Was low: twelve nights a side, a busy week at φ 0.9, 92.05% covered."""
    hits = total = 0
    for seed in (4110, 4111):
        rng = np.random.default_rng(seed)
        a, b = _weeks(rng, 1000, 12, 0.9)
        a += np.where(rng.random(a.shape) < 0.2, BUSY, 0.0)
        hits += 1000 * _score(a, b)[1]
        total += 1000
    assert hits / total >= 0.93, hits / total


@pytest.mark.xfail(strict=True, reason=(
    "low: the marker flags quiet nights: no busy night at all, phi 0, ten nights a side: a "
    "night listed as set aside in 11.7% of 600 pairs (seed 4103); 12.2% / 11.7% of 1,000 at "
    "ten nights and 12.5% / 10.8% at twenty (seeds 4103 / 4104) against 5.6-6.7% at eight "
    "and nine (the middle-half centring from MIDDLE_FROM doubles it; busy_nights' docstring "
    "states 6.0% at eight). Four metrics a row each: were their flags independent, ~40% of "
    "unchanged configs would show a BUSY NIGHTS SET ASIDE line. Coverage holds (97-98%)"))
def test_quiet_nights_are_rarely_marked_busy():
    rng = np.random.default_rng(4103)
    for n in (10, 20):
        a, b = _weeks(rng, 600, n, 0.0)
        marked = sum(bool(night_ratio(_rates(x), _rates(y)).get("busy")) for x, y in zip(a, b))
        assert marked / 600 <= 0.06, (n, marked / 600)


def test_busy_nights_at_both_ends_and_lopsided_sides_hold_the_targets():
    """Guard (300 pairs each, seed 4107): A's first and last nights both busy, ten and
    twenty nights, φ 0 and 0.9 (end nights read from one neighbour): 96.0-100% covered,
    ≤ 0.7% claims; five nights against thirty, a busy night in the five (four quiet: kept
    as noise) and three in the thirty, either way round: 100%, no claim; two nodes apart,
    twenty nights, a busy week in A at φ 0.9: 94.7%, 3.0% claims (another draw: 95.2%,
    1.5%, where 620eda9 covered 84.2% with 6.0% claims)."""
    rng = np.random.default_rng(4107)
    for n in (10, 20):
        for phi in (0.0, 0.9):
            a, b = _weeks(rng, 300, n, phi)
            a[:, [0, -1]] += BUSY
            claims, cover = _score(a, b)
            assert claims <= 0.06 and cover >= 0.93, ("ends", n, phi, claims, cover)
    for phi in (0.0, 0.9):
        x = _ar1(rng, 300, 37, phi)
        a, b = x[:, :5].copy(), x[:, 7:].copy()
        _busy(rng, a, 1)
        _busy(rng, b, 3)
        for pair in ((a, b), (b, a)):
            claims, cover = _score(*pair)
            assert claims <= 0.06 and cover >= 0.93, ("5v30", phi, claims, cover)
    a, b = _ar1(rng, 300, 20, 0.9), _ar1(rng, 300, 20, 0.9)
    a += np.where(rng.random(a.shape) < 0.2, BUSY, 0.0)
    claims, cover = _score(a, b, apart=True)
    assert claims <= 0.06 and cover >= 0.93, ("apart", claims, cover)


def test_a_side_of_equal_nights_beside_a_busy_one():
    """Guard: A's ten nights all equal against B's noisy ten with a 0.6x night: a finite
    ratio, an interval of positive width, B's spike named; both sides all equal: the ratio
    with a zero-width interval (a spread measured as none), nothing set aside."""
    b = list(100 * np.exp(0.03 * np.random.default_rng(4122).standard_normal(10)))
    b[4] *= 0.6
    r = night_ratio([100.0] * 10, b)
    assert r["busy"] == [[], [4]] and r["ci"][0] < r["ratio"] < r["ci"][1], r
    r = night_ratio([100.0] * 10, [101.0] * 10)
    assert r["ci"] == [pytest.approx(1.01)] * 2 and "busy" not in r, r


def test_tied_nights_give_no_zero_width_interval():
    """Was medium: tied nights left busy_nights a σ of rounding (1e-16), an odd night set
    aside 1e14 σ off and a zero-width 'B better'; the unit decided the verdict."""
    a, b = [0.55] + [0.62] * 9, [0.63] * 10
    rs = [night_ratio([c * x for x in a], [c * x for x in b]) for c in (1.0, 0.001, 1000.0)]
    assert rs[0]["ci"][1] > rs[0]["ci"][0], rs[0]
    assert all(r["ci"] == pytest.approx(rs[0]["ci"], rel=1e-6) for r in rs), rs
    x, y = _weeks(np.random.default_rng(4105), 300, 10, 0.5)
    zero = 0
    for la, lb in zip(x, y):
        sa, sb = (list(np.round(0.62 * np.exp(v / 10) / 0.01) * 0.01) for v in (la, lb))
        r = night_ratio(sa, sb)
        zero += r["ci"][0] == r["ci"][1] and len(set(sa)) + len(set(sb)) > 2
    assert zero == 0, zero


# -- 4. properties -----------------------------------------------------------------------------

@st.composite
def _side(draw, least: int = 3) -> list[float]:
    """Nights around 100 (±8% in logs, no two within 0.01% of each other: ties are
    test_tied_nights_give_no_zero_width_interval's), up to three of them 0.7x."""
    n = draw(st.integers(least, 14))
    dev = draw(st.lists(st.integers(-800, 800), min_size=n, max_size=n, unique=True))
    xs = [100 * math.exp(d / 10_000) for d in dev]
    for i in draw(st.lists(st.integers(0, n - 1), max_size=3)):
        xs[i] *= 0.7
    return xs


@settings(max_examples=120, deadline=None)
@given(a=_side(), b=_side(), apart=st.booleans())
def test_swapping_the_sides_inverts_the_ratio_interval_and_busy_nights(a, b, apart):
    """Guard (1,500 examples explored, none failed): B/A from (b, a) is 1 / (A/B) to 1e-9,
    its interval the other's inverted, the same p, each side's busy nights its own."""
    r, s = night_ratio(a, b, apart=apart), night_ratio(b, a, apart=apart)
    assert r["ratio"] * s["ratio"] == pytest.approx(1.0, rel=1e-9)
    assert (r.get("busy") or [[], []]) == (s.get("busy") or [[], []])[::-1]
    if r["ci"] is not None:
        assert r["ci"][0] * s["ci"][1] == pytest.approx(1.0, rel=1e-9)
        assert r["ci"][1] * s["ci"][0] == pytest.approx(1.0, rel=1e-9)
        assert r["p"] == pytest.approx(s["p"], rel=1e-9, abs=1e-15)


@settings(max_examples=120, deadline=None)
@given(a=_side(), b=_side(), c=st.sampled_from([1e-3, 0.37, 7.3, 1e4]))
def test_rescaling_every_night_changes_nothing(a, b, c):
    """Guard, for nights that do not tie (those that do fail:
    test_tied_nights_give_no_zero_width_interval): tok/s or tok/ms, the same ratio,
    interval, p and busy nights."""
    r, s = night_ratio(a, b), night_ratio([c * x for x in a], [c * x for x in b])
    assert s["ratio"] == pytest.approx(r["ratio"], rel=1e-9)
    assert s.get("busy") == r.get("busy")
    if r["ci"] is not None:
        assert s["ci"] == pytest.approx(r["ci"], rel=1e-7)


def test_a_busy_night_added_narrows_the_interval_little():
    """Guard: a night of f x A's lowest (f 0.3-0.75) added at A's start or end and set
    aside, A's quiet nights unchanged, both sides 5-14 quiet nights (±8%), one or two nodes
    (1,500 draws, seed 4140; 1,500 of 5,898 kept in a longer run of seed 7): no interval
    narrower than 0.75 of its log width without the night, 99% at least 0.9 (seed 7: one
    of 5,898 below, 0.83). The trimming explains no narrowing (A's level and spread are
    its quiet nights'); what there is comes from which of A's other nights the spike
    unflags (a normal night flagged with four quiet left counts as noise on three df) or
    from B's busy nights, which A's nights help decide
    (test_a_busy_night_in_a_decides_bs_level; Hypothesis also found 0.43, φ 0.82 read
    without a flagged normal first night, 0.0 once the spike unflagged it)."""
    rng = np.random.default_rng(4140)
    widths = []
    for _ in range(1500):
        a, b = (list(100 * np.exp(rng.uniform(-0.08, 0.08, rng.integers(5, 15))))
                for _ in range(2))
        first, apart = bool(rng.integers(2)), bool(rng.integers(2))
        extra = min(a) * rng.uniform(0.3, 0.75)
        r = night_ratio(a, b, apart=apart)
        u = night_ratio([extra, *a] if first else [*a, extra], b, apart=apart)
        if r["ci"] and u["ci"] and (u.get("busy") or [[]])[0] == [0 if first else len(a)]:
            w0, w1 = (math.log(x["ci"][1] / x["ci"][0]) for x in (r, u))
            widths.append(w1 / w0)
    assert len(widths) > 1000 and min(widths) >= 0.75, (len(widths), min(widths))
    assert np.mean(np.asarray(widths) >= 0.9) >= 0.99


@pytest.mark.xfail(strict=True, reason=(
    "low: A's nights decide which of B's are set aside (one robust sigma, one centre per "
    "side's mean below MIDDLE_FROM): B six nights with a 0.343x night; without A's extra "
    "night B's +8% neighbour is flagged with it, four quiet remain (< MIN_QUIET), the spike "
    "counts as noise: 0.861, 0.483-1.532; adding a 0.6x night to A (set aside, A's quiet "
    "nights unchanged) leaves B's spike alone flagged and set aside: 1.034, 0.972-1.100, "
    "the interval 9.4x narrower in log width (B's spike out: 0.985-1.085)"))
def test_a_busy_night_in_a_decides_bs_level():
    a = [104.60380676165471, 100.0, 100.0000100000005, 96.23380234087527, 108.32870676749586,
         95.59620099518905, 96.15705670756306, 97.58317160461021, 100.0]
    b = [100.0, 108.08673765132555, 103.27630958710681, 104.64371328918116, 34.3,
         99.87397658535853]
    r, u = night_ratio(a, b), night_ratio([*a, min(a) * 0.6], b)
    assert (r.get("busy") or [[], []])[1] == u["busy"][1], (r, u)
