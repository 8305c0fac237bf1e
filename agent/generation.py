"""One measured generation with mlx-lm's ``stream_generate``."""

from __future__ import annotations

import resource
import sys
import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from .engines import ENGINES
from .protocol import KNOBS, setting
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


class _Cache(list):
    """The prompt cache handed to mlx-lm, kept in sight: mlx-lm swaps a layer's cache for
    its quantised form in the list it holds, and speculation holds slices of this one
    (target, draft), so the slices it takes are remembered to measure what it kept."""

    def __init__(self, *a):
        super().__init__(*a)
        self.parts: list[list] = []

    def __getitem__(self, i):
        out = super().__getitem__(i)
        if isinstance(i, slice):
            self.parts.append(out)
        return out

    def nbytes(self) -> int:
        return sum(int(c.nbytes) for part in (self.parts or [self]) for c in part)

    def quantised(self) -> bool:
        """Whether mlx-lm swapped any layer's cache for its quantised form: 0.32.2 does so
        only once a cache holds ``quantized_kv_start`` positions (``maybe_quantize_kv_cache``
        after each forward call), so a shorter generation keeps it unquantised."""
        from mlx_lm.models.cache import QuantizedKVCache

        return any(isinstance(c, QuantizedKVCache) for part in (self.parts or [self])
                   for c in part)

    def positions(self) -> int:
        """The most positions any cache held at the end (speculation rewinds rejected
        drafts, so it may have held a few more during a verify step)."""
        return max((int(c.offset) for part in (self.parts or [self]) for c in part),
                   default=0)


def mlx_arguments(cfg: dict, speculative: bool) -> tuple[dict, dict, dict, int | None]:
    """A config as mlx-lm takes it: (sampler arguments, logits-processor arguments,
    generate arguments, max_kv_size), every knob under the name the registry's mlx-lm
    entry gives it. A knob left at null is not passed (mlx-lm's own default applies)."""
    names = ENGINES["mlx-lm"].knobs
    by_kind: dict[str, dict] = {"sampler": {}, "logits": {}, "cache": {}, "prefill": {}}
    for name, arg in names.items():
        knob = KNOBS[name]
        if knob.kind in by_kind:
            value = setting(cfg, name)
            if value is not None:
                by_kind[knob.kind][arg] = value
    gen = {**by_kind["cache"], **by_kind["prefill"]}
    max_kv = gen.pop(names["max_kv_size"], None)
    if max_kv is not None and speculative:
        # mlx-lm would drop it without a word; plan lock refuses it, this is the backstop
        raise ValueError("max_kv_size is honoured in autoregressive generation only")
    if speculative:
        gen["num_draft_tokens"] = cfg["num_draft_tokens"]
    return by_kind["sampler"], by_kind["logits"], gen, max_kv


def _target_cache(model, max_kv: int | None) -> list:
    """The target's cache. mlx-lm 0.32.2 drops max_kv_size for a model that builds its own
    cache (llama among them); a bound on plain KV caches is applied as mlx-lm applies it to
    the others (a rotating cache keeping the first 4 positions), and refused otherwise."""
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    cache = make_prompt_cache(model, max_kv)
    if max_kv is None or not any(type(c) is KVCache for c in cache):
        return cache
    if not all(type(c) is KVCache for c in cache):
        raise ValueError("max_kv_size: this model builds its own cache (sliding windows); "
                         "a bound cannot be applied to it")
    return [RotatingKVCache(max_size=max_kv, keep=4) for _ in cache]


def generate_trace(model, tokenizer, prompt_ids: list[int], cfg: dict, max_tokens: int,
                   draft_model=None, seed: int = 0) -> Trace:
    """Run one generation; every token's arrival time, id and origin (draft or target)."""
    speculative = draft_model is not None
    sampler_args, logits_args, kwargs, max_kv = mlx_arguments(cfg, speculative)
    kwargs["sampler"] = make_sampler(**sampler_args)
    if logits_args:
        kwargs["logits_processors"] = make_logits_processors(**logits_args)
    cache = _Cache(_target_cache(model, max_kv) + (
        make_prompt_cache(draft_model) if speculative else []))
    kwargs["prompt_cache"] = cache
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
                             draft_model=draft_model, **kwargs):
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
            # what the KV caches hold at the end (target and draft when drafting): the
            # memory kv_bits, kv_group_size, quantized_kv_start and max_kv_size decide
            "kv_cache_bytes": cache.nbytes(),
            # declared = applied: did kv_bits take effect (None: no kv_bits declared)
            "kv_quantised": cache.quantised() if setting(cfg, "kv_bits") is not None else None,
            "kv_positions": cache.positions(),
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
