"""Moves the same way that meet, for the change-point detector (``changepoints``): one
drift, not a staircase of steps and short drifts.

``join_drifts`` joins neighbours pairwise (a drift and a step at its edge, two steps a ramp
fits better than three levels); ``one_move`` then asks of each run of findings the same way
whether one ramp (a level, a straight move, a level) explains the nights they cover as well
as their pieces do, at BIC's price per parameter: a mid-window drift the fit cut into a step,
a short level and a drift was reported as all three (audit 27cp).
"""

from __future__ import annotations

import numpy as np

from .ramps import best_ramp, ramp_over_steps
from .segfit import MIN_DRIFT, MIN_NIGHTS

RAMP_PARAMS = 4  # a ramp's two levels and two corners


def join_drifts(found: list[dict], caused: set[int], x: np.ndarray,
                 pen: float = 0.0) -> list[dict]:
    """Moves the same way that meet: one drift. Drifts that meet or overlap; a step within
    ``MIN_DRIFT`` nights of a drift's end or start (the staircase a ramp leaves in flat
    segments); two such steps with a short level between them, when a ramp of ``MIN_DRIFT``
    nights or more fits them as well as the three levels do (within ``pen``: the ramp has
    one parameter fewer). A step at an identity change (``caused``), or a sharp one (no
    bend of the drift beside it fits it), stays a step; a small one the other way at a
    drift's edge (under half of it: the line's end overshot) goes unless caused."""
    kept = caused | {f["index"] for f in found if f.get("sharp")}
    out: list[dict] = []
    for n, f in enumerate(found):
        p = out[-1] if out else None
        if p is not None and {p["kind"], f["kind"]} & {"drift"} and \
                f["index"] - p.get("until", p["index"]) <= MIN_DRIFT:
            # a small step at a drift's edge: the ramp's fit overshot (the other way) or a
            # corner of it (its way, unless sharp)
            drift, other = (p, f) if p["kind"] == "drift" else (f, p)
            its_way = (other["size"] > 0) == (drift["size"] > 0)
            if "step" in other["kind"] and other["index"] not in caused and \
                    not (its_way and other.get("sharp")) and \
                    abs(other["size"]) < abs(drift["size"]) / 2:
                out[-1] = drift
                continue
        if p is None or (f["size"] > 0) != (p["size"] > 0) or "step" in f["kind"] \
                and f["index"] in kept or "step" in p["kind"] and p["index"] in kept:
            out.append(f)
            continue
        p_end = p.get("until", p["index"])
        near = f["index"] - p_end <= MIN_DRIFT
        if "drift" in (p["kind"], f["kind"]) and near or \
                p["kind"] == f["kind"] == "step" and f["index"] - p["index"] < 2 * MIN_NIGHTS \
                and one_ramp(x, out, found[n:], pen):
            p.update(kind="drift", until=max(p_end, f.get("until", f["index"])),
                     after=f["after"], size=f["after"] / p["before"] - 1,
                     z=max(p["z"], f["z"]))
            continue
        out.append(f)
    return out


def one_ramp(x: np.ndarray, before: list[dict], after: list[dict], pen: float) -> bool:
    """Whether the last step of ``before`` and the first of ``after`` are one ramp of
    ``MIN_DRIFT`` nights or more: over the nights from the finding before them (or
    ``MIN_DRIFT`` × 2 nights) to the one after."""
    first, second = before[-1]["index"], after[0]["index"]
    lo = max(before[-2].get("until", before[-2]["index"]) + 1 if len(before) > 1 else 0,
             first - 2 * MIN_DRIFT)
    hi = min(after[1]["index"] if len(after) > 1 else len(x), second + 2 * MIN_DRIFT)
    span = ramp_over_steps(x[lo:hi], first - lo, second - lo, pen)
    # a "ramp" of fewer nights than the shortest drift is two sudden moves, not a slow one
    return span is not None and span[1] - span[0] + 1 >= MIN_DRIFT


