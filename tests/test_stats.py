from hypothesis import given
from hypothesis import strategies as st

from agent.stats import acceptance_rounds, acceptance_summary, decode_rates, percentile, slope


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 95) == 10
    assert percentile([], 50) is None
    assert abs(percentile(list(range(101)), 95) - 95.0) < 1e-9


def test_slope_of_a_line_and_degenerate_input():
    assert abs(slope([0, 1, 2, 3], [1, 3, 5, 7]) - 2.0) < 1e-12
    assert slope([1], [1]) is None
    assert slope([2, 2, 2], [1, 2, 3]) is None


def test_decode_rate_is_slope_after_skipping_warmup_tokens():
    # First token at 1 s (prefill), then a slow start, then 100 tok/s steady.
    times = [1.0] + [1.0 + 0.05 * i for i in range(1, 11)]
    times += [times[-1] + 0.01 * i for i in range(1, 101)]
    rate, mean, skipped = decode_rates(times, skip=10)
    assert skipped == 10
    assert abs(rate - 100.0) < 1e-6
    assert mean < rate  # the plain mean includes the slow start


def test_decode_rate_keeps_at_least_16_tokens():
    times = [0.0] + [0.1 * i for i in range(1, 21)]
    rate, _, skipped = decode_rates(times, skip=64)
    assert skipped == 4 and abs(rate - 10.0) < 1e-6


def test_decode_rate_keeps_at_least_half_of_a_short_generation():
    # 63 decode tokens at 100 tok/s after a 10 tok/s start of 8: skipping 64 would leave
    # the last 16 (~0.16 s); at least half are kept, so the slope spans 31 tokens
    times = [0.0] + [0.1 * i for i in range(1, 9)]
    times += [times[-1] + 0.01 * i for i in range(1, 56)]
    rate, _, skipped = decode_rates(times, skip=64)
    assert (len(times) - 1, skipped) == (63, 32) and abs(rate - 100.0) < 1e-6


@given(st.integers(2, 400), st.integers(0, 200))
def test_decode_rate_skip_never_takes_more_than_half(n, skip):
    times = [0.0] + [0.01 * i for i in range(1, n + 1)]
    _, _, skipped = decode_rates(times, skip=skip)
    assert 0 <= skipped <= skip and n - skipped >= min(n, max(16, n // 2))
    if n - skip >= max(16, n // 2):  # enough left after the declared skip: applied whole
        assert skipped == skip


def test_acceptance_rounds_rebuilt_from_from_draft_flags():
    # k=3: round 1 accepts 2 then target token; round 2 accepts 3 then target;
    # round 3 accepts 0 (target token only); round 4 limited by max_tokens=10 to 2 drafts.
    flags = [True, True, False, True, True, True, False, False, True, False]
    rounds = acceptance_rounds(flags, k=3, max_tokens=10)
    assert rounds == [(3, 2), (3, 3), (3, 0), (2, 1)]
    s = acceptance_summary(flags, k=3, max_tokens=10)
    assert s["drafted_tokens"] == 11 and s["accepted_tokens"] == 6
    assert s["accepted_tokens"] == sum(flags)
    assert s["acceptance_by_position"][0] == {"position": 1, "drafted": 4, "accepted": 3,
                                              "rate": 0.75}
    assert s["acceptance_by_position"][2]["drafted"] == 3


def test_acceptance_when_budget_ends_inside_accepted_run():
    # max_tokens reached right after accepted draft tokens: no trailing target token.
    flags = [False, True, True]
    assert acceptance_rounds(flags, k=4, max_tokens=3) == [(3, 0), (2, 2)]
