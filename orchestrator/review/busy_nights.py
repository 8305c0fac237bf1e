"""Busy nights: a night far off the line its neighbours draw, for `compare`'s read of memory.

A night the machine was busy (one 0.7× night in a week of twenty at σ 5%) is a spike, not
a level the next night remembers: it breaks two neighbour pairs, and the likelihood's bound
on the nights' memory read φ 0.30 on average where the nights' was 0.9, so the interval
covered 87.2% with 4.7% false claims (one such night in each of two weeks of twenty, weeks
two nights apart; 1,000 pairs, seed 2703, tests/test_audit_27r.py). Read again with such
nights left out (nightmemory.likelihood_memory: the larger of both bounds), and their
excess counted once in the mean rather than in the nights' spread (compare._side_variance):
97.0%, 0.6%; a 0.8× night 94.9%, a 0.9× night (2σ: 86.1%, 7.9% before) 92.3%, 4.3%.

Which night: the additive-outlier test of Chang, Tiao & Chen (1988), for AR(1) in closed
form: a night against what its neighbours predict under memory φ (both neighbours:
φ(x₋ + x₊)/(1 + φ²), variance σₐ²/(1 + φ²); an end night, its one neighbour: φx, σₐ²),
in units of the innovations' robust spread σₐ (1.4826 × their median absolute value, which
one spike cannot move), at Chen & Liu's (1993) critical value 3.5. Without a busy night
it flags 6.0% of eight-night pairs at φ 0 (σₐ from fourteen innovations is itself
uncertain) and 4.6% of twenty-night pairs at φ 0.9: a true 20% at eight nights is found
in 81.0% (82.0% before, seed 99).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

BUSY_Z = 3.5
_MAD_SD = 1.4826   # a normal's σ per median absolute deviation


def busy_nights(sides: Sequence[Sequence[float]], phi: float) -> list[list[int]]:
    """Per side (log levels in night order), the nights at least ``BUSY_Z`` robust σₐ off
    what their neighbours predict under memory ``phi`` (each the largest among its
    neighbours, so a spike's neighbours are not flagged with it); none where the sides'
    innovations have no spread."""
    innovations, scores = [], []
    for xs in sides:
        x = np.asarray(xs, dtype=float) - float(np.mean(xs))
        if len(x) < 2:
            scores.append(np.zeros(len(x)))
            continue
        innovations.append(x[1:] - phi * x[:-1])
        r = np.empty(len(x))
        r[0], r[-1] = x[0] - phi * x[1], x[-1] - phi * x[-2]
        r[1:-1] = (x[1:-1] - phi * (x[:-2] + x[2:]) / (1 + phi * phi)) * math.sqrt(1 + phi * phi)
        scores.append(np.abs(r))
    if not innovations:
        return [[] for _ in sides]
    sd = _MAD_SD * float(np.median(np.abs(np.concatenate(innovations))))
    if sd <= 0:
        return [[] for _ in sides]
    return [[i for i in range(len(z))
             if z[i] >= BUSY_Z * sd and z[i] >= z[max(0, i - 1):i + 2].max()] for z in scores]
