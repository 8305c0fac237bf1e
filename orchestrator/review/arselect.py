"""Model selection for the change-point detector (``changepoints``): every break and
slope must pay for itself in a likelihood with AR(1) noise (each model's own φ, BIC's log n
per parameter, weighted), so a level that wanders by the noise's memory is explained by it,
not by a step. Two straight segments that meet (a drift that turns: a V) are a hinge, whose
second level is no parameter of its own; a break between two lines is first moved to where
they meet best (``HINGE_SLACK``).
"""

from __future__ import annotations

import math

import numpy as np

from .arnoise import MAX_PHI, NOISE_FLOOR
from .segfit import MIN_CHANGE, MIN_DRIFT, Sums

BIC_WEIGHT = 2.5     # times BIC's log n per level or break in the AR(1) score
SLOPE_WEIGHT = 3.0   # … and per slope (a slow wander of strongly remembering noise fits one)
QUIET_WEIGHT = 0.25   # … the share of it a first look asks of one change, to skip the search
HINGE_SLACK = 3      # nights a break between two lines may move to where they meet best


def _ar_score(x: np.ndarray, segs: list, sums: Sums, log_n: float) -> float:
    """−2 exact log-likelihood of the fit with AR(1) noise (its φ fitted to the residuals;
    the first night at the stationary spread σ²/(1 − φ²), so a V is no wander), plus
    BIC's log n per parameter (a level, a slope, a break's night): a wandering level is
    explained by the noise's memory at the price of one parameter, a step by a break."""
    fit = np.concatenate([sums.fit(i, j, k)[0] + sums.fit(i, j, k)[1] * np.arange(j - i)
                          for i, j, k in segs])
    r = x - fit
    lag = float(r[:-1] @ r[:-1])
    phi = min(max(float(r[1:] @ r[:-1]) / lag, 0.0), MAX_PHI) if lag > 0 else 0.0
    u = r[1:] - phi * r[:-1]
    # the exact AR(1) likelihood counts the first night too, at the noise's stationary
    # spread: a flat level with strong memory no longer explains a V's far first night free
    first = (1 - phi * phi) * float(r[0] * r[0])
    var = max((float(u @ u) + first) / len(r), (NOISE_FLOOR / 10) ** 2)
    # a level per segment, a night per break; but two lines that meet (a drift that turns)
    # are a hinge: the second's level is the first's end, no parameter of its own
    params = 2 * len(segs) - 1 - sum(_hinge(a, b, sums) for a, b in zip(segs, segs[1:]))
    slopes = sum(k == "line" for *_, k in segs)
    return (len(r) * math.log(var) - math.log(1 - phi * phi)
            + log_n * (BIC_WEIGHT * params + SLOPE_WEIGHT * slopes))


def _hinge(a: tuple, b: tuple, sums: Sums) -> bool:
    """Whether straight segments ``a`` and ``b`` meet: the first's fitted end and the
    second's start within ``MIN_CHANGE`` (a V, a drift that turns, not a jump)."""
    if a[2] != "line" or b[2] != "line":
        return False
    (l0, s0), (l1, _) = sums.fit(*a), sums.fit(*b)
    end = l0 + s0 * (a[1] - 1 - a[0])
    return abs(l1 - end) < MIN_CHANGE * abs(end or 1)


def quiet(x: np.ndarray, sums: Sums, log_n: float) -> bool:
    """Whether no single change could pay for itself: no step at any night and no slope
    over the whole series beats one flat level in the AR(1) score, even at a fraction of
    the weight the selection asks. Most series of a history are like that; they skip the
    search (a year of nights costs a few array operations, not a partition)."""
    n = len(x)
    if n < 2 * MIN_DRIFT:
        return False
    t = np.arange(n)
    k = np.arange(1, n)[:, None]  # a step before night k
    c0 = sums.c[0]
    before = (c0[1:n] / np.arange(1, n))[:, None]
    after = ((c0[n] - c0[1:n]) / (n - np.arange(1, n)))[:, None]
    fits = [np.where(t[None, :] < k, before, after)]
    level, slope = sums.fit(0, n, "line")
    fits.append((level + slope * t)[None, :])
    fits.append(np.full((1, n), c0[n] / n))
    r = x[None, :] - np.concatenate(fits)
    lag = np.maximum((r[:, :-1] * r[:, :-1]).sum(1), 1e-300)
    phi = np.clip((r[:, 1:] * r[:, :-1]).sum(1) / lag, 0.0, MAX_PHI)
    u = r[:, 1:] - phi[:, None] * r[:, :-1]
    var = np.maximum((u * u).sum(1) / (n - 1), (NOISE_FLOOR / 10) ** 2)
    score = (n - 1) * np.log(var)
    # what one change adds (a break and a level, or a slope), at a share of its price
    step = score[:-2] + QUIET_WEIGHT * 2 * BIC_WEIGHT * log_n
    line = score[-2:-1] + QUIET_WEIGHT * SLOPE_WEIGHT * log_n
    return bool(min(step.min(), line.min()) >= score[-1])


def select(x: np.ndarray, segs: list, sums: Sums, log_n: float) -> list:
    """Backward elimination by the AR(1) score: drop the break (joining its sides, flat or
    straight, whichever scores better) or straighten the line whose removal improves the
    score most, until none does. What the noise's memory explains goes. First each break
    between two lines moves to where the score is best (``HINGE_SLACK`` nights either way):
    the partition's night for a V's apex is one or two off, where the lines do not meet."""
    segs = _place_hinges(x, list(segs), sums, log_n)
    best = _ar_score(x, segs, sums, log_n)
    while len(segs) > 1 or segs[0][2] == "line":
        options = []
        for s in range(len(segs) - 1):
            i, j = segs[s][0], segs[s + 1][1]
            for kind in ("flat", "line") if j - i >= MIN_DRIFT else ("flat",):
                options.append([*segs[:s], (i, j, kind), *segs[s + 2:]])
        for s, (i, j, kind) in enumerate(segs):
            if kind == "line":
                options.append([*segs[:s], (i, j, "flat"), *segs[s + 1:]])
        scored = [(_ar_score(x, o, sums, log_n), o) for o in options]
        score, option = min(scored, key=lambda so: so[0])
        if score >= best:
            return segs
        best, segs = score, option
    return segs


def _place_hinges(x: np.ndarray, segs: list, sums: Sums, log_n: float) -> list:
    """Each break between two straight segments at its best night by the AR(1) score,
    within ``HINGE_SLACK`` nights (each side keeping ``MIN_DRIFT``)."""
    for s in range(len(segs) - 1):
        (i, k, ka), (_, j, kb) = segs[s], segs[s + 1]
        if ka == kb == "line":
            moves = range(max(i + MIN_DRIFT, k - HINGE_SLACK),
                          min(j - MIN_DRIFT, k + HINGE_SLACK) + 1)
            options = [[*segs[:s], (i, m, "line"), (m, j, "line"), *segs[s + 2:]] for m in moves]
            segs = min([segs, *options], key=lambda o: _ar_score(x, o, sums, log_n))
    return segs
