"""How much a node's nights remember each other, for `compare`'s interval.

A night's level leans on the last one's (a machine's state carries over: AR(1) memory φ),
so five nights of one week agree with each other more than with the other week's, and
Welch's t on them is too narrow: at φ 0.5 its 95% interval covers 78% and it claims 8% false
differences (2,000 planted pairs, tests/test_audit_27_stats.py). The mean of ``n`` AR(1)
nights scatters ``g(n, φ) = Σ_ij φ^|i−j| / n²`` × σ² (not σ²/n), and their sample variance
reads only ``σ² (1 − g) n / (n − 1)``; both are corrected for the φ taken.

Which φ: five nights a side barely show it. The lag-1 autocorrelation of a side's nights
about their own mean has (ratio of expectations) −0.20 at φ 0, +0.04 at 0.5, +0.17 at 0.9
for five nights, with a standard error of about 1/√(pairs of neighbours) ≈ 0.35 on ten
nights. A plug-in estimate (the φ whose expected autocorrelation is the one observed)
covers 88.6% at φ 0.5; φ is therefore taken where the expectation meets the observed value
plus 0.6 of its standard error (a one-sided ~73% upper bound; 0.5 covered 183 of the audit's
200 pairs, 0.75 costs a third of the power). 2,000 planted pairs, 5 nights a side, night σ
5%: φ 0 → 0.25% false claims, 98.7% coverage; φ 0.5 → 1.5%, 95.6%; φ 0.7 → 2.5%, 94.0%.
The price is power: a true 10% difference is found in 14% of pairs at φ 0 (Welch: 37%) and
11% at φ 0.5 (Welch's 52% there is mostly luck it cannot tell from memory; knowing φ
exactly gives 14%).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

MAX_PHI = 0.9      # the most memory believed (as the change-point noise, review/arnoise.py)
# fewer neighbour pairs (three nights a side): the autocorrelation's standard error (≥ 0.5)
# dwarfs all it can tell (−0.33 at φ 0 … −0.18 at 0.9 for three nights), so every such
# compare would take φ 0.9; no memory is read there: plain Welch, as before (a known gap)
MIN_PAIRS = 6
UPPER_SE = 0.6     # how many standard errors of the autocorrelation φ is taken above its estimate


def mean_gain(n: int, phi: float) -> float:
    """Variance of the mean of ``n`` AR(1) nights in units of one night's σ²:
    Σ_ij φ^|i−j| / n² (1/n at φ 0)."""
    if n < 1:
        raise ValueError("mean_gain needs at least one night")
    return (n + 2 * sum((n - k) * phi ** k for k in range(1, n))) / (n * n)


@lru_cache(maxsize=4096)
def _expected_lag1(n: int, phi: float) -> tuple[float, float]:
    """(E[Σ e_i e_{i+1}], E[Σ e_i²]) / σ² for the residuals ``e`` of ``n`` AR(1) nights about
    their own mean: traces of M A M R and M R (M centres, A pairs neighbours)."""
    def r(i: int, j: int) -> float:
        return float(phi ** abs(i - j))
    col = [sum(r(i, j) for i in range(n)) / n for j in range(n)]  # (1'R)_j / n
    tot = sum(col) / n                                           # 1'R1 / n²
    cov = [[r(i, j) - col[i] - col[j] + tot for j in range(n)] for i in range(n)]  # M R M
    return sum(cov[i][i + 1] for i in range(n - 1)), sum(cov[i][i] for i in range(n))


def _expected_autocorrelation(ns: Sequence[int], phi: float) -> float:
    parts = [_expected_lag1(n, round(phi, 2)) for n in ns if n >= 2]
    return sum(p[0] for p in parts) / sum(p[1] for p in parts)


def lag1(sides: Sequence[Sequence[float]]) -> float | None:
    """Pooled lag-1 autocorrelation of each side's values about its own mean (in order);
    None when no side has two values that differ."""
    num = den = 0.0
    for xs in sides:
        if len(xs) < 2:
            continue
        m = sum(xs) / len(xs)
        e = [x - m for x in xs]
        num += sum(a * b for a, b in zip(e, e[1:]))
        den += sum(a * a for a in e)
    return num / den if den > 0 else None


def night_memory(sides: Sequence[Sequence[float]]) -> float:
    """The φ the interval assumes: where the expected autocorrelation of nights like these
    reaches the observed one plus ``UPPER_SE`` standard errors, within [0, MAX_PHI]."""
    ns = [len(xs) for xs in sides if len(xs) >= 2]
    r1 = lag1(sides)
    pairs = sum(n - 1 for n in ns)
    if r1 is None or pairs < MIN_PAIRS:
        return 0.0
    want = r1 + UPPER_SE / math.sqrt(pairs)
    lo, hi = 0.0, MAX_PHI
    if _expected_autocorrelation(ns, lo) >= want:
        return 0.0
    if _expected_autocorrelation(ns, hi) <= want:
        return MAX_PHI
    for _ in range(20):  # the expectation rises with φ: bisect to 0.01
        if hi - lo <= 0.01:
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _expected_autocorrelation(ns, mid) < want else (lo, mid)
    return round(hi, 2)


def mean_variance(s2: float, n: int, phi: float) -> float:
    """Variance of the mean of ``n`` nights whose sample variance is ``s2`` under memory
    ``phi``: σ² = s2 (n − 1) / (n (1 − g)), times g (s2 / n at φ 0)."""
    g = mean_gain(n, phi)
    return s2 * (n - 1) / (n * (1 - g)) * g
