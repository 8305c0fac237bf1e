"""Predicted vs measured speedup of a calibration pair on this machine, per draft width.

The pair is the demo draft grown with identity layers (`specfleet models calibrate`):
acceptance 1.0, so speculative decode tok/s should be (k+1) / (k·draft + verify(k+1)) from
step costs timed directly in mlx (agent/calibrate.py). On a noisy shared machine the two
sides are measured in alternating rounds (``agent.calibrate.speed_rounds``, the method
`specfleet calibrate` judges with): each round times the step costs, then per width a bare
mlx-lm autoregressive and speculative loop back to back. The table prints, per width, the
medians of predicted and measured speedup over the rounds, the median of the per-round
ratio measured/predicted, its spread (lower–upper quartile), and the instrument check's
verdict on them: ok when the 90% distribution-free interval for the median ratio lies
within ±10%, off when it lies wholly outside, unverified (too noisy to judge) otherwise.

    .venv/bin/python bench/calibration.py [--layers 16 32] [--rounds 7] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.calibrate import bare_decode_tok_s, speed_rounds, step_costs  # noqa: E402
from orchestrator.calibration import calibrate  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.instrument import TOLERANCE, judge_width  # noqa: E402

PROMPT = 'def heappush(heap, item):\n    """Push item onto heap, maintaining the heap invariant."""'


def one(d: Path, layers: int, widths: list[int], rounds: int, max_tokens: int,
        cost_reps: int) -> None:
    from mlx_lm import load

    calibrate(d / "draft", d / f"cal-{layers}", layers=layers, log=lambda m: None)
    target, tok = load(str(d / f"cal-{layers}"))[:2]
    draft = load(str(d / "draft"))[0]
    ids = tok.encode(PROMPT)

    def measure(k: int) -> float | None:
        # skip 8 tokens (not the agent's 64): a short generation keeps a round short
        return bare_decode_tok_s(target, tok, ids, max_tokens, draft if k else None, k, 8)

    measure(0), measure(max(widths))  # warm both paths
    t0 = time.perf_counter()
    rows = speed_rounds(lambda: step_costs(target, draft, ids, widths, cost_reps), measure,
                        widths, rounds)
    print(f"\n{layers} layers: {rounds} rounds of ({cost_reps} timed forwards per step cost, "
          f"then AR and speculative at each width, {max_tokens} tokens) in "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'width':>6}{'predicted':>11}{'measured':>10}{'measured/predicted':>20}"
          f"{'spread (quartiles)':>21}{'rounds':>8}  verdict (±{TOLERANCE:.0%})")
    for k, r in rows.items():
        if not r["rounds"]:
            print(f"{k:>6}  no round could be timed")
            continue
        lo, hi = r["spread"]
        print(f"{k:>6}{r['predicted']:>10.2f}×{r['measured']:>9.2f}×{r['ratio']:>19.3f}"
              f"{lo:>13.3f} – {hi:.3f}{r['rounds']:>8}  "
              f"{verdict(k, r)}")


def verdict(k: int, r: dict) -> str:
    """What `specfleet calibrate` would say of this width (orchestrator/instrument.py)."""
    w = {"measured": r["measured"], "predicted": r["predicted"], "off": r["ratio"] - 1}
    why = judge_width(k, r, w)
    interval = f", {w['confidence']:.0%} interval {w['interval'][0]:.3f}–" \
        f"{w['interval'][1]:.3f}" if "interval" in w else ""
    return w["status"] + interval + (f": {why}" if why and w["status"] != "off" else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 3, 4, 6])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cost-reps", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        for layers in args.layers:
            one(Path(d), layers, args.widths, args.rounds, args.max_tokens, args.cost_reps)


if __name__ == "__main__":
    main()
