"""Our agent's measured generation vs a bare mlx-lm loop, side by side in one run.

Prints the median wall-clock tokens/s of each and their ratio (agent ÷ bare) for the
autoregressive baseline and speculative decoding. The two are interleaved (bare, agent,
bare, agent, …) so machine noise hits both. Usage:

    .venv/bin/python bench/agent_overhead.py [--reps 7] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.generation import generate_once  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.jobspec import load_workload  # noqa: E402


def bare(model, tok, prompt_ids, max_tokens, draft=None, k=3) -> tuple[float, int]:
    from mlx_lm import stream_generate

    kw = {"num_draft_tokens": k} if draft is not None else {}
    t0 = time.perf_counter()
    n = sum(1 for _ in stream_generate(model, tok, prompt_ids, max_tokens=max_tokens,
                                       draft_model=draft, **kw))
    return n / (time.perf_counter() - t0), n


def ours(model, tok, prompt_ids, max_tokens, draft=None, k=3) -> tuple[float, int]:
    cfg = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "num_draft_tokens": k}
    t0 = time.perf_counter()
    m = generate_once(model, tok, prompt_ids, cfg, max_tokens, draft_model=draft)
    return m["generated_tokens"] / (time.perf_counter() - t0), m["generated_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    from mlx_lm import load

    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        model, tok = load(f"{d}/target")
        draft, _ = load(f"{d}/draft")
    prompt = tok.encode(load_workload("code")["prompt"])
    for fn in (bare, ours):  # warm-up both paths
        fn(model, tok, prompt, 16)
        fn(model, tok, prompt, 16, draft)
    print(f"{'mode':<14}{'bare tok/s':>12}{'agent tok/s':>13}{'agent/bare':>12}   (median of "
          f"{args.reps}, {args.max_tokens} tokens, code prompt)")
    for label, d in (("autoregressive", None), ("speculative k3", draft)):
        b, o = [], []
        for _ in range(args.reps):
            b.append(bare(model, tok, prompt, args.max_tokens, d)[0])
            o.append(ours(model, tok, prompt, args.max_tokens, d)[0])
        mb, mo = statistics.median(b), statistics.median(o)
        ratios = [x / y for x, y in zip(o, b)]
        print(f"{label:<14}{mb:>12.1f}{mo:>13.1f}{mo / mb:>12.3f}   paired ratios "
              f"min {min(ratios):.3f} max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
