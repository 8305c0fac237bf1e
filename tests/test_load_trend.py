"""An open loop's saturation is judged by the trend of its lag (issue 27, item 6): the
Theil-Sen slope of completion-less-schedule over the schedule, with Sen's bound, so that
service which keeps up however its times scatter (random lengths, every other reply slow,
batches on a tick) reads ok, a queue that grows reads saturated, and a failed request
counts against the served rate wherever it falls."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from agent.load import Outcome, arrival_times, saturation, summarize
from agent.stats import kendall_z, sen_slope


def test_sen_slope_of_four_points_by_hand():
    """(0,0) (1,1) (2,0) (3,1): the six pairs' slopes are -1, 0, 0, 1/3, 1, 1, median 1/6;
    Kendall's S over four points has sd √(4·3·13/18) = 2.94, so the 90% bounds are the
    slopes of rank round((6 ∓ 1.645 × 2.94) / 2) = 1 and 5 + 1 = 6: -1 and 1. Three
    points bound nothing (ranks 0 and 4 of 3)."""
    assert sen_slope([0, 1, 2, 3], [0, 1, 0, 1]) == (pytest.approx(1 / 6), -1.0, 1.0)
    assert sen_slope([0, 1, 2], [0, 1, 0]) == (0.0, -math.inf, math.inf)
    assert sen_slope([1.0, 1.0], [0.0, 5.0]) is None  # no two distinct xs: no slope


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=60, unique=True), st.data())
def test_sen_slope_is_scipys_theilslopes(xs, data):
    """For any points with distinct xs and distinct ys (a schedule's times are; lags
    measured to the microsecond nearly always), the slope and its 90% bounds are scipy's
    ``theilslopes(alpha=0.90)``, where ours are finite (scipy clips an index ours leave
    unbounded). With ties scipy corrects Kendall's variance for them (and can give nan);
    ours does not, which only widens the bounds."""
    ys = data.draw(st.lists(st.floats(-100, 100), min_size=len(xs), max_size=len(xs),
                            unique=True))
    got = sen_slope(xs, ys)
    ref = sps.theilslopes(ys, xs, alpha=0.90)
    assert got[0] == pytest.approx(ref.slope, rel=1e-9, abs=1e-9)
    for mine, theirs in ((got[1], ref.low_slope), (got[2], ref.high_slope)):
        if math.isfinite(mine):
            assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=3, max_size=50))
def test_kendall_z_is_scipys_test_with_ties(points):
    """For any points, ties in both included (requests sent together, waits alike): the
    two-sided p of our z is scipy's asymptotic Kendall test's (tau-b, tie-corrected)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    z = kendall_z(xs, ys)
    ref = sps.kendalltau(xs, ys, method="asymptotic")
    if z is None or math.isnan(ref.pvalue):
        assert z is None or len(set(xs)) < 2 or len(set(ys)) < 2
        return
    assert math.erfc(abs(z) / math.sqrt(2)) == pytest.approx(ref.pvalue, abs=1e-9)


def test_waits_that_differ_at_the_ends_without_a_trend_are_no_queue():
    """Waits of 10 ms or 5 s (a long prefill for some prompts), 5 s at requests 0, 1, 6,
    7, 12, 13 and 14 of 16 at 1 req/s: the thirds' medians (requests 0-4, 11-15) differ by
    the whole 5 s, yet the waits do not surely rise (Kendall's z 0.05), so the queue did
    not grow: 0 (before: 4990 ms, 'queue growing'). 5 s at the last four only (z 2.9) is
    growth, 4990 ms."""
    slow = {0, 1, 6, 7, 12, 13, 14}

    def level(slow):
        return [Outcome(i, i, chunk_times=[w, w + 0.1], end=i + w + 0.1)
                for i in range(16) for w in [5.0 if i in slow else 0.01]]

    assert summarize(level(slow), 21.0)["queue_growth_ms"] == 0.0
    assert summarize(level({12, 13, 14, 15}), 21.0)["queue_growth_ms"] == 4990.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 100_000), min_size=8, max_size=400, unique=True),
       st.floats(-10, 10), st.floats(-10, 10))
def test_a_straight_line_is_its_own_bound(ms, a, b):
    """Points on one line at any distinct times to the millisecond, 8 or more (thinned past
    300): slope and both bounds are the line's slope."""
    xs = [m / 1e3 for m in ms]
    slope, lo, hi = sen_slope(xs, [a + b * x for x in xs])
    assert slope == pytest.approx(b, abs=1e-6) and lo == pytest.approx(b, abs=1e-6)
    assert hi == pytest.approx(b, abs=1e-6)


def _verdict(outs: list[Outcome], rate: float) -> str | None:
    return saturation([summarize(outs, max(o.end for o in outs))], "request_rate", rate)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(0.5, 50.0), st.integers(16, 80), st.sampled_from(["constant", "poisson"]),
       st.floats(0.0, 5.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.booleans(),
       st.integers(0, 2**20))
