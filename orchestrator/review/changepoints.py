"""Change points in a nightly series: where its level moved, not only whether this week
differs from a fixed window.

``ruptures`` segments the nightly levels (PELT over the l2 cost, run by its C kernel
implementation ``KernelCPD(kernel="linear")``, which finds the same segments as
``Pelt(model="l2")`` a thousand times faster: a year of nights in under a millisecond;
each segment at least ``MIN_NIGHTS`` nights; a BIC-style penalty scaled by the series' own
night-to-night noise). Each candidate is then confirmed the way a regression is: the medians of the
segments on either side must differ by at least ``MIN_CHANGE`` and a Mann-Whitney test
(scipy) must reject "same level" at ``ALPHA``. So a one-night outlier (it moves no
segment's median) and a noisy-but-flat series give none, a step gives one at its night,
and a slow drift gives steps along it — each with the identity fields that changed
between the nights on either side (none, for a drift: then the cause is not in the
identity).
"""

from __future__ import annotations

import math
import statistics
from datetime import date

from .ranktest import mann_whitney

MIN_NIGHTS = 4     # the shortest segment: 4 vs 4 nights can reach p = 0.029
MIN_CHANGE = 0.03  # a level change smaller than 3% is not reported
ALPHA = 0.05
NOISE_FLOOR = 0.005  # relative night-to-night noise assumed at least this (planted data is exact)


def segment(values: list[float]) -> list[int]:
    """Candidate change indices (a segment starts there), by PELT."""
    n = len(values)
    if n < 2 * MIN_NIGHTS:
        return []  # before the imports: ruptures (and scipy with it) costs ~0.6 s to load
    import numpy as np
    import ruptures as rpt

    x = np.asarray(values, dtype=float)
    x = x / (np.median(x) or 1.0)
    diffs = np.diff(x)
    sigma = max(1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2),
                NOISE_FLOOR)
    algo = rpt.KernelCPD(kernel="linear", min_size=MIN_NIGHTS).fit(x.reshape(-1, 1))
    ends = algo.predict(pen=3 * sigma ** 2 * math.log(n))
    return [int(e) for e in ends if e < n]


def change_points(nights: list[tuple[date, float, dict]], labels) -> list[dict]:
    """``nights``: (night, median of its reliable runs, identity), in date order.
    ``labels(a, b)`` words the identity differences between two identities."""
    values = [v for _, v, _ in nights]
    bounds = [0, *segment(values), len(values)]
    out = []
    for i in range(1, len(bounds) - 1):
        before = values[bounds[i - 1]:bounds[i]]
        after = values[bounds[i]:bounds[i + 1]]
        m0, m1 = statistics.median(before), statistics.median(after)
        if not m0:
            continue
        size = m1 / m0 - 1
        p = mann_whitney(before, after)["p"]
        if abs(size) < MIN_CHANGE or p is None or p >= ALPHA:
            continue  # a candidate the confirmation does not carry
        at, _, ident = nights[bounds[i]]
        out.append({"date": at.isoformat(), "before": m0, "after": m1, "size": size, "p": p,
                    "confidence": 1 - p, "nights": [len(before), len(after)],
                    "changed": labels(nights[bounds[i] - 1][2], ident), "kind": "step"})
    # three or more moves the same way in a row, none with an identity change: one drift
    run: list[dict] = []
    for cp in [*out, None]:
        if cp is not None and not cp["changed"] and (
                not run or (cp["size"] > 0) == (run[-1]["size"] > 0)):
            run.append(cp)
            continue
        if len(run) >= 3:
            for x in run:
                x["kind"] = "drift"
        run = [cp] if cp is not None and not cp["changed"] else []
    return out
