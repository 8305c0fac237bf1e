"""What one generation looked like, whatever produced it, and the metrics derived from it.

Both engines produce a ``Trace``: in-process mlx-lm one arrival per token, an http runtime
one arrival per streamed chunk (a chunk may hold several tokens). Everything a generation
event reports about time and acceptance is derived here, once, so the two engines cannot
drift apart in how TTFT, the decode slope or the inter-token latencies are computed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from .protocol import KNOB_DEFAULTS
from .stats import acceptance_summary, decode_rates, percentile


@dataclass
class Trace:
    arrivals: list[float]        # seconds since the request, one per arrival of output
    token_times: list[float]     # seconds since the request, one per output token
    output_text: str
    token_ids: list[int] | None = None  # None: not known (an http runtime, no tokenizer)
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    from_draft: list[bool] | None = None  # per token, where the engine knows (mlx-lm)
    drafted: int | None = None   # totals, where only a runtime's own report is known
    accepted: int | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # the engine's own measurements


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def metrics(t: Trace, *, speculative: bool, num_draft_tokens: int, max_tokens: int,
            decode_skip: int) -> dict:
    """The generation event's measurements (units in the names)."""
    times = t.arrivals
    itl_ms = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    rate, mean_rate, skipped = decode_rates(t.token_times, decode_skip)
    m: dict[str, Any] = {
        "prompt_tokens": t.prompt_tokens,
        "generated_tokens": len(t.token_times),
        "finish_reason": t.finish_reason,
        "ttft_ms": round(times[0] * 1e3, 3) if times else None,
        # request to last output: the E2E latency TPOT = (E2E - TTFT) / (tokens - 1) needs
        "e2e_ms": round(times[-1] * 1e3, 3) if times else None,
        "decode_tok_s": round(rate, 2) if rate else None,
        "decode_tok_s_mean": round(mean_rate, 2) if mean_rate else None,
        "decode_skipped_tokens": skipped,
        "itl_p50_ms": _r(percentile(itl_ms, 50)),
        "itl_p95_ms": _r(percentile(itl_ms, 95)),
        "itl_p99_ms": _r(percentile(itl_ms, 99)),
        "token_ids": t.token_ids or [],
        "output_text": t.output_text,
        "output_sha256": hashlib.sha256(t.output_text.encode("utf-8", "replace")).hexdigest(),
    }
    if t.from_draft is not None and speculative:
        m.update(acceptance_summary(t.from_draft, num_draft_tokens, max_tokens))
        m["from_draft"] = "".join("1" if f else "0" for f in t.from_draft)
    elif t.from_draft is not None:  # known to be autoregressive: nothing drafted
        m.update({"drafted_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None,
                  "mean_accepted_len": None, "mean_acceptance_length_vllm": None,
                  "acceptance_by_position": []})
    else:  # a runtime's own totals where it reports them; never invented
        m.update({"drafted_tokens": t.drafted, "accepted_tokens": t.accepted,
                  "acceptance_rate": (t.accepted / t.drafted) if t.drafted and
                  t.accepted is not None else None,
                  "acceptance": "reported" if t.drafted is not None else "not reported",
                  "acceptance_by_position": []})
    m.update(t.fields)
    return m


def not_applied(m: dict, cfg: dict) -> list[str]:
    """Reasons a generation did not measure a setting it declared (empty: it did). mlx-lm
    quantises the KV cache only once it holds ``quantized_kv_start`` positions: a shorter
    generation at ``kv_bits`` 4 measured an unquantised cache, so it is set aside, never
    pooled as a 4-bit result."""
    if m.get("kv_quantised") is not False:
        return []
    start = cfg.get("quantized_kv_start", KNOB_DEFAULTS["quantized_kv_start"])
    return [f"kv_bits {cfg.get('kv_bits')} not applied: the KV cache held "
            f"{m.get('kv_positions')} positions, below quantized_kv_start {start}, so mlx-lm "
            "never quantised it (lower quantized_kv_start or generate longer)"]
