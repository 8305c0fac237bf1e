"""Small, dependency-free statistics for per-token timings and acceptance."""

from __future__ import annotations

import math
import statistics
from collections import Counter


def median(values) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def cv(values) -> float | None:
    """Coefficient of variation (sample stdev / mean) of the non-None values."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    mean = statistics.fmean(vals)
    return statistics.stdev(vals) / mean if mean else None


# 1/Φ⁻¹(3/4): scales the median absolute deviation to the stdev of a normal sample
MAD_TO_SD = 1.4826
# small-sample factors that make the scaled MAD unbiased for normal noise (Croux and
# Rousseeuw 1992, b_n; n/(n - 0.8) past 9)
_MAD_SMALL_N = {4: 1.363, 5: 1.206, 6: 1.200, 7: 1.140, 8: 1.129, 9: 1.107}


def robust_cv(values) -> float | None:
    """1.4826 × b_n × MAD / median of the non-None values (n ≥ 4): the CV for normal
    noise, which one cold or preempted repetition among several does not move."""
    vals = [v for v in values if v is not None]
    n = len(vals)
    if n < 4:
        return None
    mid = statistics.median(vals)
    if not mid:
        return None
    b = _MAD_SMALL_N.get(n, n / (n - 0.8))
    return MAD_TO_SD * b * statistics.median(abs(v - mid) for v in vals) / abs(mid)


# E|a − b| = 2σ/√π for two normal draws: √π/2 × |a − b| is unbiased for σ
PAIR_TO_SD = math.sqrt(math.pi) / 2
C4_THREE = math.sqrt(math.pi) / 2  # c4(3) = Γ(3/2)/Γ(1): E[s] = c4(3)·σ for 3 normal values


def pair_cv(a: float, b: float) -> float | None:
    """The CV two repetitions show, unbiased for normal noise: √π/2 × |a − b| / mean. Their
    sample CV, |a − b| / (√2 × mean), reads σ 20% low on average (c4(2) = 0.80; at n = 3 it is
    0.89, at n ≥ 4 the robust reading carries its own b_n): 100 and 114 tok/s read 9.3%, under
    a 10% limit, though a config whose true CV is 10% shows a gap that wide or wider 42% of the
    time. Read this way two repetitions are reliable at a 10% limit only within 11.3% of their
    mean (the limit × 2/√π): 100 and 114 read 11.6%, set aside."""
    mean = (a + b) / 2
    return PAIR_TO_SD * abs(a - b) / abs(mean) if mean else None


def repetition_spread(values) -> float | None:
    """How far the repetitions spread, as a reliability reading for their median. Two
    values: their CV unbiased for normal noise (``pair_cv``). Three cannot tell an outlier
    from a second state: the classic CV, made unbiased for normal noise (÷ c4(3)). From four,
    the larger of the robust CV and how far from the median a third of the repetitions
    lie: the first is the CV for normal noise, the second sees two machine states (two of
    five runs 40% faster, a 4/3 split of seven: MAD reads 0 there), and one cold run among
    four or more moves neither (184, 667, 674, 688 tok/s: classic CV 45%, this 3%). The
    price, measured on normal noise at half the 10% limit: 6-7% of configs set aside at
    n = 4-6 (classic CV: under 1%); at twice the limit 80% / 91% / 95% (85% / 91% / 94%)."""
    vals = [v for v in values if v is not None]
    if len(vals) == 2:
        return pair_cv(*vals)
    r = robust_cv(vals)
    if r is None:
        c = cv(vals)
        # three values: their sample CV reads σ × c4(3) = √π/2 on average, 11% low, which made
        # three the most lenient count (audit 27: at a true CV on the limit 37% set aside,
        # two 42%, four 45%); corrected, 46%
        return c / C4_THREE if c is not None and len(vals) == 3 else c
    mid = statistics.median(vals)
    far = sorted((abs(v - mid) / abs(mid) for v in vals), reverse=True)
    return max(r, _third_farthest(far))


def _third_farthest(far: list[float]) -> float:
    """How far a third of the repetitions lie (``far``: each one's distance from the median,
    farthest first): the second farthest up to six, then the distance at n/3 interpolated
    between neighbours. The whole rank (ceil(n/3)) stepped from 33% of six to 43% of seven,
    so a seventh repetition hid a noisy config more often than six did (audit 27: at a true
    CV 1.5× the limit 87.5% of sixes set aside, 81.1% of sevens); interpolated, 4-13
    repetitions set aside 68, 81, 87, 91, 91, 91, 92, 93, 94, 94% there."""
    pos = max(2.0, len(far) / 3)
    i = int(pos)
    return far[i - 1] + (pos - i) * (far[i] - far[i - 1]) if pos > i else far[i - 1]


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), as numpy's default."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs; None when undefined."""
    n = len(xs)
    if n < 2:
        return None
    mx_, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx_) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx_) * (y - my) for x, y in zip(xs, ys)) / sxx


SEN_MOST = 300  # points a Theil-Sen fit pairs (45k slopes); more are thinned evenly


