"""The memory and prefill knobs on the demo pair, side by side on this machine.

Per setting, interleaved over ``--rounds`` (so slow drift of a shared machine hits every
setting alike): the KV cache the generation kept (``kv_cache_bytes``; exact, not noisy),
the prefill time and the decode rate, autoregressive and speculative. Prints each setting's
ratio to the unquantised default. Run:
``.venv/bin/python bench/knobs.py [--rounds 5] [--prompt-repeat 40] [--max-tokens 64]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = {
    "default": {},
    "kv_bits 8": {"kv_bits": 8, "quantized_kv_start": 0},
    "kv_bits 4": {"kv_bits": 4, "quantized_kv_start": 0},
    "kv_bits 4 g32": {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 0},
    "prefill_step_size 16": {"prefill_step_size": 16},
    "max_kv_size 64 (AR)": {"max_kv_size": 64},
}


def main() -> None:
    from mlx_lm import load

    from agent.generation import generate_trace
    from agent.protocol import SAMPLING_DEFAULTS
    from agent.trace import metrics

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-repeat", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    models = ROOT / "tests" / "data" / "demo-models"
    target, tok = load(str(models / "target"))[:2]
    draft = load(str(models / "draft"))[0]
    ids = tok.encode("def fibonacci(n):\n    return n\n" * args.prompt_repeat)
    base = {**SAMPLING_DEFAULTS, "num_draft_tokens": 3}
    seen: dict[tuple[str, bool], list[dict]] = {}
    for _ in range(args.rounds):
        for name, extra in SETTINGS.items():
            for spec in (False, True):
                if spec and "max_kv_size" in extra:
                    continue  # autoregressive only
                t = generate_trace(target, tok, ids, {**base, **extra}, args.max_tokens,
                                   draft_model=draft if spec else None)
                m = metrics(t, speculative=spec, num_draft_tokens=3,
                            max_tokens=args.max_tokens, decode_skip=8)
                seen.setdefault((name, spec), []).append(m)
    print(f"prompt {len(ids)} tokens, {args.max_tokens} generated, {args.rounds} rounds")
    print(f"{'setting':24} {'mode':12} {'KV cache B':>11} {'× default':>9} "
          f"{'prefill ms':>10} {'× default':>9} {'decode tok/s':>12} {'× default':>9}")
    for (name, spec), ms in seen.items():
        ref = seen[("default", spec)]

        def med(rows, key):
            xs = [r[key] for r in rows if r.get(key) is not None]
            return statistics.median(xs) if xs else None

        kv, kv0 = med(ms, "kv_cache_bytes"), med(ref, "kv_cache_bytes")
        pf, pf0 = med(ms, "prefill_ms"), med(ref, "prefill_ms")
        dc, dc0 = med(ms, "decode_tok_s"), med(ref, "decode_tok_s")
        print(f"{name:24} {'speculative' if spec else 'autoregress.':12} {kv:>11.0f} "
              f"{kv / kv0:>9.3f} {pf:>10.1f} {pf / pf0:>9.2f} {dc:>12.1f} {dc / dc0:>9.2f}")


if __name__ == "__main__":
    main()
