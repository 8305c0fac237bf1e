"""Opening the store, migrating it, and ingesting agent events idempotently."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, delete, func, insert, select, text, update
from sqlalchemy import event as sa_event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from agent.protocol import model_roles, role_kind

from ..errors import StoreError
from .ledger import admit
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

if TYPE_CHECKING:
    from alembic.config import Config

DEFAULT_URL = "sqlite:///specfleet.db"
MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"

MEASUREMENT_COLUMNS = ("run_index", "workload", "prompt_sha256", "mode", "knob", "num_draft_tokens",
               "repetition", "generated_tokens", "ttft_ms", "decode_tok_s", "itl_p50_ms",
               "itl_p95_ms", "drafted_tokens", "accepted_tokens", "acceptance_rate",
               "peak_mlx_memory_bytes", "exact_match", "first_divergence", "output_text",
               "context_bucket", "itl_p99_ms", "swap_in_bytes", "bandwidth_utilisation",
               "unreliable", "unreliable_reasons", "first_divergence_unit")


try:  # orjson reads JSON columns several times faster; the review reads a lot of them
    from orjson import loads as _json_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay importable
    _json_loads = json.loads  # type: ignore[assignment]


def resolve_url(url: str | None) -> str:
    return url or os.environ.get("SPECFLEET_DB") or DEFAULT_URL


def alembic_config(url: str) -> Config:
    # alembic is imported where a migration runs: a store already at head (every command
    # but the first) opens without it, about a fifth of a short command's start-up
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


class Store:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._insert = (postgresql.insert if engine.dialect.name == "postgresql"
                        else sqlite.insert)

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as c:
            return MigrationContext.configure(c).get_current_revision()

    def create_sweep(self, sweep_id: str, job: dict, inventory: str | None, *,
                     plan_id: str | None = None, trigger: str = "manual",
                     controller: str | None = None) -> None:
        with self.engine.begin() as c:
            c.execute(insert(Sweep).values(
                id=sweep_id, created_at=datetime.now(timezone.utc), status="running",
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
        with Session(self.engine) as s:
            row = s.get(Sweep, sweep_id)
            if row is not None:
                s.expunge(row)
            return row

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
               raw: list[str] | None = None, refused: list | None = None) -> int:
        """Store events (and their measurements, telemetry, runs) once; returns how many
        events were new. ``raw`` are the journal lines the events were parsed from: stored
        as they are, they need not be serialised again (ingest is the hot path).

        Append-only (``ledger.admit``): a line that conflicts with what is stored, measures
        a run again or outside the plan, or ends the job with counts the journal does not
        hold is set aside with its reason, in the same transaction; the newly set-aside
        ones are appended to ``refused``."""
        if not events:
            return 0
        payloads = raw or [json.dumps(e, separators=(",", ":")) for e in events]
        with self.engine.begin() as c:
            events, payloads, out = admit(c, sweep_id, node, events, payloads)
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
            new = self._bulk(c, "events", EVENT_COLUMNS, rows) if rows else 0
            for e in events:
                if e["type"] == "environment_checked":
                    self._set_identity(c, sweep_id, node, e)
            if gens:  # their telemetry is read through the telemetry_samples view
                self._bulk(c, "measurements", MEASUREMENT_TABLE_COLUMNS,
                           [_measurement_tuple(sweep_id, node, e) for e in gens])
            summaries = [e for e in events if e["type"] == "config_summary"]
            if summaries:
                identity = self._identity(c, sweep_id, node)
                c.execute(self._insert(Run).on_conflict_do_nothing(),
                          [_run_row(sweep_id, node, e, identity) for e in summaries])
        return new

    def quarantine(self, sweep_id: str, node: str, items: list) -> int:
        """Keep lines the decode boundary set aside (``decode.Quarantined``), once each;
        returns how many were new."""
        with self.engine.begin() as c:
            return len(self._quarantine(c, sweep_id, node, items))

    def _quarantine(self, c, sweep_id: str, node: str, items: list) -> list:
        """Insert set-aside lines; returns the ones that were not kept already."""
        import hashlib

        now = datetime.now(timezone.utc)
        new = []
        for q in items:  # rare: one statement per line, to know what is new
            # a line with bytes that were not UTF-8 arrives with them escaped: kept replaced
            line = q.line.encode("utf-8", "replace")
            digest = hashlib.sha256(line).hexdigest()
            reason = q.reason.encode("utf-8", "replace").decode()
            row = {"sweep_id": sweep_id, "node": node, "seq": q.seq,
                   "reason": reason.replace("\x00", "\ufffd"),
                   "line": line.decode("utf-8", "replace")[:65536].replace("\x00", "\ufffd"),
                   "line_sha256": digest, "received_at": now}
            if c.execute(self._insert(QuarantinedEvent).values(**row).on_conflict_do_nothing()
                         .returning(QuarantinedEvent.id)).all():
                new.append(q)
        return new

    def quarantined_count(self, sweep_id: str, node: str) -> int:
        with self.engine.connect() as c:
            return c.execute(select(func.count()).select_from(QuarantinedEvent).where(
                QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node)).scalar() or 0

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

    def _bulk(self, c, table: str, columns: tuple[str, ...], rows: list[tuple]) -> int:
        """INSERT … ON CONFLICT DO NOTHING straight through the driver (SQLite
        executemany, PostgreSQL COPY).

        SQLAlchemy's per-row parameter processing cost more than the database itself;
        values here are already plain (JSON pre-serialised). Returns rows inserted.
        """
        cols = ", ".join(columns)
        if self.engine.dialect.name == "postgresql":
            import psycopg

            try:
                return self._copy(c, table, cols, rows)
            except psycopg.Error as e:
                # the raw cursor bypasses SQLAlchemy: give callers the error they handle
                # (the follower retries SQLAlchemyError while the store is down)
                raise DBAPIError.instance(f"COPY {table}", None, e, psycopg.Error) from e
        values = ", ".join("?" for _ in columns)
        result = c.exec_driver_sql(f"INSERT INTO {table} ({cols}) VALUES ({values}) "
                                   "ON CONFLICT DO NOTHING", rows)
        return max(result.rowcount, 0)

    @staticmethod
    def _copy(c, table: str, cols: str, rows: list[tuple]) -> int:
        import psycopg

        cur = c.connection.driver_connection.cursor()
        # Usually every row is new (the follower starts after the last stored seq):
        # COPY straight in. If any row exists, undo that and take the idempotent path.
        cur.execute("SAVEPOINT specfleet_bulk")
        try:
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                for row in rows:
                    cp.write_row(row)
            cur.execute("RELEASE SAVEPOINT specfleet_bulk")
            return len(rows)
        except psycopg.errors.UniqueViolation:
            cur.execute("ROLLBACK TO SAVEPOINT specfleet_bulk")
        # COPY into a per-transaction scratch table, then one INSERT … SELECT that skips
        # what is already stored.
        scratch = f"_in_{table}"
        cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {scratch} AS SELECT {cols} FROM "
                    f"{table} WITH NO DATA")
        with cur.copy(f"COPY {scratch} ({cols}) FROM STDIN") as cp:
            for row in rows:
                cp.write_row(row)
        cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {scratch} "
                    "ON CONFLICT DO NOTHING")
        inserted = cur.rowcount
        cur.execute(f"TRUNCATE {scratch}")
        return max(inserted, 0)

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
                      [_run_row(sweep_id, node, e, identity) for e in summaries])

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


EVENT_COLUMNS = ("sweep_id", "node", "seq", "type", "ts", "payload")
MEASUREMENT_TABLE_COLUMNS = ("sweep_id", "node", "seq", "knob_value", "temperature", "pair",
                             "measured_at", "e2e_ms", *MEASUREMENT_COLUMNS)


_REASONS_AT = MEASUREMENT_COLUMNS.index("unreliable_reasons")


def _measurement_tuple(sweep_id: str, node: str, e: dict) -> tuple:
    values = list(map(e.get, MEASUREMENT_COLUMNS))  # hot path: once per generation ingested
    if values[_REASONS_AT] is not None:
        values[_REASONS_AT] = json.dumps(values[_REASONS_AT])
    kv = e.get("knob_value")
    return (sweep_id, node, e["seq"], None if kv is None else str(kv),
            e["config"]["temperature"], result_pair(e), measured_at(e["ts"]), e2e_ms(e),
            *values)


def measured_at(ts: float) -> str:
    """An event's time as text both drivers store as timestamptz / SQLAlchemy's SQLite
    DateTime (UTC, microseconds): the bulk insert bypasses SQLAlchemy's own conversion."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(sep=" ", timespec="microseconds")


