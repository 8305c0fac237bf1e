"""A drift at the window's end: the level held, then a straight move up to the last night.

The change-point fit weighs a move against a level that wanders by the noise's memory; at
the window's end a ramp has no nights after it to show that it is not a wander coming back,
so a fitted AR(1) φ explains it away (a +12% ramp over the last 8 nights at σ 1.5%, 8σ,
was reported as nothing; issue 27). ``tail_drift`` asks the question directly: a hinge
(a level, then a straight move from night ``k`` to the end) fitted to the nights since the
last finding, its slope tested against the noise the hinge leaves (σ and φ, the exact
AR(1) variance of the slope's estimate), and its shape against a step's (same number of
parameters: a step the fit placed there is a step, not a drift).
"""

from __future__ import annotations

import math

import numpy as np

from .arnoise import NOISE_FLOOR, SE_MAX_PHI
from .ramps import levels_sse

MIN_RAMP = 6     # nights from the hinge to the end (the shortest drift)
MAX_RAMP = 14    # longer ramps at the end are the segment fit's (it has nights to judge them)
MIN_HEAD = 8     # nights held before the hinge: the level the drift leaves
MAX_SPAN = 40    # nights the hinge is fitted over at most


def _hinge(y: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The least-squares fit of a level then a slope from index ``k``: design, coefficients
    (level, slope) and the sum of squares."""
    t = np.arange(len(y), dtype=float)
    design = np.column_stack([np.ones_like(t), np.maximum(t - k, 0.0)])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    r = y - design @ coef
    return design, coef, float(r @ r)


def _best_step(y: np.ndarray, lo: int) -> float:
    """The smallest sum of squares of two levels with a break at or after ``lo``."""
    c, cc = np.cumsum(y), np.cumsum(y * y)
    m = len(y)
    j = np.arange(max(lo, 1), m)  # the first night of the new level
    a, b = c[j - 1], c[-1] - c[j - 1]
    sse = (cc[-1] - a * a / j - b * b / (m - j))
    return float(sse.min()) if len(sse) else math.inf


def _ar(r: np.ndarray, params: int) -> tuple[float, float]:
    """(variance, φ) of residuals: lag-1 correlation corrected for its small-sample bias,
    as ``arnoise.residual_noise``."""
    m, rr = len(r), float(r @ r)
    r1 = float(r[1:] @ r[:-1]) / rr if rr > 0 else 0.0
    phi = min(max(r1 + (1 + 3 * max(r1, 0.0)) / m + params / m, 0.0), SE_MAX_PHI)
    return max(rr / (m - params), NOISE_FLOOR ** 2), phi


def _slope_z(design: np.ndarray, coef: np.ndarray, y: np.ndarray, k: int) -> float:
    """The hinge's slope over its standard error under AR(1) noise: the larger spread and
    memory of the hinge's residuals and of the held nights' own (before ``k``). A ramp
    after white noise leaves both small; a wander of strongly remembering noise shows its
    memory in the nights before it, which the hinge cannot bend away."""
    r = y - design @ coef
    head = y[:k + 1] - y[:k + 1].mean()
    (v1, p1), (v2, p2) = _ar(r, 2), _ar(head, 1)
    var, phi = max(v1, v2), max(p1, p2)
    m = len(y)
    w = np.linalg.pinv(design)[1]  # the slope's weights on the nights
    lags = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    gain = float(w @ (phi ** lags) @ w)
    return abs(float(coef[1])) / math.sqrt(var * gain)


def tail_drift(x: np.ndarray, lo: int, min_change: float, z: float,
               steps: list[int]) -> dict | None:
    """A drift from a held level to the end of ``x`` (nights ``lo`` on, relative levels),
    as a finding (``index``: the hinge's night, ``until``: the last), or None: none whose
    move is at least ``min_change`` and ``z`` standard errors and whose shape beats one
    step's anywhere and the levels between ``steps`` (the steps the fit found there: a
    level held between two steps is a staircase, not a ramp)."""
    n = len(x)
    lo = max(lo, n - MAX_SPAN)
    knots = range(max(lo + MIN_HEAD, n - MAX_RAMP), n - MIN_RAMP + 1)
    if not knots:
        return None
    y = x[lo:]
    fits = [(_hinge(y, k - lo), k) for k in knots]
    (design, coef, sse), k = min(fits, key=lambda f: f[0][2])
    level, slope = float(coef[0]), float(coef[1])
    end = level + slope * (n - 1 - k)
    if abs(end / level - 1) < min_change or sse >= _best_step(y, MIN_HEAD) or \
            steps and sse >= levels_sse(y, [i - lo for i in steps]):
        return None
    zs = _slope_z(design, coef, y, k - lo)
    if zs < z:
        return None
    return {"index": k, "until": n - 1, "kind": "drift", "before": level, "after": end,
            "size": end / level - 1, "z": zs, "nights": [n - k]}
