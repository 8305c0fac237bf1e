"""A move's shape: a straight ramp between two held levels, or steps.

The change-point fit (``changepoints``) cuts a series into flat and straight segments; a
ramp with noise often comes out as one step or a staircase of two. These ask the data
which shape it is, by least squares: a ramp (a level, a straight move from night ``a`` to
night ``b``, a level) against the steps found. A ramp has one corner more than one step, so
it must pay for it (``pen``: one parameter's worth in the sum of squares, the noise's
variance × log n); against two steps it must fit better.
"""

from __future__ import annotations

import numpy as np


def best_ramp(y: np.ndarray, starts: range, ends: range,
              min_len: int) -> tuple[float, tuple[int, int]] | None:
    """The ramp (first index ``a`` in ``starts``, last ``b`` in ``ends``, ``b − a + 1 ≥
    min_len``) that fits ``y`` best: its sum of squares and (a, b); None when none fits."""
    m = len(y)
    pairs = [(a, b) for a in starts for b in ends if b < m and b - a + 1 >= min_len]
    if not pairs:
        return None
    t = np.arange(m, dtype=float)
    sy, syy = float(y.sum()), float((y * y).sum())
    a_, b_ = (np.array(v, dtype=float)[:, None] for v in zip(*pairs))
    r = np.clip((t[None, :] - a_) / (b_ - a_), 0.0, 1.0)  # 0 before the ramp, 1 after
    sr, srr, sry = r.sum(1), (r * r).sum(1), r @ y
    vr = srr - sr * sr / m
    sse = syy - sy * sy / m - (sry - sr * sy / m) ** 2 / np.where(vr > 0, vr, np.inf)
    k = int(np.argmin(sse))
    return float(sse[k]), pairs[k]


def levels_sse(y: np.ndarray, breaks: list[int]) -> float:
    """Sum of squares of ``y`` about its own mean between consecutive ``breaks``."""
    edges = [0, *breaks, len(y)]
    return float(sum(((seg := y[i:j]) - seg.mean()) @ (seg - seg.mean())
                     for i, j in zip(edges, edges[1:]) if j > i))


def ramp_or_step(y: np.ndarray, at: int, pen: float, min_len: int) -> tuple[int, int] | None:
    """Whether a confirmed step at ``at`` in ``y`` (the two levels around it) is better
    explained by a ramp of ``min_len`` nights or more: its first and last index, or None
    (a step). The ramp has one parameter more (its second corner): it must pay ``pen``."""
    ramp = best_ramp(y, range(0, at + 1), range(max(at - 1, 0), len(y)), min_len)
    if ramp is None:
        return None
    sse, span = ramp
    return span if sse + pen < levels_sse(y, [at]) else None


def staircase(y: np.ndarray, span: tuple[int, int], pen: float) -> int | None:
    """Whether what a ramp over ``span`` (its first and last index in ``y``) explains is two
    steps: three levels, both breaks within the ramp's span, fitting better than the ramp
    by more than ``pen`` (their one parameter more). Two sudden drops two nights apart fit
    a six-night ramp better than one step, and two steps better still; a noisy ramp does
    not (a staircase leaves its slope inside each level). The first step's index, or None."""
    a, b = span
    pairs = [(p, q) for p in range(max(a, 1), b + 1) for q in range(p + 1, min(b + 2, len(y)))]
    if not pairs:
        return None
    sse, first = min((levels_sse(y, [p, q]), p) for p, q in pairs)
    ramp = best_ramp(y, range(a, a + 1), range(b, b + 1), 2)
    return first if ramp is not None and sse + pen < ramp[0] else None


def ramp_over_steps(y: np.ndarray, first: int, second: int,
                    pen: float = 0.0) -> tuple[int, int] | None:
    """Whether two steps the same way, at ``first`` and ``second`` in ``y`` (three levels),
    are one ramp: the best ramp from at or before the first to at or after the night before
    the second, if it fits better than the three levels (a staircase a noisy ramp left in
    flat segments does; a level held between two steps does not). The ramp has one
    parameter fewer than the three levels: it may fit worse by ``pen``."""
    ramp = best_ramp(y, range(0, first + 1), range(max(second - 1, 0), len(y)), 2)
    if ramp is None:
        return None
    sse, span = ramp
    return span if sse < levels_sse(y, [first, second]) + pen else None


def _bend_basis(t: np.ndarray, knot: int, kinds: tuple[str, str]) -> np.ndarray:
    """Columns of a continuous fit that bends at ``knot``: flat then straight, straight
    then flat, or straight with a change of slope."""
    after, before = np.maximum(t - knot, 0.0), np.minimum(t - knot, 0.0)
    cols = {("flat", "line"): [after], ("line", "flat"): [before],
            ("line", "line"): [t, after]}[kinds]
    return np.column_stack([np.ones_like(t), *cols])


def _sse(design: np.ndarray, y: np.ndarray) -> float:
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    r = y - design @ coef
    return float(r @ r)


def sharp_jump(y: np.ndarray, at: int, kinds: tuple[str, str], pen: float) -> bool:
    """Whether the jump at ``at`` between two parts of ``y`` (each flat or straight, at
    least one straight) is a step of its own: the two parts fitted apart beat every
    continuous bend (at any night: the corner of a ramp the fit cut late) by ``pen``, the
    jump's one parameter. A ramp cut into a level and a line leaves a small jump a bend
    fits as well; a step with a drift after it leaves one no bend can (issue 27)."""
    m = len(y)
    t = np.arange(m, dtype=float)
    apart = sum(_sse(np.column_stack([np.ones(j - i), *([t[i:j]] if k == "line" else [])]),
                     y[i:j]) for i, j, k in ((0, at, kinds[0]), (at, m, kinds[1])))
    bent = min(_sse(_bend_basis(t, knot, kinds), y) for knot in range(1, m - 1))
    return bent - apart > pen
