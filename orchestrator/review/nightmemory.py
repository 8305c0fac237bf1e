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

Below six neighbour pairs (three nights a side, two against three) that normal reading
fails: the expectation hardly moves with φ (−0.33 at φ 0 … −0.18 at 0.9 for three nights)
and 1/√pairs (≥ 0.5) is no standard error of so skewed a statistic; the rule before read no
memory there (plain Welch: 84.8% coverage at φ 0.5, 70.1% at 0.9). There φ is taken at the
same kind of bound read exactly: the largest φ under which the observed autocorrelation is
not in the lower ``ALPHA`` tail of its exact distribution (a ratio of quadratic forms in
Gaussian nights, Imhof 1961). Few nights tell little, so the bound is mostly near MAX_PHI
(the most memory believed) and lower only where the nights alternate: three nights a side
at φ 0.5 cover 96.5%, two against three 96.4% (tests/test_audit_27_compare.py).

Not reached (measured there, strict xfails): ≥ 93% at φ 0.9 from eight nights and at φ 0.7
on five. Any bound high enough for them (the exact one at ALPHA 0.2, or 0.8 standard errors)
leaves eight independent nights' 20% difference found in under 80% of pairs (guarded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

MAX_PHI = 0.9      # the most memory believed (as the change-point noise, review/arnoise.py)
# fewer neighbour pairs (three nights a side): the autocorrelation's normal reading (standard
# error ≥ 0.5, the expectation flat in φ) tells nothing; its exact tail is read instead
MIN_PAIRS = 6
UPPER_SE = 0.6     # how many standard errors of the autocorrelation φ is taken above its estimate
ALPHA = 0.25       # below MIN_PAIRS: how far into the lower tail of r the observed one may be
_STEP = 0.01       # φ is read to this
_SAME = 1e-12      # residuals this small (relative to the values) are rounding, not nights


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


def _corr(n: int, phi: float) -> np.ndarray:
    i = np.arange(n)
    return np.asarray(phi ** np.abs(i[:, None] - i[None, :]), dtype=float)


@lru_cache(maxsize=256)
def _forms(ns: tuple[int, ...], phi: float) -> tuple[np.ndarray, np.ndarray]:
    """(L'AL, L'ML) for the sides' nights stacked: A pairs neighbours of a side's residuals
    (x'Ax = Σ e_i e_{i+1}), M centres each side (x'Mx = Σ e_i²), L the Cholesky factor of
    the sides' AR(1) correlation (sides independent)."""
    size = sum(ns)
    a, m, chol = (np.zeros((size, size)) for _ in range(3))
    at = 0
    for n in ns:
        c = np.eye(n) - 1.0 / n
        pair = np.eye(n, k=1) / 2
        s = slice(at, at + n)
        m[s, s], a[s, s] = c, c @ (pair + pair.T) @ c
        chol[s, s] = np.linalg.cholesky(_corr(n, phi))
        at += n
    return chol.T @ a @ chol, chol.T @ m @ chol


_U, _W = np.polynomial.legendre.leggauss(192)
_T = np.pi / 4 * (_U + 1)                  # Gauss–Legendre on (0, π/2), u = tan t
_DU = (np.pi / 4) * _W / np.cos(_T) ** 2   # du, weight included


def _below_zero(lam: np.ndarray) -> float:
    """P(Σ λ_i z_i² ≤ 0), z standard normal: Imhof's integral (accurate to ~1e-7 here)."""
    lam = lam[np.abs(lam) > 1e-12 * float(np.abs(lam).max(initial=0.0))]
    if lam.size == 0 or (lam <= 0).all():
        return 1.0
    if (lam >= 0).all():
        return 0.0
    x = np.outer(np.tan(_T), lam / np.abs(lam).max())
    f = np.sin(0.5 * np.arctan(x).sum(axis=1)) * np.exp(-0.25 * np.log1p(x * x).sum(axis=1))
    return float(0.5 - (f / np.tan(_T) * _DU).sum() / math.pi)


def lag1_cdf(ns: Sequence[int], phi: float, r: float) -> float:
    """P(lag1 ≤ r) for independent sides of ``ns`` AR(1) Gaussian nights at memory ``phi``:
    P(x'(A − rM)x ≤ 0), exact."""
    la, lm = _forms(tuple(ns), round(phi, 4))
    return _below_zero(np.linalg.eigvalsh(la - r * lm))


def lag1(sides: Sequence[Sequence[float]]) -> float | None:
    """Pooled lag-1 autocorrelation of each side's values about its own mean (in order);
    None when no side has two values that differ."""
    num = den = 0.0
    for xs in sides:
        if len(xs) < 2:
            continue
        m = sum(xs) / len(xs)
        e = [x - m for x in xs]
        # values apart by their arithmetic's last bits are one value: logs of [1, 1 + 2e-16]
        # read φ 0.9 and the same nights in eighths φ 0 (a CI run's Hypothesis example)
        if max(abs(v) for v in e) <= _SAME * max(1.0, max(abs(x) for x in xs)):
            continue
        num += sum(a * b for a, b in zip(e, e[1:]))
        den += sum(a * a for a in e)
    return num / den if den > 0 else None


def night_memory(sides: Sequence[Sequence[float]]) -> float:
    """The φ the interval assumes: where the expected autocorrelation of nights like these
    reaches the observed one plus ``UPPER_SE`` standard errors, within [0, MAX_PHI]; below
    MIN_PAIRS, the exact bound (``exact_memory``)."""
    ns = [len(xs) for xs in sides if len(xs) >= 2]
    r1 = lag1(sides)
    pairs = sum(n - 1 for n in ns)
    if r1 is None:
        return 0.0
    if pairs < MIN_PAIRS:
        return exact_memory(tuple(ns), r1)
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


def exact_memory(ns: tuple[int, ...], r1: float) -> float:
    """The largest φ in [0, MAX_PHI] (to 0.01) under which nights of sides ``ns`` show a
    lag-1 autocorrelation at least ``r1`` with probability ≥ ALPHA (a one-sided 1 − ALPHA
    upper bound; 0 where even independent nights would rarely show one this low)."""
    # two nights a side show r = −1/2 whatever φ (a point mass: no memory readable, so
    # MAX_PHI); read just above r so the last bit of r's arithmetic cannot flip it
    r1 += 1e-9
    if lag1_cdf(ns, 0.0, r1) <= ALPHA:
        return 0.0
    if lag1_cdf(ns, MAX_PHI, r1) >= ALPHA:
        return MAX_PHI
    lo, hi = 0, round(MAX_PHI / _STEP)     # the tail shrinks as φ rises: bisect on the grid
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lag1_cdf(ns, mid * _STEP, r1) >= ALPHA else (lo, mid)
    return round(hi * _STEP, 2)


def mean_variance(s2: float, n: int, phi: float) -> float:
    """Variance of the mean of ``n`` nights whose sample variance is ``s2`` under memory
    ``phi``: σ² = s2 (n − 1) / (n (1 − g)), times g (s2 / n at φ 0)."""
    g = mean_gain(n, phi)
    return s2 * (n - 1) / (n * (1 - g)) * g
