"""The store's writes and the reads the controller makes while it writes: sweeps, node
states and leases, and ingest (events, measurements, runs) exactly once per line.

Opening a store is ``opening.open_store``; migrations are ``migrate``; how an event maps
to rows is ``rows`` (their names are re-exported here, where callers first found them)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from agent.protocol import model_roles, role_kind

from .bulk import Collided, bulk
from .coverage import NOT_ASIDE, kept_line_sha256
from .ledger import admit
from .migrate import (  # noqa: F401  (re-exported)
    alembic_config,
    downgrade,
    downgrade_losses,
    script_head,
    upgrade,
)
from .models import (
    Environment,
    Event,
    Measurement,
    ModelRecord,
    NodeFacts,
    NodeLease,
    NodeOutcome,
    Plan,
    ProvisionRun,
    QuarantinedEvent,
    Run,
    Sweep,
    SweepNode,
)
from .rows import (  # noqa: F401  (re-exported)
    EVENT_COLUMNS,
    MEASUREMENT_COLUMNS,
    MEASUREMENT_TABLE_COLUMNS,
    config_key,
    e2e_ms,
    measured_at,
    measurement_row,
    measurement_tuple,
    result_pair,
    run_row,
)

DEFAULT_URL = "sqlite:///specfleet.db"


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("SPECFLEET_DB") or DEFAULT_URL


class Store:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._jobs: dict[str, object] = {}  # sweep → its job, once read (ledger.admit)
        self._insert = (postgresql.insert if engine.dialect.name == "postgresql"
                        else sqlite.insert)

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as c:
            return MigrationContext.configure(c).get_current_revision()

    def create_sweep(self, sweep_id: str, job: dict, inventory: str | None, *,
                     plan_id: str | None = None, trigger: str = "manual",
                     controller: str | None = None, created_at: datetime | None = None) -> None:
        """``created_at``: the controller's clock, unless a sweep is replayed (tests plant
        nights past) or imported with the date it ran."""
        with self.engine.begin() as c:
            c.execute(insert(Sweep).values(
                id=sweep_id, created_at=created_at or datetime.now(timezone.utc),
                status="running",
                inventory=inventory, job=job, plan_id=plan_id, trigger=trigger,
                controller=controller,
                target_fingerprint=job["models"]["target"].get("fingerprint"),
                draft_fingerprint=job["models"]["draft"].get("fingerprint")))

    def record_failed_start(self, sweep_id: str, reason: str, *, trigger: str,
                            plan_id: str | None = None, controller: str | None = None) -> None:
        """A sweep that stopped before any node was contacted (lock refused, no hosts):
        stored as failed with its reason, so the weekly review shows the night it missed."""
        now = datetime.now(timezone.utc)
        with self.engine.begin() as c:
            c.execute(insert(Sweep).values(
                id=sweep_id, created_at=now, finished_at=now, status="failed", inventory=None,
                job={}, plan_id=None, trigger=trigger, controller=controller))
            c.execute(insert(NodeOutcome).values(sweep_id=sweep_id, node="(controller)",
                                                 status="failed", detail=reason))

    def sweep(self, sweep_id: str) -> Sweep | None:
        from .runs import detached

        return detached(self.engine, Sweep, sweep_id)

    def last_seq(self, sweep_id: str, node: str) -> int:
        with self.engine.connect() as c:
            return c.execute(select(func.max(Event.seq)).where(
                Event.sweep_id == sweep_id, Event.node == node)).scalar() or 0

    def last_event(self, sweep_id: str, node: str) -> dict | None:
        with self.engine.connect() as c:
            return c.execute(select(Event.payload).where(
                Event.sweep_id == sweep_id, Event.node == node).order_by(Event.seq.desc())
                .limit(1)).scalar()

    def agent_started_at(self, sweep_id: str, node: str) -> float | None:
        """When the node's agent said it started (its last job_started: a --resume starts
        a new process), in the node's clock; None before it did."""
        with self.engine.connect() as c:
            return c.execute(select(Event.ts).where(
                Event.sweep_id == sweep_id, Event.node == node, Event.type == "job_started")
                .order_by(Event.seq.desc()).limit(1)).scalar()

    def set_sweep_node(self, sweep_id: str, node: str, **fields) -> None:
        now = datetime.now(timezone.utc)
        with self.engine.begin() as c:
            stmt = self._insert(SweepNode).values(sweep_id=sweep_id, node=node,
                                                  state=fields.pop("state", "launching"),
                                                  updated_at=now, **fields)
            c.execute(stmt.on_conflict_do_update(
                index_elements=["sweep_id", "node"],
                set_={**{k: stmt.excluded[k] for k in fields}, "state": stmt.excluded.state,
                      "updated_at": now}))

    def sweep_nodes(self, sweep_id: str) -> list[SweepNode]:
        with Session(self.engine) as s:
            rows = list(s.scalars(select(SweepNode).where(SweepNode.sweep_id == sweep_id)
                                  .order_by(SweepNode.node)))
            s.expunge_all()
            return rows

    # -- leases: several controllers, one PostgreSQL ---------------------------------

    def acquire_lease(self, node: str, holder: str, sweep_id: str, ttl_s: float) -> dict:
        """Take or renew the node's lease; returns the lease as it now stands.

        Succeeds when the node is free, the old lease expired, or it is ours (same holder,
        or the same sweep being re-attached). One statement, so two controllers racing
        for a node cannot both win.
        """
        now = datetime.now(timezone.utc)
        until = now + timedelta(seconds=ttl_s)
        stmt = self._insert(NodeLease).values(node=node, holder=holder, sweep_id=sweep_id,
                                              acquired_at=now, expires_at=until)
        t = NodeLease.__table__
        stmt = stmt.on_conflict_do_update(
            index_elements=["node"],
            set_={"holder": holder, "sweep_id": sweep_id, "expires_at": until,
                  "acquired_at": now},
            where=(t.c.expires_at < now) | (t.c.holder == holder) | (t.c.sweep_id == sweep_id))
        with self.engine.begin() as c:
            c.execute(stmt)
            row = c.execute(select(NodeLease).where(NodeLease.node == node)).one()
        return {"node": row.node, "holder": row.holder, "sweep_id": row.sweep_id,
                "expires_at": row.expires_at, "ours": row.holder == holder}

    def take_lease(self, node: str, old_holder: str, holder: str, sweep_id: str,
                   ttl_s: float) -> bool:
        """Take the lease from ``old_holder`` (a controller known to be gone); False when
        someone else took it first."""
        now = datetime.now(timezone.utc)
        with self.engine.begin() as c:
            res = c.execute(update(NodeLease).where(
                NodeLease.node == node, NodeLease.holder == old_holder).values(
                holder=holder, sweep_id=sweep_id, acquired_at=now,
                expires_at=now + timedelta(seconds=ttl_s)))
            return res.rowcount == 1

    def release_lease(self, node: str, holder: str) -> None:
        with self.engine.begin() as c:
            c.execute(delete(NodeLease).where(NodeLease.node == node,
                                              NodeLease.holder == holder))

    def finish_sweep(self, sweep_id: str, outcomes: dict[str, tuple[str, str | None]],
                     pending: tuple[str, ...] = ()) -> str:
        """Record the nodes' outcomes; the sweep's status follows, unless ``pending`` nodes
        (left out of an --attach or --resume) have yet to finish: it stays running."""
        with self.engine.begin() as c:
            for node, (st, detail) in outcomes.items():
                stmt = self._insert(NodeOutcome).values(sweep_id=sweep_id, node=node, status=st,
                                                        detail=detail)
                c.execute(stmt.on_conflict_do_update(
                    index_elements=["sweep_id", "node"],
                    set_={"status": st, "detail": detail}))
            statuses = set(c.execute(select(NodeOutcome.status).where(
                NodeOutcome.sweep_id == sweep_id)).scalars())
        # a node ended with --stop was stopped on purpose: the sweep is "stopped", not failed;
        # one that never started because another job held the node is "busy" (nothing ran)
        # and one whose every node's runs were all set aside has no reliable result (a node
        # among others that did is shown on its own line; the sweep itself went fine)
        if statuses == {"unreliable"}:
            status = "unreliable"
        else:
            statuses = {"ok" if s == "unreliable" else s for s in statuses}
            status = ("ok" if statuses == {"ok"} else "stopped" if statuses - {"ok"} == {
                "stopped"} else "busy" if statuses == {"busy"}
                else "failed" if "ok" not in statuses else "partial")
        if pending:
            return "running"
        with self.engine.begin() as c:
            c.execute(update(Sweep).where(Sweep.id == sweep_id).values(
                status=status, finished_at=datetime.now(timezone.utc)))
        return status

    def ingest(self, sweep_id: str, node: str, events: list[dict],
               raw: list[str] | None = None, refused: list | None = None,
               open_end: bool = False, twice: frozenset[int] = frozenset(),
               nth: list[tuple[int, bool]] | None = None) -> int:
        """Store events (and their measurements, telemetry, runs) once; returns how many
        events were new. ``raw`` are the journal lines the events were parsed from: stored
        as they are, they need not be serialised again (ingest is the hot path).

        Append-only (``ledger.admit``): a line that conflicts with what is stored, measures
        a run again or outside the plan, or ends the job with counts the journal does not
        hold is set aside with its reason, in the same transaction; the newly set-aside
        ones are appended to ``refused``. ``open_end``: the node's agent may still be
        writing; ``twice``: seqs the follower's read holds more than one line of; ``nth``:
        each line's occurrence of its content in the read (see ``ledger.admit``)."""
        if not events:
            return 0
        payloads = raw or [json.dumps(e, separators=(",", ":")) for e in events]
        had = None if refused is None else len(refused)
        try:  # rows the ledger admitted are new: written with no savepoint to fall back to
            return self._ingest(sweep_id, node, events, payloads, refused, open_end, twice,
                                nth, True)
        except Collided:  # another writer stored some meanwhile: all undone, again with one
            if refused is not None and had is not None:
                del refused[had:]
            return self._ingest(sweep_id, node, events, payloads, refused, open_end, twice,
                                nth, False)

    def _ingest(self, sweep_id, node, events, payloads, refused, open_end, twice, nth,
                fresh: bool) -> int:
        with self.engine.begin() as c:
            events, payloads, out = admit(c, sweep_id, node, events, payloads, open_end, twice,
                                         nth, self._jobs)
            if out:
                kept = self._quarantine(c, sweep_id, node, out)
                if refused is not None:
                    refused.extend(kept)
                if {getattr(r, "moved", None) for r in out} & {"config_summary",
                                                               "environment_checked"}:
                    self._rederive_runs(c, sweep_id, node)  # what they fed goes with them
            rows = [(sweep_id, node, e["seq"], e["type"], e["ts"], p)
                    for e, p in zip(events, payloads, strict=True)]
            gens = [e for e in events if e["type"] == "generation"]
            new = bulk(c, "events", EVENT_COLUMNS, rows, fresh) if rows else 0
            for e in events:
                if e["type"] == "environment_checked":
                    self._set_identity(c, sweep_id, node, e)
            if gens:  # their telemetry is read through the telemetry_samples view
                bulk(c, "measurements", MEASUREMENT_TABLE_COLUMNS,
                     [measurement_tuple(sweep_id, node, e) for e in gens], fresh)
            summaries = [e for e in events if e["type"] == "config_summary"]
            if summaries:
                identity = self._identity(c, sweep_id, node)
                c.execute(self._insert(Run).on_conflict_do_nothing(),
                          [run_row(sweep_id, node, e, identity) for e in summaries])
        return new

    def quarantine(self, sweep_id: str, node: str, items: list) -> int:
        """Keep lines the decode boundary set aside (``decode.Quarantined``), once per
        occurrence (identical lines are kept as often as the journal has them; the same
        occurrence read again is kept once); returns how many were new."""
        with self.engine.begin() as c:
            return len(self._quarantine(c, sweep_id, node, items))

    def _quarantine(self, c, sweep_id: str, node: str, items: list) -> list:
        """Insert set-aside lines; returns the ones that were not kept already."""
        now = datetime.now(timezone.utc)
        new = []
        for q in items:  # rare: one statement per line, to know what is new
            # a line with bytes that were not UTF-8 arrives with them escaped: kept replaced,
            # hashed as the journal holds them (as `sweeps verify` hashes it on the node)
            line = q.line.encode("utf-8", "replace")
            digest = kept_line_sha256(q.line)
            reason = q.reason.encode("utf-8", "replace").decode()
            row = {"sweep_id": sweep_id, "node": node, "seq": q.seq,
                   "reason": reason.replace("\x00", "\ufffd"),
                   "line": line.decode("utf-8", "replace")[:65536].replace("\x00", "\ufffd"),
                   "line_sha256": digest, "occurrence": getattr(q, "occurrence", 1),
                   "received_at": now}
            if c.execute(self._insert(QuarantinedEvent).values(**row).on_conflict_do_nothing()
                         .returning(QuarantinedEvent.id)).all():
                new.append(q)
        return new

    def quarantined_count(self, sweep_id: str, node: str) -> int:
        with self.engine.connect() as c:
            return c.execute(select(func.count()).select_from(QuarantinedEvent).where(
                QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
                *[~QuarantinedEvent.reason.startswith(p) for p in NOT_ASIDE])).scalar() or 0

    def set_aside_generations(self, sweep_id: str, node: str) -> tuple[int, int, list[str]]:
        """(generations measured, how many were set aside as unreliable, their reasons by
        how often, most frequent first)."""
        from collections import Counter

        with self.engine.connect() as c:
            rows = c.execute(select(Measurement.unreliable, Measurement.unreliable_reasons)
                             .where(Measurement.sweep_id == sweep_id,
                                    Measurement.node == node)).all()
        why = Counter(r for bad, reasons in rows if bad for r in (reasons or []))
        return len(rows), sum(bool(bad) for bad, _ in rows), [r for r, _ in why.most_common()]

    def missing_seqs(self, sweep_id: str, node: str) -> tuple[list[tuple[int, int]], int]:
        """Ranges of journal sequence numbers below the last one that are neither stored
        nor set aside with that number, and how many lines were set aside with no readable
        number (they may be some of those)."""
        with self.engine.connect() as c:
            unnumbered = c.execute(select(func.count()).select_from(QuarantinedEvent).where(
                QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
                QuarantinedEvent.seq.is_(None))).scalar() or 0
            have = set(c.execute(select(Event.seq).where(
                Event.sweep_id == sweep_id, Event.node == node)).scalars())
            have |= {n for n in c.execute(select(QuarantinedEvent.seq).where(
                QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
                QuarantinedEvent.seq.is_not(None))).scalars() if n is not None}
        gaps: list[tuple[int, int]] = []
        for n in range(1, max(have, default=0)):
            if n not in have:
                if gaps and gaps[-1][1] == n - 1:
                    gaps[-1] = (gaps[-1][0], n)
                else:
                    gaps.append((n, n))
        return gaps, unnumbered

    def quarantined(self, sweep_id: str, node: str | None = None) -> list[QuarantinedEvent]:
        with Session(self.engine) as s:
            q = select(QuarantinedEvent).where(QuarantinedEvent.sweep_id == sweep_id)
            if node is not None:
                q = q.where(QuarantinedEvent.node == node)
            rows = list(s.scalars(q.order_by(QuarantinedEvent.id)))
            s.expunge_all()
            return rows

    def _set_identity(self, c, sweep_id: str, node: str, e: dict) -> None:
        facts = c.execute(select(NodeFacts.facts).where(NodeFacts.node == node)
                          .order_by(NodeFacts.collected_at.desc()).limit(1)).scalar()
        sweep_env = c.execute(select(SweepNode.identity).where(
            SweepNode.sweep_id == sweep_id, SweepNode.node == node)).scalar() or {}
        identity = {**sweep_env, "mlx_version": e["versions"].get("mlx"),
                    "mlx_lm_version": e["versions"].get("mlx-lm"),
                    "target_fingerprint": e["fingerprints"]["target"],
                    "draft_fingerprint": e["fingerprints"]["draft"],
                    "os_build": (facts or {}).get("os_build"),
                    "chip": (facts or {}).get("chip"),
                    "target_quant": (e.get("quantization") or {}).get("target"),
                    "draft_quant": (e.get("quantization") or {}).get("draft")}
        if len(e["fingerprints"]) > 2:  # a lineup: each result names its pair's roles
            quant = e.get("quantization") or {}
            identity["roles"] = {r: {"fingerprint": fp, "quant": quant.get(r)}
                                 for r, fp in e["fingerprints"].items()}
        now = datetime.now(timezone.utc)
        stmt = self._insert(SweepNode).values(sweep_id=sweep_id, node=node, state="running",
                                              identity=identity, updated_at=now)
        c.execute(stmt.on_conflict_do_update(index_elements=["sweep_id", "node"],
                                             set_={"identity": identity, "updated_at": now}))

    def _rederive_runs(self, c, sweep_id: str, node: str) -> None:
        """The node's identity and runs again from its stored events, after the ledger moved
        an event they came from aside (``journal_ends``: a forged line past the end)."""
        c.execute(delete(Run).where(Run.sweep_id == sweep_id, Run.node == node))
        stored = select(Event.payload).where(Event.sweep_id == sweep_id, Event.node == node)
        for e in c.execute(stored.where(Event.type == "environment_checked")
                           .order_by(Event.seq)).scalars():
            self._set_identity(c, sweep_id, node, e)
        summaries = list(c.execute(stored.where(Event.type == "config_summary")
                                   .order_by(Event.seq)).scalars())
        if summaries:
            identity = self._identity(c, sweep_id, node)
            c.execute(self._insert(Run).on_conflict_do_nothing(),
                      [run_row(sweep_id, node, e, identity) for e in summaries])

    def _identity(self, c, sweep_id: str, node: str) -> dict:
        ident = c.execute(select(SweepNode.identity).where(
            SweepNode.sweep_id == sweep_id, SweepNode.node == node)).scalar()
        if ident is None:  # an old journal without environment_checked: rebuild from events
            e = c.execute(select(Event.payload).where(
                Event.sweep_id == sweep_id, Event.node == node,
                Event.type == "environment_checked")).scalar()
            if e:
                self._set_identity(c, sweep_id, node, e)
                return self._identity(c, sweep_id, node)
        return ident or {}

    def add_facts(self, node: str, facts: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(NodeFacts).values(
                node=node, collected_at=datetime.now(timezone.utc), os_build=facts.get("os_build"),
                chip=facts.get("chip"), ram_bytes=facts.get("ram_bytes"), facts=facts))

    def add_provision(self, node: str, plan_sha256: str, status: str, details: dict) -> None:
        with self.engine.begin() as c:
            c.execute(insert(ProvisionRun).values(
                node=node, created_at=datetime.now(timezone.utc), plan_sha256=plan_sha256,
                status=status, env_id=details.get("env_id"), agent_id=details.get("agent_id"),
                seconds=details.get("seconds"), details=details))

    def record_lock(self, doc: dict) -> None:
        """Plan, environments and models of a lock, once (idempotent)."""
        with self.engine.begin() as c:
            c.execute(self._insert(Plan).values(
                id=doc["lock_id"], name=doc["name"], created_at=datetime.now(timezone.utc),
                plan=doc["plan"], lock=doc).on_conflict_do_nothing())
            for desc, entry in doc["platforms"].items():
                c.execute(self._insert(Environment).values(
                    env_id=entry["env_id"], platform=desc, python=doc["python"],
                    wheels=entry["wheels"]).on_conflict_do_nothing())
            for role in model_roles(doc["models"]):
                m = doc["models"][role]
                c.execute(self._insert(ModelRecord).values(
                    fingerprint=m["fingerprint"], role=role_kind(role),
                    source=doc["models"].get("source"),
                    revision=doc["models"].get("revision"), manifest=m["manifest"]
                ).on_conflict_do_nothing())

    def latest_facts(self) -> dict[str, dict]:
        """The newest facts snapshot per node."""
        with self.engine.connect() as c:
            rows = c.execute(select(NodeFacts.node, NodeFacts.facts)
                             .order_by(NodeFacts.collected_at)).all()
        return {node: facts for node, facts in rows}

    def latest_sweep_id(self) -> str | None:
        with self.engine.connect() as c:
            return c.execute(select(Sweep.id).order_by(Sweep.created_at.desc()).limit(1)
                             ).scalar_one_or_none()
