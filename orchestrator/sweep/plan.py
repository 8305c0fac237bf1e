"""Plan files (YAML) and their locks.

A plan says what to measure: pinned environment, model pair, workloads, the sweep
(base config, knobs, repetitions), gates and which nodes. ``specfleet plan lock``
freezes it into ``PLAN.lock.json``: exact wheels with sha256 per node platform, weight
fingerprints and prompt hashes. A sweep runs only from a lock, and a lock that no
longer matches its plan or files is refused with what changed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.fingerprint import VERIFY_MAX_AGE_S, manifest, model_files
from agent.protocol import MAX_ROLES, model_roles

from ..calibration import calibration_of
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
    "sweep": {"base": dict, "baseline": dict, "knobs": dict, "repetitions": int,
              "warmup_tokens": int, "seed": int, "cv_threshold": float,
              "contention_threshold": float,
              # stop repeating once the answer is known (tolerance, confidence,
              # min_repetitions); checked by the agent's parser at lock time
              "adaptive": dict},
    "gates": {"acceptance_floor": float, "min_speedup": float, "itl_p95_ceiling_ms": float,
              "swap_ceiling_bytes": int, "ttft_regression_limit": float},
    "nodes": {"limit": str, "labels": [str]},
    # soak instead of a sweep: back-to-back generations of one config, memory watched
    # (variant: which of an http engine's variants; it must be one the agent starts)
    "soak": {"duration_s": float, "num_draft_tokens": int, "max_tokens": int, "workload": str,
             "rss_growth_limit": float, "sample_every_s": float, "variant": str},
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
LOCK_SCHEMA = 1


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


def _tier(folder: Path) -> dict:
    """A model's quantisation tier, and where it came from when specfleet made it."""
    from agent.checks import quant_tier

    from ..tiers import TIER_FILE

    out: dict = {"tier": quant_tier(folder)}
    made = folder / TIER_FILE
    if made.is_file():
        record = json.loads(made.read_text())
        out.update({k: record.get(k) for k in ("source_fingerprint", "bits", "group_size",
                                                "mlx_lm")})
    return out


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


# -- platforms a lock resolves wheels for ------------------------------------------

def controller_platform() -> str:
    if sys.platform == "darwin":
        return f"macos-{platform.mac_ver()[0].split('.')[0]}-{platform.machine()}"
    libc, version = platform.libc_ver()
    return f"linux-{platform.machine()}-{libc}{version}"


def platform_node(desc: str, python: str) -> dict:
    """``macos-14-arm64`` / ``linux-x86_64-glibc2.36`` → the probe dict the resolver takes."""
    parts = desc.split("-")
    if parts[0] == "macos" and len(parts) == 3:
        return {"sys_platform": "darwin", "machine": parts[2], "python": python,
                "python_full": python, "libc": ["", ""], "mac_ver": f"{parts[1]}.0",
                "implementation": "cpython"}
    if parts[0] == "linux" and len(parts) == 3 and parts[2].startswith("glibc"):
        return {"sys_platform": "linux", "machine": parts[1], "python": python,
                "python_full": python, "libc": ["glibc", parts[2][5:]], "mac_ver": "",
                "implementation": "cpython"}
    raise ConfigError(f"environment.platforms: {desc!r} is not macos-MAJOR-ARCH or "
                      "linux-ARCH-glibcX.Y")


def platform_matches(desc: str, node: dict) -> bool:
    """Can a node with this probe run the wheels locked for ``desc``?"""
    want = platform_node(desc, node["python"])
    if want["sys_platform"] != node["sys_platform"] or want["machine"] != node["machine"]:
        return False
    if node["sys_platform"] == "darwin":
        return int(node["mac_ver"].split(".")[0] or 0) >= int(want["mac_ver"].split(".")[0])
    if node["libc"][0] != "glibc" or not re.fullmatch(r"\d+(\.\d+)*", node["libc"][1]):
        return False  # musl, or no version read: no glibc lock is known to run there
    have = tuple(int(x) for x in node["libc"][1].split("."))
    need = tuple(int(x) for x in want["libc"][1].split("."))
    return have >= need


def _floor(desc: str) -> tuple[int, ...]:
    """The OS floor a platform names: macOS major, or glibc version."""
    part = desc.split("-")[1] if desc.startswith("macos-") else desc.split("-")[2][5:]
    return tuple(int(x) for x in part.split("."))