def test_a_server_that_answers_each_request_in_bounded_time_keeps_up(
        rate, n, arrivals, least, spread, first, two_point, seed):
    """Any schedule, answered by a server with unlimited parallelism whose reply time is
    drawn afresh for each request, whatever came before it (so nothing queues): at least
    ``least`` seconds, and up to ``spread`` times the arrivals' span more (uniformly, or
    either end: every other kind of reply), the first token at any share of it. Over 40
    such levels at most 4 read saturated: the bound's one-sided 5% at a flat trend is the
    worst case, approached only when the scatter dwarfs the span (measured: 0-3%
    here). Derandomized, as the claim is a rate, not a certainty per level."""
    said = 0
    for k in range(40):
        rng = random.Random(seed + k)
        sched = arrival_times(rate, n, arrivals, seed + k)
        width = spread * (sched[-1] - sched[0])
        outs = []
        for t in sched:
            d = least + 0.001 + width * (rng.choice((0.0, 1.0)) if two_point else rng.random())
            outs.append(Outcome(t, t, chunk_times=[first * d, d], end=t + d))
        said += _verdict(outs, rate) is not None
    assert said <= 4, said


def _serial(sched: list[float], rate: float, load: float, jitter: float, first: float,
            rng: random.Random) -> list[Outcome]:
    """One request at a time in arrival order, each ``load`` / rate ± ``jitter``."""
    outs, free = [], 0.0
    for t in sched:
        service = load / rate * rng.uniform(1 - jitter, 1 + jitter)
        start = max(t, free)
        free = start + service
        outs.append(Outcome(t, t, chunk_times=[start - t + first * service, free - t],
                            end=free))
    return outs


@settings(max_examples=150, deadline=None)
@given(st.floats(0.5, 50.0), st.integers(16, 120), st.floats(1.5, 4.0), st.floats(0.0, 0.2),
       st.floats(0.0, 1.0), st.integers(0, 2**31))
def test_a_serial_server_offered_over_its_capacity_is_saturated(rate, n, load, jitter,
                                                               first, seed):
    """Constant arrivals to a server that serves one request at a time, each taking 1.5 to
    4 times the gap (±20%), 16 requests or more: its queue grows and the level reads
    'cannot keep up', served at most what the server can do (a little over its mean rate
    only by the bound's margin: never above 95% of offered)."""
    rng = random.Random(seed)
    sched = arrival_times(rate, n, "constant", seed)
    outs = _serial(sched, rate, load, jitter, first, rng)
    m = summarize(outs, max(o.end for o in outs))
    assert m["served_rps"] < 0.95 * m["offered_rps"], m
    assert saturation([m], "request_rate", rate).startswith("cannot keep up: "), m


@settings(max_examples=100, deadline=None)
@given(st.integers(40, 120), st.floats(2.0, 4.0), st.floats(0.0, 0.2), st.integers(0, 2**31))
def test_a_serial_server_under_poisson_arrivals_is_saturated(n, load, jitter, seed):
    """Poisson arrivals (4 a second) to the same serial server at 2 to 4 times its
    capacity, 40 requests or more: saturated (the arrivals' own scatter widens the bound;
    at 1.5× and 60 requests 10 of 2,000 levels read ok)."""
    rng = random.Random(seed)
    sched = arrival_times(4.0, n, "poisson", seed)
    why = _verdict(_serial(sched, 4.0, load, jitter, 0.1, rng), 4.0)
    assert why is not None and why.startswith("cannot keep up: "), why


@settings(max_examples=150, deadline=None)
@given(st.floats(0.5, 50.0), st.integers(3, 64), st.floats(0.0, 2.0), st.data())
def test_failures_count_against_served_wherever_they_fall(rate, n, latency, data):
    """Constant arrivals, each answered ``latency`` later, any set of requests failed
    (at least two succeed): served is offered × the share that succeeded, whichever
    failed, and the verdict is the same for any placement of the same number."""
    failed = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 2))
    outs = [Outcome(i / rate, i / rate, chunk_times=[] if i in failed else [latency / 2,
                                                                            latency + 1e-3],
                    end=i / rate + latency + 1e-3, error="reset" if i in failed else None)
            for i in range(n)]
    m = summarize(outs, n / rate + latency)
    assert m["served_rps"] == pytest.approx(m["offered_rps"] * (n - len(failed)) / n,
                                            abs=0.002), m
    shifted = {(i + data.draw(st.integers(0, n - 1))) % n for i in failed}
    if len(shifted) == len(failed):
        again = [Outcome(o.scheduled, o.sent, chunk_times=[] if i in shifted else
                         [latency / 2, latency + 1e-3], end=o.end,
                         error="reset" if i in shifted else None)
                 for i, o in enumerate(outs)]
        assert (_verdict(again, rate) is None) == (_verdict(outs, rate) is None)
