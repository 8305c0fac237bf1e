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


def speed_rounds(costs_of, measure, widths, rounds: int) -> dict:
    """Predicted and measured speedup per width, robust to a noisy machine: ``rounds``
    alternating rounds, each measuring the step costs (``costs_of()``: the predicted
    speedups of that round) and then, per width, autoregressive and speculative decode
    (``measure(k)`` tok/s, k=0 autoregressive) back to back, so what loads the machine in
    one round hits both sides of that round's ratio. Per width: the medians of predicted
    and measured speedup, the median of the per-round ratio measured/predicted, and its
    spread (lower and upper quartile of those ratios)."""
    per: dict[int, dict[str, list[float]]] = {
        k: {"predicted": [], "measured": [], "ratio": []} for k in widths}
    for _ in range(rounds):
        costs = costs_of()
        for k in widths:
            ar, sp = measure(0), measure(k)
            if not ar or not sp:
                continue  # too short to time: no sample this round
            p, m = predicted_speedup(costs, k), sp / ar
            for name, x in (("predicted", p), ("measured", m), ("ratio", m / p)):
                per[k][name].append(x)
    return {k: summarise_rounds(v) for k, v in per.items()}


def summarise_rounds(v: dict[str, list[float]]) -> dict:
    """Medians of one width's rounds, the quartiles of its measured/predicted ratio (the
    spread shown) and the per-round ratios themselves (what the check's interval for the
    median is taken from, ``median_interval``)."""
    r = v["ratio"]
    if not r:
        return {"rounds": 0}
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    return {"rounds": len(r), "predicted": statistics.median(v["predicted"]),
            "measured": statistics.median(v["measured"]), "ratio": statistics.median(r),
            "spread": [q[0], q[2]], "ratios": list(r)}


def bare_decode_tok_s(model, tokenizer, prompt_ids: list[int], max_tokens: int, draft=None,
                      k: int = 0, skip: int = 64) -> float | None:
    """Decode tok/s of a bare mlx-lm loop, computed as the agent computes it."""
    from mlx_lm import stream_generate

    from .stats import decode_rates

    kw = {"draft_model": draft, "num_draft_tokens": k} if draft is not None else {}
    times = []
    t0 = time.perf_counter()
    for _ in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens, **kw):
        times.append(time.perf_counter() - t0)
    return decode_rates(times, skip)[0]


def loop_overhead(job, loaded: dict, k: int, reps: int = 5) -> dict:
    """The agent's measuring loop (telemetry sampler running) against a bare mlx-lm loop in
    this process, interleaved: median decode tok/s of each at draft width ``k``."""
    import tempfile
    from pathlib import Path

    from .journal import Journal
    from .loop import Loop, Request
    from .mlxengine import SPECULATIVE, MlxEngine
    from .telemetry import Sampler

    (target, tok), (draft, _) = loaded["target"], loaded["draft"]
    w = job.workloads[0]
    ids = tok.encode(w.prompt)
    cfg = {**job.base, "num_draft_tokens": k}
    with Sampler(job.telemetry_interval_s) as sampler, tempfile.TemporaryDirectory() as d:
        loop = Loop(job, Journal(Path(d) / "j.jsonl"), MlxEngine(job, loaded), sampler)
        bare_decode_tok_s(target, tok, ids, 16, draft, k)  # warm both paths
        loop.measure(Request(SPECULATIVE, w.prompt, 16, cfg, 0, prompt_key=w.name))
        bare, agent = [], []
        for _ in range(reps):
            bare.append(bare_decode_tok_s(target, tok, ids, w.max_tokens, draft, k,
                                          job.decode_skip_tokens))
            agent.append(loop.measure(Request(SPECULATIVE, w.prompt, w.max_tokens, cfg, 0,
                                              prompt_key=w.name))["decode_tok_s"])
    b = statistics.median([x for x in bare if x])
    a = statistics.median([x for x in agent if x])
    return {"bare_tok_s": b, "agent_tok_s": a, "ratio": a / b, "num_draft_tokens": k,
            "reps": reps, "max_tokens": w.max_tokens}


def agent_speed_rounds(job, loaded: dict, widths, rounds: int, cost_reps: int) -> dict:
    """``speed_rounds`` with the agent's own measuring loop as the measured side (the
    instrument under check), the step costs timed in mlx between its rounds."""
    import tempfile
    from pathlib import Path

    from .journal import Journal
    from .loop import Loop, Request
    from .mlxengine import BASELINE, SPECULATIVE, MlxEngine
    from .telemetry import Sampler

    (target, tok), (draft, _) = loaded["target"], loaded["draft"]
    w = job.workloads[0]
    ids = tok.encode(w.prompt)
    with Sampler(job.telemetry_interval_s) as sampler, tempfile.TemporaryDirectory() as d:
        loop = Loop(job, Journal(Path(d) / "j.jsonl"), MlxEngine(job, loaded), sampler)

        def measure(k: int) -> float | None:
            req = Request(SPECULATIVE if k else BASELINE, w.prompt, w.max_tokens,
                          {**job.base, "num_draft_tokens": k}, 0, prompt_key=w.name)
            return loop.measure(req)["decode_tok_s"]

        measure(0), measure(max(widths))  # warm both paths
        return speed_rounds(lambda: step_costs(target, draft, ids, widths, cost_reps),
                            measure, widths, rounds)


def node_costs(job_path, reps: int = 25, rounds: int = 5) -> dict:
    """What ``python -m agent costs JOB`` prints: the node's step costs for the job's pair
    and widths, predicted vs measured speedup per width in alternating rounds, and the
    agent loop's overhead against a bare mlx-lm loop."""
    from .checks import load_models
    from .job import load_job

    job = load_job(job_path)
    loaded = load_models(job)
    (target, tok), (draft, _) = loaded["target"], loaded["draft"]
    widths = [int(k) for k in job.knobs.get("num_draft_tokens") or [4]]
    costs = step_costs(target, draft, tok.encode(job.workloads[0].prompt), widths, reps)
    speed = agent_speed_rounds(job, loaded, widths, rounds, max(5, reps // 3))
    return {"costs": costs, "speed": speed,
            "overhead": loop_overhead(job, loaded, max(widths))}
