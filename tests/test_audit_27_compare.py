"""Audit of issue 27 item 3 ("The night is the unit") after the night-memory interval
(orchestrator/review/nightmemory.py) and the repetition spread (agent/stats.py), against
truths of the auditor's own: fresh seeds, other sizes, heavy tails, outlier nights,
negative and strong memory, several nodes interleaved, true differences, degenerate
inputs, and the store's own night order. A test marked xfail(strict) is a finding that
fails today; a plain one is a guard that held.

Every planted pair here is drawn by this module (seeds never used by the project's own
truth tests): each side's nightly levels are log-normal (σ 5%) with AR(1) memory φ from
night to night, B's true level ``ratio`` × A's. The issue's targets (item 3): false claims
≤ 6%, coverage ≥ 93%, at a true ratio of 1.0."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

Sides = tuple[list[float], list[float]]


def _ar1(rng: random.Random, n: int, phi: float, sd: float = 0.05,
         draw: Callable[[], float] | None = None) -> list[float]:
    """``n`` stationary AR(1) log levels of spread ``sd`` (unit-variance innovations)."""
    draw = draw or (lambda: rng.gauss(0, 1))
    e, out = draw() * sd, []
    for _ in range(n):
        out.append(e)
        e = phi * e + draw() * sd * math.sqrt(max(0.0, 1 - phi * phi))
    return out


def _t3(rng: random.Random) -> float:
    """Student's t with 3 degrees of freedom, scaled to unit variance (heavy tails)."""
    z, c = rng.gauss(0, 1), sum(rng.gauss(0, 1) ** 2 for _ in range(3))
    return z / math.sqrt(c / 3) / math.sqrt(3)


def _weeks(na: int, nb: int, phi: float, gap: int = 2, t3: bool = False,
           outlier: float | None = None) -> Callable[[random.Random, float], Sides]:
    """A side of ``na`` nights, ``gap`` unmeasured nights, a side of ``nb``; ``outlier``
    scales one random night of A (a night the machine was busy)."""
    def draw(rng: random.Random, ratio: float) -> Sides:
        lv = _ar1(rng, na + gap + nb, phi, draw=(lambda: _t3(rng)) if t3 else None)
        a = [100 * math.exp(x) for x in lv[:na]]
        b = [ratio * 100 * math.exp(x) for x in lv[na + gap:]]
        if outlier is not None:
            a[rng.randrange(na)] *= outlier
        return a, b
    return draw


def _nodes(k: int, m: int, phi: float, node_sd: float) -> Callable[[random.Random, float], Sides]:
    """``k`` nodes, ``m`` nights each a side, listed node by node (compare's order: node,
    then date) so a neighbour pair spans two nodes; each node its own level (``node_sd``)
    and its own AR(1) nights."""
    def draw(rng: random.Random, ratio: float) -> Sides:
        a: list[float] = []
        b: list[float] = []
        for _ in range(k):
            off, lv = rng.gauss(0, node_sd), _ar1(rng, 2 * m + 2, phi)
            a += [100 * math.exp(off + x) for x in lv[:m]]
            b += [ratio * 100 * math.exp(off + x) for x in lv[m + 2:]]
        return a, b
    return draw