def e2e_ms(e: dict) -> float | None:
    """The request's end-to-end time: the agent's ``e2e_ms``, or for journals written
    before it reported one, its last token's arrival (``token_times_us``)."""
    v = e.get("e2e_ms")
    if isinstance(v, int | float):
        return float(v)
    times = e.get("token_times_us")
    if isinstance(times, list) and times and isinstance(times[-1], int | float):
        return times[-1] / 1e3
    return None


def measurement_row(sweep_id: str, node: str, e: dict) -> dict:
    """A generation event's measurement row, as ingest derives it (and verify again)."""
    row = dict(zip(MEASUREMENT_TABLE_COLUMNS, _measurement_tuple(sweep_id, node, e)))
    row["measured_at"] = datetime.fromisoformat(row["measured_at"])
    return row


def _pair_identity(e: dict, identity: dict) -> dict:
    """A lineup result's own models: fingerprints, tiers and name of the pair it names; a
    draft-free method's result has no draft weights, and is named by its method."""
    method = e.get("method")
    if method:
        target = str(identity.get("model_pair") or "target").split(" / ")[0]
        return {**identity, "draft_fingerprint": None, "draft_quant": f"no draft: {method}",
                "model_pair": f"{target} / {method}"}
    pair, roles = e.get("models"), identity.get("roles")
    if not pair or not roles:
        return identity
    t, d = roles.get(pair["target"]) or {}, roles.get(pair.get("draft") or "") or {}
    names = identity.get("role_names") or {}
    return {**identity, "target_fingerprint": t.get("fingerprint"),
            "draft_fingerprint": d.get("fingerprint"), "target_quant": t.get("quant"),
            "draft_quant": d.get("quant"),
            "model_pair": " / ".join(names.get(r) or r for r in (pair["target"], pair["draft"])
                                     if r) if names else identity.get("model_pair")}


