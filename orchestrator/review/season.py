"""A weekly pattern in a nightly series: some weekdays' nights always lower or higher.

A backup job every weekend, or a shared machine's weekend load, makes the same nights of
every week read low. Left in, the pattern looks like noise (it inflates the spread a step
must clear) or like a run of dips and steps. ``weekday_offsets`` finds it only when the
history shows it: three weeks or more, every weekday seen three times, and a one-way
analysis of variance by weekday far beyond what noise gives; then the change points are
looked for on the series with the pattern taken out.

Each night is measured from its local level, the median of the seven nights around it
(every weekday once, so the pattern cancels; a drift moves it along). A median filter keeps
a step's edge only once the pattern is out, so level and offsets are refitted in turn; the
offsets are per weekday the median over the weeks (one week a step or a dip disturbed does
not move them).
"""

from __future__ import annotations

import numpy as np

MIN_WEEKS = 3  # each weekday seen this often before a pattern is believed
# the F ratio (weekdays against what is left) a pattern must reach. Planted no-pattern
# series (white, heavy-tailed, AR(1) φ up to 0.9, steps, drifts, dips; 35 nights, 3,000
# series) reached at most 13.5; a 10% weekend pattern at σ 1.5% with a 15% step at least 19.8
F_BOUND = 16.0
ROUNDS = 3     # level and offsets refitted in turn this often


def _rolling_level(x: np.ndarray) -> np.ndarray:
    """Each night's local level: the median of the seven nights centred on it (at the
    window's ends, of its first or last seven)."""
    n = len(x)
    starts = np.clip(np.arange(n) - 3, 0, n - 7)
    return np.array([np.median(x[s:s + 7]) for s in starts])


def weekday_offsets(x: np.ndarray, weekdays: list[int]) -> np.ndarray | None:
    """Per night the weekly pattern's offset (in ``x``'s units; the weekdays' offsets
    average 0, so what is left keeps the week's mean level), or None when the history
    shows no pattern it can trust."""
    n = len(x)
    wd = np.asarray(weekdays)
    if n < 7 * MIN_WEEKS or len(wd) != n:
        return None
    masks = [wd == d for d in sorted(set(int(d) for d in wd))]
    counts = np.array([int(m.sum()) for m in masks])
    k = len(masks)
    if k < 2 or counts.min() < MIN_WEEKS:
        return None
    off = np.zeros(n)
    for _ in range(ROUNDS):
        r = x - _rolling_level(x - off)
        med = np.array([float(np.median(r[m])) for m in masks])
        off = np.select(masks, med - med.mean())
    mean = np.array([float(r[m].mean()) for m in masks])
    within = float(sum(((r[m] - mu) ** 2).sum() for m, mu in zip(masks, mean)))
    between = float((counts * (mean - r.mean()) ** 2).sum())
    if within <= 0 or between / (k - 1) < F_BOUND * within / (n - k):
        return None
    return off