def sen_slope(xs: list[float], ys: list[float], z: float = 1.645
              ) -> tuple[float, float, float] | None:
    """Theil-Sen slope of ys over xs (the median of every pair's slope) and Sen's (1968)
    distribution-free bounds (z = 1.645: 90% two-sided, each bound one-sided 95%), from
    the ranks of the pairs' slopes that Kendall's S allows; None without two distinct xs.
    The bounds widen with the scatter about the trend and need no model of it: a bound is
    infinite where too few points give it. Over SEN_MOST points, every k-th (in x order)
    is kept."""
    pts = sorted(zip(xs, ys))
    if len(pts) > SEN_MOST:
        pts = [pts[i * len(pts) // SEN_MOST] for i in range(SEN_MOST)]
    slopes = sorted((y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts)
                    for x2, y2 in pts[i + 1:] if x2 > x1)
    if not slopes:
        return None
    n, m = len(pts), len(slopes)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    # Sen's ranks (m ∓ c) / 2 rounded, as scipy's theilslopes takes them (1-based)
    lo_rank, hi_rank = round((m - c) / 2), round((m + c) / 2) + 1
    mid = statistics.median(slopes)
    return (mid, slopes[lo_rank - 1] if lo_rank >= 1 else -math.inf,
            slopes[hi_rank - 1] if hi_rank <= m else math.inf)


def kendall_z(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's S (concordant less discordant pairs) of ys against xs over its standard
    deviation with ties in either corrected for (Kendall 1970); None where it has none.
    Above 1.645: ys surely rise with xs (one-sided 5%), however they scatter, and a tie
    (requests sent together, waits alike) counts neither way."""
    n = len(xs)
    s = sum((x2 > x1) - (x2 < x1) if y2 > y1 else (x1 > x2) - (x1 < x2) if y2 < y1 else 0
            for i, (x1, y1) in enumerate(zip(xs, ys)) for x2, y2 in zip(xs[i + 1:], ys[i + 1:]))

    def ties(v: list[float], f) -> float:
        return sum(f(c) for c in Counter(v).values())

    var = (n * (n - 1) * (2 * n + 5) - ties(xs, lambda t: t * (t - 1) * (2 * t + 5))
           - ties(ys, lambda t: t * (t - 1) * (2 * t + 5))) / 18
    if n > 2:
        var += (ties(xs, lambda t: t * (t - 1) * (t - 2)) * ties(ys, lambda t: t * (t - 1)
                                                                  * (t - 2))
                / (9 * n * (n - 1) * (n - 2)))
    if n > 1:
        var += ties(xs, lambda t: t * (t - 1)) * ties(ys, lambda t: t * (t - 1)) / (
            2 * n * (n - 1))
    return s / math.sqrt(var) if var > 0 else None


def decode_rates(token_times_s: list[float], skip: int) -> tuple[float | None, float | None, int]:
    """Steady decode tok/s (slope of token index over arrival time) and the plain mean rate.

    The first token (prefill) is excluded from both. ``skip`` further decode tokens
    are dropped for the slope, but at least half of them (and at least 16) are kept: a slope
    over the last 16 of 63 tokens spans ~60 ms of a fast speculative decode, where one
    scheduler tick moves it by a fifth. Returns (slope, mean, skipped).
    """
    decode = token_times_s[1:]
    if len(decode) < 2:
        return None, None, 0
    span = decode[-1] - token_times_s[0]
    mean = len(decode) / span if span > 0 else None
    skip = max(0, min(skip, len(decode) - max(16, len(decode) // 2)))
    kept = decode[skip:]
    rate = slope(kept, list(range(len(kept))))
    return rate, mean, skip


def acceptance_rounds(from_draft: list[bool], k: int, max_tokens: int) -> list[tuple[int, int]]:
    """Rebuild speculative verify rounds as (drafted, accepted) pairs.

    mlx-lm yields, per round, the accepted draft tokens (``from_draft`` True) then one
    target token (False); a round drafts min(k, max_tokens - tokens so far).
    """
    rounds: list[tuple[int, int]] = []
    i, n = 0, len(from_draft)
    while i < n:
        drafted = min(k, max_tokens - i)
        accepted = 0
        while i < n and from_draft[i] and accepted < drafted:
            accepted += 1
            i += 1
        if i < n and not from_draft[i]:
            i += 1
        rounds.append((drafted, accepted))
    return rounds


def acceptance_summary(from_draft: list[bool], k: int, max_tokens: int) -> dict:
    rounds = acceptance_rounds(from_draft, k, max_tokens)
    drafted = sum(d for d, _ in rounds)
    accepted = sum(a for _, a in rounds)
    by_pos = []
    for pos in range(1, k + 1):
        d = sum(1 for dr, _ in rounds if dr >= pos)
        a = sum(1 for _, ac in rounds if ac >= pos)
        by_pos.append({"position": pos, "drafted": d, "accepted": a,
                       "rate": round(a / d, 4) if d else None})
    return {
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "verify_rounds": len(rounds),
        "mean_accepted_len": round(accepted / len(rounds), 4) if rounds else None,
        # vLLM's and AIPerf's mean acceptance length: the target's bonus token counted too
        "mean_acceptance_length_vllm": round(1 + accepted / len(rounds), 4) if rounds else None,
        "acceptance_by_position": by_pos,
    }


def median_interval(xs: list[float], confidence: float = 0.90
                    ) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of whatever the ``xs`` were drawn from
    (independent draws, any continuous distribution): the order statistics
    [x_(j), x_(n+1-j)] with the largest j whose coverage 1 − 2·P(Binomial(n, ½) ≤ j − 1) is
    at least ``confidence``; (low, high, coverage), or None when even [min, max] covers
    less (fewer than 5 draws for 90%)."""
    x, n = sorted(xs), len(xs)
    best, tail, comb, total = None, 0, 1, 2 ** n
    for j in range(1, n // 2 + 1):
        tail += comb  # sum of C(n, i) for i < j, kept as an int: one pass, no float overflow
        comb = comb * (n - j + 1) // j
        cover = 1.0 - 2 * tail / total  # int / int: exact for thousands of rounds
        if cover < confidence:
            break
        best = (x[j - 1], x[n - j], cover)
    return best