def _run_row(sweep_id: str, node: str, e: dict, identity: dict) -> dict:
    m = e["metrics"]
    identity = _pair_identity(e, identity)
    return {
        "sweep_id": sweep_id, "node": node, "workload": e["workload"],
        "context_bucket": e.get("context_bucket"), "mode": e["mode"], "knob": e.get("knob"),
        "knob_value": None if e.get("knob_value") is None else str(e["knob_value"]),
        "num_draft_tokens": e["num_draft_tokens"],
        # a lineup's pairs share configs: the pair is part of what makes a run one run
        "config_key": config_key(result_pair(e), e["config"]), "config": e["config"],
        "trials": e["trials"], "decode_tok_s_median": m["decode_tok_s"]["median"],
        "decode_tok_s_p95": m["decode_tok_s"]["p95"], "decode_tok_s_cv": m["decode_tok_s"]["cv"],
        "acceptance_median": m["acceptance_rate"]["median"], "unreliable": e["unreliable"],
        "summary": {k: e.get(k) for k in ("metrics", "values", "unreliable_reasons", "exact",
                                          "distribution", "parity", "models", "method",
                                          "contention")},
        "env_id": identity.get("env_id"), "mlx_version": identity.get("mlx_version"),
        "mlx_lm_version": identity.get("mlx_lm_version"),
        "target_fingerprint": identity.get("target_fingerprint"),
        "draft_fingerprint": identity.get("draft_fingerprint"),
        "prompt_sha256": e.get("prompt_sha256"), "os_build": identity.get("os_build"),
        "chip": identity.get("chip"), "power_source": identity.get("power_source"),
        "model_pair": identity.get("model_pair"), "engine": e.get("engine") or "mlx-lm",
        "target_quant": identity.get("target_quant"), "draft_quant": identity.get("draft_quant"),
        "pair": result_pair(e), "background": identity.get("background")}


