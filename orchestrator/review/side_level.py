"""A side's level for ``compare`` where busy nights were found (review/busy_nights): set
aside from its level where ``MIN_QUIET`` quiet nights remain, else their excess counted as
noise; and the (ratio, interval, p) a difference of levels reads."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .nightmemory import mean_gain, mean_gain_at, mean_variance, spread_df

# busy nights are set aside from a side's level where this many quiet nights remain: fewer
# cannot tell a busy night from a heavy tail (Student's t nights, five a side, φ 0.9: set
# aside from four quiet ones, 92.7% covered; their excess counted as noise, 93.4%)
MIN_QUIET = 5


@dataclass
class Busy:
    """A side's busy nights (``nightmemory.read_memory``; ``at``, indices into ``xs``) and
    its quiet others, at least three."""
    xs: list[float]
    at: list[int]
    quiet: list[float]
    set_aside: bool = True  # False: counted as noise whatever their number

    @classmethod
    def of(cls, xs: list[float], busy: list[int]) -> Busy | None:
        quiet = [x for i, x in enumerate(xs) if i not in busy]
        return cls(xs, sorted(busy), quiet) if busy and len(quiet) >= 3 else None

    @property
    def aside(self) -> bool:
        """Whether the busy nights are set aside (else their excess is counted as noise)."""
        return self.set_aside and len(self.quiet) >= MIN_QUIET


def side_variance(v: float, n: int, phi: float, busy: Busy | None,
                  apart: bool) -> tuple[float, float]:
    """(variance of a side's mean log, the df its spread rests on). Busy nights set aside:
    the mean of the quiet nights, whose memory spans the gaps the busy ones leave
    (``mean_gain_at``), their σ² read from the side's winsorized spread (each busy night at
    the nearest quiet value: Yuen's, for a mean that left nights out, so a night set aside
    that was a heavy tail, not a busy machine, still widens the interval). Left in (too few
    quiet nights): its excess enters the mean once, as its own noise, σ² read from the
    others."""
    if busy is None:
        return mean_variance(v, n, phi), (spread_df(n, phi) if apart else n - 1)
    quiet, m = busy.quiet, len(busy.quiet)
    df = spread_df(m, phi) if apart else m - 1
    if not busy.aside:
        mq = statistics.fmean(quiet)
        excess = sum((busy.xs[i] - mq) ** 2 for i in busy.at)
        sigma2 = statistics.variance(quiet) * (m - 1) / (m * (1 - mean_gain(m, phi)))
        return sigma2 * mean_gain(n, phi) + excess / (n * n), df
    w = [min(max(x, min(quiet)), max(quiet)) for x in busy.xs]
    mw = statistics.fmean(w)
    g = mean_gain_at([i for i in range(n) if i not in busy.at], phi)
    return sum((x - mw) ** 2 for x in w) / (m * (1 - g)) * g, df


def reading(d: float, se2: float, df: float, level: float) -> tuple[float, list[float],
                                                                    float]:
    """(ratio, interval, p) of a difference ``d`` of mean logs, its variance and df."""
    import math

    # scipy.special, not scipy.stats: the same Student's t (stats.t calls these) at half
    # the import (0.28 against 0.59 CPU-s, in every `specfleet review` and `compare`)
    from scipy.special import stdtr, stdtrit

    se = math.sqrt(se2)
    if se == 0:
        return math.exp(d), [math.exp(d)] * 2, 1.0 if d == 0 else 0.0
    q = float(stdtrit(df, 0.5 + level / 2))
    return (math.exp(d), [math.exp(d - q * se), math.exp(d + q * se)],
            float(2 * stdtr(df, -abs(d / se))))


def mean_level(xs: list[float], busy: Busy | None) -> float:
    """A side's mean log: its quiet nights' where its busy ones are set aside."""
    return statistics.fmean(busy.quiet if busy is not None and busy.aside else xs)
