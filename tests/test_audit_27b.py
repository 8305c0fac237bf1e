"""Audit 27b: `compare`'s busy nights (review/busy_nights.py, nightmemory.read_memory,
compare._busy_part/_side_variance) and the change points' first level of three nights
(changepoints._head, MIN_HEAD of b4710c7, reverted for the two findings it made) against
truths planted here.

Every pair is one node's two weeks drawn as one stationary AR(1) series of log levels (σ 5%)
with the weekend's two nights between them (numpy, vectorised over pairs, fixed seeds); a
busy night is that night × 0.7. The truth is the ratio of the sides' true geometric means
(1.0 unless a change is planted: then the change averaged over the side's nights). Issue
27's targets: false claims (p < 0.01 and the interval off 1.0, as compare claims) ≤ 6%, the
95% interval covering the truth ≥ 93%. "Before" figures were measured on the same draws with
the code of 79cec96 (no busy nights) and 6a2c93c (busy nights read for φ only). A test
marked xfail(strict) is a finding that fails today (its reason: severity, what was measured,
seed, count); a plain one is a guard that held.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BUSY = math.log(0.7)
W19 = datetime(2026, 5, 4, 2, tzinfo=timezone.utc)  # Monday of 2026-W19, 02:00 UTC


def _ar1(rng: np.random.Generator, pairs: int, n: int, phi: float, sd: float = 0.05,
         t3: bool = False) -> np.ndarray:
    """``pairs`` stationary AR(1) series of ``n`` log levels (σ ``sd``; Student's t with 3 df
    scaled to that σ where ``t3``)."""
    e = rng.standard_t(3, (pairs, n)) / math.sqrt(3) if t3 else rng.standard_normal((pairs, n))
    x = np.empty((pairs, n))
    x[:, 0] = sd * e[:, 0]
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + sd * math.sqrt(1 - phi * phi) * e[:, i]
    return x


def _weeks(rng: np.random.Generator, pairs: int, n: int, phi: float,
           t3: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """One node's week A and week B (``n`` nights each, two unmeasured nights between)."""
    x = _ar1(rng, pairs, 2 * n + 2, phi, t3=t3)
    return x[:, :n].copy(), x[:, n + 2:].copy()


def _busy(rng: np.random.Generator, side: np.ndarray, k: int) -> None:
    """``k`` distinct random nights of each row busy (× 0.7)."""
    for row in side:
        row[rng.choice(side.shape[1], k, replace=False)] += BUSY


