"""Predicted vs measured speedup of a calibration pair on this machine, per draft width.

The pair is the demo draft grown with identity layers (`specfleet models calibrate`):
acceptance 1.0, so speculative decode tok/s should be (k+1) / (k·draft + verify(k+1)) from
step costs timed directly in mlx (agent/calibrate.py). Autoregressive and speculative bare
mlx-lm loops run interleaved (AR, k=2, AR, k=3, …) so machine noise hits both; the table
prints the median of each, the speedups and how far measured is from predicted (the
instrument check's tolerance is ±10%).

    .venv/bin/python bench/calibration.py [--layers 16 32] [--reps 5] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.calibrate import bare_decode_tok_s, predicted_speedup, step_costs  # noqa: E402
from orchestrator.calibration import calibrate  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402

PROMPT = 'def heappush(heap, item):\n    """Push item onto heap, maintaining the heap invariant."""'


def one(d: Path, layers: int, widths: list[int], reps: int, max_tokens: int) -> None:
    from mlx_lm import load

    calibrate(d / "draft", d / f"cal-{layers}", layers=layers, log=lambda m: None)
    target, tok = load(str(d / f"cal-{layers}"))
    draft, _ = load(str(d / "draft"))
    ids = tok.encode(PROMPT)
    costs = step_costs(target, draft, ids, widths, reps=35)
    bare_decode_tok_s(target, tok, ids, 16)
    bare_decode_tok_s(target, tok, ids, 16, draft, widths[0])
    ar: list[float] = []
    spec: dict[int, list[float]] = {k: [] for k in widths}
    for _ in range(reps):
        for k in widths:
            ar.append(bare_decode_tok_s(target, tok, ids, max_tokens) or 0.0)
            spec[k].append(bare_decode_tok_s(target, tok, ids, max_tokens, draft, k) or 0.0)
    a = statistics.median(ar)
    print(f"\n{layers} layers: target step {costs['target_ms']:.2f} ms, draft step "
          f"{costs['draft_ms']:.2f} ms, verify k+1 "
          + " / ".join(f"{v:.2f}" for v in costs["verify_ms"].values())
          + f" ms; autoregressive {a:.1f} tok/s (predicted {1e3 / costs['target_ms']:.1f})")
    print(f"{'width':>6}{'tok/s':>9}{'speedup':>10}{'predicted':>11}{'off':>8}   "
          f"median of {reps}, {max_tokens} tokens")
    for k in widths:
        m = statistics.median(spec[k]) / a
        p = predicted_speedup(costs, k)
        print(f"{k:>6}{statistics.median(spec[k]):>9.1f}{m:>9.2f}×{p:>10.2f}×{m / p - 1:>+8.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        for layers in args.layers:
            one(Path(d), layers, args.widths, args.reps, args.max_tokens)


if __name__ == "__main__":
    main()
