"""`specfleet compare` against planted truth: at a true ratio of 1.0 with night-clustered
noise, how often does it claim a difference, and how often does its 95% interval cover
1.0? Targets (issue 27): false claims ≤ 6%, coverage ≥ 93% over 200 pairs.

    .venv/bin/python bench/compare_truth.py [--pairs 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.store import open_store  # noqa: E402
from tests.truth.pairs import Noise, plant_pairs, score  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--night-sd", type=float, default=Noise.night_sd)
    p.add_argument("--rep-sd", type=float, default=Noise.rep_sd)
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
