"""The job spec (controller → agent), schema 1, parsed into frozen dataclasses.

Unknown keys are errors: a typo in a knob name must not silently fall back to a
default and measure the wrong thing.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from . import SCHEMA, protocol
from .engines import engine_for
from .errors import JobFileError
from .fingerprint import VERIFY_MAX_AGE_S
from .job_engine import check_engine

KNOBS = tuple(protocol.KNOBS)
SAMPLING_DEFAULTS = protocol.SAMPLING_DEFAULTS
BUCKETS = ("short", "medium", "long")
JOB_KEYS = {"schema", "job_id", "mode", "models", "pins", "workloads", "baseline", "base", "knobs",
            "repetitions", "warmup_tokens", "decode_skip_tokens", "seed", "telemetry_interval_s",
            "cv_threshold", "contention_threshold", "memory_bandwidth_gbs", "soak",
            "quality_tasks", "sweep_id", "engine", "verify_weights", "python", "lineup",
            "background", "load", "adaptive", "controller_pid"}
WORKLOAD_KEYS = {"name", "kind", "context_bucket", "prompt", "prompt_file", "prompt_sha256",
                 "max_tokens", "description", "tools"}
# a soak's settings and their types: the agent's parser and the plan's soak section read both
SOAK_FIELDS: dict[str, type] = {
    "duration_s": float, "num_draft_tokens": int, "max_tokens": int, "workload": str,
    "rss_growth_limit": float, "sample_every_s": float, "variant": str}
SOAK_KEYS = set(SOAK_FIELDS)


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    max_tokens: int
    prompt_sha256: str
    kind: str = "prose"
    context_bucket: str = "short"
    tools: tuple = ()  # OpenAI-style tool definitions, sent by the http engine's chat API

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind, "context_bucket": self.context_bucket,
               "prompt": self.prompt, "prompt_sha256": self.prompt_sha256,
               "max_tokens": self.max_tokens}
        return {**out, "tools": list(self.tools)} if self.tools else out


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
    baseline: dict = field(default_factory=dict)
    mode: str = "sweep"
    repetitions: int = 1
    warmup_tokens: int = 16
    decode_skip_tokens: int = 64
    seed: int = 0
    pins: dict = field(default_factory=dict)
    telemetry_interval_s: float = 0.5
    cv_threshold: float = 0.10
    contention_threshold: float = 0.25  # share of CPU other processes may take
    memory_bandwidth_gbs: float | None = None
    soak: dict = field(default_factory=dict)
    quality_tasks: tuple = ()
    engine: dict = field(default_factory=dict)
    verify_weights: str = "daily"  # how old a weight file's last full hash may be
    python: str | None = None  # MAJOR.MINOR the plan declares (environment.python)
    # every model by role ("target", "draft", "draft-2" …) and the (target, draft) pairs
    # the sweep measures; one pair unless the plan declares a lineup
    models: dict = field(default_factory=dict)
    lineup: tuple[tuple[str, str], ...] = (("target", "draft"),)
    background: dict = field(default_factory=dict)  # a co-tenant load during measurement
    load: dict = field(default_factory=dict)  # load levels after the sweep (http engines)
    adaptive: dict = field(default_factory=dict)  # stop repeating once the answer is known
    controller_pid: int | None = None  # the controller's process, when on this node
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    SCHEMA: ClassVar[int] = SCHEMA

    @classmethod
    def from_json(cls, doc: Any, path: Path = Path("<job>")) -> Job:
        """The job of a schema-1 document, every key checked (``JobFileError`` says which
        field is wrong, and why)."""
        return parse_job(doc, path)

    def to_json(self) -> dict:
        """The schema-1 document of this job: what the controller writes to a node, and
        what ``from_json`` reads back as an equal job. Sections left empty stay out."""
        models = self.models or {"target": self.target, "draft": self.draft}
        doc: dict[str, Any] = {
            "schema": self.SCHEMA, "job_id": self.job_id, "mode": self.mode,
            "models": {role: {"path": m.path, **({"fingerprint": m.fingerprint}
                                                 if m.fingerprint is not None else {})}
                       for role, m in models.items()},
            "workloads": [w.to_json() for w in self.workloads],
            "base": dict(self.base), "baseline": dict(self.baseline),
            "knobs": {k: list(v) for k, v in self.knobs.items()},
            "repetitions": self.repetitions, "warmup_tokens": self.warmup_tokens,
            "decode_skip_tokens": self.decode_skip_tokens, "seed": self.seed,
            "pins": dict(self.pins), "telemetry_interval_s": self.telemetry_interval_s,
            "cv_threshold": self.cv_threshold, "contention_threshold": self.contention_threshold,
            "verify_weights": self.verify_weights, "lineup": [list(p) for p in self.lineup]}
        optional = {"memory_bandwidth_gbs": self.memory_bandwidth_gbs, "python": self.python,
                    "soak": self.soak, "quality_tasks": list(self.quality_tasks),
                    "engine": self.engine, "background": self.background, "load": self.load,
                    "adaptive": self.adaptive, "controller_pid": self.controller_pid}
        return {**doc, **{k: v for k, v in optional.items() if v not in (None, {}, [])}}


def job_field_types(*names: str) -> dict[str, type]:
    """The types of the Job's fields ``names`` (a plan's sections are checked with them)."""
    import typing

    hints = typing.get_type_hints(Job)
    return {n: hints[n] for n in names}


def _fail(path: Path, field: str | None, msg: str) -> JobFileError:
    """The error for ``msg`` about the job's ``field`` (its key path, "knobs.top_p",
    "workloads[0].max_tokens"; None: the whole document), said with the file's name."""
    return JobFileError(f"{path}: {msg}", field=field, problem=msg)


