"""Least-squares segmentation of a nightly series into flat and straight segments.

``Sums`` gives any segment's cost and fit in O(1) from prefix sums; ``partition`` finds the
segments minimising cost plus a penalty per segment (optimal partitioning, PELT's pruning).
The change-point detector (``changepoints``) confirms and names what it finds.
"""

from __future__ import annotations

import numpy as np

MIN_DRIFT = 6  # the shortest straight segment
MIN_NIGHTS = 4  # a level held fewer nights than this inside the window is transient
MIN_CHANGE = 0.03    # a level change smaller than 3% is not reported


class Sums:
    """Prefix sums: the least-squares cost of any segment, flat or straight, in O(1)."""

    def __init__(self, x: np.ndarray):
        t = np.arange(len(x), dtype=float)
        self.c = [np.concatenate([[0.0], np.cumsum(v)]) for v in (x, x * x, t, t * t, t * x)]

    def parts(self, i, j):
        s, ss, st, stt, stx = (c[j] - c[i] for c in self.c)
        return j - i, s, ss, st, stt, stx

    def flat(self, i, j):
        m, s, ss, *_ = self.parts(i, j)
        return ss - s * s / m

    def line(self, i, j):
        m, s, ss, st, stt, stx = self.parts(i, j)
        vt = stt - st * st / m
        cov = stx - st * s / m
        with np.errstate(divide="ignore", invalid="ignore"):
            return ss - s * s / m - np.where(vt > 0, cov * cov / np.where(vt > 0, vt, 1), 0.0)

    def fit(self, i: int, j: int, kind: str) -> tuple[float, float]:
        """(level at i, slope per night) of the segment's least-squares fit."""
        m, s, ss, st, stt, stx = self.parts(i, j)
        if kind == "flat" or m < 2:
            return s / m, 0.0
        slope = (stx - st * s / m) / (stt - st * st / m)
        return s / m - slope * (st / m - i), slope


def partition(sums: Sums, n: int, pen_flat: float,
              pen_line: float) -> list[tuple[int, int, str]]:
    """Segments (start, end, "flat" | "line") minimising cost + penalties: optimal
    partitioning with PELT's pruning (a start that can no longer win is dropped)."""
    c0, c1, c2, c3, c4 = sums.c  # prefix sums of x, x², t, t², t·x
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back: list[tuple[int, str]] = [(0, "flat")] * (n + 1)
    alive = np.zeros(n + 1, dtype=bool)
    alive[0] = True
    for j in range(1, n + 1):
        st = np.flatnonzero(alive[:j])
        m = j - st
        s, t, tt = c0[j] - c0[st], c2[j] - c2[st], c3[j] - c3[st]
        flat = (c1[j] - c1[st]) - s * s / m
        cov = (c4[j] - c4[st]) - t * s / m
        line = flat - cov * cov / np.maximum(tt - t * t / m, 1e-12)  # one night: cov is 0
        base = best[st]
        k = int(np.argmin(base + flat))
        lined = np.where(m >= MIN_DRIFT, base + line, np.inf)
        kl = int(np.argmin(lined))
        if lined[kl] + pen_line < base[k] + flat[k] + pen_flat:
            best[j], back[j] = lined[kl] + pen_line, (int(st[kl]), "line")
        else:
            best[j], back[j] = base[k] + flat[k] + pen_flat, (int(st[k]), "flat")
        # a start whose best fit to here already costs more than ending here never wins
        alive[st[base + np.minimum(flat, line) > best[j]]] = False
        alive[j] = True
    segs: list[tuple[int, int, str]] = []
    end = n
    while end > 0:
        start, kind = back[end]
        segs.append((start, end, kind))
        end = start
    return segs[::-1]
