"""Plan files (YAML): read and checked, every refusal naming its file and line.

A plan says what to measure: pinned environment, model pair, workloads, the sweep
(base config, knobs, repetitions), gates and which nodes. ``sweep.lock`` freezes it into
a lock; ``fleet.platforms`` says which node platforms a lock resolves wheels for.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.fingerprint import VERIFY_MAX_AGE_S, model_files
from agent.job import SOAK_FIELDS, job_field_types
from agent.protocol import MAX_ROLES, cv_threshold_problem

from ..errors import ConfigError
from ..yamlfile import line_of, load_yaml

# key → type, or a nested spec; lists are written [type]
SPEC = {
    "name": str,
    "environment": {"python": str, "packages": [str], "platforms": [str]},
    # verify: how often nodes re-hash weights they already hold (always, daily, never);
    # target and draft: a folder, or a list of folders (a lineup: every target with every
    # draft, e.g. one draft at 16, 8 and 4 bits)
    "models": {"target": "folders", "draft": "folders", "source": str, "revision": str,
               "verify": str},
    "workloads": {"use": [str], "context": [str], "max_tokens": int, "quality": bool},
    # the job's own fields, typed as the job declares them (agent/job.py); adaptive: stop
    # repeating once the answer is known; each checked by the agent's parser at lock time
    "sweep": job_field_types("base", "baseline", "knobs", "repetitions", "warmup_tokens",
                             "seed", "cv_threshold", "contention_threshold", "adaptive"),
    "gates": {"acceptance_floor": float, "min_speedup": float, "itl_p95_ceiling_ms": float,
              "swap_ceiling_bytes": int, "ttft_regression_limit": float},
    "nodes": {"limit": str, "labels": [str]},
    # soak instead of a sweep: back-to-back generations of one config, memory watched
    # (variant: which of an http engine's variants; it must be one the agent starts)
    "soak": SOAK_FIELDS,
    "engine": dict,  # a runtime behind an OpenAI-compatible API (see README); checked by the agent
    # a busy desktop: a bounded co-tenant load during measurement (memory_mb, cpu_workers,
    # disk_mb_s, name); checked by the agent's own parser at lock time
    "background": dict,
    # load levels after the sweep (concurrency, request_rate, arrivals, max_concurrency,
    # requests, workload, slo); http engines only; checked by the agent's parser at lock time
    "load": dict,
}
REQUIRED = {"environment": ("python", "packages"), "models": ("target", "draft")}
TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true/false",
              dict: "a mapping"}


# Where each part of the job a lock builds comes from in the plan (job key → plan keys):
# a refusal by the agent's own parser (``JobFileError.field``) is placed at its plan line.
JOB_FIELD_IN_PLAN: dict[str, tuple[str, ...]] = {
    **{k: ("sweep", k) for k in ("knobs", "base", "baseline", "repetitions", "warmup_tokens",
                                 "seed", "cv_threshold", "contention_threshold", "adaptive")},
    "verify_weights": ("models", "verify"), "python": ("environment", "python"),
    "pins": ("environment", "packages"), "lineup": ("models",), "models": ("models",),
    "workloads": ("workloads",), "quality_tasks": ("workloads", "quality"), "mode": ("soak",),
    **{k: (k,) for k in ("soak", "engine", "background", "load")},
}


def plan_keys(job_field: str | None) -> tuple[str, ...]:
    """The plan's key path for a field of the job built from it: "knobs.top_p" →
    ("sweep", "knobs", "top_p"); () when the plan has no place for it (the job's schema)."""
    if not job_field:
        return ()
    head, *rest = re.split(r"[.\[\]]+", job_field.rstrip("]"))
    place = JOB_FIELD_IN_PLAN.get(head)
    return (*place, *rest) if place else ()


def line_of_keys(data, keys: tuple[str, ...]) -> int | None:
    """The line of the deepest of ``keys`` the plan writes (a key left to its default is
    not written: then the line of the section that would hold it)."""
    line, node = line_of(data), data
    for k in keys:
        if not isinstance(node, dict) or k not in node:
            break
        line, node = line_of(node, k) or line, node[k]
    return line


def _check(data, spec: dict, path: Path, where: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'plan'}: expected a mapping", str(path), line_of(data))
    for key, value in data.items():
        here = f"{where}.{key}" if where else key
        if key not in spec:
            raise ConfigError(f"{where or 'plan'}: unknown key {key!r} (allowed: "
                              f"{', '.join(sorted(spec))})", str(path), line_of(data, key))
        want = spec[key]
        if isinstance(want, dict):
            _check(value, want, path, here)
        elif isinstance(want, list):
            if not isinstance(value, list) or not all(_is(v, want[0]) for v in value):
                raise ConfigError(f"{here}: expected a list of {TYPE_NAMES[want[0]]}s",
                                  str(path), line_of(data, key))
        elif want == "folders":
            if not (isinstance(value, str) or isinstance(value, list) and value
                    and all(isinstance(v, str) for v in value)):
                raise ConfigError(f"{here}: expected a folder or a list of folders, got "
                                  f"{type(value).__name__} {value!r}", str(path),
                                  line_of(data, key))
        elif not _is(value, want):
            raise ConfigError(f"{here}: expected {TYPE_NAMES[want]}, got "
                              f"{type(value).__name__} {value!r}", str(path), line_of(data, key))


def _is(value, typ) -> bool:
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


@dataclass(frozen=True)
class Plan:
    path: Path
    python: str
    packages: tuple[str, ...]
    models: dict[str, Path]  # by role: target, draft, then target-2, draft-2 … in a lineup
    raw: dict = field(default_factory=dict, compare=False)
    lineup: tuple[tuple[str, str], ...] = (("target", "draft"),)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    @property
    def name(self) -> str:
        return self.raw.get("name") or self.path.stem

    def section(self, key: str) -> dict:
        return self.raw.get(key) or {}


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    data = load_yaml(path)
    _check(data, SPEC, path, "")
    for section, keys in REQUIRED.items():
        if section not in data:
            raise ConfigError(f"plan: '{section}' ({', '.join(keys)}) is required", str(path),
                              line_of(data))
        for k in keys:
            if k not in data[section]:
                raise ConfigError(f"{section}.{k}: required", str(path),
                                  line_of(data, section))
    env = data["environment"]
    python = env["python"]
    if python.count(".") != 1:
        raise ConfigError(f"environment.python: expected MAJOR.MINOR such as '3.11', got "
                          f"{python!r}", str(path), line_of(env, "python"))
    if not env["packages"] or not all("==" in p for p in env["packages"]):
        raise ConfigError("environment.packages: exact pins like 'mlx-lm==0.32.2'", str(path),
                          line_of(env, "packages"))
    pair: dict[str, Path] = {}
    kinds: dict[str, list[str]] = {"target": [], "draft": []}
    for kind in ("target", "draft"):
        spec = data["models"][kind]
        for i, folder in enumerate([spec] if isinstance(spec, str) else spec):
            role = kind if i == 0 else f"{kind}-{i + 1}"
            p = _model_folder(path, data, kind, folder)
            if p in pair.values():
                raise ConfigError(f"models.{kind}: {p} is listed twice", str(path),
                                  line_of(data["models"], kind))
            pair[role] = p
            kinds[kind].append(role)
    if len(pair) > MAX_ROLES:
        raise ConfigError(f"models: at most {MAX_ROLES} folders in one plan", str(path),
                          line_of(data, "models"))
    lineup = tuple((t, d) for t in kinds["target"] for d in kinds["draft"])
    for t, d in lineup:
        _check_vocabularies(pair[t], pair[d], path, data)
    verify = data["models"].get("verify", "daily")
    if verify not in VERIFY_MAX_AGE_S:
        raise ConfigError(f"models.verify: {verify!r} is not one of "
                          f"{', '.join(VERIFY_MAX_AGE_S)}", str(path),
                          line_of(data["models"], "verify"))
    _check_knobs(data, path)
    # refused when the plan is read (as at lock, by the agent's parser), at its own line
    sweep = data.get("sweep") or {}
    if "cv_threshold" in sweep and (why := cv_threshold_problem(sweep["cv_threshold"])):
        raise ConfigError(why, str(path), line_of(sweep, "cv_threshold"))
    _check_group_size(pair, data, path)
    _check_kv_start(data, path)
    if len(lineup) > 1 and (data.get("engine") or data.get("soak")):
        raise ConfigError("models: a lineup (several targets or drafts) is swept in process; "
                          + ("an http engine's variants start their own models: declare one "
                             "variant per model" if data.get("engine") else
                             "a soak watches one config: name one draft"), str(path),
                          line_of(data, "models"))
    return Plan(path=path, python=python, packages=tuple(env["packages"]), models=pair,
                raw=json.loads(json.dumps(data)), lineup=lineup)


def _model_folder(path: Path, data: dict, kind: str, folder: str) -> Path:
    p = (path.parent / folder).resolve()
    where = line_of(data["models"], kind)
    if not p.is_dir():
        raise ConfigError(f"models.{kind}: {p} is not a folder", str(path), where)
    files = {f.name for f in model_files(p)}
    # a folder mlx-lm cannot load would lock fine and fail on every node at sweep time
    if not any(f.endswith(".safetensors") for f in files) or "config.json" not in files:
        missing = " and ".join(x for x, ok in (
            ("weights (*.safetensors)", any(f.endswith(".safetensors") for f in files)),
            ("config.json", "config.json" in files)) if not ok)
        raise ConfigError(f"models.{kind}: {p} has no {missing}; point it at an MLX model "
                          "folder (e.g. one written by mlx_lm.convert)", str(path), where)
    return p


def _check_vocabularies(target: Path, draft: Path, path: Path, data: dict) -> None:
    """A draft of another vocabulary is refused here, with what differs: at run time it
    is no error, only acceptance near zero."""
    from .vocab import differences, vocabulary

    t, d = vocabulary(target), vocabulary(draft)
    if t is None or d is None:
        return  # nothing comparable (no tokenizer.json): mlx-lm's own size check remains
    diff = differences(t, d)
    if diff:
        raise ConfigError(f"models.draft: {draft} does not share the target's vocabulary "
                          f"({'; '.join(diff)}); speculative decoding needs one vocabulary, "
                          "or nearly every drafted token is rejected: choose a draft of the "
                          "target's family", str(path), line_of(data["models"], "draft"))


def _head_dim(folder: Path) -> int | None:
    """The attention head size the KV cache's last axis has (None: not readable)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
        return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _check_group_size(pair: dict[str, Path], data: dict, path: Path) -> None:
    """A quantised KV cache is quantised in groups along the head axis: a group size that
    does not divide a model's head size fails every generation on the node (mlx's
    quantize), so it is refused here with its line."""
    sweep = data.get("sweep") or {}
    sections = [(s, sweep.get(s) or {}) for s in ("base", "knobs", "baseline")]
    def values(block: dict, name: str, default: Any = None) -> list:
        v = block.get(name, default)
        return v if isinstance(v, list) else [v]

    if all(v is None for _, b in sections for v in values(b, "kv_bits")):
        return
    for section, block in sections:
        for g in values(block, "kv_group_size", 64 if section == "base" else None):
            for role, folder in pair.items():
                dim = _head_dim(folder)
                if isinstance(g, int) and dim and dim % g:
                    line = line_of(block, "kv_group_size") if "kv_group_size" in block \
                        else line_of(sweep, "base" if "base" in sweep else "knobs")
                    raise ConfigError(
                        f"sweep.{section}.kv_group_size: {g} does not divide the {role}'s "
                        f"attention head size {dim} ({folder}): mlx cannot quantise its KV "
                        "cache in groups of that size; choose a divisor of it", str(path),
                        line)


def _check_kv_start(data: dict, path: Path) -> None:
    """kv_bits whose quantized_kv_start no generation reaches is refused (``kvstart``)."""
    from .jobspec import plan_workloads
    from .kvstart import check_kv_start

    sweep = data.get("sweep") or {}
    declared = [(sweep.get(s) or {}).get("kv_bits") for s in ("base", "baseline", "knobs")]
    if any(x is not None for v in declared for x in (v if isinstance(v, list) else [v])):
        check_kv_start(data, path, plan_workloads(path.parent, data.get("workloads") or {})[2])


def _check_knobs(data: dict, path: Path) -> None:
    """Every knob a plan sets (sweep.knobs, sweep.base, sweep.baseline) is one the registry
    knows, with valid values, and one the plan's engine can honour as the sweep runs it
    (``agent.engines``: each engine declares the knobs it honours)."""
    from agent.engines import engine_for
    from agent.protocol import KNOB_DEFAULTS, knob_problem

    sweep = data.get("sweep") or {}
    try:
        engine = engine_for(data.get("engine"))
    except ValueError as e:
        raise ConfigError(str(e), str(path), line_of(data.get("engine") or data, "type")
                          if isinstance(data.get("engine"), dict) else line_of(data, "engine")
                          ) from None
    for section in ("knobs", "base", "baseline"):
        block = sweep.get(section) or {}
        for k, raw in block.items():
            where, line = f"sweep.{section}.{k}", line_of(block, k)
            if section == "knobs" and not isinstance(raw, list):
                raise ConfigError(f"{where}: expected a list of values", str(path), line)
            values = raw if section == "knobs" else [raw]
            for v in values:
                problem = knob_problem(k, v)
                if problem:
                    raise ConfigError(f"{where}: {problem}", str(path), line)
            # a setting left at its default asks nothing of the engine
            why = engine.refusal(k) if section == "knobs" or any(
                v != KNOB_DEFAULTS[k] for v in values) else None
            if why:
                raise ConfigError(f"{where}: {why}", str(path), line)
    _check_inert(sweep, path)


def _check_inert(sweep: dict, path: Path) -> None:
    """Every config the sweep runs (one knob at a time around the base, and each one's
    baseline) applies every knob it declares: a knob whose own prerequisite is off there
    (top_p at temperature 0) is refused, unless the base sets it and the sweep varies that
    prerequisite (temperature [0, 0.7], or kv_bits [4, 8] around a base quantized_kv_start:
    it acts in those configs)."""
    from agent.protocol import inert_knobs

    base, baseline = sweep.get("base") or {}, sweep.get("baseline") or {}
    knobs = {k: v for k, v in (sweep.get("knobs") or {}).items() if isinstance(v, list)}
    runs = [(k, {**base, k: v}) for k, values in knobs.items() for v in values] or \
        [(None, dict(base))]
    for swept, cfg in runs:
        for part, block, config in (("base", base, cfg),
                                    ("baseline", baseline, {**cfg, **baseline})):
            for name, needs, why in inert_knobs(config):
                if needs == swept or (name != swept and needs in knobs):
                    continue
                if name == swept and part == "base":
                    raise ConfigError(f"sweep.knobs.{name}: {why}", str(path),
                                      line_of(sweep["knobs"], name))
                if name in block:
                    raise ConfigError(f"sweep.{part}.{name}: {why}", str(path),
                                      line_of(block, name))
