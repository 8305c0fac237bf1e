"""Open-loop saturation verdicts against planted servers: precision and recall.

Each level is a schedule (constant or Poisson, 2 or 8 requests/s, 16 or 40 requests)
answered by a simulated server whose answer is known without the code under test:
- keeps up (truth ok): unlimited parallelism with replies of random length (uniform
  0.2-1.2 s: stochastic EOS), every other reply slow (0.1 / 0.7 s), a constant 1 s
  prefill with 10% jitter, a batching server answering on a 1 s tick at a random phase,
  and a serial server offered half its capacity with ±30% service jitter;
- falls behind (truth saturated): a serial (FIFO) server offered 1.25-3× its capacity with
  ±20% service jitter, a batching server whose tick serves half the arrivals, a server
  that degrades to serial at 2× load halfway through, a server that holds every request
  and answers them in one burst 1.5 s after the last arrival.
``agent.load.summarize`` and ``saturation`` give each level's verdict, as the agent's load
loop does; a saturated verdict on a truth-ok level is false. Goal: precision ≥ 0.95 and
recall ≥ 0.95. Run: ``.venv/bin/python bench/load_saturation.py [--per-kind 25]``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.load import Outcome, arrival_times, saturation, summarize  # noqa: E402


def _parallel(sched, rng, draw):
    out = []
    for t in sched:
        d = draw(rng)
        out.append(Outcome(t, t, chunk_times=[min(0.05, d), d], end=t + d))
    return out


def _serial(sched, rng, rate, load, jitter, first=0):
    """FIFO, one at a time, mean service load / rate; requests before ``first`` apart."""
    out, free = [], 0.0
    for i, t in enumerate(sched):
        if i < first:
            out.append(Outcome(t, t, chunk_times=[0.02, 0.05], end=t + 0.05))
            continue
        s = load / rate * rng.uniform(1 - jitter, 1 + jitter)
        start = max(t, free)
        free = start + s
        out.append(Outcome(t, t, chunk_times=[start - t + 0.02 * s, free - t], end=free))
    return out


def _tick(sched, rng, period, capacity=None):
    """Answered in batches on a tick (random phase); at most ``capacity`` a tick, FIFO."""
    phase, out, waiting, k = rng.uniform(0.0, period), [], list(sched), 0
    while waiting:
        at = phase + k * period
        k += 1
        ready = [t for t in waiting if t <= at][:capacity]
        for t in ready:
            out.append(Outcome(t, t, chunk_times=[at - t + 0.01, at - t + 0.02],
                               end=at + 0.02))
        waiting = waiting[len(ready):]
    return sorted(out, key=lambda o: o.scheduled)


def _held(sched, rng):
    at = sched[-1] + 1.5
    return [Outcome(t, t, chunk_times=[at - t + 0.01 * i, at - t + 0.01 * i + 0.05],
                    end=at + 0.01 * i + 0.05) for i, t in enumerate(sched)]


KINDS = {  # name: (truly saturated, server(schedule, rng, rate))
    "random lengths": (False, lambda s, r, q: _parallel(s, r, lambda g: g.uniform(0.2, 1.2))),
    "every other slow": (False, lambda s, r, q: [
        Outcome(t, t, chunk_times=[0.02, d], end=t + d)
        for i, t in enumerate(s) for d in [0.1 if i % 2 == 0 else 0.7]]),
    "1 s prefill": (False, lambda s, r, q: _parallel(s, r, lambda g: g.uniform(0.9, 1.1))),
    "1 s tick": (False, lambda s, r, q: _tick(s, r, 1.0)),
    "serial at half": (False, lambda s, r, q: _serial(s, r, q, 0.5, 0.3)),
    "serial 1.25-3x": (True, lambda s, r, q: _serial(s, r, q, r.uniform(1.25, 3.0), 0.2)),
    "tick, half capacity": (True, lambda s, r, q: _tick(s, r, 1.0, max(int(q / 2), 1))),
    "degrades halfway": (True, lambda s, r, q: _serial(s, r, q, 2.0, 0.1, len(s) // 2)),
    "held burst": (True, lambda s, r, q: _held(s, r)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-kind", type=int, default=25,
                    help="levels per kind and setting (8 settings)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    tp = fp = fn = 0
    print(f"{'kind':>20} {'truth':>9} {'saturated':>10} of")
    for name, (truth, server) in KINDS.items():
        hit = total = 0
        for rate in (2.0, 8.0):
            for n in (16, 40):
                for arrivals in ("constant", "poisson"):
                    for seed in range(args.per_kind):
                        rng = random.Random(f"{name}/{rate}/{n}/{arrivals}/{seed}")
                        sched = arrival_times(rate, n, arrivals, seed)
                        outs = server(sched, rng, rate)
                        m = summarize(outs, max(o.end for o in outs))
                        said = saturation([m], "request_rate", rate) is not None
                        hit, total = hit + said, total + 1
        tp, fp, fn = tp + (hit if truth else 0), fp + (0 if truth else hit), \
            fn + (total - hit if truth else 0)
        print(f"{name:>20} {'saturated' if truth else 'ok':>9} {hit:10d} {total}")
    levels = len(KINDS) * 8 * args.per_kind
    print(f"{levels} levels: precision {tp / (tp + fp) if tp + fp else 1.0:.3f}, "
          f"recall {tp / (tp + fn) if tp + fn else 1.0:.3f} "
          f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
