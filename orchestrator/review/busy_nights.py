"""Busy nights: a night far off the line its neighbours draw, for `compare`'s read of memory.

A night the machine was busy (one 0.7× night in a week of twenty at σ 5%) is a spike, not
a level the next night remembers: it breaks two neighbour pairs, and the likelihood's bound
on the nights' memory read φ 0.30 on average where the nights' was 0.9, so the interval
covered 87.2% with 4.7% false claims (one such night in each of two weeks of twenty, weeks
two nights apart; 1,000 pairs, seed 2703, tests/test_audit_27r.py). Read again with such
nights left out (nightmemory.likelihood_memory: the larger of both bounds). compare sets
them aside from their side's level (side_level.side_variance: the quiet nights' mean across
the gaps, its spread winsorized) and says which: 93.8%, 2.6%; a 0.8× night 93.9%, a 0.9×
night (2σ: 86.1%, 7.9% before busy nights were sought) 93.1%, 3.4%. Counted in the mean as
their own noise (the rule before), one busy week against a quiet one (a night in five
busy) read as a slower config: 10.6% false claims at φ 0.9, 3.4% now (audit 27b).

Which night: the additive-outlier test of Chang, Tiao & Chen (1988), for AR(1) in closed
form: a night against what its neighbours predict under memory φ (both neighbours:
φ(x₋ + x₊)/(1 + φ²), variance σₐ²/(1 + φ²); an end night, its one neighbour: φx, σₐ²),
in units of the innovations' robust spread σₐ (1.4826 × their median absolute value, which
one spike cannot move), at Chen & Liu's (1993) critical value 3.5. Without a busy night
it flags 6.0% of eight-night pairs at φ 0 (σₐ from fourteen innovations is itself
uncertain) and 4.6% of twenty-night pairs at φ 0.9: a true 20% at eight nights is found
in 80.8% (82.0% before busy nights were sought, seed 99). The nights already found are
left out and the rest tested again across the gaps they leave (a neighbour g nights away
predicts at φ^g), so of two busy nights side by side the lesser is found once the other is
out; and a side of ``MIDDLE_FROM`` nights or more is centred on its middle half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BUSY_Z = 3.5
_MAD_SD = 1.4826   # a normal's σ per median absolute deviation
_SAME = 1e-12      # a spread this small (relative to the values) is rounding, as nightmemory's
# from this many nights a side is centred on its middle half, not its mean: a week with a
# busy night in five (0.7x) pulled the mean so far that none was found (φ read 0, the busy
# nights inside 3.5 σ of the shifted mean: 10.6% false claims, audit 27b); at eight nights
# the middle four centre the scores so tightly that 16% of quiet pairs flag a night (6%)
MIDDLE_FROM = 10


def busy_nights(sides: Sequence[Sequence[float]], phi: float,
                at: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Per side (log levels in night order), the nights at least ``BUSY_Z`` robust σₐ off
    what their neighbours predict under memory ``phi`` (each the largest among its
    neighbours, so a spike's neighbours are not flagged with it); none where the sides'
    innovations have no spread. ``at``: each side's nights' positions where some are left
    out (a neighbour g nights away remembers φ^g), the indices returned into ``sides``."""
    innovations, scores = [], []
    for k, xs in enumerate(sides):
        x = np.asarray(xs, dtype=float) - _centre(xs) if len(xs) else np.zeros(0)
        if len(x) < 2:
            scores.append(np.zeros(len(x)))
            continue
        t = np.arange(len(x)) if at is None else np.asarray(at[k], dtype=float)
        rho = phi ** np.diff(t)            # each neighbour pair's correlation
        # innovations in σₐ's units: (x₊ − ρx) / √((1 − ρ²) / (1 − φ²)), ρ = φ at no gap
        innovations.append((x[1:] - rho * x[:-1]) * math.sqrt(1 - phi * phi)
                           / np.sqrt(1 - rho * rho))
        scores.append(np.abs(_off_line(x, rho, phi)))
    if not innovations:
        return [[] for _ in sides]
    sd = _MAD_SD * float(np.median(np.abs(np.concatenate(innovations))))
    # tied nights (acceptance repeats exactly under greedy decoding) leave rounding, not
    # spread: ~1e-16 read as σₐ made an odd night 1e14 σ off (audit 41b)
    scale = max((float(np.max(np.abs(xs))) for xs in sides if len(xs)), default=0.0)
    if sd <= _SAME * max(1.0, scale):
        return [[] for _ in sides]
    return [[i for i in range(len(z))
             if z[i] >= BUSY_Z * sd and z[i] >= z[max(0, i - 1):i + 2].max()] for z in scores]


def _off_line(x: np.ndarray, rho: np.ndarray, phi: float) -> np.ndarray:
    """Each night less what its neighbours predict (AR(1) is Markov: the one before at
    correlation r, the one after at s: (r(1 − s²)x₋ + s(1 − r²)x₊) / (1 − r²s²), variance
    σ²(1 − r²)(1 − s²) / (1 − r²s²); an end night, its one neighbour's rx, σ²(1 − r²)), in
    units of σₐ = σ√(1 − φ²): at no gap φ(x₋ + x₊)/(1 + φ²) and σₐ²/(1 + φ²)."""
    a2 = 1 - phi * phi
    r = np.empty(len(x))
    r[0] = (x[0] - rho[0] * x[1]) * math.sqrt(a2 / (1 - rho[0] ** 2))
    r[-1] = (x[-1] - rho[-1] * x[-2]) * math.sqrt(a2 / (1 - rho[-1] ** 2))
    b, f = rho[:-1], rho[1:]               # an inner night's correlation back, forward
    both = 1 - b * b * f * f
    guess = (b * (1 - f * f) * x[:-2] + f * (1 - b * b) * x[2:]) / both
    r[1:-1] = (x[1:-1] - guess) * np.sqrt(a2 * both / ((1 - b * b) * (1 - f * f)))
    return r


def _centre(xs: Sequence[float]) -> float:
    """Where a side's nights are centred for the test: the mean of their middle half from
    ``MIDDLE_FROM`` nights (a busy quarter of a week moves it little), the mean below."""
    v = np.sort(np.asarray(xs, dtype=float))
    if len(v) < MIDDLE_FROM:
        return float(v.mean())
    k = len(v) // 4
    return float(v[k:len(v) - k].mean())
