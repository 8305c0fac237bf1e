"""Building the versioned job spec the controller sends to an agent."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from agent import SCHEMA
from agent.fingerprint import fingerprint
from agent.protocol import DEFAULT_SWEEP, KNOBS, normal_config

from ..errors import ConfigError

PROMPTS = Path(__file__).resolve().parents[1] / "prompts"
TASKS = Path(__file__).resolve().parents[1] / "tasks" / "quality.jsonl"
DEFAULT_WORKLOADS = ("code", "memo", "translation")
BUCKETS = ("short", "medium", "long")
# every config carries the keyed knobs; the others only when set away from their default
DEFAULT_BASE = {name: knob.default for name, knob in KNOBS.items() if knob.keyed}


def _read_jsonl(path: Path, required: set[str]) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError("file not found", str(path)) from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"invalid JSON: {e.msg}", str(path), lineno) from None
        if not isinstance(rec, dict):
            raise ConfigError("each line must be a JSON object", str(path), lineno)
        missing = required - set(rec)
        if missing:
            raise ConfigError(f"record lacks {', '.join(sorted(missing))}", str(path), lineno)
        if "prompt" in rec:
            sha = hashlib.sha256(rec["prompt"].encode()).hexdigest()
            if rec.get("prompt_sha256", sha) != sha:
                raise ConfigError("prompt text does not match its prompt_sha256 (edited?)",
                                  str(path), lineno)
            rec = {**rec, "prompt_sha256": sha}
        out.append(rec)
    return out


def load_workloads(spec: str, buckets: tuple[str, ...] = ("short",)) -> list[dict]:
    """Prompts for one ``-w`` value: a shipped family (``code``: its records in the chosen
    context buckets), one shipped record (``code-long``), or a user's JSONL file (all of it).
    """
    needed = {"name", "prompt", "max_tokens"}
    path = Path(spec)
    if path.suffix == ".jsonl":
        return _read_jsonl(path, needed)
    family = PROMPTS / f"{spec.split('-')[0]}.jsonl"
    if not family.exists():
        known = ", ".join(sorted(p.stem for p in PROMPTS.glob("*.jsonl")))
        raise ConfigError(f"no workload {spec!r} (shipped: {known}; or give a .jsonl file)")
    records = _read_jsonl(family, needed)
    if spec == family.stem:
        chosen = [r for r in records if r.get("context_bucket", "short") in buckets]
    else:
        chosen = [r for r in records if r["name"] == spec]
    if not chosen:
        raise ConfigError(f"workload {spec!r} has nothing in context buckets "
                          f"{', '.join(buckets)}", str(family))
    return chosen


def load_quality_tasks(path: Path = TASKS) -> list[dict]:
    return _read_jsonl(path, {"id", "prompt", "max_tokens", "check"})


def collect_workloads(specs, buckets: tuple[str, ...],
                      max_tokens: int | None = None) -> list[dict]:
    """Every prompt of ``specs`` in ``buckets``, with ``max_tokens`` overriding when given."""
    ws = [w for spec in specs for w in load_workloads(spec, buckets)]
    return [{**w, "max_tokens": max_tokens} for w in ws] if max_tokens else ws


def plan_workloads(plan_dir: Path, w: dict) -> tuple[list[str], tuple[str, ...], list[dict]]:
    """A plan's ``workloads`` section read: (sources, context buckets, the prompts)."""
    buckets = tuple(w.get("context") or ("short",))
    sources = [str(plan_dir / spec) if spec.endswith(".jsonl") else spec
               for spec in (w.get("use") or DEFAULT_WORKLOADS)]
    return sources, buckets, collect_workloads(sources, buckets, w.get("max_tokens"))


def job_template(workloads: list[dict], *, base: dict | None = None,
                 knobs: dict | None = None, repetitions: int = 1, warmup_tokens: int = 16,
                 seed: int = 0, pins: dict | None = None, quality: bool = False) -> dict:
    """The part of a job that ad-hoc sweeps and plan locks share; callers add the rest."""
    job = {"schema": SCHEMA, "workloads": workloads,
           "base": normal_config({**DEFAULT_BASE, **(base or {})}),
           "knobs": dict(DEFAULT_SWEEP) if knobs is None else knobs,
           "repetitions": repetitions,
           "warmup_tokens": warmup_tokens, "decode_skip_tokens": 64, "seed": seed,
           "pins": pins or {}}
    if quality:
        job["quality_tasks"] = load_quality_tasks()
    return job


def build_job(models_dir: Path, workloads: list[str] | None = None, *,
              buckets: tuple[str, ...] = ("short",), max_tokens: int | None = None,
              repetitions: int = 1, draft_widths: list[int] | None = None,
              pins: dict | None = None, quality: bool = False,
              memory_bandwidth_gbs: float | None = None) -> dict:
    """A schema-1 job for the pair in ``models_dir`` (``target/`` and ``draft/``)."""
    bad = set(buckets) - set(BUCKETS)
    if bad:
        raise ConfigError(f"unknown context bucket {', '.join(sorted(bad))}; "
                          f"choose from {', '.join(BUCKETS)}")
    models = {}
    for role in ("target", "draft"):
        d = models_dir / role
        try:
            models[role] = {"path": str(d.resolve()), "fingerprint": fingerprint(d)}
        except FileNotFoundError as e:
            raise ConfigError(f"{e}; build the pair with `specfleet demo-models build "
                              f"{models_dir}`", str(d)) from None
    job = job_template(collect_workloads(workloads or DEFAULT_WORKLOADS, buckets, max_tokens),
                       knobs={"num_draft_tokens": draft_widths} if draft_widths else None,
                       repetitions=repetitions, pins=pins, quality=quality)
    job["job_id"] = uuid.uuid4().hex[:12]
    job["models"] = models
    if memory_bandwidth_gbs:
        job["memory_bandwidth_gbs"] = memory_bandwidth_gbs
    return job
