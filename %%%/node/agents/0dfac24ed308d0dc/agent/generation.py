"""One measured generation with mlx-lm's ``stream_generate``."""

from __future__ import annotations

import resource
import sys
import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from .protocol import KNOBS, SAMPLING_DEFAULTS
from .trace import Trace, metrics


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return None


def _max_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def generate_trace(model, tokenizer, prompt_ids: list[int], cfg: dict, max_tokens: int,
                   draft_model=None, seed: int = 0) -> Trace:
    """Run one generation; every token's arrival time, id and origin (draft or target)."""
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
    return Trace(
        arrivals=times, token_times=times, output_text="".join(text_parts), token_ids=tokens,
        prompt_tokens=len(prompt_ids), finish_reason=finish,
        from_draft=from_draft, fields={
            "prefill_ms": round(len(prompt_ids) / prompt_tps * 1e3, 3) if prompt_tps else None,
            "prefill_tok_s": round(prompt_tps, 2) if prompt_tps else None,
            # arrival times in µs since the request: compact, and enough to recompute all
            "token_times_us": [round(t * 1e6) for t in times],
            "peak_mlx_memory_bytes": int(mx.get_peak_memory()),
            "rss_bytes": _rss_bytes(),
            "max_rss_bytes": _max_rss_bytes(),
        })


def generate_once(model, tokenizer, prompt_ids: list[int], cfg: dict, max_tokens: int,
                  draft_model=None, seed: int = 0, decode_skip: int = 64) -> dict:
    """Run one generation and return its measurements (units in the names)."""
    t = generate_trace(model, tokenizer, prompt_ids, cfg, max_tokens, draft_model, seed)
    return metrics(t, speculative=draft_model is not None,
                   num_draft_tokens=cfg.get("num_draft_tokens") or 0, max_tokens=max_tokens,
                   decode_skip=decode_skip)
