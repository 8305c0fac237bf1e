"""Audit 27r: `compare`'s night-memory interval (nightmemory: the likelihood bound from six
neighbour pairs, the exact lag-1 bound below) and the change-point selection's exact AR(1)
score (arselect._ar_score), against truths planted here.

Every planted pair or series is drawn by this module: nightly log levels with AR(1) memory
φ, stationary, σ 5% (compare) or 1.5% (change points). Issue 27's targets for compare, at
a true ratio of 1.0: false claims ≤ 6%, coverage ≥ 93%. A test marked xfail(strict) is a
finding that fails today (its reason says the severity and what was measured); a plain one
is a guard that held.

The project's own planted pairs (tests/truth/pairs.ar1_sides, tests/test_audit_27_compare)
draw both weeks from one AR(1) series with two nights between them: at strong memory the
two weeks' means are then positively correlated, which shrinks the variance of their
difference below the sum the interval assumes. Two nodes (``node=a`` vs ``node=b``) or two
weeks months apart have no such help; ``_sides(..., gap=None)`` plants that.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest

Sides = tuple[list[float], list[float]]


def _ar1(rng: random.Random, n: int, phi: float, sd: float = 0.05) -> list[float]:
    e, out = rng.gauss(0, sd), []
    for _ in range(n):
        out.append(e)
        e = phi * e + rng.gauss(0, sd * math.sqrt(1 - phi * phi))
    return out


def _sides(na: int, nb: int, phi: float, gap: int | None = None,
           outliers: float | None = None) -> Callable[[random.Random], Sides]:
    """A pair at a true ratio of 1.0: independent AR(1) sides (``gap`` None: two nodes, or
    weeks far apart) or one series with ``gap`` unmeasured nights between the sides;
    ``outliers`` scales one random night of each side (one busy night a week each, so
    the true ratio stays 1.0)."""
    def draw(rng: random.Random) -> Sides:
        if gap is None:
            la, lb = _ar1(rng, na, phi), _ar1(rng, nb, phi)
        else:
            lv = _ar1(rng, na + gap + nb, phi)
            la, lb = lv[:na], lv[na + gap:]
        a, b = [100 * math.exp(x) for x in la], [100 * math.exp(x) for x in lb]
        if outliers is not None:
            a[rng.randrange(na)] *= outliers
            b[rng.randrange(nb)] *= outliers
        return a, b
    return draw


def _score(draw: Callable[[random.Random], Sides], pairs: int, seed: int,
           memory: bool = True, apart: bool = False) -> tuple[float, float, float]:
    """(false claims, coverage of 1.0, mean φ read) of night_ratio over ``pairs`` planted
    pairs; a claim as compare makes one (p < 0.01 and the interval off 1.0). ``apart``: as
    compare asks for two nodes or weeks not back to back (compare._apart)."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng = random.Random(seed)
    claims = covered = 0
    phis = 0.0
    for _ in range(pairs):
        r = night_ratio(*draw(rng), memory=memory, apart=apart)
        assert r["ci"] is not None and all(math.isfinite(v) for v in r["ci"])
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= 1.0 <= r["ci"][1]
        phis += r.get("memory", 0.0)
    return claims / pairs, covered / pairs, phis / pairs


# -- compare: findings ---------------------------------------------------------------------

def test_two_nodes_with_strong_memory_meet_the_targets():
    """Audit 27r finding 1 (high), closed: two nodes (independent AR(1) sides) at φ 0.9,
    eight nights a side, covered 1.0 in 86.0% with 7.2% false claims (1,000 pairs, seed
    2701): the bound on φ was tuned on two weeks of one node (whose means correlate 0.48),
    and a side's spread under memory rests on ~2.8 df, not 7. compare now tells the layouts
    apart (compare._apart) and reads independent sides at a one-sided 95% bound on φ with
    each spread's own df (nightmemory.LR_APART, spread_df): 94.1%, 2.0% false claims
    (seeds 1-5: 93.7-95.6%); the same nights read as one node's weeks (apart=False, the
    default) still 86.0%. The price, two nodes only: test_two_nodes_find_a_difference."""
    claims, coverage, _ = _score(_sides(8, 8, 0.9), 1000, 2701, apart=True)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_two_nodes_three_nights_with_strong_memory_meet_the_targets():
    """Audit 27r finding 2 (high), closed: three nights a side (the exact lag-1 path below
    MIN_PAIRS), two nodes, φ 0.9: 84.7% covered, 7.0% false claims (1,000 pairs, seed
    2706). Apart, φ is the exact tail's 5% bound (nightmemory.ALPHA_APART) with the
    spreads' df under it: 94.7%, 1.4% (seeds 1-5: 94.2-96.1%; φ 0.8: 98.0%, 0.5%; two
    against three at 0.9: 93.5%, 2.3%)."""
    claims, coverage, _ = _score(_sides(3, 3, 0.9), 1000, 2706, apart=True)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


