"""Stop when the answer is known (issue 14): the adaptive sweep picks what the full grid
picks, on planted speedup curves and on a real sweep of the demo pair, with at most half
the generations; its decisions are said, and a bad section is refused at lock."""


import pytest

from agent.adaptive import check_adaptive, median_ci, past_the_knee, resolved
from tests.history import SPEEDUP_CURVES, adaptive_grid, full_grid, planted_speedups


def test_the_median_interval_is_the_order_statistic_one():
    # n=5 at 90%: P(B ≤ 0) = 1/32 ≤ 5% < P(B ≤ 1) = 6/32, so [x(1), x(5)]... j = 1
    assert median_ci([5, 1, 4, 2, 3], 0.9) == (1, 5)
    # n=8 at 90%: P(B ≤ 1) = 9/256 ≤ 5% < P(B ≤ 2) = 37/256: [x(2), x(7)]
    assert median_ci(list(range(1, 9)), 0.9) == (2, 7)
    assert median_ci([1, 2, 3, 4], 0.9) is None  # too few for any 90% interval
    assert median_ci([1, 2, 3, 4, 5], 0.95) is None


@pytest.mark.parametrize("name", sorted(SPEEDUP_CURVES))
def test_on_planted_curves_adaptive_picks_the_full_grids_width_in_half_the_time(name):
    curve = SPEEDUP_CURVES[name]
    widths = sorted(curve)
    spent = full = 0
    for seed in range(20):
        sample = planted_speedups(curve, seed)
        grid_best, grid_runs = full_grid(widths, 12, sample)
        best, runs, why = adaptive_grid(widths, 12, {"tolerance": 0.05}, sample)
        assert best == grid_best, (name, seed, why)
        spent, full = spent + runs, full + grid_runs
    assert spent <= 0.5 * full, (name, spent, full)


def test_widths_past_the_knee_stop_once_two_in_a_row_are_worse_with_confidence():
    spec = resolved({}, 10)
    clear = {2: [1.20, 1.21, 1.22, 1.19, 1.20], 3: [1.30, 1.31, 1.29, 1.30, 1.32],
             4: [1.10, 1.11, 1.09, 1.10, 1.12], 6: [1.00, 1.01, 0.99, 1.0, 1.02],
             8: [0.9, 0.91, 0.9, 0.92, 0.9]}
    stop = past_the_knee(clear, spec)
    assert sorted(stop) == [4, 6, 8] and "widths 4 and 6 are both slower than width 3" \
        in stop[4]
    # one worse width followed by one that overlaps the best: not yet
    mixed = {**clear, 6: [1.2, 1.4, 1.31, 1.25, 1.33]}
    assert past_the_knee(mixed, spec) == {}
    # too few repetitions for any interval: nothing is known
    assert past_the_knee({k: v[:3] for k, v in clear.items()}, spec) == {}


@pytest.mark.parametrize("spec, message", [
    ({"tolerance": 0}, "adaptive.tolerance: a share between 0 and 1"),
    ({"confidence": 1.0}, "adaptive.confidence: a share from 0.5 to below 1"),
    ({"min_repetitions": 1}, "adaptive.min_repetitions: an integer from 2 to 1000"),
    ({"min_repetitions": 9}, "adaptive.min_repetitions 9 is more than sweep.repetitions 5"),
    ({"max_repetitions": 9}, "adaptive: unknown key(s) max_repetitions"),
])
def test_a_bad_adaptive_section_is_refused(spec, message):
    assert check_adaptive(spec, 5).startswith(message)
