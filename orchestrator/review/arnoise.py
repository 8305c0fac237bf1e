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
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


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
