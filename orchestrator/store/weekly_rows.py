"""What the weekly review and the history site read from the store, as typed rows: runs of
a window, the sweeps that failed, the plans behind sweeps, and nightly levels grouped by
the database. The judgement on them lives in ``review``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import String, case, cast, func, select

from agent.engines import DEFAULT_ENGINE

from .models import NodeOutcome, Plan, Run, Sweep

# a run's identity columns (``weekly.IDENTITY``): what must match for runs to be pooled
IDENTITY = ("env_id", "mlx_version", "mlx_lm_version", "os_build", "node", "prompt_sha256",
            "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant")
# a night's identity in ``level_rows`` (the node left out: a series pools a chip's nodes)
LEVEL_IDENTITY = ("env_id", "mlx_version", "mlx_lm_version", "os_build", "prompt_sha256",
                  "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant")


@dataclass(frozen=True)
class WeekRun:
    """One run (config summary) of a window, with its sweep's time and trigger. ``summary``
    is None when the per-repetition values were not asked for (medians only)."""

    run_id: int
    sweep_id: str
    at: datetime            # its sweep's creation (a naive time read as UTC)
    trigger: str | None
    node: str
    chip: str | None
    model_pair: str | None
    workload: str
    context_bucket: str | None
    mode: str
    num_draft_tokens: int
    engine: str | None
    background: str | None
    config_key: str
    summary: dict | None
    decode_tok_s_median: float | None
    acceptance_median: float | None
    unreliable: bool
    identity: dict           # IDENTITY's columns
    pair: str | None = None  # the lineup pair ("target+draft-2"); None: the plan's one pair


def week_runs(store, start: datetime | None, end: datetime | None, values: bool = True,
              sweep_id: str | None = None) -> list[WeekRun]:
    """Runs of sweeps created in [start, end) (a bound left None: none), or of the one sweep
    asked. ``values=False`` leaves out the per-repetition JSON (medians only: far cheaper
    over weeks of history)."""
    cols = [Run.id, Run.sweep_id, Run.node, Run.chip, Run.model_pair, Run.workload,
            Run.context_bucket, Run.mode, Run.num_draft_tokens, Run.engine, Run.background,
            Run.config_key, Run.decode_tok_s_median, Run.acceptance_median, Run.unreliable,
            Run.pair, *(getattr(Run, k) for k in IDENTITY if k != "node")]
    if values:
        cols.append(Run.summary)
    q = select(*cols, Sweep.created_at, Sweep.trigger).join(Sweep, Sweep.id == Run.sweep_id)
    if start is not None:
        q = q.where(Sweep.created_at >= start)
    if end is not None:
        q = q.where(Sweep.created_at < end)
    if sweep_id is not None:  # a sweep's runs by its id (the sweep page), never by its time
        q = q.where(Run.sweep_id == sweep_id)
    with store.engine.connect() as c:  # only the columns the review reads (not config)
        rows = c.execute(q).all()
    return [WeekRun(r.id, r.sweep_id, _aware(r.created_at), r.trigger, r.node, r.chip,
                    r.model_pair, r.workload, r.context_bucket, r.mode, r.num_draft_tokens,
                    r.engine, r.background, r.config_key,
                    (r.summary or {}) if values else None, r.decode_tok_s_median,
                    r.acceptance_median, r.unreliable, {k: getattr(r, k) for k in IDENTITY},
                    r.pair)
            for r in rows]


@dataclass(frozen=True)
class FailedSweep:
    """A sweep that did not finish ok, with a node that was not ok (None: no node row)."""

    sweep_id: str
    at: datetime
    status: str
    trigger: str | None
    plan: str | None
    node: str | None
    node_status: str | None
    detail: str | None


def failed_sweeps(store, start: datetime, end: datetime) -> list[FailedSweep]:
    """Sweeps created in [start, end) whose status is failed or partial, one row per node
    that was not ok, by time and node."""
    with store.engine.connect() as c:
        rows = c.execute(
            select(Sweep.id, Sweep.created_at, Sweep.status, Sweep.trigger, Plan.name,
                   NodeOutcome.node, NodeOutcome.status, NodeOutcome.detail)
            .outerjoin(Plan, Plan.id == Sweep.plan_id)
            .outerjoin(NodeOutcome, (NodeOutcome.sweep_id == Sweep.id)
                       & (NodeOutcome.status != "ok"))
            .where(Sweep.created_at >= start, Sweep.created_at < end,
                   Sweep.status.in_(("failed", "partial")))
            .order_by(Sweep.created_at, NodeOutcome.node)).all()
    return [FailedSweep(*r) for r in rows]


def sweep_plans(store, sweep_ids: list[str]) -> dict[str, tuple[str, dict]]:
    """{sweep: (its plan's name, its lock document)} for the sweeps that have a plan."""
    with store.engine.connect() as c:
        return {sid: (name, lock or {}) for sid, name, lock in c.execute(
            select(Sweep.id, Plan.name, Plan.lock).join(Plan, Plan.id == Sweep.plan_id)
            .where(Sweep.id.in_(sweep_ids)))}


def calibration_locks(store, start: datetime | None = None, end: datetime | None = None,
                      sweep_id: str | None = None) -> dict[str, dict]:
    """{sweep: its lock} for the sweeps (created in [start, end) when given) whose lock can
    mark a calibration target: only locks whose text names one are read and decoded (a
    year of sweeps shares a few locks)."""
    with store.engine.connect() as c:
        plans = dict(c.execute(select(Plan.id, Plan.lock).where(
            cast(Plan.lock, String).like('%"calibration"%'))).all())
        if not plans:
            return {}
        q = select(Sweep.id, Sweep.plan_id).where(Sweep.plan_id.in_(sorted(plans)))
        if start is not None:
            q = q.where(Sweep.created_at >= start)
        if end is not None:
            q = q.where(Sweep.created_at < end)
        if sweep_id is not None:
            q = q.where(Sweep.id == sweep_id)
        return {sid: plans[pid] or {} for sid, pid in c.execute(q)}


def sweep_times(store) -> dict[str, datetime]:
    """Every sweep's creation time, in UTC."""
    with store.engine.connect() as c:
        return {sid: _aware(at).astimezone(timezone.utc)
                for sid, at in c.execute(select(Sweep.id, Sweep.created_at))}


@dataclass(frozen=True)
class LevelRow:
    """One sweep's runs of one config in one series, summed by the database: the sum and
    count of the reliable runs' median decode tok/s, the count of all runs, and the highest
    value of each ``LEVEL_IDENTITY`` field among the reliable ones."""

    sweep_id: str
    series: tuple            # chip (or node), pair, workload, context bucket, engine
    lineup_pair: str | None  # Run.pair: which of a lineup's pairs (its target's role)
    mode: str
    num_draft_tokens: int
    config_key: str
    decode_sum: float | None
    reliable: int
    runs: int
    identity: tuple


def _series_columns() -> tuple:
    """A run's series key in SQL, as ``review.week_runs.load_runs`` builds it in Python."""
    pair = func.coalesce(Run.model_pair,
                         func.substr(Run.target_fingerprint, 8, 12, type_=String) + "/"
                         + func.substr(Run.draft_fingerprint, 8, 12, type_=String))
    # a busy node's runs (a background profile) are a series of their own
    engine = func.coalesce(Run.engine, DEFAULT_ENGINE) + func.coalesce(" · " + Run.background, "")
    return (func.coalesce(Run.chip, Run.node), pair, Run.workload,
            func.coalesce(Run.context_bucket, "short"), engine)


def level_rows(store, start: datetime, end: datetime, window: bool) -> list[LevelRow]:
    """``LevelRow`` per (sweep, series, config); ``window``: only sweeps created in
    [start, end) (by index), otherwise every sweep's."""
    reliable = Run.unreliable.is_(False) & Run.decode_tok_s_median.is_not(None)
    # Run.pair splits nothing further (the config key holds it): it names the run's target
    keys = (Run.sweep_id, *_series_columns(), Run.pair, Run.mode, Run.num_draft_tokens,
            Run.config_key)
    # grouped per sweep, not per night: no join and no date arithmetic in the scan (the
    # database reads the table once, in order); the caller merges the nights
    q = (select(*keys, func.sum(case((reliable, Run.decode_tok_s_median))),
                func.count(case((reliable, 1))), func.count(),
                *(func.max(case((reliable, getattr(Run, k)))) for k in LEVEL_IDENTITY))
         .group_by(*keys))
    if window:
        q = q.where(Run.sweep_id.in_(select(Sweep.id).where(Sweep.created_at >= start,
                                                            Sweep.created_at < end)))
    with store.engine.connect() as c:
        return [LevelRow(sid, (chip, p, workload, bucket, engine), lp, mode, k, ck, total, n_ok,
                         n, tuple(ident))
                for sid, chip, p, workload, bucket, engine, lp, mode, k, ck, total, n_ok, n,
                *ident in c.execute(q)]


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)