def config_key(pair: str | None, config: dict) -> str:
    """A run's stored config key: its pair and every knob, as sorted JSON. The column holds
    255 characters; a longer key (a config with many knobs set) ends in a hash of the whole,
    since two configs cut to the same 255 characters were one run: the second was dropped."""
    import hashlib

    whole = (f"{pair} " if pair else "") + json.dumps(config, sort_keys=True)
    if len(whole) <= 255:
        return whole
    return whole[:238] + " #" + hashlib.sha256(whole.encode()).hexdigest()[:15]


def result_pair(e) -> str | None:
    """What a result was measured with, beyond the plan's one pair: a lineup pair
    ("target+draft-2") or a draft-free method ("target+prompt-lookup")."""
    method = e.get("method")  # a dict, or a typed event (agent.events), alike
    return f"target+{method}" if method else pair_name(e.get("models"))


def pair_name(models: dict | None) -> str | None:
    """A lineup result's pair as stored and reviewed: "target+draft-2"; a target's own
    baseline (quality tasks) is "target+None"."""
    if not isinstance(models, dict) or not models:
        return None
    return f"{models.get('target')}+{models.get('draft')}"


def open_store(url: str | None = None, migrate: bool = True, must_exist: bool = False,
               create_folder: bool = False) -> Store:
    """Open (and by default migrate to head) the store at ``url``. ``must_exist``: a
    command that only reads refuses a SQLite file that is not there, rather than create
    an empty store and answer "nothing" (a mistyped --db looked like an empty fleet).
    A SQLite file whose folder does not exist is refused too (a mistyped folder made a new
    store elsewhere) unless ``create_folder`` (`specfleet db upgrade`: creating is explicit)."""
    url = resolve_url(url)
    check_url(url)
    path = sqlite_path(url)
    if must_exist and path is not None and not path.exists():
        raise StoreError(f"no store at {path}: nothing has been stored there (a sweep creates "
                         "it). Check --db, SPECFLEET_DB or the specfleet.toml in use")
    if path is not None and not path.parent.is_dir():
        if not create_folder:
            raise StoreError(
                f"no folder {path.parent} for the store {path}: check --db, SPECFLEET_DB or "
                f"the specfleet.toml in use (a mistyped folder would start an empty store). "
                f"To start a store there: `specfleet db upgrade --db sqlite:///{path}` "
                "creates it")
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # pre_ping: after a PostgreSQL restart, stale pooled connections are replaced
        engine = create_engine(url, pool_pre_ping=True, json_deserializer=_json_loads)
        if engine.dialect.name == "sqlite":
            sa_event.listen(engine, "connect", _sqlite_pragmas)
            sa_event.listen(engine, "begin", _sqlite_begin)
        if migrate:
            was, now = upgrade(engine, url)
            if was is not None and was != now:
                # a store someone downgraded on purpose is not moved back up silently
                print(f"specfleet: store {engine_url_for_humans(url)} upgraded from revision "
                      f"{was} to {now}", file=sys.stderr)
    except SQLAlchemyError as e:
        msg = str(getattr(e, "orig", None) or e).splitlines()[0]
        if "disk is full" in msg or "No space left" in msg:  # the migration rolled back
            raise StoreError(f"the store is out of disk space ({msg}); nothing stored so far "
                             f"is lost: free space and run the command again") from None
        raise StoreError(f"cannot open store {engine_url_for_humans(url)}: "
                         f"{e.__class__.__name__}: {str(e).splitlines()[0]}") from None
    return Store(engine)


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (None: another database, or SQLite in memory)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def check_url(url: str) -> None:
    """Refuse, with the fix, what SQLAlchemy would answer with its own words: a bare path,
    another database, a folder."""
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is None:
        raise StoreError(f"--db {url!r} is not a store URL; for a SQLite file write "
                         f"sqlite:///{url} (sqlite://// + an absolute path)")
    if scheme not in ("sqlite", "postgresql", "postgresql+psycopg"):
        raise StoreError(f"--db: {scheme!r} stores are not supported; use sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST:PORT/DB")
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if scheme == "sqlite" and path == "":
        raise StoreError(f"--db {url}: names no file; e.g. sqlite:///specfleet.db")
    if path and Path(path).is_dir():
        raise StoreError(f"--db {url}: that is a folder; name a file in it, e.g. "
                         f"{url.rstrip('/')}/specfleet.db")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL: the review reads while the controller writes, and a commit is one append instead
    # of a rewritten journal. synchronous=NORMAL is still crash-safe for the process (only
    # a power cut can drop the newest commits, and re-ingesting a node journal restores
    # them). busy_timeout: a second writer waits instead of failing at once.
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=10000"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()
    # Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE, so CREATE,
    # DROP and ALTER committed on their own: a migration that failed halfway stayed
    # halfway, and a downgrade could not be tried and rolled back. SQLAlchemy's recipe:
    # the driver does no transaction handling, and every SQLAlchemy transaction is BEGIN.
    dbapi_conn.isolation_level = None