def _score(draw: Callable[[random.Random, float], Sides], pairs: int, seed: int,
           ratio: float = 1.0) -> tuple[float, float]:
    """(claims, coverage of the true ratio) of night_ratio over ``pairs`` planted pairs; a
    claim as compare makes one (p < 0.01 and the 95% interval off 1.0)."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng = random.Random(seed)
    claims = covered = 0
    for _ in range(pairs):
        r = night_ratio(*draw(rng, ratio))
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= ratio <= r["ci"][1]
    return claims / pairs, covered / pairs


# -- findings ------------------------------------------------------------------------------

def _plant(store, week_start: datetime, levels: list[float]) -> None:
    from tests.history import config_values, night

    for i, level in enumerate(levels):
        night(store, week_start + timedelta(days=i, hours=2), node="mac-01",
              chip="Apple M2 Max", pair="p", workload="code",
              configs={("baseline", 0): config_values(level, 3, jitter=0.0)})


def _row(tmp_path, name: str, monday: datetime, a: list[float], b: list[float]) -> dict:
    from orchestrator.review.compare import compare
    from orchestrator.store import open_store

    store = open_store(f"sqlite:///{tmp_path}/{name}.db")
    _plant(store, monday, a)
    _plant(store, monday + timedelta(days=7), b)
    wa, wb = (f"{d.isocalendar()[0]}-W{d.isocalendar()[1]:02d}"
              for d in (monday, monday + timedelta(days=7)))
    c = compare(store, f"node=mac-01,week={wa}", f"node=mac-01,week={wb}")
    (row,) = [r for r in c["rows"] if r["metric"] == "decode_tok_s"]
    return row


def test_the_night_order_does_not_depend_on_the_calendar(tmp_path):
    """Audit 27 compare finding (medium). compare reads the nights' memory from neighbours
    "in night order (node, then date)", but `_per_run` sorts by ``str((node, date))``:
    "datetime.date(2026, 5, 10)" sorts before "datetime.date(2026, 5, 4)", so a week from
    Monday 4 May to Sunday 10 May is read 10, 4, 5, …, 9 (and a month 1, 10, 11, …, 19,
    2, 20, …). The same seven planted nights a side (the one falling night last) give
    φ 0.79 and an interval 0.841–1.191 in 2026-W20/W21, but φ 0.05 and 0.945–1.060 in
    2026-W19/W20: the interval depends on the calendar. Direct (1,000 pairs, φ 0.7, seed
    99): 28 nights a side from 1 September read in string order cover 89.6% with 4.8%
    false claims, in night order 94.5% and 2.3%."""
    a = [103.7, 99.1, 101.9, 99.5, 100.4, 95.5, 87.0]
    b = [99.2, 99.4, 95.5, 99.8, 95.0, 98.3, 99.6]
    w19 = datetime(2026, 5, 4, tzinfo=timezone.utc)
    early = _row(tmp_path, "w19", w19, a, b)
    later = _row(tmp_path, "w20", w19 + timedelta(days=7), a, b)
    # no 9 → 10 inside: night order (the likelihood bound reads 0.9 here, 0.79 by the
    # lag-1 rule of the finding; the string order 0.0 by both)
    assert later["memory"] == pytest.approx(0.9)
    assert early["memory"] == later["memory"], (early["memory"], later["memory"])
    assert early["ci"] == pytest.approx(later["ci"]), (early["ci"], later["ci"])


def test_three_nights_a_side_with_memory_meet_the_targets():
    """Audit 27 compare (medium), closed: three nights a side (4 neighbour pairs < 6) fell
    back to plain Welch; at φ 0.5 (1,000 pairs, seed 4242) coverage 84.8%, false claims 4.3%;
    at φ 0.9 70.1% and 11.6%. Below six pairs φ is now the exact one-sided bound
    (nightmemory.exact_memory): 96.5% / 1.1% here."""
    claims, coverage = _score(_weeks(3, 3, 0.5), 1000, 4242)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_two_nights_against_three_with_memory_meet_the_coverage_target():
    """Audit 27 compare (medium), closed: two nights against three (φ not read: 3 neighbour
    pairs) at φ 0.5 covered 89.6% (1,000 pairs, seed 777); now 96.4%, 0.5% false claims."""
    claims, coverage = _score(_weeks(2, 3, 0.5), 1000, 777)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_strong_memory_over_eight_nights_meets_the_coverage_target():
    """Audit 27 compare (low), closed: at φ 0.9 (the most memory nightmemory believes)
    eight nights a side covered 91.1% (1,000 pairs, seed 4242; 92.2% at 12 nights, 91.9%
    at 20): φ, read from the lag-1 autocorrelation 0.6 SE up, was taken at 0.81-0.86 on
    average. Now φ is the restricted likelihood's upper bound (both sides at once,
    nightmemory.likelihood_memory, LR_BOUND 0.9): 93.7% here, the power guard's 20% found
    in 82.0% (the lag-1 rule at as much coverage, 0.8 SE: 93.2% and 80.0%)."""
    claims, coverage = _score(_weeks(8, 8, 0.9), 1000, 4242)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_an_infinite_night_is_not_an_interval_of_nan():
    """Audit 27 compare finding (low). A night whose rate is infinite (a zero-length span
    that slipped past a reader) passed ``x > 0`` into the logs: ratio 0.0, interval
    [nan, nan], p nan — and compare's verdict then read "same within noise". It is now
    dropped like a zero or a NaN: the two finite nights are compared."""
    from orchestrator.review.compare import night_ratio

    r = night_ratio([math.inf, 100.0, 101.0], [100.0, 101.0, 102.0])
    finite = night_ratio([100.0, 101.0], [100.0, 101.0, 102.0])
    assert r["ratio"] == pytest.approx(finite["ratio"])
    assert r["ci"] == pytest.approx(finite["ci"]) and r["p"] == pytest.approx(finite["p"])


# -- guards that held --------------------------------------------------------------------

def test_fresh_seed_at_night_memory_meets_the_targets():
    """Guard: not tuned to the audit's 200 pairs. 1,000 fresh pairs (seed 31337) five
    nights a side at φ 0.5 within the targets (bench seed 7919, 2,000 pairs: 1.6% / 95.4%)."""
    claims, coverage = _score(_weeks(5, 5, 0.5), 1000, 31337)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


@pytest.mark.xfail(strict=True, reason=(
    "audit 27 compare (low): at φ 0.7 five nights a side, 1,000 fresh pairs (seed 31337) "
    "cover 92.2% (3.6% false claims) under the likelihood bound (nightmemory.LR_BOUND 0.9; "
    "92.0% by the lag-1 rule before), though seeds 1-6 cover 93.5-96.0% (95.0% on 6,000) "
    "and tests.truth.pairs.direct_score 5 seeds × 2,000 (11, 22, 33, 44, 55) 94.6% (93.5% "
    "before): this seed's pairs are a low draw. LR_BOUND 1.0 covers 92.7% here, 1.64 95.7%, "
    "at the power cost in test_a_twenty_percent_difference_is_found_at_eight_nights "
    "(80.0%, 71.7%). 92.1% since busy nights are sought (cmp27, which took that guard "
    "from 82.0% to 81.0%: no room left for a wider bound); each side's spread on its df "
    "under memory (spread_df) 92.7% with that guard at 76.7%"))
def test_fresh_seed_at_strong_memory_meets_the_coverage_target():
    claims, coverage = _score(_weeks(5, 5, 0.7), 1000, 31337)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_strong_memory_on_five_nights_meets_the_coverage_target_over_seeds():
    """Guard: φ 0.7, five nights a side, over 5,000 pairs (seeds 1-5, 1,000 each): 95.3%
    covered (the lag-1 rule before: 93.5% on direct_score's 10,000)."""
    scores = [_score(_weeks(5, 5, 0.7), 1000, seed) for seed in range(1, 6)]
    claims = statistics.fmean(c for c, _ in scores)
    coverage = statistics.fmean(v for _, v in scores)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


@pytest.mark.parametrize("n", [4, 6, 12])
def test_other_sizes_at_memory_meet_the_targets(n):
    """Guard: 4, 6, 12 nights a side at φ 0.5 (seed 4242): 97.1%, 95.1%, 94.4% covered."""
    claims, coverage = _score(_weeks(n, n, 0.5), 600, 4242)
    assert claims <= 0.06 and coverage >= 0.93, (n, claims, coverage)


@pytest.mark.parametrize("na,nb", [(3, 8), (2, 10), (5, 12)])
def test_unequal_sides_at_memory_meet_the_targets(na, nb):
    """Guard: unequal sides at φ 0.5 (seed 777): 96.2%, 97.1%, 95.7% covered."""
    claims, coverage = _score(_weeks(na, nb, 0.5), 600, 777)
    assert claims <= 0.06 and coverage >= 0.93, (na, nb, claims, coverage)


def test_heavy_tailed_nights_meet_the_targets():
    """Guard: t3 night noise (unit variance), five nights a side, φ 0.5 (seed 777):
    1.2% false claims, 96.3% covered."""
    claims, coverage = _score(_weeks(5, 5, 0.5, t3=True), 1000, 777)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


def test_one_busy_night_does_not_make_a_claim():
    """Guard: one of five A nights at half its level (φ 0, seed 777): no false claim in
    1,000 pairs (the busy night widens the interval, it never narrows it)."""
    claims, coverage = _score(_weeks(5, 5, 0.0, outlier=0.5), 1000, 777)
    assert claims <= 0.01 and coverage >= 0.93, (claims, coverage)


def test_negative_memory_stays_within_the_targets():
    """Guard: φ −0.5 and −0.9 (nights alternate): φ is never taken below 0, so the interval
    is wider than needed (99.8%, 100% covered), never narrower."""
    for phi in (-0.5, -0.9):
        claims, coverage = _score(_weeks(5, 5, phi), 600, 777)
        assert claims <= 0.06 and coverage >= 0.93, (phi, claims, coverage)


@pytest.mark.parametrize("k,m,node_sd", [(2, 5, 0.0), (3, 3, 0.05), (5, 2, 0.0)])
def test_nodes_interleaved_do_not_distort_memory(k, m, node_sd):
    """Guard: nights of several nodes listed node by node, so some neighbour pairs span two
    nodes, φ 0.7 per node (seed 99): 95.1%, 98.8%, 98.8% covered. A pair across nodes
    reads no memory (a lower φ) but those nights are independent too, so the variance of
    the mean is lower in step; a node level difference reads as memory (a higher φ):
    conservative."""
    claims, coverage = _score(_nodes(k, m, 0.7, node_sd), 600, 99)
    assert claims <= 0.06 and coverage >= 0.93, (k, m, claims, coverage)


def test_a_twenty_percent_difference_is_found_at_eight_nights():
    """Guard (power): a true 20% difference, eight independent nights a side, is found in
    most pairs (82.0% under the likelihood bound, 81.0% since busy nights are sought
    (review/busy_nights), 80.8% since they are set aside from the level (78.0% with every
    side centred on its middle half, busy_nights.MIDDLE_FROM), 87.9% under the lag-1 rule
    before, seed 99); the interval covers
    the true 1.2 in ≥ 95%. The price of the upper bound on φ (measured, not asserted): at
    five nights a true 10% is found in 11.3% (plain Welch 37%), 20% in 44.7%."""
    claims, coverage = _score(_weeks(8, 8, 0.0), 600, 99, ratio=1.2)
    assert claims >= 0.8 and coverage >= 0.95, (claims, coverage)


def test_welch_df_under_two_gives_a_wide_finite_interval():
    """Guard: two nights a side, one side almost without spread: Welch's df ≈ 1, the 95%
    interval is finite and wide (t quantile 12.7), no claim."""
    from orchestrator.review.compare import night_ratio

    r = night_ratio([100.0, 100.0001], [120.0, 150.0])
    assert all(math.isfinite(x) for x in r["ci"]) and r["ci"][0] < 1.0 < r["ci"][1]
    assert r["p"] > 0.1


def test_identical_nights_read_no_spread():
    """Guard: identical nights both sides: ratio 1, interval [1, 1], p 1; a single night a
    side: a ratio, no interval."""
    from orchestrator.review.compare import night_ratio

    assert night_ratio([100.0] * 4, [100.0] * 4) == {"ratio": 1.0, "ci": [1.0, 1.0],
                                                      "p": 1.0, "memory": 0.0}
    assert night_ratio([100.0], [120.0])["ci"] is None


def test_zero_and_negative_rates_are_not_nights():
    """Guard: a zero or negative rate is no night (no log): left out, not a crash."""
    from orchestrator.review.compare import night_ratio

    r = night_ratio([0.0, -5.0, 100.0, 101.0], [100.0, 101.0])
    assert r == night_ratio([100.0, 101.0], [100.0, 101.0])
    assert night_ratio([0.0, 0.0], [100.0, 101.0])["ratio"] is None


_night = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(_night, min_size=2, max_size=12), b=st.lists(_night, min_size=2, max_size=12),
       scale=st.floats(min_value=0.01, max_value=100.0))
