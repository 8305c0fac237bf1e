"""Checks on a possible step (a new level in the window's last 2-3 nights) that the fit
cannot make: it sees the tail's mean, not its nights, and not the weeks before.

- **held**: every night of the tail lies past the midpoint of the old and new levels. One
  night far off and the next back at the level (a run that crashed to 30%) has a mean
  that reads as a new level; the last night says the level did not move (audit 27: 17 of
  40 such series read as a possible step).
- **recurring**: the tail's weekdays read the same a week earlier (each tail night's last
  night of the same weekday, before the tail, past the midpoint too): the last nights are
  a weekly pattern coming round again (a weekend load that began some weeks ago, too few
  weeks for ``season`` to take it out), not a new level (audit 27: 36-40 of 40).
"""

from __future__ import annotations

import numpy as np


def _past(v: float, before: float, after: float) -> bool:
    """Whether ``v`` lies on the new level's side of the midpoint."""
    mid = (before + after) / 2
    return v < mid if after < before else v > mid


def held(x: np.ndarray, at: int, before: float, after: float) -> bool:
    """Whether every night from ``at`` to the end sits at the new level's side."""
    return all(_past(float(v), before, after) for v in x[at:])


def recurring(x: np.ndarray, at: int, days: list[int], before: float, after: float) -> bool:
    """Whether each tail night's weekday, the last time before ``at`` it was seen, already
    read at the new level's side (a weekly pattern coming round, not a new level)."""
    for i in range(at, len(x)):
        prior = [j for j in range(at) if days[j] == days[i]]
        if not prior or not _past(float(x[prior[-1]]), before, after):
            return False
    return True
