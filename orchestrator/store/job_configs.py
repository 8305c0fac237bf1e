"""Which knob values a job measures, from the job the controller sent (the sweep's job).

The agent runs each knob value around the job's base config (``agent.loop.candidates``): a
baseline with speculation off (and the job's baseline overrides), a speculative variant at
the config's draft width or at one its http variant fixes. A generation whose config gives
a knob a value the job never gave it was not measured by this job: the ledger sets it aside
(it would add a measurement at a width or setting nobody asked for).

Judged knob by knob, not config by config: lenient where the agent's plan is richer than
the spec spells out (lineups, http request fields), strict on what the job fixes. A job the
ledger cannot read (none kept, a soak, an engine this controller does not know) judges
nothing here.
"""

from __future__ import annotations

from agent.engines import engine_for
from agent.protocol import DEFAULT_SWEEP, KNOB_DEFAULTS, KNOBS

Allowed = dict[str, list]  # knob -> the values the job gives it


def allowed_values(job: object) -> Allowed | None:
    """Each knob's values the job may run it at; None when the job cannot say."""
    if not isinstance(job, dict) or not job.get("models") or \
            job.get("mode", "sweep") != "sweep":
        return None
    try:
        spec = engine_for(job.get("engine"))
    except ValueError:
        return None
    base, baseline = job.get("base") or {}, job.get("baseline") or {}
    knobs = job.get("knobs", DEFAULT_SWEEP if spec.sweeps_draft_width else {})
    if not all(isinstance(d, dict) for d in (base, baseline, knobs)):
        return None
    out: Allowed = {}
    for k in KNOBS:
        values = knobs.get(k)
        out[k] = [base.get(k, KNOB_DEFAULTS[k]), *(values if isinstance(values, list) else []),
                  *([baseline[k]] if k in baseline else [])]
    out["num_draft_tokens"].append(0)  # a baseline runs with speculation off
    engine = job.get("engine")
    for v in (engine.get("variants") or []) if isinstance(engine, dict) else []:
        if isinstance(v, dict) and "num_draft_tokens" in v:  # an http variant's own width,
            try:  # as the agent reads it (agent/httpruntime.py: int(...))
                out["num_draft_tokens"].append(int(v["num_draft_tokens"]))
            except (TypeError, ValueError, OverflowError):
                return None  # a width the agent cannot read: its job fails, nothing to judge
    return out


def _said(values: list) -> str:
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return ", ".join(map(str, seen))


def config_problem(allowed: Allowed, e: dict) -> str | None:
    """Why generation ``e`` runs a setting its job never gave (None: every one it has).
    Ingest's hot path (once per generation): each value is looked up as it is, and a
    reason is worded only for the one that fails."""
    cfg = e.get("config")
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            values = allowed.get(k)
            if values is not None and v not in values:
                return _problem(f"config {k}", k, v, values)
    if "num_draft_tokens" in e:
        v = e["num_draft_tokens"]
        if v not in allowed["num_draft_tokens"]:
            return _problem("num_draft_tokens", "num_draft_tokens", v,
                            allowed["num_draft_tokens"])
    if isinstance(knob := e.get("knob"), str) and knob in allowed and "knob_value" in e:
        v = e["knob_value"]
        if v not in allowed[knob]:
            return _problem(f"knob_value of {knob}", knob, v, allowed[knob])
    return None


def _problem(where: str, k: str, v: object, values: list) -> str:
    return (f"not in the job: {where} {str(v)[:40]} is not a value the sweep's job "
            f"gives {k} ({_said(values)})")
