"""Change points: properties of the shapes audit 27cp found misread (review.changepoints,
cpjoin, arselect): a level with noise well under the smallest change reported has none; two
sudden moves the same way two nights apart are steps, not a drift; a level held four nights
or more inside the window is reported at its edges, one held fewer is not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.changepoints import analyse


def _noisy(levels: list[float], noise: list[float]) -> list[float]:
    return [100 * v * (1 + e) for v, e in zip(levels, noise)]


@settings(max_examples=150, deadline=None)
@given(st.integers(6, 70).flatmap(
    lambda n: st.lists(st.floats(-0.004, 0.004), min_size=n, max_size=n)))
def test_a_level_with_noise_under_the_threshold_has_no_change_point(noise):
    """Property: any nightly noise within ±0.4% of one level (any length, so with or
    without a weekly look): nothing is reported."""
    assert analyse(_noisy([1.0] * len(noise), noise)) == []


@settings(max_examples=120, deadline=None)
@given(st.integers(24, 50).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(6, n - 10), st.floats(0.10, 0.25), st.floats(0.10, 0.25),
    st.sampled_from((-1, 1)), st.lists(st.floats(-0.003, 0.003), min_size=n, max_size=n))))
def test_two_sudden_moves_two_nights_apart_are_steps_not_a_drift(case):
    """Property: two moves the same way (10-25% each) two nights apart, noise within
    ±0.3%: no drift, and a step within a night of the first."""
    n, at, a, b, way, noise = case
    levels = [(1 + way * a if i >= at else 1.0) * (1 + way * b if i >= at + 2 else 1.0)
              for i in range(n)]
    got = analyse(_noisy(levels, noise))
    assert not [f for f in got if f["kind"] == "drift"], got
    assert [f for f in got if "step" in f["kind"] and abs(f["index"] - at) <= 1], got


@settings(max_examples=120, deadline=None)
@given(st.integers(24, 50).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(6, n - 12), st.integers(1, 6), st.floats(0.10, 0.25),
    st.sampled_from((-1, 1)), st.lists(st.floats(-0.003, 0.003), min_size=n, max_size=n))))
def test_a_level_held_four_nights_is_reported_and_a_shorter_one_is_not(case):
    """Property: a level 10-25% off held ``held`` nights inside the window (noise within
    ±0.3%): four nights or more, a step at each edge; fewer, nothing."""
    n, at, held, depth, way, noise = case
    levels = [1 + way * depth if at <= i < at + held else 1.0 for i in range(n)]
    got = [(f["kind"], f["index"]) for f in analyse(_noisy(levels, noise))]
    assert got == ([("step", at), ("step", at + held)] if held >= 4 else []), got
