"""The instrument check's node side: step costs measured in mlx, and what they predict.

A calibration pair (a target grown from its draft with identity layers) has a known
acceptance, so its speculative speed follows from three costs measured on the node itself:
one draft step, one target step, and one target forward verifying k+1 tokens. Per verify
round mlx-lm drafts k tokens (k draft steps), verifies them in one target forward and keeps
the accepted ones plus one token of its own:

    tok/s(k) = (1 + acceptance · k) / (k · draft_s + verify_s(k + 1))

(the expected tokens per round is 1 + the mean accepted length; at acceptance 1 it is k + 1;
for a per-token acceptance probability α, the standard expected-accepted-tokens model gives
(1 − α^(k+1)) / (1 − α), see ``expected_tokens``). Autoregressive decoding is one target step
per token, so the predicted speedup is tok/s(k) · target_s.

Standard library, mlx and mlx-lm only (runs on the node).
"""

from __future__ import annotations

import statistics
import time


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verify round when each drafted token is accepted with probability
    ``alpha`` independently (Leviathan et al. 2023): (1 − α^(k+1)) / (1 − α)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_tok_s(costs: dict, k: int, acceptance: float = 1.0) -> float:
    """Speculative decode tok/s at width ``k`` from a node's step costs (milliseconds) and
    the measured acceptance rate (accepted ÷ drafted)."""
    round_ms = k * costs["draft_ms"] + costs["verify_ms"][k + 1]
    return (1.0 + acceptance * k) / round_ms * 1e3


def predicted_speedup(costs: dict, k: int, acceptance: float = 1.0) -> float:
    """Predicted speculative tok/s over autoregressive tok/s (one target step a token)."""
    return predicted_tok_s(costs, k, acceptance) * costs["target_ms"] / 1e3


def _forward_ms(model, cache, tokens, reps: int) -> float:
    """Median wall time of one forward of ``tokens`` at the cache's position; the cache is
    trimmed back after each, so every repetition sees the same context length."""
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    times = []
    for i in range(reps + 2):  # two discarded: the first calls compile and allocate
        t0 = time.perf_counter()
        mx.eval(model(tokens[None], cache=cache))
        dt = time.perf_counter() - t0
        trim_prompt_cache(cache, tokens.size)
        if i >= 2:
            times.append(dt * 1e3)
    return statistics.median(times)


def step_costs(target, draft, prompt_ids: list[int], widths, reps: int = 25) -> dict:
    """Draft step, target step and target verification of k+1 tokens (ms, medians), each
    after prefilling the prompt into a KV cache as generation does."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    prompt = mx.array(prompt_ids, mx.uint32)
    caches = {}
    for name, model in (("target", target), ("draft", draft)):
        cache = make_prompt_cache(model)
        mx.eval(model(prompt[None], cache=cache))
        caches[name] = cache
    one = prompt[-1:]
    verify = {k + 1: _forward_ms(target, caches["target"], prompt[-(k + 1):], reps)
              for k in sorted(set(widths))}
    return {"target_ms": _forward_ms(target, caches["target"], one, reps),
            "draft_ms": _forward_ms(draft, caches["draft"], one, reps),
            "verify_ms": verify, "reps": reps, "context_tokens": len(prompt_ids)}
