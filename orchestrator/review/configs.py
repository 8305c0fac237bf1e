"""One config identity for every reader: the ingest's config key, and one label for it.

The store keys a run by its config as the agent ran it (``runs.config_key``: the lineup pair
and every knob — sampling settings, draft width, an http variant's fields); the series
around it (chip, model pair, workload, context bucket, runtime, background profile) and
the identity (tiers, versions, weights) fix the rest. Readers group runs by that key, so
temperature 0.0 and 0.7 at draft width 3 are two configs, each compared with the baseline
of its own sampling settings, never one "speculative k=3".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

from agent.protocol import KNOB_DEFAULTS, KNOBS

from ..errors import SpecfleetError

# what tells speculation apart from its baseline: not a sampling setting
NOT_SAMPLING = frozenset({n for n, k in KNOBS.items() if not k.sampling} | {"variant"})

T = TypeVar("T")


class MixedConfigs(SpecfleetError):
    """Runs grouped as one config differ in a knob: they must never be pooled."""


class ConfigId(NamedTuple):
    """A config within its series: mode, draft width, and the ingest's key (every knob)."""

    mode: str
    k: int
    key: str

    def order(self) -> tuple:
        return (self.mode != "baseline", self.k, self.key)


def canonical(config: dict | None) -> str:
    return json.dumps(config or {}, sort_keys=True, default=str)


def knobs_of_key(config_key: str | None) -> dict | None:
    """The config a stored ``config_key`` holds ("target+draft-2 {...}" or "{...}"), or
    None when it cannot be read back (an old or cut-short key)."""
    if not config_key or "{" not in config_key:
        return None
    try:
        out = json.loads(config_key[config_key.index("{"):])
    except ValueError:
        return None
    return out if isinstance(out, dict) else None


def sampling_key(config: dict | None) -> str:
    """What a config shares with its baseline: every knob but the draft width (and an http
    runtime's variant). A speculative run is compared with the baseline of this key."""
    return canonical({k: v for k, v in (config or {}).items() if k not in NOT_SAMPLING})


_PLAIN = re.compile(r"[A-Za-z0-9_.:/+@-]+")


def _variant_text(variant: object) -> str:
    """An http variant's name as a label shows it: plain where it could read as nothing
    else, else as JSON (quoted, its own letters kept): a name that reads as a knob or
    another name ("a · temperature 0.7"), one that reads as a number or a flag (the string
    "1" beside the number 1), an empty one (audits 43, 44)."""
    if isinstance(variant, str) and _PLAIN.fullmatch(variant):
        try:
            json.loads(variant)  # "1", "true", "null": the same text as a number or flag
        except ValueError:
            return variant
    return json.dumps(variant, ensure_ascii=False, default=str)


def knob_suffix(config: dict | None) -> str:
    """" · temperature 0.7" for each setting away from its default (none: ""), after an
    http runtime's variant (" · draft-a · temperature 0.7")."""
    variant = (config or {}).get("variant")
    parts = [] if variant is None else [_variant_text(variant)]
    for name, v in sorted((config or {}).items()):
        if name in NOT_SAMPLING or (name in KNOB_DEFAULTS and v == KNOB_DEFAULTS[name]):
            continue
        parts.append(f"{name} {v:g}" if isinstance(v, float) else f"{name} {v}")  # null: off
    return "".join(f" · {p}" for p in parts)


def config_label(mode: str, k: int, config: dict | None = None) -> str:
    """A config as every page names it: "baseline", "speculative k=3", an http runtime's
    variant after it, then each knob away from its default ("speculative k=3 · draft-a ·
    temperature 0.7"): two variants of one width were two configs with one name on every
    page (audit 27z)."""
    head = "baseline" if mode == "baseline" else f"speculative k={k}"
    return head + knob_suffix(config)


def group_configs(runs: Iterable[T], ident: Callable[[T], tuple[ConfigId, Any]]
                  ) -> dict[ConfigId, list[T]]:
    """Runs by config. ``ident(run)`` gives its ConfigId and everything the group must share
    (the full config, engine, pair, tiers …); a group whose runs differ in any of it raises
    ``MixedConfigs`` instead of pooling them (e.g. two long configs whose stored keys were
    cut to the same 255 characters)."""
    out: dict[ConfigId, list[T]] = {}
    seen: dict[ConfigId, Any] = {}
    for r in runs:
        cid, whole = ident(r)
        if cid in seen and seen[cid] != whole:
            raise MixedConfigs(f"{config_label(cid.mode, cid.k)}: runs stored under one config "
                               f"key differ ({seen[cid]!r} vs {whole!r}); they are not pooled")
        seen.setdefault(cid, whole)
        out.setdefault(cid, []).append(r)
    return out
