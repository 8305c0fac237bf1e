"""A job's http engine section, checked: its variants (named, the baseline first, each
method known), its api, its request-field knobs (agent.job's ``parse_job`` calls it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import protocol

KNOBS = tuple(protocol.KNOBS)
# a run is keyed by its config, the variant's name in it (runs.config_key, 255 characters)
VARIANT_NAME_MAX = 64


def check_engine(raw: dict, path: Path, _fail: Callable[[Path, str, str], Exception]) -> dict:
    """The job's ``engine`` section checked (an http runtime's variants, api, knobs), or {}
    for mlx-lm in process. ``_fail`` makes the error (job.py's, with the file's name)."""
    eng = raw.get("engine") or {}
    if not eng:
        return {}
    if eng.get("api", "completions") not in ("completions", "chat"):
        raise _fail(path, "engine.api", "engine.api: completions or chat")
    variants = eng.get("variants")
    if not isinstance(variants, list) or not variants or not all(
            isinstance(v, dict) and v.get("name") and v.get("base_url") for v in variants):
        raise _fail(path, "engine.variants",
                    "engine.variants: a list of {name, base_url, command?, speculative?, "
                    "fields?}")
    for v in variants:
        if not isinstance(v["name"], str) or len(v["name"]) > VARIANT_NAME_MAX:
            raise _fail(path, "engine.variants",
                        f"engine.variants: a variant's name is text of at most "
                        f"{VARIANT_NAME_MAX} characters (got {str(v['name'])[:40]!r}…, "
                        f"{len(str(v['name']))}): the store keys each run by its config")
    if variants[0].get("speculative") and any(not v.get("speculative") for v in variants):
        raise _fail(path, "engine.variants",
                    "engine.variants: list the baseline (non-speculative) variant first: "
                    "speculative variants are checked against its output")
    for v in variants:
        method = v.get("method", "draft-model")
        if method not in ("draft-model", *protocol.DRAFT_FREE_METHODS):
            raise _fail(path, "engine.variants",
                        f"engine.variants ({v['name']}).method: {method!r} is not one of "
                        f"draft-model, {', '.join(protocol.DRAFT_FREE_METHODS)}")
        if "method" in v and not v.get("speculative"):
            raise _fail(path, "engine.variants",
                        f"engine.variants ({v['name']}).method: only a speculative "
                        "variant has a method (set speculative: true)")
    if not isinstance(eng.get("interleave", False), bool):
        raise _fail(path, "engine.interleave",
                    "engine.interleave: true or false (true: every variant runs at "
                    "once, so baseline and candidate alternate per generation)")
    # runtime-specific request fields swept one at a time, e.g. llama-server's flat
    # "speculative.n_max" or mlx-serve's "enable_pld"
    fknobs = eng.get("knobs", {})
    if not isinstance(fknobs, dict) or not all(
            isinstance(v, list) and v and all(isinstance(x, (bool, int, float, str)) for x in v)
            for v in fknobs.values()):
        raise _fail(path, "engine.knobs",
                    "engine.knobs: a map of request field → non-empty list of values")
    clash = sorted(set(fknobs) & set(KNOBS))
    if clash:
        raise _fail(path, "engine.knobs",
                    f"engine.knobs: {', '.join(clash)} belong in the job's knobs")
    return eng
