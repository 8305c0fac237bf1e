"""Before measuring: pinned versions, model fingerprints, a pair that can speculate."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from .errors import EnvironmentMismatch, ModelLoadError, SpeculationUnsupported
from .fingerprint import cached_fingerprint
from .job import Job

TOKENIZER_SAMPLE = 'def f(x):\n    return {"a": [1, 2.5]}  # The quick brown fox, café. 東京'


def installed_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("mlx", "mlx-lm", "psutil"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def check_environment(job: Job, cache_file: Path) -> dict:
    """Refuse to measure on the wrong thing: version pins and model fingerprints."""
    versions = installed_versions()
    running = ".".join(platform.python_version_tuple()[:2])
    if job.python and job.python != running:
        raise EnvironmentMismatch(f"Python {running} runs the agent but the plan declares "
                                  f"{job.python} (environment.python)")
    for dist, want in job.pins.items():
        if versions.get(dist) != want:
            raise EnvironmentMismatch(
                f"{dist} {versions.get(dist)} is installed but the job pins {want}")
    prints, stats = {}, {}
    for role, ref in _refs(job):
        try:
            got, stats[role] = cached_fingerprint(ref.path, cache_file, job.verify_weights)
        except OSError as e:
            raise ModelLoadError(f"{role} model: {e}") from e
        if ref.fingerprint and got != ref.fingerprint:
            raise EnvironmentMismatch(
                f"{role} model at {ref.path} has fingerprint {got}, job expects {ref.fingerprint}")
        prints[role] = got
    return {"versions": versions, "fingerprints": prints, "fingerprint_cache": stats,
            "quantization": {role: quant_tier(Path(ref.path)) for role, ref in _refs(job)}}


def _refs(job: Job) -> list:
    """(role, ModelRef) of every model the job names: the pair, or the whole lineup."""
    return list(job.models.items()) or [("target", job.target), ("draft", job.draft)]


def quant_tier(folder: Path) -> str | None:
    """The tier a model folder's weights are stored at, as its config.json says (the
    ``quantization`` block mlx_lm.convert writes): "4-bit g64", or "unquantised". None when
    the folder has no readable config. Part of a result's identity: tiers never pool."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict) or "bits" not in q:
        return "unquantised"
    mode = q.get("mode")
    return f"{q['bits']}-bit g{q.get('group_size', '?')}" + (
        f" {mode}" if mode and mode != "affine" else "")


def load_models(job: Job) -> dict:
    """Every model of the job loaded once, role → (model, tokenizer); refuses a pair of the
    lineup that cannot speculate."""
    from mlx_lm import load

    loaded = {}
    for role, ref in _refs(job):
        try:
            loaded[role] = load(ref.path)
        except Exception as e:  # mlx-lm raises many types for a bad folder
            raise ModelLoadError(f"{role} model at {ref.path} does not load: "
                                 f"{type(e).__name__}: {e}") from e
    for role, (model, _) in loaded.items():  # type: ignore[misc]  # load() returns (model, tokenizer) unless asked for its config
        check_trimmable(model, role)
    for t, d in job.lineup:
        try:
            check_same_tokenizer(loaded[t][1], loaded[d][1])
        except SpeculationUnsupported as e:
            raise SpeculationUnsupported(f"{d} with {t}: {e}" if len(job.lineup) > 1
                                         else str(e)) from None
    return loaded


def load_pair(job: Job):
    """Load target and draft once; refuse pairs that cannot speculate."""
    loaded = load_models(job)
    (target, tokenizer), (draft, _) = loaded["target"], loaded["draft"]
    return target, draft, tokenizer


def check_same_tokenizer(target_tok, draft_tok) -> None:
    tv, dv = len(target_tok.get_vocab()), len(draft_tok.get_vocab())
    t_ids, d_ids = target_tok.encode(TOKENIZER_SAMPLE), draft_tok.encode(TOKENIZER_SAMPLE)
    if tv != dv or t_ids != d_ids:
        first = next((i for i, (a, b) in enumerate(zip(t_ids, d_ids)) if a != b),
                     min(len(t_ids), len(d_ids)))
        raise SpeculationUnsupported(
            f"the draft's tokenizer differs from the target's: vocab {dv} vs {tv}; sample ids "
            f"diverge at {first}: draft {d_ids[first:first + 5]} vs target "
            f"{t_ids[first:first + 5]}")


def check_trimmable(model, role: str) -> None:
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    cache = make_prompt_cache(model)
    if not can_trim_prompt_cache(cache):
        kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        raise SpeculationUnsupported(
            f"the {role} model's KV cache cannot be trimmed ({', '.join(kinds)}); mlx-lm "
            "cannot roll back rejected drafts for this architecture")
