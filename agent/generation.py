"""One measured generation with mlx-lm's ``stream_generate``."""

from __future__ import annotations

import hashlib
import resource
import sys
import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from .protocol import KNOBS, SAMPLING_DEFAULTS
from .stats import acceptance_summary, decode_rates, percentile


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None


def _max_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def generate_once(model, tokenizer, prompt_ids: list[int], cfg: dict, max_tokens: int,
                  draft_model=None, seed: int = 0, decode_skip: int = 64) -> dict:
    """Run one generation and return its measurements (units in the names)."""
    speculative = draft_model is not None
    sampler = make_sampler(**{KNOBS[k].engines["mlx-lm"]: cfg[k] for k in SAMPLING_DEFAULTS})
    kwargs = {"sampler": sampler}
    if speculative:
        kwargs["num_draft_tokens"] = cfg["num_draft_tokens"]
    mx.random.seed(seed)
    mx.reset_peak_memory()
    tokens: list[int] = []
    from_draft: list[bool] = []
    times: list[float] = []
    text_parts: list[str] = []
    finish = None
    prompt_tps = None
    t0 = time.perf_counter_ns()
    for r in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens,
                             draft_model=draft_model, **kwargs):  # type: ignore[arg-type]
        times.append((time.perf_counter_ns() - t0) / 1e9)
        tokens.append(int(r.token))
        from_draft.append(bool(r.from_draft))
        text_parts.append(r.text)
        finish, prompt_tps = r.finish_reason, r.prompt_tps
    itl_ms = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    rate, mean_rate, skipped = decode_rates(times, decode_skip)
    text = "".join(text_parts)
    m = {
        "prompt_tokens": len(prompt_ids),
        "generated_tokens": len(tokens),
        "finish_reason": finish,
        "ttft_ms": round(times[0] * 1e3, 3) if times else None,
        "prefill_ms": round(len(prompt_ids) / prompt_tps * 1e3, 3) if prompt_tps else None,
        "prefill_tok_s": round(prompt_tps, 2) if prompt_tps else None,
        "decode_tok_s": round(rate, 2) if rate else None,
        "decode_tok_s_mean": round(mean_rate, 2) if mean_rate else None,
        "decode_skipped_tokens": skipped,
        "itl_p50_ms": _r(percentile(itl_ms, 50)),
        "itl_p95_ms": _r(percentile(itl_ms, 95)),
        "itl_p99_ms": _r(percentile(itl_ms, 99)),
        # Arrival times in µs since the request: compact, and enough to recompute everything.
        "token_times_us": [round(t * 1e6) for t in times],
        "peak_mlx_memory_bytes": int(mx.get_peak_memory()),
        "rss_bytes": _rss_bytes(),
        "max_rss_bytes": _max_rss_bytes(),
        "token_ids": tokens,
        "output_text": text,
        "output_sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    if speculative:
        m.update(acceptance_summary(from_draft, cfg["num_draft_tokens"], max_tokens))
        m["from_draft"] = "".join("1" if f else "0" for f in from_draft)
    else:
        m.update({"drafted_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None,
                  "mean_accepted_len": None, "acceptance_by_position": []})
    return m


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