# found by a CI run: the last bit of a log read as a night's memory (0.9 in one unit, 0 in another)
@example(a=[1.0, 1.0], b=[1.0, 1.0000000000000002], scale=0.125)
def test_the_interval_holds_its_ratio_and_ignores_units(a, b, scale):
    """Property: for any positive nights, the interval is finite and holds the ratio, p is
    a probability, and measuring both sides in other units (× scale) changes nothing."""
    from orchestrator.review.compare import night_ratio

    r = night_ratio(a, b)
    s = night_ratio([x * scale for x in a], [x * scale for x in b])
    lo, hi = r["ci"]
    assert math.isfinite(lo) and math.isfinite(hi)
    assert lo <= r["ratio"] * (1 + 1e-9) and r["ratio"] <= hi * (1 + 1e-9)
    assert 0.0 <= r["p"] <= 1.0
    assert s["ratio"] == pytest.approx(r["ratio"], rel=1e-6)
    assert s["memory"] == r["memory"]


# -- the repetition spread: consistent across n? --------------------------------------------

def _mean_reading(n: int, sigma: float, draws: int, seed: int) -> float:
    from agent.stats import repetition_spread

    rng = random.Random(seed)
    return statistics.fmean(repetition_spread([100 * (1 + rng.gauss(0, sigma))
                                               for _ in range(n)]) for _ in range(draws))


