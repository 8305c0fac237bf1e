"""The df a through-the-noise interval is read on (``compare.night_ratio``'s ``few_df``):
Welch's where both sides have three trials or more; beside a side of two, Hsu's for the
interval a pass is read on (the smaller side's own df); and for the 95% interval beside a
side of one or two, the pooled spread's own df (Satterthwaite): the summed df where the
sides' spreads agree, never below the few side's own. Oracles: scipy's t tests and t
quantiles, on the logs of the trials."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from scipy import stats

from orchestrator.review.compare import POOL_BELOW, night_ratio
from orchestrator.review.through_noise import pass_interval, ratio_interval

rates = st.lists(st.floats(1.0, 1e4), min_size=1, max_size=9)
levels = st.sampled_from([0.95, 0.975, 1 - 0.05 / 6])


def _logs(xs: list[float]) -> list[float]:
    return [math.log(x) for x in xs]


def _spread(xs: list[float]) -> float:
    return statistics.variance(_logs(xs)) if len(xs) > 1 else 0.0


def _close(got, want, rel: float = 1e-9) -> bool:
    return got is not None and all(math.isclose(g, w, rel_tol=rel) for g, w in zip(got, want))


@settings(max_examples=60, deadline=None)
@given(base=rates, spec=rates, level=levels)
@example(base=[100.0, 104.0, 96.0], spec=[150.0, 90.0, 210.0], level=0.95)
def test_three_trials_a_side_are_welchs_interval_for_a_pass_and_a_fail(base, spec, level):
    assume(min(len(base), len(spec)) > POOL_BELOW and _spread(base) + _spread(spec) > 1e-12)
    lo, hi = stats.ttest_ind(_logs(spec), _logs(base), equal_var=False
                             ).confidence_interval(level)
    want = (math.exp(statistics.fmean(_logs(spec)) - statistics.fmean(_logs(base))),
            math.exp(lo), math.exp(hi))
    assert _close(ratio_interval(base, spec, level), want)
    assert _close(pass_interval(base, spec, level), want)


@settings(max_examples=60, deadline=None)
@given(base=rates, spec=rates, level=levels)
@example(base=[100.0, 104.0, 96.0, 101.0, 99.0, 103.0, 97.0, 100.0], spec=[160.0, 240.0],
         level=0.975)
def test_a_pass_beside_two_trials_is_welchs_spread_on_the_smaller_sides_df(base, spec, level):
    """Hsu's rule; a side of one trial has no spread of its own, so nothing passes on it."""
    n = min(len(base), len(spec))
    assume(n <= POOL_BELOW)
    got = pass_interval(base, spec, level)
    if n < 2:
        assert got is None
        return
    d = statistics.fmean(_logs(spec)) - statistics.fmean(_logs(base))
    q = stats.t.ppf(0.5 + level / 2, n - 1) * math.sqrt(
        _spread(base) / len(base) + _spread(spec) / len(spec))
    assert _close(got, (math.exp(d), math.exp(d - q), math.exp(d + q)))


@settings(max_examples=60, deadline=None)
@given(base=rates, spec=rates, level=levels)
@example(base=[100.0, 101.0, 99.0, 100.0, 100.0, 102.0, 98.0, 100.0], spec=[160.0, 240.0],
         level=0.95)
@example(base=[100.0, 100.0], spec=[90.0, 140.0, 120.0], level=0.95)
def test_beside_a_few_trials_the_df_lies_between_the_few_sides_own_and_the_summed(
        base, spec, level):
    """The 95% interval beside a side of one or two trials is as wide as the pooled reading
    on the summed df (compare's) or wider, and no wider than that spread read on the
    smallest own df a side with a spread has: Satterthwaite's df of a pooled spread lies
    between its parts' df and their sum."""
    assume(min(len(base), len(spec)) <= POOL_BELOW)
    got = ratio_interval(base, spec, level)
    summed = night_ratio(base, spec, level, memory=False, few=POOL_BELOW)
    if got is None:
        return
    own = min(len(xs) - 1 for xs in (base, spec) if len(xs) > 1)
    half, summed_half = math.log(got[2] / got[0]), math.log(summed["ci"][1] / got[0])
    q = 0.5 + level / 2
    total = len(base) + len(spec) - 2
    assert summed_half * (1 - 1e-9) <= half
    assert half <= summed_half * stats.t.ppf(q, own) / stats.t.ppf(q, total) * (1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(w=st.lists(st.floats(-3.0, 3.0), min_size=1, max_size=2),
       z=st.lists(st.floats(-3.0, 3.0), min_size=2, max_size=9),
       sd=st.floats(0.01, 0.5), shift=st.floats(-1.0, 1.0), level=levels)
def test_sides_whose_spreads_agree_read_the_summed_df_as_students_t(w, z, sd, shift, level):
    """Two (or one) baseline trials and any number of others, planted with the same log
    spread: the interval is Student's pooled t on the summed df, scipy's equal_var."""
    def planted(xs: list[float], centre: float) -> list[float]:
        if len(xs) == 1:
            return [math.exp(centre)]
        m, s = statistics.fmean(xs), statistics.stdev(xs)
        return [math.exp(centre + sd * (x - m) / s) for x in xs]

    assume(all(statistics.stdev(xs) > 1e-3 for xs in (w, z) if len(xs) > 1))
    base, spec = planted(w, 4.6), planted(z, 4.6 + shift)
    lo, hi = stats.ttest_ind(_logs(spec), _logs(base), equal_var=True
                             ).confidence_interval(level)
    got = ratio_interval(base, spec, level)
    assert got is not None
    assert got[1:] == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-9)
