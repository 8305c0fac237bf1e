"""Plan locks: ``specfleet plan lock`` freezes a plan into ``PLAN.lock.json`` (exact wheels
with sha256 per node platform, weight fingerprints, prompt hashes and the job every node
runs); a sweep runs only from a lock, and a lock that no longer matches its plan or files
is refused with what changed."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agent.fingerprint import manifest
from agent.protocol import model_roles

from ..calibration_record import CALIBRATION_FILE, calibration_check, draft_holds
from ..errors import ConfigError
from ..fleet.platforms import controller_platform, platform_node
from ..yamlfile import line_of, load_yaml
from .plan import Plan, line_of_keys, load_plan, plan_keys

LOCK_SCHEMA = 1


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
    _calibrations(plan, models)
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


def _calibrations(plan: Plan, models: dict) -> None:
    """Mark each calibration target with its record; refuse, at the plan's line for the
    folder, a record that does not hold for these weights or for the draft it is paired
    with: swept unmarked, an instrument's numbers could reach a policy as a real pair's."""
    for role, folder in plan.models.items():
        m = models[role]
        record, why = calibration_check(folder, m["fingerprint"])
        if record is None and why is None:
            continue
        kind = role.split("-")[0]
        where = (str(plan.path), line_of(load_yaml(plan.path).get("models"), kind))
        drafts = [d for t, d in plan.lineup if t == role]
        if why is None and drafts and record is not None and record.get(
                "draft_fingerprint") not in {models[d]["fingerprint"] for d in drafts}:
            # a lighter tier of its draft beside its own is a ladder rung; without its own
            # draft the known answer is nowhere in the sweep
            why = (f"it was grown from the draft {record.get('draft_fingerprint')}, but the "
                   f"plan pairs it only with {', '.join(str(plan.models[d]) for d in drafts)} "
                   f"({', '.join(models[d]['fingerprint'] for d in drafts)}): its known "
                   "answer holds only with its own draft")
        own = [d for d in drafts if models[d]["fingerprint"] == (record or {}).get(
            "draft_fingerprint")]
        if why is None and record is not None and own:
            why = draft_holds(record, plan.models[own[0]])
        if why is None and record is not None and kind == "draft":
            # its known answer is a target's (its logits are its draft's): as a draft it is
            # a real pair's draft whose series would go unmarked into the policy
            raise ConfigError(f"models.{role}: {folder} is a calibration target ("
                              f"{folder}/{CALIBRATION_FILE}); it has a known answer only as "
                              "a target: give it as models.target, with the draft it was "
                              f"grown from ({record.get('draft_fingerprint')}) as "
                              "models.draft", *where)
        if why is not None:
            raise ConfigError(f"models.{kind}: {folder}/{CALIBRATION_FILE} does not hold: "
                              f"{why}. Remake it with `specfleet models calibrate DRAFT OUT` "
                              "(and point the plan at OUT); if the folder is a real "
                              f"model's, not a calibration target, remove its "
                              f"{CALIBRATION_FILE}", *where)
        m["calibration"] = record  # a grown target: its series are marked as such


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
    except JobFileError as e:  # placed by its field, at the plan's line for it
        raise ConfigError(e.problem, str(path),
                          line_of_keys(load_yaml(path), plan_keys(e.field))) from None


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


def _record_differs(m: dict, folder: Path) -> str | None:
    """Why the lock's calibration mark of a model is not its folder's record now (the
    record file is outside the fingerprint, and lock_id is a hash anyone can recompute: an
    instrument unmarked in the lock would reach the policy as a real pair)."""
    path = folder / CALIBRATION_FILE
    try:
        now = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    except (OSError, ValueError):
        now = "unreadable"
    was = m.get("calibration")
    if was is None and now is not None:
        return (f"its folder holds {CALIBRATION_FILE}, but the lock does not mark it a "
                "calibration target (lock it again with `specfleet plan lock`)")
    if was is not None and now != was:
        return (f"the lock marks it a calibration target whose {CALIBRATION_FILE} is "
                f"{'gone' if now is None else 'not the one locked'} (lock it again)")
    return None


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
        if why := _record_differs(m, d):
            changes.append(f"{role}: {why}")
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
