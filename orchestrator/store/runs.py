"""Sweeps, runs and measurements as readers get them: detached rows of the store's typed
tables (``models``), never a session or a query of the reader's own.

The listing, the sweep page, compare, repro, the exporters and the instrument read here;
the weekly review's bulk reads live in ``weekly_rows``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Event, Measurement, NodeOutcome, Plan, Run, Sweep, SweepNode

# the filters `specfleet compare` takes beside sweep, week and trigger: Run columns
RUN_FILTERS = ("node", "chip", "env_id", "mlx_version", "mlx_lm_version", "os_build",
               "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant",
               "prompt_sha256", "model_pair", "engine", "power_source")


@dataclass(frozen=True)
class SweepRow:
    """A sweep as `specfleet sweeps list` shows it, with each node's outcome."""

    sweep_id: str
    created_at: datetime
    status: str
    trigger: str | None
    plan_id: str | None
    nodes: dict[str, str]


def newest_sweeps(store, limit: int = 20) -> list[SweepRow]:
    """The ``limit`` newest sweeps, newest first."""
    with Session(store.engine) as s:
        rows = s.scalars(select(Sweep).order_by(Sweep.created_at.desc()).limit(limit)).all()
        ids = [r.id for r in rows]
        nodes: dict[str, dict[str, str]] = {i: {} for i in ids}
        for sid, node, status in s.execute(select(
                NodeOutcome.sweep_id, NodeOutcome.node, NodeOutcome.status).where(
                NodeOutcome.sweep_id.in_(ids)).order_by(NodeOutcome.node)):
            nodes[sid][node] = status
        return [SweepRow(r.id, r.created_at, r.status, r.trigger, r.plan_id, nodes[r.id])
                for r in rows]


def runs(store, sweep_id: str | None = None, node: str | None = None,
         workload: str | None = None, engine: str | None = None) -> list[Run]:
    """Config summaries (runs), filtered by whichever of the arguments are given."""
    q = select(Run).order_by(Run.sweep_id, Run.node, Run.workload, Run.mode,
                             Run.num_draft_tokens)
    for col, value in ((Run.sweep_id, sweep_id), (Run.node, node), (Run.workload, workload),
                       (Run.engine, engine)):
        if value:
            q = q.where(col == value)
    return _detached(store, q)


def detached(engine, model, key):
    """One row by primary key, detached from its session (readers keep it after)."""
    with Session(engine) as s:
        row = s.get(model, key)
        if row is not None:
            s.expunge(row)
        return row


def run(store, run_id: int) -> Run | None:
    return detached(store.engine, Run, run_id)


def run_measurements(store, r: Run) -> list[Measurement]:
    """The generations behind one run, in run order."""
    return _detached(store, select(Measurement).where(
        Measurement.sweep_id == r.sweep_id, Measurement.node == r.node,
        Measurement.workload == r.workload, Measurement.mode == r.mode,
        Measurement.num_draft_tokens == r.num_draft_tokens,
        Measurement.pair.is_(None) if r.pair is None else Measurement.pair == r.pair
    ).order_by(Measurement.run_index))


def sweep_measurements(store, sweep_id: str) -> list[Measurement]:
    """Every generation of a sweep, by node and run order."""
    return _detached(store, select(Measurement).where(Measurement.sweep_id == sweep_id)
                     .order_by(Measurement.node, Measurement.run_index))


def node_outcomes(store, sweep_id: str) -> list[NodeOutcome]:
    return _detached(store, select(NodeOutcome).where(NodeOutcome.sweep_id == sweep_id)
                     .order_by(NodeOutcome.node))


def sweep_runs(store, sweep_id: str) -> list[Run]:
    return _detached(store, select(Run).where(Run.sweep_id == sweep_id))


def node_identities(store, sweep_id: str) -> dict[str, dict]:
    """Each node's identity as the sweep recorded it ({} where none was)."""
    with store.engine.connect() as c:
        return {n: i or {} for n, i in c.execute(select(SweepNode.node, SweepNode.identity)
                                                  .where(SweepNode.sweep_id == sweep_id))}


def plan_lock(store, plan_id: str | None) -> dict | None:
    """The lock document of a plan (None without one)."""
    if not plan_id:
        return None
    with store.engine.connect() as c:
        return c.execute(select(Plan.lock).where(Plan.id == plan_id)).scalar()


def selected_runs(store, *, sweep: str | None = None, trigger: str | None = None,
                  since: datetime | None = None, until: datetime | None = None,
                  columns: dict[str, str] | None = None) -> list[tuple[Run, datetime]]:
    """Runs with their sweep's creation time: of ``sweep``, of sweeps started by
    ``trigger`` or created in [since, until), whose ``columns`` (``RUN_FILTERS``) equal
    the values given."""
    q = select(Run, Sweep.created_at).join(Sweep, Sweep.id == Run.sweep_id)
    if sweep is not None:
        q = q.where(Run.sweep_id == sweep)
    if trigger is not None:  # manual, nightly, repro, demo
        q = q.where(Sweep.trigger == trigger)
    if since is not None:
        q = q.where(Sweep.created_at >= since)
    if until is not None:
        q = q.where(Sweep.created_at < until)
    for key, value in (columns or {}).items():
        if key not in RUN_FILTERS:
            raise ValueError(f"{key!r} is not a run filter")
        q = q.where(getattr(Run, key) == value)
    with Session(store.engine) as s:
        got = [(r, at) for r, at in s.execute(q)]
        s.expunge_all()
    return got


def sweep_ids(store, ids: list[str] | None = None, since: datetime | None = None,
              until: datetime | None = None) -> list[str]:
    """Sweep ids (of ``ids``, created in [since, until)), oldest first."""
    q = select(Sweep.id)
    if ids:
        q = q.where(Sweep.id.in_(ids))
    # in UTC: SQLite keeps times as UTC text and compares text, so an offset a user gave
    # (--since 2026-11-24T03:00+02:00) would otherwise be read as 03:00 UTC
    if since is not None:
        q = q.where(Sweep.created_at >= _utc(since))
    if until is not None:
        q = q.where(Sweep.created_at < _utc(until))
    with store.engine.connect() as c:
        return [str(x) for x in c.execute(q.order_by(Sweep.created_at)).scalars()]


def measurements_with_payloads(store, sweep_id: str) -> list[tuple[Measurement, dict]]:
    """Each generation of a sweep with its stored event's payload, by node and run order."""
    with Session(store.engine) as s:
        rows = [(m, p) for m, p in s.execute(select(Measurement, Event.payload).join(
            Event, (Event.sweep_id == Measurement.sweep_id) & (Event.node == Measurement.node)
            & (Event.seq == Measurement.seq)).where(Measurement.sweep_id == sweep_id)
            .order_by(Measurement.node, Measurement.run_index))]
        s.expunge_all()
    return rows


def _utc(t: datetime) -> datetime:
    return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _detached(store, q) -> list:
    # the rows outlive their session: readers only read their columns
    with Session(store.engine) as s:
        rows = list(s.scalars(q))
        s.expunge_all()
    return rows
