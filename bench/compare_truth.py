"""`specfleet compare` against planted truth: at a true ratio of 1.0 with night-clustered
noise, how often does it claim a difference, and how often does its 95% interval cover
1.0? Targets (issue 27): false claims ≤ 6%, coverage ≥ 93% over 200 pairs.

    .venv/bin/python bench/compare_truth.py [--pairs 200] [--seed 1] [--direct 2000] [--nights 5]
        [--apart] [--busy 0.7]

``--direct N`` adds, without a store, N planted pairs per night memory φ (AR(1) from
night to night: 0, 0.3, 0.5, 0.7) through compare's night_ratio, beside plain Welch (the
rule before nightmemory): false claims and coverage at a true ratio of 1.0, and how often
a true 10% difference is found (power); ``--nights`` a side (5; 3 reads φ by its exact
bound, nightmemory.exact_memory); ``--apart``: two nodes (independent sides, each its own
AR(1) series, read as compare reads them), φ up to 0.9, and the power for a true 20%;
``--busy F``: one night of each side at F × its level (a busy night a week), φ up to 0.9.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.store import open_store  # noqa: E402
from tests.truth.pairs import Noise, direct_score, plant_pairs, score  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--night-sd", type=float, default=Noise.night_sd)
    p.add_argument("--rep-sd", type=float, default=Noise.rep_sd)
    p.add_argument("--direct", type=int, default=0, help="pairs per φ without a store")
    p.add_argument("--nights", type=int, default=Noise.nights, help="a side, for --direct")
    p.add_argument("--apart", action="store_true", help="--direct on two nodes' nights")
    p.add_argument("--busy", type=float, help="--direct: one night a side at this multiple")
    args = p.parse_args()
    if args.direct and args.busy:
        direct(args.direct, args.seed, args.nights, args.busy)
    elif args.direct:
        (direct_apart if args.apart else direct)(args.direct, args.seed, args.nights)
    if not args.pairs:
        return
    noise = Noise(night_sd=args.night_sd, rep_sd=args.rep_sd)
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/truth.db")
        t = time.perf_counter()
        nodes = plant_pairs(store, args.pairs, noise, args.seed)
        planted = time.perf_counter() - t
        s = score(store, nodes)
    print(f"{s['pairs']} planted pairs, true ratio 1.0, {noise.nights} nights × {noise.reps} "
          f"repetitions a side, night spread {noise.night_sd:.0%}, repetition spread "
          f"{noise.rep_sd:.0%} (planted in {planted:.0f} s)")
    print(f"false claims: {s['false_claims']}/{s['pairs']} = {s['false_claim_rate']:.1%} "
          f"(target ≤ 6%)")
    print(f"95% interval covers 1.0: {s['covered']}/{s['pairs']} = {s['coverage']:.1%} "
          f"(target ≥ 93%)")


def direct(pairs: int, seed: int, nights: int = Noise.nights, busy: float | None = None) -> None:
    print(f"night_ratio, {pairs} planted pairs per φ ({nights} nights a side, weekend between"
          + (f", one night a side at {busy}×" if busy else "") + "):")
    print(f"{'φ':>4} {'rule':<14}{'false claims':>13}{'coverage':>10}{'found 10%':>11}")
    for phi in (0.0, 0.3, 0.5, 0.7) + ((0.9,) if busy else ()):
        for name, memory in (("night memory", True), ("plain Welch", False)):
            null = direct_score(phi, 1.0, pairs, seed, memory, nights, busy=busy)
            power = direct_score(phi, 1.1, pairs, seed + 1, memory, nights, busy=busy)["claims"]
            print(f"{phi:>4} {name:<14}{null['claims']:>13.1%}{null['coverage']:>10.1%}"
                  f"{power:>11.1%}")
    print()


def direct_apart(pairs: int, seed: int, nights: int = Noise.nights) -> None:
    print(f"night_ratio, {pairs} planted pairs per φ, two nodes ({nights} nights a side):")
    print(f"{'φ':>4} {'read as':<16}{'false claims':>13}{'coverage':>10}{'found 20%':>11}")
    for phi in (0.0, 0.5, 0.7, 0.9):
        for name, apart in (("apart", True), ("one node's weeks", False)):
            null = _two_nodes(phi, 1.0, pairs, seed, nights, apart)
            power = _two_nodes(phi, 1.2, pairs, seed + 1, nights, apart)["claims"]
            print(f"{phi:>4} {name:<18}{null['claims']:>11.1%}{null['coverage']:>10.1%}"
                  f"{power:>11.1%}")
    print()


def _two_nodes(phi: float, ratio: float, pairs: int, seed: int, nights: int,
               apart: bool) -> dict:
    """Two nodes' nights through night_ratio, read apart (as compare reads them) or as if
    they were one node's back-to-back weeks (the rule before)."""
    import random

    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio
    from tests.truth.pairs import ar1_sides

    rng, claims, covered = random.Random(seed), 0, 0
    for _ in range(pairs):
        a, b = ar1_sides(rng, phi, ratio, Noise(nights=nights), apart=True)
        r = night_ratio(a, b, apart=apart)
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= ratio <= r["ci"][1]
    return {"claims": claims / pairs, "coverage": covered / pairs}


if __name__ == "__main__":
    main()