def _piece_sse(y: np.ndarray, breaks: list[int], lines: set[int]) -> float:
    """Sum of squares of ``y`` about a fit flat between ``breaks``, straight on the pieces
    that start at an index in ``lines``."""
    edges, sse = [0, *breaks, len(y)], 0.0
    for i, j in zip(edges, edges[1:]):
        seg, t = y[i:j], np.arange(j - i, dtype=float)
        if j - i >= 2 and i in lines:
            seg = seg - np.polyval(np.polyfit(t, seg, 1), t)
        else:
            seg = seg - seg.mean()
        sse += float(seg @ seg)
    return sse


def _ramp_levels(y: np.ndarray, a: int, b: int) -> tuple[float, float]:
    """The levels before and after the least-squares ramp from ``a`` to ``b`` in ``y``."""
    r = np.clip((np.arange(len(y), dtype=float) - a) / max(b - a, 1), 0.0, 1.0)
    (c0, c1), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(r), r]), y, rcond=None)
    return float(c0), float(c0 + c1)


def _as_ramp(x: np.ndarray, found: list[dict], k: int, m: int, pen: float) -> dict | None:
    """Findings ``k`` … ``m − 1`` as one drift, if a ramp over the nights from the finding
    before them to the one after (at most ``2 × MIN_DRIFT`` beyond) fits with its
    ``RAMP_PARAMS`` as well as their pieces with theirs (a level each, a slope each drift,
    a night each break), at ``pen`` per parameter."""
    group = found[k:m]
    lo = max(found[k - 1].get("until", found[k - 1]["index"]) + 1 if k else 0,
             group[0]["index"] - 2 * MIN_DRIFT)
    hi = min(found[m]["index"] if m < len(found) else len(x),
             group[-1].get("until", group[-1]["index"]) + 1 + 2 * MIN_DRIFT)
    breaks, lines = [], set()
    for f in group:
        breaks.append(f["index"] - lo)
        if f["kind"] == "drift":
            lines.add(f["index"] - lo)
            breaks.append(f["until"] + 1 - lo)
    breaks = sorted(b for b in set(breaks) if 0 < b < hi - lo)
    y = x[lo:hi]
    ramp = best_ramp(y, range(len(y)), range(len(y)), MIN_DRIFT)
    params = 2 * len(breaks) + 1 + len(lines)
    if ramp is None or ramp[0] + RAMP_PARAMS * pen >= _piece_sse(y, breaks, lines) + params * pen:
        return None
    a, b = ramp[1]
    before, after = _ramp_levels(y, a, b)
    return {"index": lo + a, "until": lo + b, "kind": "drift", "before": before,
            "after": after, "size": after / before - 1, "z": max(f["z"] for f in group),
            "nights": [b - a + 1]}


def one_move(x: np.ndarray, found: list[dict], caused: set[int], pen: float) -> list[dict]:
    """Each run of two or more findings the same way, each within ``MIN_DRIFT`` nights of
    the last (steps and drifts inside the window, none at an identity change), as one drift
    when one ramp explains it (``_as_ramp``)."""
    out: list[dict] = []
    k = 0
    while k < len(found):
        m = k + 1
        while m < len(found) and _same_move(found[m - 1], found[m], caused):
            m += 1
        drift = _as_ramp(x, found, k, m, pen) if m - k >= 2 else None
        out.extend([drift] if drift is not None else found[k:m])
        k = m
    return out


def _same_move(p: dict, f: dict, caused: set[int]) -> bool:
    """Whether ``f`` continues ``p``'s move: the same way, within ``MIN_DRIFT`` nights,
    neither a possible step nor at an identity change."""
    return (p["size"] > 0) == (f["size"] > 0) and \
        f["index"] - p.get("until", p["index"]) <= MIN_DRIFT and \
        not {p["kind"], f["kind"]} & {"possible step"} and \
        not {p["index"], f["index"]} & caused
