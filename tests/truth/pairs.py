"""Planted `compare` pairs with night-clustered noise: nights differ more than the
repetitions of one night (the usual case on a Mac that runs other things by day).

Each pair is one node measured on ``nights`` nights in week A and as many in week B at the
same true rate (true ratio 1.0): any "B better/worse" is a false claim, and a 95% interval
that misses 1.0 is a miss. Used by tests/truth/test_compare_truth.py and
bench/compare_truth.py.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta

from orchestrator.review.compare import compare
from orchestrator.store import Store
from tests.history import config_values, night, week_nights

WEEK_A = "2026-W19"
WEEK_B = "2026-W20"


@dataclass(frozen=True)
class Noise:
    night_sd: float = 0.05   # log-normal spread of a night's level
    rep_sd: float = 0.01     # log-normal spread of repetitions within a night
    nights: int = 5          # a side
    reps: int = 3            # per night


def plant_pairs(store: Store, pairs: int, noise: Noise, seed: int) -> list[str]:
    """``pairs`` nodes, each with ``noise.nights`` nights in WEEK_A and WEEK_B at 100 tok/s
    true; returns the nodes."""
    from tests.test_weekly_review import W20

    rng = random.Random(seed)
    nodes = [f"pair-{i:03d}" for i in range(pairs)]
    sweeps: dict = {}  # one nightly sweep a night, every node in it
    for node in nodes:
        for start in (W20 - timedelta(days=7), W20):
            for at in week_nights(start, noise.nights):
                level = 100.0 * math.exp(rng.gauss(0, noise.night_sd))
                v = config_values(level, noise.reps, jitter=0.0)
                v["decode_tok_s"] = [level * math.exp(rng.gauss(0, noise.rep_sd))
                                     for _ in range(noise.reps)]
                sweeps[at] = night(store, at, node=node, chip="Apple M2 Max", pair="p",
                                   workload="code", sweep_id=sweeps.get(at),
                                   configs={("baseline", 0): v})
    return nodes


def score(store: Store, nodes: list[str]) -> dict:
    """False claims (a verdict other than "same within noise" at a true ratio of 1.0) and
    how often the 95% interval covers 1.0, over the decode tok/s row of each pair."""
    claims = covered = 0
    for node in nodes:
        c = compare(store, f"node={node},week={WEEK_A}", f"node={node},week={WEEK_B}")
        (row,) = [r for r in c["rows"] if r["metric"] == "decode_tok_s"]
        claims += row["verdict"] in ("B better", "B worse")
        covered += bool(row["ci"]) and row["ci"][0] <= 1.0 <= row["ci"][1]
    return {"pairs": len(nodes), "false_claims": claims, "covered": covered,
            "false_claim_rate": claims / len(nodes), "coverage": covered / len(nodes)}


def ar1_sides(rng: random.Random, phi: float, ratio: float = 1.0,
              noise: Noise = Noise(), apart: bool = False,
              busy: float | None = None) -> tuple[list[float], list[float]]:
    """One planted pair as compare reduces it (each night to its median), without a store:
    two weeks of ``noise.nights`` nightly levels with the weekend between (``apart``: two
    nodes, each its own series), log-normal (``noise.night_sd``) with AR(1) memory ``phi``
    from night to night (stationary), B's true level ``ratio`` × A's. ``busy``: one random
    night of each side at that multiple of its level (a busy night a week; the ratio holds)."""
    import statistics

    def series(n: int) -> list[float]:
        e, out = rng.gauss(0, noise.night_sd), []
        for _ in range(n):
            out.append(e)
            e = phi * e + rng.gauss(0, noise.night_sd * math.sqrt(1 - phi * phi))
        return out

    if apart:
        week_a, week_b = series(noise.nights), series(noise.nights)
    else:
        levels = series(2 * noise.nights + 2)
        week_a, week_b = levels[:noise.nights], levels[noise.nights + 2:]
    if busy is not None:
        for side in (week_a, week_b):
            side[rng.randrange(len(side))] += math.log(busy)
    return tuple([statistics.median(scale * 100 * math.exp(x + rng.gauss(0, noise.rep_sd))
                                    for _ in range(noise.reps)) for x in side]
                 for scale, side in ((1.0, week_a), (ratio, week_b)))  # type: ignore[return-value]


def direct_score(phi: float, ratio: float, pairs: int, seed: int, memory: bool = True,
                 nights: int = Noise.nights, apart: bool = False,
                 busy: float | None = None) -> dict:
    """night_ratio over ``pairs`` planted AR(1) pairs of ``nights`` a side: claims (p < 0.01,
    interval off 1.0), and how often the interval covers the true ratio. ``apart``: two
    nodes (independent sides), read as compare reads them; ``busy``: see ar1_sides."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng = random.Random(seed)
    claims = covered = 0
    for _ in range(pairs):
        a, b = ar1_sides(rng, phi, ratio, Noise(nights=nights), apart, busy)
        r = night_ratio(a, b, memory=memory, apart=apart)
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= ratio <= r["ci"][1]
    return {"claims": claims / pairs, "coverage": covered / pairs}