@pytest.mark.xfail(strict=True, reason=(
    "severity: low. One node's back-to-back weeks (two nights between, compare reads them "
    "as one series), three nights a side, φ 0.9: 92.1% covered, 3.0% false claims (1,000 "
    "pairs, seed 2701; seeds 1-3: 92.2-93.8%); five nights 92.8% (seeds 1-3: 93.3-94.8%). "
    "The joined bounds (LR_BOUND 0.9, ALPHA 0.25) lean on the weeks' covariance, which few "
    "nights barely give. Read apart: 98.3% and 97.8%, at the power cost in "
    "test_two_nodes_find_a_difference; four nights between read as one series would cover "
    "89.6-90.3% at 3-8 nights, hence compare.JOINED_DAYS 3. Measured (cmp27): the exact "
    "bound at ALPHA 0.2 covers 93.6% (seeds 1-3: 93.5-95.0%) but widens 5 v 2 past 5 v 1 "
    "(median log-width 0.534 > 0.519: test_a_second_night_does_not_widen_the_interval) and "
    "finds a true 20% at three nights in 8.2% (10.7%); each side's spread on its df under "
    "memory (spread_df, as apart) 92.2%; busy nights (busy_nights) change nothing here"))
def test_one_node_three_nights_back_to_back_with_strong_memory_meet_the_targets():
    claims, coverage, _ = _score(_sides(3, 3, 0.9, gap=2), 1000, 2701)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