def _sqlite_begin(conn) -> None:
    conn.exec_driver_sql("BEGIN")


MIGRATION_LOCK = 0x5F5EC_F1EE7  # pg advisory lock key: one migrating controller at a time


@functools.cache
def script_head() -> str | None:
    """The newest revision of migrations/versions, read from the files' ``revision`` and
    ``down_revision`` lines; None unless the history is one plain chain (alembic decides)."""
    revs: dict[str, str | None] = {}
    for f in (MIGRATIONS / "versions").glob("*.py"):
        src = f.read_text(encoding="utf-8")
        rev = re.search(r'^revision\s*(?::[^=]*)?=\s*["\'](\w+)["\']', src, re.M)
        down = re.search(r'^down_revision\s*(?::[^=]*)?=\s*(?:["\'](\w+)["\']|None)\s*$',
                         src, re.M)
        if not rev or not down:
            return None
        revs[rev.group(1)] = down.group(1)
    heads = set(revs) - set(revs.values())
    return heads.pop() if len(heads) == 1 else None


def at_head(engine: Engine) -> bool:
    """The store's recorded revision is the newest migration (a read, no lock: a store
    mid-migration elsewhere still reads its old revision and takes the full path)."""
    head = script_head()
    if head is None:
        return False
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalars().all() \
                == [head]
    except SQLAlchemyError:  # no table yet: a new store
        return False


def upgrade(engine: Engine, url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate up; returns the revisions before and after."""
    if revision == "head" and at_head(engine):
        head = script_head()
        return head, head
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    cfg = alembic_config(url)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Two controllers opening a fresh database at once would race on CREATE TABLE.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        was = MigrationContext.configure(conn).get_current_revision()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        return was, MigrationContext.configure(conn).get_current_revision()


def downgrade(engine: Engine, url: str, revision: str) -> None:
    with _downgrading(engine, url, revision) as conn:
        conn.commit()


@contextlib.contextmanager
def _downgrading(engine: Engine, url: str, revision: str):
    """Migrate down inside one transaction and hand it over, to commit or roll back."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    cfg = alembic_config(url)
    known = [s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()]
    with engine.connect() as conn:
        conn.begin()
        try:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
        except CommandError as e:
            raise StoreError(f"cannot downgrade to {revision!r}: {str(e).splitlines()[0]}; "
                             f"revisions: base, {', '.join(sorted(known))}") from None
        yield conn


def downgrade_losses(engine: Engine, url: str, revision: str) -> list[str]:
    """What a downgrade to ``revision`` would delete, found by doing it in a transaction
    and rolling it back (both stores migrate in transactions): each dropped table with its
    rows and each dropped column with its values, where there are any."""
    from sqlalchemy import inspect

    def shape(conn) -> dict[str, set[str]]:
        insp = inspect(conn)
        return {t: {c["name"] for c in insp.get_columns(t)} for t in insp.get_table_names()
                if t != "alembic_version"}

    with engine.connect() as conn:
        before = shape(conn)
    with _downgrading(engine, url, revision) as conn:
        after = shape(conn)
        conn.rollback()
    losses = []
    with engine.connect() as conn:
        for table, cols in sorted(before.items()):
            if table not in after:
                n = conn.exec_driver_sql(f'SELECT count(*) FROM "{table}"').scalar() or 0
                if n:
                    losses.append(f"table {table}: {n} row(s)")
                continue
            for col in sorted(cols - after[table]):
                n = conn.exec_driver_sql(f'SELECT count("{col}") FROM "{table}"').scalar() or 0
                if n:
                    losses.append(f"column {table}.{col}: {n} value(s)")
    return losses


def engine_url_for_humans(url: str) -> str:
    from ..redact import redact_url

    return redact_url(url)
