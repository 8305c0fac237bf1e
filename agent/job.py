"""The job spec (controller → agent), schema 1, parsed into frozen dataclasses."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from . import SCHEMA
from .errors import JobFileError

KNOBS = ("num_draft_tokens", "temperature", "top_k", "top_p", "min_p")
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    max_tokens: int
    prompt_sha256: str
    kind: str = "prose"
    context_bucket: str = "short"


@dataclass(frozen=True)
class ModelRef:
    path: str
    fingerprint: str | None = None


@dataclass(frozen=True)
class Job:
    job_id: str
    target: ModelRef
    draft: ModelRef
    workloads: tuple[Workload, ...]
    base: dict
    knobs: dict
    repetitions: int = 1
    warmup_tokens: int = 16
    decode_skip_tokens: int = 64
    seed: int = 0
    pins: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict, compare=False, repr=False)


def _fail(path: Path, msg: str) -> JobFileError:
    return JobFileError(f"{path}: {msg}")


def _require(d: dict, key: str, typ, path: Path, where: str):
    if key not in d:
        raise _fail(path, f"{where}: missing required key {key!r}")
    if not isinstance(d[key], typ) or isinstance(d[key], bool) and typ is not bool:
        raise _fail(path, f"{where}.{key}: expected {getattr(typ, '__name__', typ)}, "
                          f"got {type(d[key]).__name__}")
    return d[key]


def load_job(path: str | Path) -> Job:
    """Read and validate a job file; errors name the file (and line for JSON errors)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(path, f"cannot read job file: {e.strerror}") from e
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise JobFileError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    return parse_job(raw, path)


def parse_job(raw, path: Path = Path("<job>")) -> Job:
    if not isinstance(raw, dict):
        raise _fail(path, "a job must be a JSON object")
    schema = raw.get("schema")
    if schema != SCHEMA:
        raise _fail(path, f"unsupported job schema {schema!r}; this agent speaks schema {SCHEMA}")
    models = _require(raw, "models", dict, path, "job")
    refs = {}
    for role in ("target", "draft"):
        m = _require(models, role, dict, path, "models")
        refs[role] = ModelRef(_require(m, "path", str, path, f"models.{role}"),
                              m.get("fingerprint"))
    workloads = []
    for i, w in enumerate(_require(raw, "workloads", list, path, "job")):
        where = f"workloads[{i}]"
        if not isinstance(w, dict):
            raise _fail(path, f"{where}: expected an object")
        prompt = _require(w, "prompt", str, path, where)
        sha = hashlib.sha256(prompt.encode()).hexdigest()
        if w.get("prompt_sha256") not in (None, sha):
            raise _fail(path, f"{where}: prompt does not match its prompt_sha256")
        workloads.append(Workload(
            name=_require(w, "name", str, path, where), prompt=prompt,
            max_tokens=_require(w, "max_tokens", int, path, where), prompt_sha256=sha,
            kind=w.get("kind", "prose"), context_bucket=w.get("context_bucket", "short")))
    if not workloads:
        raise _fail(path, "job has no workloads")
    base = {**SAMPLING_DEFAULTS, "num_draft_tokens": 3, **raw.get("base", {})}
    knobs = raw.get("knobs", {"num_draft_tokens": [2, 3, 4, 6]})
    for k, values in knobs.items():
        if k not in KNOBS:
            raise _fail(path, f"knobs: unknown knob {k!r}; known: {', '.join(KNOBS)}")
        if not isinstance(values, list) or not values:
            raise _fail(path, f"knobs.{k}: expected a non-empty list")
    for k in base:
        if k not in KNOBS:
            raise _fail(path, f"base: unknown setting {k!r}; known: {', '.join(KNOBS)}")
    return Job(
        job_id=_require(raw, "job_id", str, path, "job"), target=refs["target"],
        draft=refs["draft"], workloads=tuple(workloads), base=base, knobs=knobs,
        repetitions=int(raw.get("repetitions", 1)), warmup_tokens=int(raw.get("warmup_tokens", 16)),
        decode_skip_tokens=int(raw.get("decode_skip_tokens", 64)), seed=int(raw.get("seed", 0)),
        pins=raw.get("pins", {}), raw=raw)