@pytest.mark.parametrize("nights,found", [(8, 0.45), (12, 0.85)])
def test_two_nodes_find_a_difference(nights, found):
    """Guard (power on independent sides, the price of closing findings 1 and 2): a true
    20% difference between two nodes with independent nights (φ 0), seed 99, 600 pairs:
    found (p < 0.01, interval off 1.0) in 50.8% at eight nights a side (82.5% when read as
    one node's weeks), 89.5% at twelve (98.8%); 50.0% and 89.3% since busy nights are
    sought (review/busy_nights); the true 1.2 covered ≥ 95%. The bound on φ
    against it (eight nights; seed 2701 covered at φ 0.9 / seed 99 found): LR 0.9 88.9% /
    78.3%, 1.64 91.9% / 66.0%, 2.71 94.1% / 50.8%, 3.84 94.8% / 37.5%."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng, hits, covered = random.Random(99), 0, 0
    for _ in range(600):
        a, b = _sides(nights, nights, 0.0)(rng)
        r = night_ratio(a, [1.2 * x for x in b], apart=True)
        hits += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= 1.2 <= r["ci"][1]
    assert hits / 600 >= found and covered / 600 >= 0.95, (hits, covered)


def _plant_week(store, node: str, monday, levels: list[float]) -> None:
    from tests.history import config_values, night

    for i, level in enumerate(levels):
        night(store, monday + timedelta(days=i, hours=2), node=node, chip="Apple M2 Max",
              pair="p", workload="code", configs={("baseline", 0): config_values(level, 3,
                                                                                jitter=0.0)})


def test_compare_reads_two_nodes_and_far_weeks_as_independent_sides(tmp_path):
    """Planted: five nights a week (Monday to Friday) of mac-01 in 2026-W19, W20 and W22
    and of mac-02 in W19, rising steadily (strong memory). One node's back-to-back weeks
    (Friday to Monday: three days) are one series; two nodes, or W19 against W22, are
    independent sides, and each row's interval is night_ratio's for that layout (wider
    apart: φ at the wider bound, the spreads' df under it)."""
    from datetime import datetime, timezone

    from orchestrator.review.compare import compare, night_ratio
    from orchestrator.store import open_store
    from tests.store_templates import fresh_sqlite

    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    w19 = datetime(2026, 5, 4, tzinfo=timezone.utc)
    a = [100.0, 101.5, 101.0, 103.0, 104.5]
    b = [104.0, 104.5, 106.5, 106.0, 108.0]
    for node, days, levels in (("mac-01", 0, a), ("mac-01", 7, b), ("mac-01", 21, b),
                               ("mac-02", 0, b)):
        _plant_week(store, node, w19 + timedelta(days=days), levels)
    got = {}
    for name, other in (("weeks", "node=mac-01,week=2026-W20"),
                        ("nodes", "node=mac-02,week=2026-W19"),
                        ("far", "node=mac-01,week=2026-W22")):
        c = compare(store, "node=mac-01,week=2026-W19", other)
        (got[name],) = [r for r in c["rows"] if r["metric"] == "decode_tok_s"]
    assert [got[k]["apart"] for k in ("weeks", "nodes", "far")] == [False, True, True]
    joined, apart = night_ratio(a, b), night_ratio(a, b, apart=True)
    assert got["weeks"]["ci"] == pytest.approx(joined["ci"])
    for k in ("nodes", "far"):
        assert got[k]["ci"] == pytest.approx(apart["ci"])
    assert apart["ci"][0] < joined["ci"][0] and joined["ci"][1] < apart["ci"][1]


def test_two_nights_against_twenty_meet_the_coverage_target():
    """Audit 27r finding 5 (medium), closed: two against twenty independent nights at φ 0
    covered 91.0% with 3.6% false claims (1,000 pairs, seed 2702; plain Welch 87.7%,
    6.9%): Welch-Satterthwaite's df credited the twenty-night side while the two-night
    side's variance is one df. A side of ≤ compare.POOL_BELOW nights now pools the night
    spread with the other side's (keeping its own where larger), Student's t on the
    pooled df: 97.8% here, no false claim."""
    claims, coverage, _ = _score(_sides(2, 20, 0.0), 1000, 2702)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_a_two_night_side_twice_as_noisy_is_covered_as_welch_covers_it():
    """Guard for the pooled rule's cost: two nights twice as noisy (σ 10%) as the twenty
    they meet, iid: the plain pooled spread covers 80.3% (3,000 pairs, seed 5) where
    Welch covers 90.8%; the few-night side keeps its own spread where larger: 89.9% (here,
    2,000 pairs: 89.7%, Welch 91.0%). Welch's own shortfall there (the Behrens-Fisher
    problem on one df) remains, below the 93% target."""
    from orchestrator.review.compare import night_ratio

    rng, covered, pairs = random.Random(5), 0, 2000
    for _ in range(pairs):
        a = [100 * math.exp(rng.gauss(0, 0.10)) for _ in range(2)]
        b = [100 * math.exp(rng.gauss(0, 0.05)) for _ in range(20)]
        ci = night_ratio(a, b)["ci"]
        covered += ci[0] <= 1.0 <= ci[1]
    assert covered / pairs >= 0.88, covered / pairs


@pytest.mark.parametrize("busy", [0.7, 0.8])
def test_one_busy_night_a_week_does_not_hide_strong_memory(busy):
    """Audit 27r (medium), closed: one busy night (0.7x) in each of two weeks of twenty
    nights, φ 0.9, weeks two nights apart: the outliers broke the likelihood's read of
    memory (mean φ 0.87 -> 0.30), 87.2% covered, 4.7% false claims (1,000 pairs, seed
    2703). Busy nights (review/busy_nights: the additive-outlier test) are left out of a
    second read of φ, the larger bound kept, and out of the nights' spread, their excess
    entering the mean once as their own noise (compare._side_variance): 97.0%, 0.6% (seeds
    1-2: 98.1%, 97.1%); a 0.8x night 94.9%, 1.4%. Set aside from the level since (audit
    27b): 93.8%, 2.6%; 0.8x 93.9%, 2.5%."""
    claims, coverage, _ = _score(_sides(20, 20, 0.9, gap=2, outliers=busy), 1000, 2703)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_a_busy_night_a_week_leaves_the_power_to_find_a_difference():
    """Guard (the price of busy nights): one 0.7x night in each of two weeks of twenty
    nights, φ 0.5, a true 10% difference (tests.truth.pairs, 500 pairs, seed 2): found in
    46.4% since busy nights are set aside from the level (28.8% with their excess counted
    as noise; 34.8% before busy nights were sought, at 99.7% coverage of 1.0). Read into
    the nights' spread and scaled by memory, the busy night left 5.5%."""
    from tests.truth.pairs import direct_score

    assert direct_score(0.5, 1.1, 500, 2, nights=20, busy=0.7)["claims"] >= 0.2


def test_one_slightly_busy_night_a_week_does_not_hide_strong_memory():
    """Audit 27r (low), closed, narrowly: one 0.9x night a week (2σ at σ 5%) in two weeks
    of twenty nights, φ 0.9, two nights apart: 92.3% covered, 4.3% false claims (1,000
    pairs, seed 2703; 86.1%, 7.9% before busy nights were sought). A spike this small is
    flagged in some pairs only; flagged, it is now set aside from the level (audit 27b):
    93.1%, 3.4%."""
    claims, coverage, _ = _score(_sides(20, 20, 0.9, gap=2, outliers=0.9), 1000, 2703)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


@pytest.mark.xfail(strict=True, reason=(
    "severity: low (MAX_PHI 0.9 is the design's ceiling). φ 0.95 on two weeks of twenty "
    "nights two apart: 90.8% covered, 3.0% false claims (1,000 pairs, seed 2704); "
    "independent sides at φ 0.95: 76-80% covered, 10.5-13.4% false claims (4-20 nights). "
    "Measured (cmp27): MAX_PHI 0.95 covers 95.8%, 1.9% with the power guards barely moved "
    "(eight nights 81.0% -> 80.8%, two nodes 50.0% -> 49.8%) but widens every few-night "
    "interval whose bound sits at the ceiling (3 v 1 median log-width 0.949 -> 1.197, "
    "5 v 1 0.469 -> 0.507), and moves the finding to φ beyond the new ceiling: a design "
    "choice, left to the design"))
def test_memory_beyond_the_ceiling_meets_the_coverage_target():
    claims, coverage, _ = _score(_sides(20, 20, 0.95, gap=2), 1000, 2704)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


# audit 27r (medium), closed: Welch credited two trials' one-df spread with the other
# side's df (90.3% covered; 2 vs 20: 87.8%); two trials now pool as few nights do (96.3%).
# The price, measured alongside (seed 7, 8 v 2 trials): a two-trial side twice as noisy as
# the other covers 87.2% (Welch 88.4%), three times 82.0% (88.1%); on one node within one
# night the two sides share the host's noise, so equal spreads are the case that matters
def test_through_noise_two_trials_against_ten_cover_the_truth():
    from orchestrator.review.through_noise import ratio_interval

    rng, covered, pairs = random.Random(2705), 0, 2000
    for _ in range(pairs):
        a = [100 * math.exp(rng.gauss(0, 0.1)) for _ in range(2)]
        b = [100 * math.exp(rng.gauss(0, 0.1)) for _ in range(10)]
        iv = ratio_interval(a, b)
        assert iv is not None
        covered += iv[1] <= 1.0 <= iv[2]
    assert covered / pairs >= 0.93, covered / pairs


@pytest.mark.parametrize("na", [3, 5])
def test_a_second_night_does_not_widen_the_interval(na):
    """Audit 27r finding 8 (low), closed: five nights against one, independent, φ 0, median
    log-width 0.469, against two 0.637 (+36%; three against one 0.949, against two 1.015)
    (1,000 pairs, seed 8): one night borrowed the other side's spread, two switched to
    Welch on B's own one-df variance. Two nights now pool as one did: 0.455 and 0.822."""
    from orchestrator.review.compare import night_ratio

    widths: dict[int, list[float]] = {1: [], 2: []}
    for nb in widths:
        rng = random.Random(8)
        for _ in range(1000):
            a = [100 * math.exp(x) for x in _ar1(rng, na, 0.0)]
            b = [100 * math.exp(x) for x in _ar1(rng, nb, 0.0)]
            ci = night_ratio(a, b)["ci"]
            widths[nb].append(math.log(ci[1] / ci[0]))
    assert float(np.median(widths[2])) <= float(np.median(widths[1])), widths


# -- compare: guards that held -------------------------------------------------------------

@pytest.mark.parametrize("phi", [-0.5, 0.0, 0.5])
def test_two_nodes_with_weak_or_negative_memory_meet_the_targets(phi):
    """Guard: independent sides, five and ten nights, φ −0.5/0/0.5 (seed 2710, 400 pairs:
    94.5-99.8% covered, ≤ 2.5% claims), read as one node's weeks or apart."""
    for n in (5, 10):
        for apart in (False, True):
            claims, coverage, _ = _score(_sides(n, n, phi), 400, 2710, apart=apart)
            assert claims <= 0.06 and coverage >= 0.93, (n, apart, claims, coverage)


def test_the_interval_ignores_units_at_any_scale():
    """Guard: the same planted pairs at 1e-300 and 1e300 tok/s give the same interval."""
    from orchestrator.review.compare import night_ratio

    rng = random.Random(2711)
    for _ in range(50):
        a, b = _sides(6, 6, 0.5)(rng)
        base = night_ratio(a, b)
        for scale in (1e-300, 1e300):
            got = night_ratio([x * scale for x in a], [x * scale for x in b])
            assert got["ci"] == pytest.approx(base["ci"], rel=1e-9)
            assert got["memory"] == base["memory"]


def test_rounded_nights_and_a_level_shift_inside_a_week_meet_the_targets():
    """Guard: nights rounded to whole tok/s at 10 tok/s (ties everywhere), and a 10% level
    shift from A's fifth night of eight that B keeps (truth: B over A's geometric mean),
    φ 0.5, weeks two nights apart (seed 2712, 400 pairs: 97.8% and 98.8% covered, 0.3%
    and 0.8% false claims)."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng, up = random.Random(2712), math.log(1.1)
    tallies = {"ties": [0, 0], "shift": [0, 0]}
    for _ in range(400):
        lv = _ar1(rng, 18, 0.5)
        cases = {"ties": ([round(10 * math.exp(x)) for x in lv[:8]],
                          [round(10 * math.exp(x)) for x in lv[10:]], 1.0),
                 "shift": ([100 * math.exp(x + (up if i >= 4 else 0)) for i, x in
                            enumerate(lv[:8])], [110 * math.exp(x) for x in lv[10:]],
                           math.exp(up / 2))}
        for name, (a, b, truth) in cases.items():
            r = night_ratio(a, b)
            tallies[name][0] += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= truth <= r["ci"][1]
            tallies[name][1] += r["ci"][0] <= truth <= r["ci"][1]
    for name, (claims, covered) in tallies.items():
        assert claims / 400 <= 0.06 and covered / 400 >= 0.93, (name, claims, covered)


# -- change points: findings ---------------------------------------------------------------

def _cp_series(rng: np.random.Generator, n: int, phi: float, level: np.ndarray,
               sd: float = 0.015) -> list[float]:
    e = rng.standard_normal() * sd
    noise = []
    for _ in range(n):
        noise.append(e)
        e = phi * e + rng.standard_normal() * sd * math.sqrt(1 - phi * phi)
    return list(100 * level * (1 + np.asarray(noise)))


def _with_findings(n: int, phi: float, series: int, seed: int) -> int:
    from orchestrator.review.changepoints import analyse

    rng = np.random.default_rng(seed)
    return sum(bool(analyse(_cp_series(rng, n, phi, np.ones(n)))) for _ in range(series))


@pytest.mark.xfail(strict=True, reason=(
    "severity: medium. No change, AR(1) φ 0.9 (σ 1.5%), ten nights: 31 of 400 series "
    "(7.8%) report a change (30 drifts), 22 (5.5%) with the score before the exact "
    "likelihood; fourteen nights 26 (was 17), 35 nights 27 (was 20), 35 nights at φ 0.95 "
    "39 (was 36) (seed 5); the bench's own planted_nightly at φ 0.9, fresh seeds 100-499: "
    "none 29 false (was 21), step 25 (was 20), drift 7 (7). The exact score's "
    "−log(1 − φ²) charges the flat fit, whose residuals keep the strong memory, up to "
    "1.66 more than a line's. Tried (cp27, seed 5, 400 series): 19 of the 31 leave residuals "
    "at the noise floor, 12 with both the residuals' and the differences' φ at 0 (ten "
    "nights cannot tell that wander from a drift); φ from the "
    "differences as a floor under the residuals' 30; a line's slope tested against the "
    "stationary σ its residuals imply (E[RSS] = σ² tr((I − H)R)) 28, the bench's φ 0.7 "
    "drifts 58 -> 53 of 60; both 14, but the selection's one line over a mid-window ramp "
    "and its holds then fails that test (test_a_drift_in_the_middle_of_the_window_keeps_"
    "precision_and_recall 0.949/0.925); φ by profile likelihood in the score: 31; a "
    "line into a flat level counted as a hinge: 34"))
def test_strong_memory_in_a_short_window_is_no_change():
    assert _with_findings(10, 0.9, 400, 5) <= 20


def test_a_step_after_a_drift_and_a_hold_is_found():
    """Audit 27r (medium), closed: a 12% drift over nights 0-14, a level held ten nights,
    then a 15% step up at night 24 (35 nights, φ 0.3, σ 1.5%) was missed in 34 of 200
    series (seed 9): the selection stretched the drift over the hold, whose misfit then
    inflated the noise a sharp jump's price was taken from, so the step read as the
    drift's edge. The price is now taken against the nights' own noise as well (from
    differences, as the stair and join tests do): 6 of 200."""
    from orchestrator.review.changepoints import analyse

    n = 35
    level = np.array([(1 + 0.12 * min(i / 14, 1)) * (1.0 if i < 24 else 1.15) for i in range(n)])
    rng, missed = np.random.default_rng(9), 0
    for _ in range(200):
        found = analyse(_cp_series(rng, n, 0.3, level))
        missed += not any("step" in f["kind"] and abs(f["index"] - 24) <= 1 for f in found)
    assert missed <= 10, missed


@pytest.mark.xfail(strict=True, reason=(
    "severity: low. A 15% step after the third night of 35 (32 nights at the new level, "
    "φ 0.3): nothing is reported in 100 of 100 series (seed 9); the first segment needs "
    "MIN_NIGHTS 4. Reading a three-night head as a level (b4710c7, each night on the old "
    "level's side) closed it, but a window's first nights may be the last of a dip the "
    "week before saw whole: that read them as a step in 196 of 200 windows, and three "
    "contended first nights as one in 3.8% (audit 27b, both medium): reverted. Closing "
    "it needs the nights before the window (the store holds them)"))
def test_a_step_after_the_third_night_is_reported():
    from orchestrator.review.changepoints import analyse

    n = 35
    level = np.array([1.0 if i < 3 else 1.15 for i in range(n)])
    rng = np.random.default_rng(9)
    silent = sum(not analyse(_cp_series(rng, n, 0.3, level)) for _ in range(100))
    assert silent <= 5, silent


def test_a_two_night_dip_at_the_start_is_no_step():
    """Guard for the three-night first level: a 20% dip on nights 1-2 of 35 (σ 1.5%, φ 0)
    makes a three-night head whose mean reads as a level; its night 0 is back at the
    level, so no step (49 of 50 reported one before ``_head`` asked every night)."""
    from orchestrator.review.changepoints import analyse

    rng, found = np.random.default_rng(3), 0
    for _ in range(50):
        values = _cp_series(rng, 35, 0.0, np.array([0.8 if i in (1, 2) else 1.0
                                                    for i in range(35)]))
        found += bool(analyse(values))
    assert found <= 1, found


@pytest.mark.xfail(strict=True, reason=(
    "severity: low. An inverted V 15% high (up over 17 nights, down over 17, φ 0.3): "
    "silent in 13 of 100 series, where the V 15% deep is silent in 4 (seed 9; 200 series: "
    "23 and 10, with the score before 81 and 37: today's change helps, not enough). "
    "Measured (cp27): the gap is the planting's multiplicative noise, the inverted V's "
    "move 16% fewer σ (its noise scales with its higher level): with additive noise "
    "silent 7, 7, 9 (seeds 9-11) against the V's 15, 5, 5, and at the V's σ ratio 2 of 100. "
    "What is left is power at ~9σ: the true hinge (two lines meeting at night 17) scores "
    "worse than one flat level with φ 0.7 in 10 of 100 (arselect's weighted BIC, 8.5 log n "
    "more), so no better search closes it (a V re-cut offered to the selection: 13); "
    "a line into a flat level counted as a hinge: 11; MAX_PHI 0.9 in the score: 63 (the "
    "V 51)"))
def test_an_inverted_v_is_found_as_often_as_a_v():
    from orchestrator.review.changepoints import analyse

    n, m = 35, 17
    level = np.array([1 + 0.15 * (1 - abs(i - m) / m) for i in range(n)])
    rng = np.random.default_rng(9)
    silent = sum(not analyse(_cp_series(rng, n, 0.3, level)) for _ in range(100))
    assert silent <= 5, silent
