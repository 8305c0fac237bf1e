"""AR(1) noise for the change-point detector: its spread and memory, and the exact
standard errors of the estimates a segment's fit makes (its mean, a line's end, its slope).

A night's level leans on the last one's (a machine's state carries over), so nights are
not independent. The long-run rule, variance × (1 + φ)/(1 − φ), holds only for long runs:
over 12 nights at φ 0.9 it overstates a line's slope variance 10×, and a detector that used
it must cap φ low (and then call a strongly remembering wander a step). The exact w'Rw
lets φ be taken at its word.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

NOISE_FLOOR = 0.005  # relative night-to-night noise assumed at least this (planted data is exact)
MAX_PHI = 0.7        # the most memory a first look (differences) and the scores assume
SE_MAX_PHI = 0.9     # … and the standard errors (exact AR(1) variance: short runs keep power)


class _Fits(Protocol):
    """A segmentation's fits: (level at i, slope) of segment [i, j) of a kind."""

    def fit(self, i: int, j: int, kind: str) -> tuple[float, float]: ...


@dataclass(frozen=True)
class Noise:
    """AR(1) noise around a level: its spread σ (a night's own) and memory φ."""
    sigma: float
    phi: float = 0.0

    @property
    def lr(self) -> float:
        """The long-run spread: how the mean of a long run of nights scatters (× √m)."""
        return self.sigma * math.sqrt((1 + self.phi) / (1 - self.phi))


@lru_cache(maxsize=4096)
def _ar_gain(m: int, what: str, phi: float) -> float:
    """w'Rw for the weights ``w`` of a least-squares estimate over ``m`` nights (a flat
    segment's mean, a line's value at an end, a line's slope) under AR(1) correlation
    R_ij = φ^|i−j|: its variance in units of σ². Exact for any ``m``: a short segment's
    mean scatters far less than the long-run rule (1 + φ)/(1 − φ)/m says once φ is high,
    so a high φ can be taken at its word without losing short steps and drifts."""
    t = np.arange(m, dtype=float)
    if what == "flat" or m < 3:
        w = np.full(m, 1.0 / m)
    else:
        c = t - t.mean()
        w = c / float(c @ c) if what == "slope" else 1.0 / m + c * c[-1] / float(c @ c)
    if phi == 0.0:
        return float(w @ w)
    lags = np.correlate(w, w, mode="full")[m - 1:]  # Σ_i w_i w_{i+k}, k = 0 … m−1
    return float(lags[0] + 2 * (lags[1:] @ phi ** np.arange(1, m)))


def end_se(m: int, kind: str, nz: Noise) -> float:
    """Standard error of a segment's fitted level at one end (flat: its mean)."""
    return nz.sigma * math.sqrt(_ar_gain(m, "flat" if kind == "flat" else "end",
                                         round(nz.phi, 3)))


def slope_z(m: int, slope: float, nz: Noise) -> float:
    return abs(slope) / (nz.sigma * math.sqrt(_ar_gain(m, "slope", round(nz.phi, 3))))


def noise(x: np.ndarray) -> tuple[float, float]:
    """(σ, φ) of AR(1) noise around a level, from the robust spreads of the one- and
    two-night differences, each about its own running median (a step moves one or two
    differences, a drift their local centre, neither their spread)."""
    def spread(d: np.ndarray) -> float:
        if len(d) < 3:
            return 0.0
        ds = [float(v) for v in d]
        local = np.array([statistics.median(ds[max(0, i - 4):i + 5]) for i in range(len(ds))])
        return 1.4826 * float(np.median(np.abs(d - local)))

    s1, s2 = spread(np.diff(x)), spread(x[2:] - x[:-2])
    phi = min(max(s2 ** 2 / s1 ** 2 - 1, 0.0), MAX_PHI) if s1 > 0 else 0.0
    sigma = max(s1 / math.sqrt(2 * (1 - phi)), NOISE_FLOOR)
    return sigma, phi


def residual_noise(x: np.ndarray, segs: list, sums: _Fits, spent: int = 0
                   ) -> tuple[float, float]:
    """(σ, φ) of the residuals around a fit: their spread (for the parameters fitted, and
    ``spent`` more: a weekly pattern's offsets taken out before) and their lag-1
    autocorrelation, corrected for its small-sample bias (−(1 + 3φ)/n)."""
    fit = np.concatenate([sums.fit(i, j, k)[0] + sums.fit(i, j, k)[1] * np.arange(j - i)
                          for i, j, k in segs])
    r = x - fit
    n, p = len(x), sum(2 if k == "line" else 1 for *_, k in segs) + spent
    var = float(r @ r) / max(n - p, 1)
    if var < NOISE_FLOOR ** 2:  # residuals below the floor (exact data: rounding) show no memory
        return NOISE_FLOOR, 0.0
    r1 = float(r[1:] @ r[:-1]) / float(r @ r)
    phi = min(max(r1 + (1 + 3 * max(r1, 0.0)) / n + p / n, 0.0), SE_MAX_PHI)
    return max(math.sqrt(var), NOISE_FLOOR), phi