def _require(d: dict, key: str, typ, path: Path, where: str):
    if key not in d:
        raise _fail(path, where, f"{where}: missing required key {key!r}")
    if not isinstance(d[key], typ) or isinstance(d[key], bool) and typ is not bool:
        raise _fail(path, f"{where}.{key}",
                    f"{where}.{key}: expected {getattr(typ, '__name__', typ)}, "
                    f"got {type(d[key]).__name__}")
    return d[key]


def _no_unknown(d: dict, allowed: set, path: Path, where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise _fail(path, where, f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")


def check_knob(name: str, value, path: Path, where: str) -> None:
    """Refuse values mlx-lm would reject or silently misread (rules: ``protocol.KNOBS``)."""
    problem = protocol.knob_problem(name, value)
    if problem:
        field = where if where.endswith(f".{name}") else f"{where}.{name}"
        raise _fail(path, field, f"{where}: {problem}")


def load_job(path: str | Path) -> Job:
    """Read and validate a job file; errors name the file (and line for JSON errors)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(path, None, f"cannot read job file: {e.strerror}") from e
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise JobFileError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e
    return parse_job(raw, path)


def _workload(w, i: int, path: Path) -> Workload:
    where = f"workloads[{i}]"
    if not isinstance(w, dict):
        raise _fail(path, where, f"{where}: expected an object")
    _no_unknown(w, WORKLOAD_KEYS, path, where)
    name = _require(w, "name", str, path, where)
    if "prompt_file" in w:
        pf = Path(_require(w, "prompt_file", str, path, where))
        try:
            prompt = pf.read_text(encoding="utf-8")
        except OSError as e:
            raise _fail(path, f"{where}.prompt_file",
                        f"{where} ({name}): prompt file {pf}: {e.strerror}") from None
    else:
        prompt = _require(w, "prompt", str, path, where)
    sha = hashlib.sha256(prompt.encode()).hexdigest()
    if w.get("prompt_sha256") not in (None, sha):
        raise _fail(path, f"{where}.prompt",
                    f"{where} ({name}): prompt sha256 is {sha}, the job expects "
                    f"{w['prompt_sha256']} (prompt file changed?)")
    bucket = w.get("context_bucket", "short")
    if bucket not in BUCKETS:
        raise _fail(path, f"{where}.context_bucket",
                    f"{where}.context_bucket: {bucket!r} is not one of {', '.join(BUCKETS)}")
    max_tokens = _require(w, "max_tokens", int, path, where)
    if max_tokens < 1:
        raise _fail(path, f"{where}.max_tokens", f"{where}.max_tokens: must be ≥ 1")
    tools = w.get("tools", [])
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str)
            for t in tools):
        raise _fail(path, f"{where}.tools", f"{where} ({name}).tools: must be a list of "
                          '{"type": "function", "function": {"name": ...}} objects')
    return Workload(name=name, prompt=prompt, max_tokens=max_tokens, prompt_sha256=sha,
                    kind=w.get("kind", "prose"), context_bucket=bucket, tools=tuple(tools))


def parse_job(raw, path: Path = Path("<job>")) -> Job:
    if not isinstance(raw, dict):
        raise _fail(path, None, "a job must be a JSON object")
    schema = raw.get("schema")
    if schema != SCHEMA:
        raise _fail(path, "schema",
                    f"unsupported job schema {schema!r}; this agent speaks schema {SCHEMA}")
    _no_unknown(raw, JOB_KEYS, path, "job")
    refs = _models(raw, path)
    lineup = _lineup(raw, refs, path)
    workloads = [_workload(w, i, path)
                 for i, w in enumerate(_require(raw, "workloads", list, path, "job"))]
    if not workloads:
        raise _fail(path, "workloads", "job has no workloads")
    names = [w.name for w in workloads]
    if len(set(names)) != len(names):
        raise _fail(path, "workloads", "workload names must be unique")
    base, baseline, knobs = _settings(raw, path)
    mode = raw.get("mode", "sweep")
    if mode not in ("sweep", "soak"):
        raise _fail(path, "mode", f"mode: {mode!r} is not one of sweep, soak")
    soak = raw.get("soak", {})
    _no_unknown(soak, SOAK_KEYS, path, "soak")
    if soak.get("workload") is not None and soak["workload"] not in names:
        raise _fail(path, "soak.workload",
                    f"soak.workload: {soak['workload']!r} is not one of the job's "
                    f"workloads ({', '.join(names)})")
    duration = soak.get("duration_s", 600)
    if not isinstance(duration, (int, float)) or duration <= 0:
        raise _fail(path, "soak.duration_s", "soak.duration_s: must be a number of seconds > 0")
    engine = check_engine(raw, path, _fail)
    if len(lineup) > 1 and (engine or mode == "soak"):
        raise _fail(path, "lineup",
                    "lineup: several models are measured in process, in a sweep; " + (
            "an http engine's variants start their own models: declare one variant per "
            "model" if engine else "a soak watches one config: choose one draft"))
    soak = _soak_target(soak, engine, path)
    verify = raw.get("verify_weights", "daily")
    if verify not in VERIFY_MAX_AGE_S:
        raise _fail(path, "verify_weights", f"verify_weights: {verify!r} is not one of "
                          f"{', '.join(VERIFY_MAX_AGE_S)}")
    reps = raw.get("repetitions", 1)
    if not isinstance(reps, int) or reps < 1:
        raise _fail(path, "repetitions", "repetitions: must be an integer ≥ 1")
    return Job(
        job_id=_require(raw, "job_id", str, path, "job"), target=refs["target"],
        draft=refs["draft"], workloads=tuple(workloads), base=base, knobs=knobs,
        baseline=baseline, mode=mode, repetitions=reps,
        warmup_tokens=int(raw.get("warmup_tokens", 16)),
        decode_skip_tokens=int(raw.get("decode_skip_tokens", 64)), seed=int(raw.get("seed", 0)),
        pins=raw.get("pins", {}), telemetry_interval_s=float(raw.get("telemetry_interval_s", 0.5)),
        cv_threshold=_share(raw, "cv_threshold", 0.10, path),
        contention_threshold=_share(raw, "contention_threshold", 0.25, path),
        memory_bandwidth_gbs=raw.get("memory_bandwidth_gbs"), soak=soak,
        quality_tasks=tuple(raw.get("quality_tasks", ())), engine=engine,
        verify_weights=verify, python=_python(raw, path), models=refs, lineup=lineup,
        background=_background(raw, path), load=_load(raw, engine, path),
        adaptive=_adaptive(raw, path), raw=raw,
        controller_pid=_require(raw, "controller_pid", int, path, "job")
        if "controller_pid" in raw else None)


def _models(raw: dict, path: Path) -> dict[str, ModelRef]:
    """The job's models by role: a target and a draft at least, each a path."""
    models = _require(raw, "models", dict, path, "job")
    refs = {}
    for role in ("target", "draft"):
        _require(models, role, dict, path, "models")
    if len(models) > protocol.MAX_ROLES:
        raise _fail(path, "models", f"models: at most {protocol.MAX_ROLES} models in one job")
    for role, m in models.items():
        if not re.fullmatch(protocol.MODEL_ROLE, role):
            raise _fail(path, f"models.{role}",
                        f"models: {role!r} is not a role (target, draft, draft-2 …)")
        if not isinstance(m, dict):
            raise _fail(path, f"models.{role}", f"models.{role}: expected an object")
        _no_unknown(m, {"path", "fingerprint", "source"}, path, f"models.{role}")
        refs[role] = ModelRef(_require(m, "path", str, path, f"models.{role}"),
                              m.get("fingerprint"))
    return refs


def _settings(raw: dict, path: Path) -> tuple[dict, dict, dict]:
    """(base, baseline, knobs): every setting known to the registry, valid, and one the
    job's engine honours."""
    base = {**SAMPLING_DEFAULTS, "num_draft_tokens": protocol.KNOBS["num_draft_tokens"].default,
            **raw.get("base", {})}
    baseline = raw.get("baseline", {})
    try:
        spec = engine_for(raw.get("engine"))
    except ValueError as e:
        raise _fail(path, "engine.type", str(e)) from None
    # an http job sweeps no draft width by default: each variant fixes its own
    knobs = raw.get("knobs", protocol.DEFAULT_SWEEP if spec.sweeps_draft_width else {})
    for where, d in (("base", base), ("baseline", baseline)):
        for k, v in d.items():
            if k not in KNOBS:
                raise _fail(path, f"{where}.{k}",
                            f"{where}: unknown setting {k!r}; known: {', '.join(KNOBS)}")
            check_knob(k, v, path, where)
            if v != protocol.KNOB_DEFAULTS[k] and (why := spec.refusal(k)):
                raise _fail(path, f"{where}.{k}", f"{where}.{k}: {why}")
    for k, values in knobs.items():
        if k not in KNOBS:
            raise _fail(path, f"knobs.{k}", f"knobs: unknown knob {k!r}; known: {', '.join(KNOBS)}")
        if not isinstance(values, list) or not values:
            raise _fail(path, f"knobs.{k}", f"knobs.{k}: expected a non-empty list")
        for v in values:
            check_knob(k, v, path, f"knobs.{k}")
        if why := spec.refusal(k):
            raise _fail(path, f"knobs.{k}", f"knobs.{k}: {why}")
    return protocol.normal_config(base), protocol.normal_config(baseline), knobs


def _adaptive(raw: dict, path: Path) -> dict:
    from .adaptive import check_adaptive

    spec = raw.get("adaptive")
    if spec is None:
        return {}
    problem = check_adaptive(spec, int(raw.get("repetitions", 1)))
    if problem:
        raise _fail(path, "adaptive", problem)
    return spec


def _load(raw: dict, engine: dict, path: Path) -> dict:
    from .load import check_load

    load = raw.get("load")
    if load is None:
        return {}
    problem = check_load(load, engine_for(engine).name)
    if not problem and engine_for(engine).in_process and \
            (raw.get("base") or {}).get("kv_bits") is not None:
        problem = ("load: mlx-lm's BatchGenerator cannot quantise the KV cache: a load ramp "
                   "runs the base config, so leave kv_bits out of base (sweep it instead)")
    names = [w.get("name") for w in raw.get("workloads") or [] if isinstance(w, dict)]
    if not problem and load.get("workload") is not None and load["workload"] not in names:
        problem = f"load.workload: {load['workload']!r} is not one of the job's workloads " \
                  f"({', '.join(map(str, names))})"
    if not problem and load.get("variants"):  # named as the engine names its variants
        if engine:
            known = [str(v.get("name")) for v in engine.get("variants") or []]
        else:
            targets = list(dict.fromkeys(p[0] for p in raw.get("lineup") or [["target"]]))
            known = ["autoregressive"] if len(targets) == 1 else [
                f"autoregressive@{t}" for t in targets]
        bad = [x for x in load["variants"] if x not in known]
        if bad:
            problem = f"load.variants: {', '.join(bad)} not among this job's variants " \
                      f"({', '.join(known)})"
    if problem:
        raise _fail(path, "load", problem)
    return load


def _background(raw: dict, path: Path) -> dict:
    from .cotenant import check_profile

    profile = raw.get("background")
    if profile is None:
        return {}
    problem = check_profile(profile)
    if problem:
        raise _fail(path, "background", problem)
    return profile


def _lineup(raw: dict, refs: dict, path: Path) -> tuple[tuple[str, str], ...]:
    """The (target, draft) pairs to measure: each names roles of the job's models, each
    once; every model is in some pair (a model nothing measures must not be pushed and
    fingerprinted for nothing)."""
    lineup = raw.get("lineup", [["target", "draft"]])
    if not isinstance(lineup, list) or not lineup or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(r, str) for r in p)
            for p in lineup):
        raise _fail(path, "lineup", "lineup: a non-empty list of [target role, draft role] pairs")
    pairs = [(t, d) for t, d in lineup]
    for t, d in pairs:
        for role, kind in ((t, "target"), (d, "draft")):
            if role not in refs or protocol.role_kind(role) != kind:
                raise _fail(path, "lineup",
                            f"lineup: {role!r} is not a {kind} role of the job's models "
                            f"({', '.join(sorted(refs))})")
    if len(set(pairs)) != len(pairs):
        raise _fail(path, "lineup", "lineup: a pair is listed twice")
    unused = sorted(set(refs) - {r for p in pairs for r in p})
    if unused:
        raise _fail(path, "lineup", f"lineup: no pair measures {', '.join(unused)}")
    return tuple(pairs)