def closest_platform(platforms, node: dict) -> str | None:
    """The locked platform a node takes: of those it can run, the one built for the same
    macOS major (or glibc), else the highest below its own; never the first that fits
    (a macOS 15 node given macOS 14 wheels when 15's are locked too)."""
    fits = [d for d in platforms if platform_matches(d, node)]
    return max(fits, key=_floor) if fits else None


# -- the lock ----------------------------------------------------------------------

def build_lock(plan: Plan, log=print) -> dict:
    """Resolve everything a sweep needs into one JSON document."""
    from ..fleet.wheelhouse import resolve
    from .jobspec import job_template, plan_workloads

    env = plan.section("environment")
    # An empty list means unmanaged: nodes bring their own Python, the agent checks pins.
    platforms = env["platforms"] if "platforms" in env else sorted(
        {"macos-14-arm64", controller_platform()})
    locked = {}
    for desc in platforms:
        lock = resolve(plan.packages, plan.python, platform_node(desc, plan.python), log)
        locked[desc] = {"env_id": lock.env_id, "platform_key": lock.platform_key,
                        "wheels": list(lock.wheels)}
    models: dict[str, Any] = {role: {"path": str(d), "manifest": manifest(d)}
                                         for role, d in plan.models.items()}
    if len(plan.lineup) > 1:
        models["lineup"] = [list(p) for p in plan.lineup]
    for m in (models[r] for r in plan.models):
        m["fingerprint"] = "sha256:" + hashlib.sha256(json.dumps(
            m["manifest"], sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        m["tier"] = _tier(Path(m["path"]))
        if calibration := calibration_of(Path(m["path"]), m["fingerprint"]):
            m["calibration"] = calibration  # a grown target: its series are marked as such
    w = plan.section("workloads")
    sources, buckets, workloads = plan_workloads(plan.path.parent, w)
    sweep = plan.section("sweep")
    # an http engine sweeps no draft width unless asked (each variant fixes its own)
    knobs = sweep.get("knobs") or ({} if plan.section("engine") else None)
    job = job_template(workloads, base=sweep.get("base"), knobs=knobs,
                       repetitions=sweep.get("repetitions", 1),
                       warmup_tokens=sweep.get("warmup_tokens", 16), seed=sweep.get("seed", 0),
                       pins={p.split("==")[0].split("[")[0].strip(): p.split("==")[1].strip()
                             for p in plan.packages}, quality=bool(w.get("quality")))
    job["baseline"] = sweep.get("baseline") or {}
    job["cv_threshold"] = sweep.get("cv_threshold", 0.10)
    job["contention_threshold"] = sweep.get("contention_threshold", 0.25)
    if sweep.get("adaptive") is not None:
        job["adaptive"] = sweep["adaptive"]
    job["python"] = plan.python  # managed envs are built for it; unmanaged nodes must run it
    job["verify_weights"] = plan.section("models").get("verify", "daily")
    if plan.section("engine"):
        job["engine"] = plan.section("engine")
    if plan.section("background"):
        job["background"] = plan.section("background")
    if plan.section("load"):
        job["load"] = plan.section("load")
    if plan.section("soak"):
        soak = plan.section("soak")
        names = [r["name"] for r in workloads]
        if soak.get("workload") is not None and soak["workload"] not in names:
            raise ConfigError(f"soak.workload: {soak['workload']!r} is not one of the plan's "
                              f"workloads ({', '.join(names)})", str(plan.path),
                              line_of(load_yaml(plan.path).get("soak"), "workload"))
        job["mode"], job["soak"] = "soak", soak
    if len(plan.lineup) > 1:
        job["lineup"] = [list(p) for p in plan.lineup]
    _agent_would_accept(job, plan.path)
    doc = {"lock_schema": LOCK_SCHEMA, "name": plan.name, "plan_path": str(plan.path.resolve()),
           "plan_sha256": plan.sha256, "plan": plan.raw,
           "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "python": plan.python, "packages": list(plan.packages), "platforms": locked,
           "models": {**models, "source": plan.section("models").get("source"),
                      "revision": plan.section("models").get("revision"),
                      "verify": job["verify_weights"]},
           "prompts": {r["name"]: r["prompt_sha256"] for r in workloads},
           "prompt_sources": {"use": sources, "context": list(buckets)},
           "job": job, "gates": plan.section("gates"), "nodes": plan.section("nodes")}
    doc["lock_id"] = lock_digest(doc)
    return doc


def lock_digest(doc: dict) -> str:
    """A lock's id: the sha256 of its own canonical content (all but the id and the time it
    was written), so any edit to the file shows."""
    return hashlib.sha256(json.dumps(
        {k: v for k, v in doc.items() if k not in ("created_at", "lock_id")},
        sort_keys=True).encode()).hexdigest()


def _agent_would_accept(job: dict, path: Path) -> None:
    """Check the job with the agent's own parser now, so a bad engine or soak section
    stops at `plan lock` with the plan's line instead of on every node at sweep time."""
    from agent.errors import JobFileError
    from agent.job import parse_job

    try:
        parse_job({**job, "job_id": "lock-check",
                   "models": {r: {"path": r} for p in job.get("lineup") or [["target", "draft"]]
                              for r in p}})
    except JobFileError as e:
        msg = str(e).split(": ", 1)[1]
        section = re.match(r"[a-z_]*", msg).group(0)  # type: ignore[union-attr]  # [a-z_]* always matches
        section = "sweep" if section in ("knobs", "base", "baseline", "cv_threshold",
                                         "contention_threshold", "adaptive") else section
        raise ConfigError(msg, str(path), line_of(load_yaml(path), section)) from None


def lock_path_for(plan_path: Path) -> Path:
    return plan_path.with_name(plan_path.name + ".lock.json") if plan_path.suffix not in (
        ".yml", ".yaml") else plan_path.with_suffix(".lock.json")


def write_lock(plan: Plan, log=print) -> Path:
    out = lock_path_for(plan.path)
    doc = build_lock(plan, log)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(out)
    return out


def load_lock(path: str | Path) -> dict:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError("lock file not found; create it with `specfleet plan lock PLAN`",
                          str(path)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid JSON at column {e.colno}: {e.msg}", str(path),
                          e.lineno) from None
    if doc.get("lock_schema") != LOCK_SCHEMA:
        raise ConfigError(f"lock schema {doc.get('lock_schema')!r} is not {LOCK_SCHEMA}; "
                          "re-lock the plan with this specfleet", str(path))
    return doc


def verify_lock(doc: dict, lock_file: Path) -> None:
    """Refuse a lock that was edited, or whose plan, weights or prompts changed since it
    was written."""
    changes = []
    if lock_digest(doc) != doc.get("lock_id"):
        changes.append("the lock file itself was edited after `plan lock` wrote it (its "
                       "content no longer hashes to its lock_id)")
    plan_path = Path(doc["plan_path"])
    if not plan_path.exists():
        changes.append(f"the plan {plan_path} is gone")
    elif hashlib.sha256(plan_path.read_bytes()).hexdigest() != doc["plan_sha256"]:
        try:
            now = load_plan(plan_path).raw
        except ConfigError as e:
            now = {"<invalid>": str(e)}
        keys = sorted(k for k in set(now) | set(doc["plan"]) if now.get(k) != doc["plan"].get(k))
        changes.append(f"the plan changed ({', '.join(keys) or 'comments/whitespace'})")
    for role in model_roles(doc["models"]):
        m = doc["models"][role]
        d = Path(m["path"])
        if not d.is_dir():
            changes.append(f"{role} model folder {d} is gone")
            continue
        now = {f["path"]: f for f in manifest(d)}
        was = {f["path"]: f for f in m["manifest"]}
        diff = sorted(p for p in set(now) | set(was) if now.get(p) != was.get(p))
        if diff:
            changes.append(f"{role} weights changed: {', '.join(diff)}")
    from .jobspec import load_workloads

    src = doc["prompt_sources"]
    try:
        now = {r["name"]: r["prompt_sha256"] for spec in src["use"]
               for r in load_workloads(spec, tuple(src["context"]))}
    except ConfigError as e:
        now = {}
        changes.append(f"prompt files no longer load ({e})")
    for name, sha in doc["prompts"].items():
        if name not in now:
            if now:
                changes.append(f"prompt {name} is gone")
        elif now[name] != sha:
            changes.append(f"prompt {name} changed")
    for name in sorted(set(now) - set(doc["prompts"])):
        changes.append(f"prompt {name} was added")
    for w in doc["job"]["workloads"]:  # the lock itself must not have been edited
        if hashlib.sha256(w["prompt"].encode()).hexdigest() != w["prompt_sha256"]:
            changes.append(f"the lock's copy of prompt {w['name']} was edited")
    if changes:
        raise ConfigError("the lock no longer matches: " + "; ".join(changes) +
                          ". Re-lock with `specfleet plan lock` and review the change.",
                          str(lock_file))