def _score(a: np.ndarray, b: np.ndarray, truth: float | np.ndarray = 1.0,
           apart: bool = False) -> tuple[float, float]:
    """(false-claim or power rate, coverage of ``truth``) of night_ratio over the rows."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    truths = np.broadcast_to(np.asarray(truth, dtype=float), (len(a),))
    claims = covered = 0
    for la, lb, t in zip(a, b, truths):
        r = night_ratio(list(100 * np.exp(la)), list(100 * np.exp(lb)), apart=apart)
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= t <= r["ci"][1]
    return claims / len(a), covered / len(a)


# -- busy nights: a real change is not one ----------------------------------------------------

def test_a_real_change_inside_a_week_is_not_hidden_as_busy_nights():
    """Guard: twenty nights a side at φ 0.9 (400 pairs, seed 2727). A 15% step on B's night
    10, a drift to 0.8× across B, a 20% drop on B's last night only: the interval covers
    the change averaged over B's nights (measured 100%, 99.5%, 94.25%; the last 98.75% at
    79cec96, 95.25% with busy nights' excess counted as noise, not set aside). A 15%
    regression that began on A's last night (an end night, read as busy, set aside) is
    found in 58.25% of pairs at φ 0.9 and 73.75% at φ 0.5 (79cec96: 37.0%, 72.0%;
    6a2c93c: 32.0%, 69.5%), its interval covering the truth 94.5% / 97.0%."""
    rng = np.random.default_rng(2727)
    pairs, n = 400, 20
    for name, shape in (("step", np.r_[np.zeros(10), np.full(10, math.log(0.85))]),
                        ("drift", np.linspace(0, math.log(0.8), n)),
                        ("last night", np.r_[np.zeros(n - 1), math.log(0.8)])):
        a, b = _weeks(rng, pairs, n, 0.9)
        _, cover = _score(a, b + shape, math.exp(shape.mean()))
        assert cover >= 0.93, (name, cover)
    for phi, least in ((0.9, 0.5), (0.5, 0.6)):
        a, b = _weeks(rng, pairs, n, phi)
        a[:, -1] += math.log(0.85)
        found, cover = _score(a, b + math.log(0.85), 0.85 ** ((n - 1) / n))
        assert found >= least and cover >= 0.93, (phi, found, cover)


def test_a_true_difference_beside_busy_nights_keeps_its_power():
    """Guard: a true 10% and 15% slowdown over twenty nights at φ 0.5, one busy night a week
    on each side (600 pairs, seed 2728): found in 54.0% and 85.7% since busy nights are
    set aside (37.8% and 84.2% counted as noise; 6a2c93c, the spike in the spread: 8.0%,
    41.0%), the interval covering the true ratio 97.7%. (15%: below what 79cec96 found:
    test_busy_nights_cost_power_where_memory_is_moderate.)"""
    for (ratio, least), (found, cover) in zip(((0.9, 0.3), (0.85, 0.7)),
                                              _slowdowns_beside_busy_nights()):
        assert found >= least and cover >= 0.93, (ratio, found, cover)


def _slowdowns_beside_busy_nights() -> list[tuple[float, float]]:
    """(found, covered) for a true 0.9x and 0.85x over twenty nights at φ 0.5, one busy
    night a week on each side (600 pairs each, seed 2728)."""
    rng, out = np.random.default_rng(2728), []
    for ratio in (0.9, 0.85):
        a, b = _weeks(rng, 600, 20, 0.5)
        _busy(rng, a, 1)
        _busy(rng, b, 1)
        out.append(_score(a, b + math.log(ratio), ratio))
    return out


@pytest.mark.xfail(strict=True, reason=(
    "low: power lost where memory is moderate and the old interval already covered: a true "
    "10% / 15% slowdown, twenty nights a side at phi 0.5, one busy night a week each: found "
    "in 54.0% / 85.7% of 600 pairs (seed 2728; 37.8% / 84.2% before busy nights were set "
    "aside from the level) where 79cec96 (no busy nights sought) found "
    "44.7% / 92.5% while covering 99.8% / 99.3% (seed 2727, 1,000 pairs: 39.5% / 82.9% v "
    "48.0% / 91.4%). phi is the larger of two bounds (with and without the busy nights), "
    "so their finding only ever widens; at phi 0 power rose (81.0% v 66.4% for 10%)"))
def test_busy_nights_cost_power_where_memory_is_moderate():
    for (ratio, before), (found, _) in zip(((0.9, 0.447), (0.85, 0.925)),
                                           _slowdowns_beside_busy_nights()):
        assert found >= before - 0.02, (ratio, found)


# -- busy nights: where they fall, how many, how few nights ------------------------------------

def test_two_busy_nights_in_one_week_hold_the_targets():
    """Guard: twenty nights a side at φ 0.9 (600 pairs, seed 2729). Two busy nights in each
    week: 2.5% false claims, 94.7% covered (no claim, 98.5%, with their excess counted as
    noise; set aside with the quiet nights' own spread, not winsorized: 92.2%, the same
    nights without busy ones 92.8%); two in week A and none in B: 2.0%, 94.5% (80.0% at
    79cec96), two adjacent ones in A: 0.2%, 98.8%."""
    rng = np.random.default_rng(2729)
    for name, k_a, k_b in (("two each", 2, 2), ("two in A", 2, 0)):
        a, b = _weeks(rng, 600, 20, 0.9)
        _busy(rng, a, k_a)
        _busy(rng, b, k_b)
        claims, cover = _score(a, b)
        assert claims <= 0.06 and cover >= 0.93, (name, claims, cover)
    a, b = _weeks(rng, 600, 20, 0.9)
    for row, at in zip(a, rng.integers(0, 19, 600)):
        row[at:at + 2] += BUSY
    claims, cover = _score(a, b)
    assert claims <= 0.06 and cover >= 0.93, ("adjacent", claims, cover)


def test_three_busy_nights_in_one_week_and_none_in_the_other_are_covered():
    """Audit 27b (medium), closed: three busy nights (0.7x) in week A of twenty and none in
    B, no change: the interval covered 1.0 in 90.6% of 1,000 pairs at φ 0.9 and 92.1% at
    φ 0.5 (seed 2730; false claims 2.5% / 0.8%): each busy night's excess entered the
    variance once (excess/n²) while its deviation moved the mean. Busy nights are now set
    aside from the level (side_level.side_variance: the quiet nights' mean, its spread
    winsorized): 95.8% / 98.0%, 1.2% / 0.6%."""
    for phi, claims, cover in _busy_week_scores(2730, lambda rng, a: _busy(rng, a, 3)):
        assert claims <= 0.06 and cover >= 0.93, (phi, claims, cover)


def _busy_week_scores(seed: int, make_busy) -> list[tuple[float, float, float]]:
    """(φ, false claims, coverage) at φ 0.9 and 0.5: 1,000 pairs of twenty nights a side,
    week A made busy by ``make_busy(rng, a)`` (in place), B quiet, no change."""
    rng, out = np.random.default_rng(seed), []
    for phi in (0.9, 0.5):
        a, b = _weeks(rng, 1000, 20, phi)
        make_busy(rng, a)
        out.append((phi, *_score(a, b)))
    return out


def test_a_busy_week_against_a_quiet_week_is_no_difference():
    """Audit 27b (medium), closed: each of A's twenty nights busy (0.7x) with probability
    0.2, none in B, no change: 10.6% false claims at φ 0.9 and 6.9% at φ 0.5 (1,000 pairs,
    seed 2731), 77.7% / 80.1% covered: a busy night counted as noise in the mean it moved.
    Set aside from the level, and sought again across the gaps found ones leave (two side
    by side) from a centre a busy quarter cannot move (busy_nights._centre): 3.4% / 2.2%,
    93.5% / 94.6% covered. Set aside without those two, 8.9% / 6.0%."""
    def busy_week(rng, a):
        a += np.where(rng.random(a.shape) < 0.2, BUSY, 0.0)

    for phi, claims, cover in _busy_week_scores(2731, busy_week):
        assert claims <= 0.06, (phi, claims, cover)


def test_a_busy_night_at_a_weeks_edge_holds_the_targets():
    """Guard: one busy night at the first night of both weeks, at the last of both, and at
    A's last and B's first (beside the weekend: the end-night test reads each from one
    neighbour), twenty and seven nights a side at φ 0.9 (400 pairs each, seed 2732):
    measured 98.75%, 97.5%, 98.25% covered at twenty, 100% at seven; ≤ 0.75% false
    claims."""
    rng = np.random.default_rng(2732)
    for n in (20, 7):
        for name, at_a, at_b in (("first", 0, 0), ("last", -1, -1), ("weekend", -1, 0)):
            a, b = _weeks(rng, 400, n, 0.9)
            a[:, at_a] += BUSY
            b[:, at_b] += BUSY
            claims, cover = _score(a, b)
            assert claims <= 0.06 and cover >= 0.93, (n, name, claims, cover)


def test_sides_of_four_to_six_nights_with_a_busy_night_hold_the_targets():
    """Guard: four to six nights a side at φ 0.5 and 0.9, one busy night in each week or in
    A only (300 pairs each, seed 2733): no false claim, 99.7-100% covered. (Their power is
    small: a true 20% with a busy night a week is found in 0-0.9% at five or six nights, as
    before busy nights were sought; eight nights 26.6%, 17.7% before; seed 2727.)"""
    rng = np.random.default_rng(2733)
    for n in (4, 5, 6):
        for phi in (0.5, 0.9):
            for k_b in (1, 0):
                a, b = _weeks(rng, 300, n, phi)
                _busy(rng, a, 1)
                _busy(rng, b, k_b)
                claims, cover = _score(a, b)
                assert claims <= 0.06 and cover >= 0.93, (n, phi, k_b, claims, cover)


def test_heavy_tailed_nights_without_busy_nights_hold_the_targets():
    """Guard: Student's t (3 df) nights, no busy night, φ 0.9, five, eight and twenty
    nights a side (1,000 pairs, seed 2727): 93.4%, 93.5%, 94.9% covered (other seeds
    93.2-94.9%), ≤ 3.6% false claims; a tail night is read as busy about as often as the
    t's tail passes 3.5 robust σ and the interval is no narrower for it than before
    (93.5%, 93.4%, 93.8% at 79cec96). Held, narrowly: set aside from four quiet nights
    (five a side, side_level.MIN_QUIET) 92.7%; set aside with the quiet nights' own spread,
    not winsorized, 93.4% / 93.0% / 94.3%."""
    rng = np.random.default_rng(2727)
    for n in (5, 8, 20):
        a, b = _weeks(rng, 1000, n, 0.9, t3=True)
        claims, cover = _score(a, b)
        assert claims <= 0.06 and cover >= 0.93, (n, claims, cover)


# -- through the real ingest and `specfleet compare` ------------------------------------------

def _plant(store, node: str, days: list[int], logs: np.ndarray, version: str) -> list[float]:
    """Nightly sweeps of ``node`` on ``days`` (after Monday of W19), decode at 100 × e^log
    (three equal repetitions: the night's median is the planted level); returns the levels."""
    from tests.history import config_values, night

    levels = [float(100 * math.exp(x)) for x in logs]
    for d, level in zip(days, levels):
        night(store, W19 + timedelta(days=d), node=node, chip="Apple M2 Max", pair="p",
              workload="code", identity={"mlx_lm_version": version},
              configs={("baseline", 0): config_values(level, 3, jitter=0.0)})
    return levels


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``reg``: twenty nights on mlx-lm 0.32.2, twenty on 0.33.0 25% slower, busy nights on
    the last night before the upgrade, the first after it and B's tenth (φ 0.5: so planted,
    such a regression is found in 99.7% of 600 draws, 15% in 84.8%). ``same``:
    forty nights, no change, two busy nights in the first twenty. ``wk-NN``: thirty nodes,
    W19 and W20 Monday to Sunday, no change, φ 0.9, busy on W19's Sunday and W20's Monday."""
    from orchestrator.store import open_store
    from tests.store_templates import fresh_sqlite

    url = fresh_sqlite(tmp_path_factory.mktemp("a27b") / "s.db")
    store = open_store(url)
    rng = np.random.default_rng(2734)
    x = _ar1(rng, 2, 40, 0.5)
    x[0, 20:] += math.log(0.75)
    x[0, [19, 20, 30]] += BUSY
    x[1, [5, 13]] += BUSY
    sides = {}
    for node, row in (("reg", x[0]), ("same", x[1])):
        sides[node] = (_plant(store, node, list(range(20)), row[:20], "0.32.2"),
                       _plant(store, node, list(range(20, 40)), row[20:], "0.33.0"))
    weeks = _ar1(rng, 30, 14, 0.9)
    weeks[:, [6, 7]] += BUSY
    for i, row in enumerate(weeks):
        _plant(store, f"wk-{i:02d}", list(range(14)), row, "0.32.2")
    return url, store, sides


def test_compare_through_the_ingest_reads_busy_nights_as_night_ratio_does(planted):
    """Guard: `specfleet compare` on a store planted through the real ingest. Its row is
    night_ratio on the planted nights (so the direct measurements above are the CLI's); a
    real 25% regression with busy nights on both sides of the upgrade is "B worse" with an
    interval covering 0.75; two busy nights in one of two unchanged versions claim nothing;
    thirty nodes' weeks with a busy night either side of the weekend: no false claim, 30/30
    covered (a claim would be one in thirty: the target allows one)."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.review.compare import compare, night_ratio

    url, store, sides = planted
    for node, verdict in (("reg", "B worse"), ("same", "same within noise")):
        r = CliRunner().invoke(main, ["compare", f"node={node},mlx_lm_version=0.32.2",
                                      f"node={node},mlx_lm_version=0.33.0", "--db", url,
                                      "--json"])
        assert r.exit_code == 0, r.output
        (row,) = [x for x in json.loads(r.stdout)["rows"] if x["metric"] == "decode_tok_s"]
        want = night_ratio(*sides[node], apart=False)
        assert row["apart"] is False and row["ratio"] == pytest.approx(want["ratio"])
        assert row["ci"] == pytest.approx(want["ci"]) and row["p"] == pytest.approx(want["p"])
        assert row["verdict"] == verdict, row
        truth = 0.75 if node == "reg" else 1.0
        assert row["ci"][0] <= truth <= row["ci"][1], row
    claims = covered = 0
    for i in range(30):
        c = compare(store, f"node=wk-{i:02d},week=2026-W19", f"node=wk-{i:02d},week=2026-W20")
        (row,) = [x for x in c["rows"] if x["metric"] == "decode_tok_s"]
        claims += row["verdict"] in ("B better", "B worse")
        covered += row["ci"][0] <= 1.0 <= row["ci"][1]
    assert claims <= 1 and covered >= 28, (claims, covered)


def test_compare_says_which_busy_nights_it_set_aside(planted, tmp_path):
    """Guard: a busy night set aside from a side's level is never silent: the JSON row lists
    each side's by night ('node date'), the text's row counts them and a line names them,
    and the page's row says so in Chromium, the nights on hover (planted: "same" A's nights
    5 and 13; "reg" A's last night, B's first and tenth)."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.browser import dump_dom
    from tests.test_pages import visible

    url, _, _ = planted
    want = {"same": {"A": ["same 2026-05-09", "same 2026-05-17"], "B": []},
            "reg": {"A": ["reg 2026-05-23"], "B": ["reg 2026-05-24", "reg 2026-06-03"]}}
    for node, busy in want.items():
        args = ["compare", f"node={node},mlx_lm_version=0.32.2",
                f"node={node},mlx_lm_version=0.33.0", "--db", url]
        r = CliRunner().invoke(main, [*args, "--json"])
        (row,) = [x for x in json.loads(r.stdout)["rows"] if x["metric"] == "decode_tok_s"]
        assert row["busy"] == busy, row
        text = CliRunner().invoke(main, args).stdout
        counts = ", ".join(f"{side} {len(v)}" for side, v in busy.items() if v)
        assert f"(busy nights set aside: {counts})" in text, text
        for side, nights in busy.items():
            if nights:
                assert f"BUSY NIGHTS SET ASIDE {side} code baseline decode_tok_s: " \
                       f"{len(nights)} ({', '.join(nights)})" in text, text
        # the reading with them kept, which the interval spans (audit 41b), said beside
        kept = row["all_nights"]
        assert kept["ci"][0] >= row["ci"][0] and kept["ci"][1] <= row["ci"][1], row
        assert f"with them kept B/A is {kept['ratio']:.3f} ({kept['ci'][0]:.3f}–" \
               f"{kept['ci'][1]:.3f})" in text, text
        page = tmp_path / f"{node}.html"
        CliRunner().invoke(main, [*args, "--out", str(page)])
        dom = dump_dom(page)
        shown = visible(dom)
        for side, nights in busy.items():
            if nights:
                n = len(nights)
                assert f"({n} busy night{'s' if n > 1 else ''} in {side} set aside)" in shown
                assert f'title="{", ".join(nights)}: far off' in dom


# -- change points: a first level of three nights ----------------------------------------------

def _series(rng: np.random.Generator, count: int, n: int = 35,
            phi: float | None = None) -> np.ndarray:
    """``count`` nightly series of ``n`` levels around 1.0, AR(1) noise as the bench plants
    it (φ drawn in 0-0.5 unless given, σ 1-2%), one row each."""
    out = np.empty((count, n))
    for row in out:
        p = rng.uniform(0, 0.5) if phi is None else phi
        row[:] = 1 + _ar1(rng, 1, n, p, rng.uniform(0.01, 0.02))[0]
    return out


def _head_steps(series: np.ndarray) -> int:
    """Series in which analyse reports a step (or possible step) in the first five nights."""
    from orchestrator.review.changepoints import analyse

    return sum(any(f["kind"] != "drift" and f["index"] <= 4 for f in analyse(list(100 * s)))
               for s in series)


def test_the_change_point_bench_keeps_its_precision_and_recall():
    """Guard: bench/changepoints.py as shipped (520 planted series): precision 0.984, recall
    0.997 (≥ 0.95 each; at 200 a kind, 2,000 series: 0.978, 0.993, as at 79cec96)."""
    got = subprocess.run([sys.executable, "bench/changepoints.py", "--show", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    line = [ln for ln in got.splitlines() if "precision" in ln][-1]
    precision = float(line.split("precision ")[1].split(",")[0])
    recall = float(line.split("recall ")[1].split()[0])
    assert precision >= 0.95 and recall >= 0.95, line


def test_remembering_noise_gets_no_step_at_the_head():
    """Guard: no change, φ 0.5, 0.7, 0.8, 0.9 (200 series each, 35 nights, σ 1-2%, seed
    2735): no step in the first five nights (0 of 800; the first three nights of strongly
    remembering noise sit off the level together, which ``_head`` could have read as a
    level). (Any finding at all: 1.0%, 2.0%, 2.5%, 8.0%, as at 79cec96: drifts.)"""
    rng = np.random.default_rng(2735)
    for phi in (0.5, 0.7, 0.8, 0.9):
        assert _head_steps(_series(rng, 200, phi=phi)) <= 2, phi


def test_a_two_night_start_or_a_three_night_dip_inside_stays_none():
    """Guard: a 15% dip on the first two nights, or on nights 7-9 or 15-17, is no finding
    (0 of 200 each, seed 2736); four nights at the start are a level (a step: 200 of 200)."""
    from orchestrator.review.changepoints import analyse

    rng = np.random.default_rng(2736)
    for at, k in ((0, 2), (7, 3), (15, 3)):
        s = _series(rng, 200)
        s[:, at:at + k] *= 0.85
        assert sum(bool(analyse(list(100 * v))) for v in s) == 0, (at, k)
    s = _series(rng, 200)
    s[:, :4] *= 0.85
    assert _head_steps(s) == 200


def test_three_contended_nights_at_the_start_are_no_step():
    """Audit 27b (medium), closed by reverting the three-night head (b4710c7): three
    contended first nights (noise x5, the same level) made a step in the first five
    nights in 19 of 500 series; 0 of 500 before it and again now."""
    rng = np.random.default_rng(2737)
    s = _series(rng, 500)
    sd = np.std(np.diff(s, axis=1), axis=1, keepdims=True) / math.sqrt(2)
    s[:, :3] = 1 + 5 * sd * rng.standard_normal((500, 3))
    assert _head_steps(s) <= 10


def test_a_dip_one_weekly_window_called_transient_is_no_step_in_the_next():
    """Audit 27b (medium), closed by reverting the three-night head (b4710c7): a 15%
    three-night dip one week's window called transient was a confident step the next
    week, its last three nights the window's first, in 196 of 200 series; now 0."""
    rng = np.random.default_rng(2738)
    s = _series(rng, 200, n=42)
    s[:, 7:10] *= 0.85
    assert _head_steps(s[:, 7:]) == 0