def _python(raw: dict, path: Path) -> str | None:
    v = raw.get("python")
    if v is not None and (not isinstance(v, str) or v.count(".") != 1):
        raise _fail(path, "python", f"python: MAJOR.MINOR such as '3.11', got {v!r}")
    return v


def _share(raw: dict, key: str, default: float, path: Path) -> float:
    v = raw.get(key, default)
    if key == "cv_threshold":  # a spread, not a share: it may pass 100% (protocol says why)
        if (why := protocol.cv_threshold_problem(v)) is not None:
            raise _fail(path, key, why)
        return float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise _fail(path, key, f"{key}: a share of the machine's CPU in (0, 1], got {v!r}")
    return float(v)


def _soak_target(soak: dict, engine: dict, path: Path) -> dict:
    """What a soak runs must be unambiguous and watchable: in process, a draft width; over
    http, a variant the agent starts itself (its memory is what the soak watches). Returns
    the soak with an http variant resolved (the first speculative one unless named)."""
    if not soak:
        return soak
    if not engine:
        if "variant" in soak:
            raise _fail(path, "soak.variant",
                        "soak.variant: only for an http engine; in process, choose "
                        "soak.num_draft_tokens")
        return soak
    if "num_draft_tokens" in soak:
        raise _fail(path, "soak.num_draft_tokens",
                    "soak.num_draft_tokens: an http variant fixes its own draft width; "
                    "choose soak.variant")
    variants = {v["name"]: v for v in engine["variants"]}
    name = soak.get("variant") or next(
        (v["name"] for v in engine["variants"] if v.get("speculative")),
        engine["variants"][0]["name"])
    if name not in variants:
        raise _fail(path, "soak.variant",
                    f"soak.variant: {name!r} is not one of the engine's variants "
                    f"({', '.join(variants)})")
    if not variants[name].get("command"):
        raise _fail(path, "soak.variant",
                    f"soak.variant: {name!r} has no command: a soak watches the "
                    "runtime's memory, so the agent must start it")
    return {**soak, "variant": name}