def _set_aside(n: int, sigma: float, draws: int, seed: int, limit: float = 0.10) -> float:
    from agent.stats import repetition_spread

    rng = random.Random(seed)
    return sum(repetition_spread([100 * (1 + rng.gauss(0, sigma)) for _ in range(n)]) >= limit
               for _ in range(draws)) / draws


def test_three_repetitions_read_sigma_as_two_do():
    """Audit 27 spread (low), closed: three repetitions read the classic CV, σ × c4(3) =
    0.886 on average where two read 1.00, so three were the most lenient n (at a true CV on
    the 10% limit 37.0% set aside, n=2 42.4%, n=4 44.6%). Now ÷ c4(3)."""
    two, three = _mean_reading(2, 0.05, 20000, 2718), _mean_reading(3, 0.05, 20000, 2718)
    assert three / two == pytest.approx(1.0, abs=0.04), (two, three)


def test_more_repetitions_never_hide_a_noisy_config():
    """Audit 27 spread (low), closed: a seventh repetition made a noisy config likelier to
    pass: at a true CV of 1.5× the 10% limit 87.5% of six-repetition configs were set aside
    but 81.1% of seven (20,000 draws, seed 2718): the third-farthest repetition (ceil(7/3))
    stepped down at n = 7. The distance at n/3 is now interpolated between ranks: 87.2% and
    90.8% (2× the limit: 95.0% and 96.8%)."""
    six, seven = _set_aside(6, 0.15, 20000, 2718), _set_aside(7, 0.15, 20000, 2718)
    assert seven >= six - 0.01, (six, seven)


def test_two_repetitions_read_sigma_without_bias():
    """Guard: √π/2 × |a − b| / mean averages σ (20,000 pairs at σ 5%: within 2%)."""
    assert _mean_reading(2, 0.05, 20000, 2718) == pytest.approx(0.05, rel=0.02)
