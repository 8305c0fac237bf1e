"""Instrument overhead: the agent's decode_tok_s vs a bare mlx-lm loop, side by side.

Both sides compute decode tok/s the same way (least-squares slope of token index over
arrival time after the same warm-up tokens); the agent additionally runs its telemetry
sampler, memory accounting and acceptance bookkeeping. Runs are interleaved (bare,
agent, bare, agent, …) so machine noise hits both. Target: agent/bare ≥ 0.98.

    .venv/bin/python bench/agent_overhead.py [--reps 9] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.job import parse_job  # noqa: E402
from agent.stats import decode_rates  # noqa: E402
from agent.telemetry import Sampler  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.jobspec import build_job  # noqa: E402

SKIP = 64


def bare(model, tok, prompt_ids, max_tokens, draft=None, k=3) -> float:
    from mlx_lm import stream_generate

    kw = {"draft_model": draft, "num_draft_tokens": k} if draft is not None else {}
    times = []
    t0 = time.perf_counter()
    for _ in stream_generate(model, tok, prompt_ids, max_tokens=max_tokens, **kw):
        times.append(time.perf_counter() - t0)
    return decode_rates(times, SKIP)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    from mlx_lm import load

    from agent.runner import Sweep

    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        raw = build_job(Path(d), ["code"], max_tokens=args.max_tokens)
        model, tok = load(f"{d}/target")
        draft, _ = load(f"{d}/draft")
    job = parse_job(raw)
    w = job.workloads[0]
    prompt = tok.encode(w.prompt)
    print(f"{'mode':<16}{'bare tok/s':>12}{'agent tok/s':>13}{'agent/bare':>12}   median of "
          f"{args.reps}, {args.max_tokens} tokens, code prompt, decode slope after {SKIP}")
    with Sampler(job.telemetry_interval_s) as sampler:
        sweep = Sweep(job, None, model, draft, tok, sampler)
        for label, spec in (("autoregressive", False), ("speculative k=3", True)):
            cfg = {**job.base, "num_draft_tokens": 3}
            bare(model, tok, prompt, 32, draft if spec else None)  # warm both paths
            sweep.measure(w, cfg, spec, 0, max_tokens=32)
            b, a = [], []
            for _ in range(args.reps):
                b.append(bare(model, tok, prompt, args.max_tokens, draft if spec else None))
                a.append(sweep.measure(w, cfg, spec, 0)["decode_tok_s"])
            mb, ma = statistics.median(b), statistics.median(a)
            paired = sorted(x / y for x, y in zip(a, b))
            print(f"{label:<16}{mb:>12.1f}{ma:>13.1f}{ma / mb:>12.3f}   paired ratio median "
                  f"{statistics.median(paired):.3f} (min {paired[0]:.3f}, max {paired[-1]:.3f})")


if __name__ == "__main__":
    main()
