"""Week over week: has a config regressed? One value a night (the night is the unit),
asv's factor and a Mann-Whitney p, and too few nights say "unconfirmed", never "stable"."""

from __future__ import annotations

import statistics
from collections import defaultdict

from agent.stats import median

from .ranktest import mann_whitney
from .week_runs import RunRow, vals

REGRESSION_FACTOR = 1.1   # asv's default
REGRESSION_P = 0.002
MIN_REPS = 7               # below this, p < 0.002 is out of reach: "unconfirmed"


def per_night_values(runs: list[RunRow], metric: str) -> list[float]:
    """One value a night on a node: the median of that night's run medians (several sweeps
    of one night share its state: one sample, not several)."""
    nights: dict[tuple, list[float]] = defaultdict(list)
    for r in runs:
        m = median([v for v in (r.summary.get("values") or {}).get(metric) or []
                    if v is not None])
        if m is not None:
            nights[(r.node, r.at.date())].append(m)
    return [m for ms in nights.values() if (m := median(ms)) is not None]


def regression(now: list[RunRow], then: list[RunRow], metric: str = "decode_tok_s",
               per_night: bool = False) -> dict:
    """``per_night``: compare one value a night (the median of its runs' medians) instead
    of repetitions."""
    pick = per_night_values if per_night else vals
    a, b = pick(then, metric), pick(now, metric)
    if not a or not b:
        return {"verdict": "no data", "ratio": None, "p": None, "n": [len(a), len(b)]}
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else None
    mw = mann_whitney(a, b)
    enough = len(a) >= MIN_REPS and len(b) >= MIN_REPS
    big = ratio is not None and (ratio < 1 / REGRESSION_FACTOR or ratio > REGRESSION_FACTOR)
    significant = mw["p"] is not None and mw["p"] < REGRESSION_P
    if big and significant and enough:
        verdict = "regression" if ratio is not None and ratio < 1 else "improvement"
    elif big or significant:
        verdict = "unconfirmed"
    else:
        verdict = "stable"
    return {"verdict": verdict, "ratio": ratio, "p": mw["p"], "n": [len(a), len(b)],
            "then": median(a), "now": median(b)}
