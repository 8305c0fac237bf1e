"""A quantised KV cache that a plan's generations could never reach, refused at lock.

mlx-lm 0.32.2 quantises a layer's cache only once it holds ``quantized_kv_start`` positions
(``maybe_quantize_kv_cache``, after each forward call; its default is 5000). A generation
holds at most prompt + max_tokens positions (and a draft width more during a verify step),
so ``kv_bits: [4, 8]`` over short prompts would measure an unquantised cache under a 4-bit
label. Where the bound is knowable here it is refused with the plan's line; what only a
node can know (the prompt's exact token count) the agent reports per generation
(``kv_quantised``) and sets aside when it did not apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.protocol import KNOB_DEFAULTS, setting

from ..errors import ConfigError
from ..yamlfile import line_of

# A tokenizer's token covers at least one byte of the text (byte-level BPE, SentencePiece
# with byte fallback); the specials an encoder adds (BOS, a leading "▁") are few.
SPECIAL_TOKENS = 16


def positions_bound(prompts_max: list[tuple[str, int]], widths: list[int]) -> int:
    """The most positions any generation's KV cache can hold: the longest prompt's UTF-8
    bytes (an upper bound of its tokens) plus specials, its max_tokens, and the widest
    draft (a verify step holds the drafted positions before rejected ones are rewound)."""
    longest = max(len(p.encode("utf-8")) + SPECIAL_TOKENS + m for p, m in prompts_max)
    return longest + max(widths, default=0) + 1


def _widths(sweep: dict, soak: dict) -> list[int]:
    out = [KNOB_DEFAULTS["num_draft_tokens"]]
    for block in (sweep.get("base") or {}, sweep.get("baseline") or {}):
        if isinstance(block.get("num_draft_tokens"), int):
            out.append(block["num_draft_tokens"])
    swept = (sweep.get("knobs") or {}).get("num_draft_tokens")
    out += [v for v in swept if isinstance(v, int)] if isinstance(swept, list) else []
    if isinstance(soak.get("num_draft_tokens"), int):
        out.append(soak["num_draft_tokens"])
    return out


def _configs(sweep: dict) -> list[tuple[str | None, str, dict]]:
    """(the knob swept, "base" or "baseline", the config) for every config the sweep runs:
    one knob at a time around the base, and each one's baseline."""
    base, baseline = sweep.get("base") or {}, sweep.get("baseline") or {}
    knobs = {k: v for k, v in (sweep.get("knobs") or {}).items() if isinstance(v, list)}
    runs = [(k, {**base, k: v}) for k, values in knobs.items() for v in values] or \
        [(None, dict(base))]
    return [x for swept, cfg in runs
            for x in ((swept, "base", cfg), (swept, "baseline", {**cfg, **baseline}))]


def _line(sweep: dict, swept: str | None, part: str) -> tuple[str, int | None]:
    """Where the config's start (or, at mlx-lm's default, its kv_bits) was declared."""
    for name in ("quantized_kv_start", "kv_bits"):
        for section in (("baseline", "base") if part == "baseline" else ("base",)):
            if name in (sweep.get(section) or {}) and not (section == "base" and swept == name):
                return f"sweep.{section}.{name}", line_of(sweep[section], name)
        if swept == name:
            return f"sweep.knobs.{name}", line_of(sweep["knobs"], name)
    return "sweep", line_of(sweep)


def check_kv_start(data: dict, path: Path, workloads: list[dict[str, Any]]) -> None:
    """Refuse a config with ``kv_bits`` whose ``quantized_kv_start`` no generation of the
    plan can reach, naming the plan's line."""
    sweep, soak = data.get("sweep") or {}, data.get("soak") or {}
    if not workloads:
        return
    limit = (soak.get("max_tokens") if isinstance(soak.get("max_tokens"), int) else None)
    bound = positions_bound([(w["prompt"], max(w["max_tokens"], limit or 0))
                             for w in workloads], _widths(sweep, soak))
    for swept, part, cfg in _configs(sweep):
        bits, start = setting(cfg, "kv_bits"), setting(cfg, "quantized_kv_start")
        if bits is None or not isinstance(start, int) or start <= bound:
            continue
        where, line = _line(sweep, swept, part)
        raise ConfigError(
            f"{where}: kv_bits {bits} would never apply: mlx-lm quantises the KV cache only "
            f"once it holds quantized_kv_start ({start}) positions, and no generation of "
            f"this plan holds more than {bound} (its longest prompt in bytes, max_tokens and "
            f"the draft width); set quantized_kv_start to at most {bound} (0 quantises from "
            "the first position)", str(path), line)
