"""How much a node's nights remember each other, for `compare`'s interval.

A night's level leans on the last one's (a machine's state carries over: AR(1) memory φ),
so five nights of one week agree with each other more than with the other week's, and
Welch's t on them is too narrow: at φ 0.5 its 95% interval covers 78% and it claims 8% false
differences (2,000 planted pairs, tests/test_audit_27_stats.py). The mean of ``n`` AR(1)
nights scatters ``g(n, φ) = Σ_ij φ^|i−j| / n²`` × σ² (not σ²/n), and their sample variance
reads only ``σ² (1 − g) n / (n − 1)``; both are corrected for the φ taken.

Which φ: five nights a side barely show it (the lag-1 autocorrelation of a side's nights
about their own mean expects −0.20 at φ 0 and +0.17 at 0.9 for five nights, with a standard
error ≈ 0.35 on ten), and a plug-in estimate covers 88.6% at φ 0.5. φ is therefore taken at
an upper bound: the largest φ whose restricted likelihood (REML: each side an AR(1) series
about its own mean, one φ and σ², σ² profiled out) lies within ``LR_BOUND`` / 2 of the best
(one-sided ~83% by χ²₁; twice the log-likelihood ratio at the true φ averages 0.8-1.03 from
five to twenty nights a side, so the χ² reading holds). The likelihood reads every lag of
both sides at once where the rule before read the lag-1 autocorrelation (its expectation
met 0.6 standard errors above the observed value): at φ 0.9 from eight nights it covered
91.1%, and raised to 0.8 standard errors 93.2% with eight independent nights' 20%
difference found in 80.0%; this bound covers 93.7% (1,000 pairs, seed 4242; 93.7% on 5,000,
seeds 4242 and 1-4) and finds the 20% in 82.0-85.0% (seeds 99, 1, 2, 3, 6). Five nights a
side, night σ 5%, tests.truth.pairs.direct_score (2,000 pairs): φ 0 → 0.2% false claims,
98.9% coverage; φ 0.5 → 1.5%, 96.1%; φ 0.7 → 94.6% (5 seeds × 2,000; 93.5% before). The
price is power: a true 10% difference is found in 12% of pairs at φ 0 (Welch: 37%), 20% in
45%. Reading both weeks as one dated series (the gap's neighbours too) adds no more: 94.3%
and 79.8% where the sides apart give 94.2% and 80.0% (LR_BOUND 1.0), and the weeks'
covariance it then credits narrows the interval (91.9% at 1.0).

Below six neighbour pairs (three nights a side, two against three) the lag-1
autocorrelation's normal reading (the rule before the likelihood) failed: the expectation
hardly moves with φ (−0.33 at φ 0 … −0.18 at 0.9 for three nights) and 1/√pairs (≥ 0.5)
is no standard error of so skewed a statistic; the rule before read no memory there
(plain Welch: 84.8% coverage at φ 0.5, 70.1% at 0.9). There φ is taken at the
same kind of bound read exactly: the largest φ under which the observed autocorrelation is
not in the lower ``ALPHA`` tail of its exact distribution (a ratio of quadratic forms in
Gaussian nights, Imhof 1961). Few nights tell little, so the bound is mostly near MAX_PHI
(the most memory believed) and lower only where the nights alternate: three nights a side
at φ 0.5 cover 96.5%, two against three 96.4% (tests/test_audit_27_compare.py).

Not reached (measured there, a strict xfail): ≥ 93% at φ 0.7 on five nights a side for the
audit's seed 31337 (92.2%; seeds 1-6: 93.5-96.0%). A bound high enough for that seed
(92.7% at LR_BOUND 1.0, 95.7% at 1.64) leaves eight independent nights' 20% difference
found in 80.0% and 71.7% of pairs (guarded: ≥ 80%).

Independent sides (``apart``: two nodes, or one node's weeks more than a weekend apart,
compare._apart) have no such help: the figures above are for one node's weeks with a
weekend between, whose means correlate (0.48 at φ 0.9 for eight nights), so the variance of
their difference is below the sum the interval assumes. Two nodes at φ 0.9, eight nights a
side, covered 86.0% (7.2% false claims; 1,000 pairs, seed 2701, tests/test_audit_27r.py),
three nights 84.7%. Two things were missing. φ's bound: independent sides are read at a
one-sided 95% bound (``LR_APART`` 2.71, χ²₁'s 90% point; ``ALPHA_APART`` 0.05 below
MIN_PAIRS). And the spread's df: under memory a side's sample variance rests on far fewer
than n − 1 df (eight nights at φ 0.9: 2.8, ``spread_df``, Satterthwaite), so the t quantile
was too small even at the true φ (φ known, 0.9: 93.0% covered; with the df 95.9%). Both:
94.1% covered, 2.0% false claims (seed 2701; seeds 1-5 93.7-95.6%); 93.6-95.2% from four
to twenty nights a side (seed 7); three nights 94.7% (seeds 1-5 94.2-96.1%), two against
three 93.5%. Either alone falls short (the df at LR_BOUND: 88.9%; LR_APART with n − 1
df: 91.3%). The price, on two nodes only: a true 20% difference at eight independent
nights (φ 0) is found in 50.8% of pairs (82.5% read as one node's weeks; seed 99, 600
pairs), at twelve 89.5%. The bound against it (eight nights, seed 2701 covered at φ 0.9 /
seed 99 found): 0.9 88.9% / 78.3%, 1.64 91.9% / 66.0%, 2.71 94.1% / 50.8%, 3.84 94.8% /
37.5%. Little is left for a cleverer rule: a likelihood-ratio test of the difference with
φ profiled on [0, 0.9] and its critical value the worst over φ (7% of no-difference pairs
rejected at most) finds that 20% in 75% of pairs, at 7% where compare claims at 1%.
Eight nights on two nodes that sit apart are as likely no difference under strong memory
as a difference without it.

A busy night (a spike: one 0.7× night among twenty at φ 0.9) breaks two neighbour pairs and
hides the memory (the bound read 0.30 on average: 87.2% covered); the bound is read again
with such nights left out (``busy_nights``, their positions kept as gaps) and the larger
kept, and compare sets them aside from the level and spread (``read_memory`` says which;
the quiet nights' mean scatters ``mean_gain_at`` × σ across the gaps): 93.8% covered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from .busy_nights import busy_nights

MAX_PHI = 0.9      # the most memory believed (as the change-point noise, review/arnoise.py)
# fewer neighbour pairs (three nights a side): φ is the exact bound of the lag-1
# autocorrelation's tail (3v3 at φ 0.5: 96.5% covered), not the likelihood's
MIN_PAIRS = 6
LR_BOUND = 0.9     # from MIN_PAIRS: twice the log-likelihood φ may lie below the best
ALPHA = 0.25       # below MIN_PAIRS: how far into the lower tail of r the observed one may be
# independent sides (two nodes, weeks apart): no covariance between the sides' means to
# lean on, so φ at a one-sided 95% bound (χ²₁'s 90% point; the exact tail's 5%)
LR_APART = 2.71
ALPHA_APART = 0.05
_STEP = 0.01       # φ is read to this
_BUSY_ROUNDS = 3   # busy nights sought again under the memory read without them
_SAME = 1e-12      # residuals this small (relative to the values) are rounding, not nights


def mean_gain(n: int, phi: float) -> float:
    """Variance of the mean of ``n`` AR(1) nights in units of one night's σ²:
    Σ_ij φ^|i−j| / n² (1/n at φ 0)."""
    if n < 1:
        raise ValueError("mean_gain needs at least one night")
    return (n + 2 * sum((n - k) * phi ** k for k in range(1, n))) / (n * n)


def mean_gain_at(at: Sequence[int], phi: float) -> float:
    """mean_gain for nights at positions ``at`` (some left out: their neighbours φ^gap
    apart): Σ_ij φ^|tᵢ−tⱼ| / m²."""
    t = np.asarray(at, dtype=float)
    return float((phi ** np.abs(t[:, None] - t[None, :])).sum()) / (len(t) ** 2)


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


def _readable(sides: Sequence[Sequence[float]]) -> list[Sequence[float]]:
    """The sides of two or more nights that differ: values apart by their arithmetic's last
    bits are one value (logs of [1, 1 + 2e-16] read φ 0.9 and the same nights in eighths
    φ 0: a CI run's Hypothesis example)."""
    out = []
    for xs in sides:
        if len(xs) < 2:
            continue
        m = sum(xs) / len(xs)
        if max(abs(x - m) for x in xs) > _SAME * max(1.0, max(abs(x) for x in xs)):
            out.append(xs)
    return out


def lag1(sides: Sequence[Sequence[float]]) -> float | None:
    """Pooled lag-1 autocorrelation of each side's values about its own mean (in order);
    None when no side has two values that differ."""
    num = den = 0.0
    for xs in _readable(sides):
        m = sum(xs) / len(xs)
        e = [x - m for x in xs]
        num += sum(a * b for a, b in zip(e, e[1:]))
        den += sum(a * a for a in e)
    return num / den if den > 0 else None


def night_memory(sides: Sequence[Sequence[float]], apart: bool = False) -> float:
    """The φ the interval assumes: the restricted likelihood's upper bound
    (``likelihood_memory``) within [0, MAX_PHI]; below MIN_PAIRS, the exact bound of the
    lag-1 autocorrelation (``exact_memory``). ``apart``: the sides are independent (two
    nodes, weeks apart), read at the wider bounds LR_APART and ALPHA_APART."""
    return read_memory(sides, apart)[0]


def read_memory(sides: Sequence[Sequence[float]],
                apart: bool = False) -> tuple[float, list[list[int]]]:
    """(φ as night_memory reads it, each side's busy nights): busy nights are sought where
    the likelihood reads φ (from MIN_PAIRS neighbour pairs), none below."""
    ns = [len(xs) for xs in sides if len(xs) >= 2]
    r1 = lag1(sides)
    none: list[list[int]] = [[] for _ in sides]
    if r1 is None:
        return 0.0, none
    if sum(n - 1 for n in ns) < MIN_PAIRS:
        return exact_memory(tuple(ns), r1, ALPHA_APART if apart else ALPHA), none
    readable = _readable(sides)
    phi, busy = _likelihood_read(readable, LR_APART if apart else LR_BOUND)
    found = iter(busy)  # back to the sides they were read from (readable ones, in order)
    return phi, [next(found) if any(xs is r for r in readable) else [] for xs in sides]


_GRID = np.round(np.arange(-MAX_PHI, MAX_PHI + _STEP / 2, _STEP), 2)  # φ read on this


def restricted_loglik(sides: Sequence[Sequence[float]],
                      at: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """The restricted (REML) log-likelihood of φ on ``_GRID``, σ² profiled out: each side an
    AR(1) series about its own mean (sides independent, one φ and σ²). Its closed forms:
    |R| = (1 − φ²)^(n−1), R⁻¹ tridiagonal, 1'R⁻¹1 = (n − (n − 2)φ) / (1 + φ). ``at``: each
    side's nights' positions where some are left out (``_gapped_loglik``)."""
    if at is not None:
        return _gapped_loglik(sides, at)
    f, q, logdet, free = _GRID, np.zeros_like(_GRID), np.zeros_like(_GRID), 0
    for xs in sides:
        if len(xs) < 2:
            continue
        x = np.asarray(xs, dtype=float)
        x = x - x.mean()
        ends, mid = x[0] + x[-1], x[1:-1]
        one = (len(x) - (len(x) - 2) * f) / (1 + f)
        onex = (ends + (1 + f * f) * mid.sum() - f * (x[:-1] + x[1:]).sum()) / (1 - f * f)
        xx = (x[0] ** 2 + x[-1] ** 2 + (1 + f * f) * (mid @ mid)
              - 2 * f * float(x[:-1] @ x[1:])) / (1 - f * f)
        q += xx - onex * onex / one
        logdet += (len(x) - 1) * np.log(1 - f * f) + np.log(one)
        free += len(x) - 1
    return -0.5 * (logdet + free * np.log(np.maximum(q, 1e-300)))


def _gapped_loglik(sides: Sequence[Sequence[float]],
                   at: Sequence[Sequence[int]]) -> np.ndarray:
    """restricted_loglik with each side's nights at positions ``at`` (a night left out is a
    gap: its neighbours φ^gap apart). The nights a Markov chain: |R| = Π (1 − ρᵢ²) and
    u'R⁻¹v = u₀v₀ + Σ (uᵢ₊₁ − ρᵢuᵢ)(vᵢ₊₁ − ρᵢvᵢ) / (1 − ρᵢ²), ρᵢ = φ^(tᵢ₊₁ − tᵢ)."""
    f, q, logdet, free = _GRID[:, None], np.zeros_like(_GRID), np.zeros_like(_GRID), 0
    for i, xs in enumerate(sides):
        if len(xs) < 2:
            continue
        x = np.asarray(xs, dtype=float)
        x = x - x.mean()
        gaps = np.diff(np.asarray(at[i], dtype=float))
        rho = f ** gaps[None, :]
        one = np.ones(len(x))
        q += _form(x, x, rho) - _form(one, x, rho) ** 2 / _form(one, one, rho)
        logdet += np.log(1 - rho * rho).sum(axis=1) + np.log(_form(one, one, rho))
        free += len(x) - 1
    return -0.5 * (logdet + free * np.log(np.maximum(q, 1e-300)))


def _form(u: np.ndarray, v: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """u'R⁻¹v for each φ (a row of ``rho``: the neighbours' correlations)."""
    du, dv = u[1:] - rho * u[:-1], v[1:] - rho * v[:-1]
    return u[0] * v[0] + (du * dv / (1 - rho * rho)).sum(axis=1)


def likelihood_memory(sides: Sequence[Sequence[float]], bound: float = LR_BOUND) -> float:
    """The largest φ in [0, MAX_PHI] whose restricted likelihood is within ``bound`` / 2
    of the best (a profile-likelihood upper bound read from both sides at once); where a
    side has busy nights (``busy_nights``: a spike hides memory), the larger of that bound
    and the one read with them left out (the interval only ever widens). The spike lowers
    the memory they are judged under, so they are sought again under the memory read
    without them."""
    return _likelihood_read(sides, bound)[0]


def _likelihood_read(sides: Sequence[Sequence[float]],
                     bound: float) -> tuple[float, list[list[int]]]:
    """(likelihood_memory's φ, each side's busy nights left out of its last read)."""
    ll = restricted_loglik(sides)
    phi, best = _upper(ll, bound), _best(ll)
    found: list[list[int]] = [[] for _ in sides]
    for _ in range(_BUSY_ROUNDS):
        # sought among the nights not yet set aside, across the gaps those leave: a busy
        # night beside another is the lesser of two neighbours until that one is out
        at = [[i for i in range(len(xs)) if i not in f] for xs, f in zip(sides, found)]
        more = busy_nights([[xs[i] for i in t] for xs, t in zip(sides, at)], best, at)
        busy = [sorted(f + [t[i] for i in m]) for f, t, m in zip(found, at, more)]
        kept = [(t, xs) for t, xs in (([i for i in range(len(xs)) if i not in b],
                                       [x for i, x in enumerate(xs) if i not in b])
                                      for xs, b in zip(sides, busy)) if len(xs) >= 2]
        if not any(more) or len(kept) < len(sides):
            break
        found = busy
        ll = restricted_loglik([xs for _, xs in kept], [t for t, _ in kept])
        phi = max(phi, _upper(ll, bound))
        if _best(ll) <= best:
            break
        best = _best(ll)
    return phi, found


def _best(ll: np.ndarray) -> float:
    """The most likely φ, within [0, MAX_PHI]."""
    return float(np.clip(_GRID[ll.argmax()], 0.0, MAX_PHI))


def _upper(ll: np.ndarray, bound: float) -> float:
    ok = _GRID[(2 * (ll.max() - ll) <= bound) & (_GRID >= 0)]
    return float(ok.max()) if ok.size else 0.0


def exact_memory(ns: tuple[int, ...], r1: float, alpha: float = ALPHA) -> float:
    """The largest φ in [0, MAX_PHI] (to 0.01) under which nights of sides ``ns`` show a
    lag-1 autocorrelation at least ``r1`` with probability ≥ ``alpha`` (a one-sided
    1 − alpha upper bound; 0 where even independent nights would rarely show one this low)."""
    # two nights a side show r = −1/2 whatever φ (a point mass: no memory readable, so
    # MAX_PHI); read just above r so the last bit of r's arithmetic cannot flip it
    r1 += 1e-9
    if lag1_cdf(ns, 0.0, r1) <= alpha:
        return 0.0
    if lag1_cdf(ns, MAX_PHI, r1) >= alpha:
        return MAX_PHI
    lo, hi = 0, round(MAX_PHI / _STEP)     # the tail shrinks as φ rises: bisect on the grid
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lag1_cdf(ns, mid * _STEP, r1) >= alpha else (lo, mid)
    return round(hi * _STEP, 2)


def mean_variance(s2: float, n: int, phi: float) -> float:
    """Variance of the mean of ``n`` nights whose sample variance is ``s2`` under memory
    ``phi``: σ² = s2 (n − 1) / (n (1 − g)), times g (s2 / n at φ 0)."""
    g = mean_gain(n, phi)
    return s2 * (n - 1) / (n * (1 - g)) * g



@lru_cache(maxsize=1024)
def spread_df(n: int, phi: float) -> float:
    """The degrees of freedom a sample variance of ``n`` AR(1) nights at memory ``phi``
    rests on (Satterthwaite: tr(MR)² / tr((MR)²), M the centring, R the nights'
    correlation): n − 1 at φ 0, 2.8 for eight nights at 0.9."""
    if n < 2:
        raise ValueError("spread_df needs at least two nights")
    mr = (np.eye(n) - 1.0 / n) @ _corr(n, phi)
    return float(np.trace(mr) ** 2 / np.trace(mr @ mr))
