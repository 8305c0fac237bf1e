"""SQLAlchemy 2 models of the result store. ``orchestrator/migrations/`` must match them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class Base(DeclarativeBase):
    pass


class JSONText(TypeDecorator):
    """JSON kept as the text it arrived as (an event's journal line).

    Why not the JSON type: PostgreSQL parses every ``json`` value it is sent, which cost
    more than the rest of ingest; the decode boundary has already parsed and checked the
    line, so the store keeps it as text and it is parsed again only when read.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect) -> str | None:
        return None if value is None else orjson.dumps(value).decode()

    def process_result_value(self, value: Any, dialect) -> Any:
        return None if value is None else orjson.loads(value)


class Sweep(Base):
    __tablename__ = "sweeps"
    __table_args__ = (Index("ix_sweeps_created", "created_at"),)
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running | ok | partial | failed
    inventory: Mapped[str | None] = mapped_column(Text)
    job: Mapped[dict] = mapped_column(JSON)
    target_fingerprint: Mapped[str | None] = mapped_column(String(80))
    draft_fingerprint: Mapped[str | None] = mapped_column(String(80))
    # added in 0005
    plan_id: Mapped[str | None] = mapped_column(ForeignKey("plans.id"))
    trigger: Mapped[str | None] = mapped_column(String(16))  # manual | nightly
    controller: Mapped[str | None] = mapped_column(String(255))


class NodeOutcome(Base):
    """What happened on one node in one sweep: ok, failed or unreachable."""

    __tablename__ = "node_outcomes"
    __table_args__ = (UniqueConstraint("sweep_id", "node"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)


class Event(Base):
    """Every raw agent event, unique by (sweep, node, seq): ingest twice, store once."""

    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("sweep_id", "node", "seq", name="uq_events_seq"),
        # the ledger's per-batch look-ups (a node's plan, its end, its failed ends): partial,
        # so the many other events do not pay for them (migrations 0015, 0017)
        *(Index(f"ix_events_{name}", "sweep_id", "node", "seq",
                sqlite_where=text(f"type = '{kind}'"), postgresql_where=text(f"type = '{kind}'"))
          for name, kind in (("plan", "plan"), ("finished", "job_finished"),
                             ("failed", "job_failed"))),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    seq: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Float)
    payload: Mapped[dict] = mapped_column(JSONText)  # text since 0009


class QuarantinedEvent(Base):
    """A journal line a node sent that the decode boundary set aside, with the reason."""

    __tablename__ = "quarantined_events"
    # once per occurrence of its content: five identical unreadable lines are five lines
    __table_args__ = (UniqueConstraint("sweep_id", "node", "line_sha256", "occurrence",
                                       name="uq_quarantined_line_occurrence"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    line: Mapped[str] = mapped_column(Text)  # the first 64 KiB, NUL characters replaced
    line_sha256: Mapped[str] = mapped_column(String(64))
    # the how-manieth line of this content in the journal (counted per read, from 1)
    occurrence: Mapped[int] = mapped_column(Integer, server_default="1")
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Measurement(Base):
    """One measured generation: one config, one workload, one repetition, on one node."""

    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint("sweep_id", "node", "run_index", name="uq_measurements_index"),
        Index("ix_measurements_series", "node", "workload", "mode", "num_draft_tokens"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    run_index: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    workload: Mapped[str] = mapped_column(String(128))
    prompt_sha256: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(16))  # baseline | speculative
    knob: Mapped[str | None] = mapped_column(String(32))
    knob_value: Mapped[str | None] = mapped_column(String(32))
    num_draft_tokens: Mapped[int] = mapped_column(Integer)
    temperature: Mapped[float] = mapped_column(Float)
    pair: Mapped[str | None] = mapped_column(String(40))  # 0011: the lineup pair, if any
    repetition: Mapped[int] = mapped_column(Integer)
    generated_tokens: Mapped[int] = mapped_column(Integer)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    decode_tok_s: Mapped[float | None] = mapped_column(Float)
    itl_p50_ms: Mapped[float | None] = mapped_column(Float)
    itl_p95_ms: Mapped[float | None] = mapped_column(Float)
    # nullable since 0007: a runtime behind an HTTP API may not report drafting at all
    drafted_tokens: Mapped[int | None] = mapped_column(Integer)
    accepted_tokens: Mapped[int | None] = mapped_column(Integer)
    acceptance_rate: Mapped[float | None] = mapped_column(Float)
    peak_mlx_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    exact_match: Mapped[bool | None] = mapped_column(Boolean)
    first_divergence: Mapped[int | None] = mapped_column(Integer)
    output_text: Mapped[str] = mapped_column(Text)
    # added in 0002: what the review needs from the agent's richer events
    context_bucket: Mapped[str | None] = mapped_column(String(16))
    itl_p99_ms: Mapped[float | None] = mapped_column(Float)
    swap_in_bytes: Mapped[int | None] = mapped_column(BigInteger)
    bandwidth_utilisation: Mapped[float | None] = mapped_column(Float)
    unreliable: Mapped[bool | None] = mapped_column(Boolean)
    unreliable_reasons: Mapped[list | None] = mapped_column(JSON)
    # added in 0008: token, or character (an http runtime without a tokenizer)
    first_divergence_unit: Mapped[str | None] = mapped_column(String(16))
    # added in 0013: when it was measured (its event's time) and its end-to-end time, so a
    # dashboard charts measurements over time and TPOT = (e2e − TTFT) / (tokens − 1)
    measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    e2e_ms: Mapped[float | None] = mapped_column(Float)


class NodeFacts(Base):
    """A snapshot of what a node reported (`specfleet fleet facts`)."""

    __tablename__ = "node_facts"
    __table_args__ = (Index("ix_node_facts_node_time", "node", "collected_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(255))
    collected_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    os_build: Mapped[str | None] = mapped_column(String(64))
    chip: Mapped[str | None] = mapped_column(String(128))
    ram_bytes: Mapped[int | None] = mapped_column(BigInteger)
    facts: Mapped[dict] = mapped_column(JSON)


class ProvisionRun(Base):
    """What `specfleet provision` did on one node: installed, pushed, skipped, how long."""

    __tablename__ = "provision_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(255), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    plan_sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    env_id: Mapped[str | None] = mapped_column(String(32))
    agent_id: Mapped[str | None] = mapped_column(String(32))
    seconds: Mapped[float | None] = mapped_column(Float)
    details: Mapped[dict] = mapped_column(JSON)


class Plan(Base):
    """A locked plan: the plan as written and the lock (wheels, fingerprints, prompt hashes)."""

    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the lock
    name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    plan: Mapped[dict] = mapped_column(JSON)
    lock: Mapped[dict] = mapped_column(JSON)


class Environment(Base):
    """An exact set of wheels for one platform; env_id is the hash of its lock."""

    __tablename__ = "environments"
    env_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    platform: Mapped[str] = mapped_column(String(128))
    python: Mapped[str] = mapped_column(String(16))
    wheels: Mapped[list] = mapped_column(JSON)


class ModelRecord(Base):
    """A model by fingerprint: its manifest and where it came from."""

    __tablename__ = "models"
    fingerprint: Mapped[str] = mapped_column(String(80), primary_key=True)
    role: Mapped[str | None] = mapped_column(String(16))
    source: Mapped[str | None] = mapped_column(String(255))
    revision: Mapped[str | None] = mapped_column(String(255))
    manifest: Mapped[list] = mapped_column(JSON)


class SweepNode(Base):
    """A node's part of a sweep: where its agent and journal live, and its state."""

    __tablename__ = "sweep_nodes"
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          primary_key=True)
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # launching | running | finished | ...
    pid: Mapped[int | None] = mapped_column(Integer)
    root: Mapped[str | None] = mapped_column(Text)
    job_path: Mapped[str | None] = mapped_column(Text)
    journal_path: Mapped[str | None] = mapped_column(Text)
    agent_dir: Mapped[str | None] = mapped_column(Text)
    python: Mapped[str | None] = mapped_column(Text)
    identity: Mapped[dict | None] = mapped_column(JSON)
    # the agent's journal signing key (hex; agent/signing.py): a secret, shown nowhere
    journal_key: Mapped[str | None] = mapped_column(String(128))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class NodeLease(Base):
    """Who benchmarks a node right now: several controllers share one PostgreSQL."""

    __tablename__ = "node_leases"
    node: Mapped[str] = mapped_column(String(255), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    sweep_id: Mapped[str | None] = mapped_column(String(64))
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Run(Base):
    """One generation config on one node in one sweep, with its identity and summary."""

    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("sweep_id", "node", "workload", "mode", "config_key",
                         name="uq_runs_config"),
        Index("ix_runs_series", "chip", "workload", "context_bucket", "target_fingerprint",
              "draft_fingerprint"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    workload: Mapped[str] = mapped_column(String(128))
    context_bucket: Mapped[str | None] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(16))
    knob: Mapped[str | None] = mapped_column(String(32))
    knob_value: Mapped[str | None] = mapped_column(String(32))
    num_draft_tokens: Mapped[int] = mapped_column(Integer)
    config_key: Mapped[str] = mapped_column(String(255))
    config: Mapped[dict] = mapped_column(JSON)
    trials: Mapped[int] = mapped_column(Integer)
    decode_tok_s_median: Mapped[float | None] = mapped_column(Float)
    decode_tok_s_p95: Mapped[float | None] = mapped_column(Float)
    decode_tok_s_cv: Mapped[float | None] = mapped_column(Float)
    acceptance_median: Mapped[float | None] = mapped_column(Float)
    unreliable: Mapped[bool] = mapped_column(Boolean)
    summary: Mapped[dict] = mapped_column(JSON)
    # identity: results whose identity differs are never averaged together
    env_id: Mapped[str | None] = mapped_column(String(32))
    mlx_version: Mapped[str | None] = mapped_column(String(32))
    mlx_lm_version: Mapped[str | None] = mapped_column(String(32))
    target_fingerprint: Mapped[str | None] = mapped_column(String(80))
    draft_fingerprint: Mapped[str | None] = mapped_column(String(80))
    prompt_sha256: Mapped[str | None] = mapped_column(String(64))
    os_build: Mapped[str | None] = mapped_column(String(64))
    chip: Mapped[str | None] = mapped_column(String(128))
    power_source: Mapped[str | None] = mapped_column(String(16))
    # added in 0006: the pair by name (plan's models.source/revision, else folder names),
    # so a draft swap stays in its series and shows up as an identity change
    model_pair: Mapped[str | None] = mapped_column(String(255))
    # added in 0007: what generated the tokens (mlx-lm in process, or a runtime by name)
    engine: Mapped[str | None] = mapped_column(String(64))
    # added in 0010: the tier each model's weights are stored at (part of the identity)
    target_quant: Mapped[str | None] = mapped_column(String(32))
    draft_quant: Mapped[str | None] = mapped_column(String(32))
    # added in 0011: the lineup pair ("target+draft-2"); None for a plan of one pair
    pair: Mapped[str | None] = mapped_column(String(40))
    # added in 0012: the co-tenant load it was measured beside; None: an idle node
    background: Mapped[str | None] = mapped_column(String(64))


# Since 0009 a view over the generation events' own telemetry windows, not a table: the
# samples are in every generation event's payload already, and writing them a second time
# (two rows per generation) was a third of ingest. Queried like a table; its column types
# also give the decode boundary its checks for each sample.
VIEWS = MetaData()
TelemetrySample = Table(
    "telemetry_samples", VIEWS,
    Column("sweep_id", String(64)),
    Column("node", String(255)),
    Column("seq", Integer),
    Column("idx", Integer),
    Column("ts", Float, nullable=False),
    Column("swap_used_bytes", BigInteger),
    Column("swap_in_bytes_total", BigInteger),
    Column("rss_bytes", BigInteger),
    Column("memory_pressure", String(16)),
    Column("thermal_throttled", Boolean),
    Column("cpu_speed_limit_pct", Integer),
    Column("power_source", String(16)),
    Column("low_power_mode", Boolean),
)


class ReproCheck(Base):
    """`specfleet repro`: did the same lock give the same numbers on several nodes?"""

    __tablename__ = "repro_checks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    reproducible: Mapped[bool] = mapped_column(Boolean)
    report: Mapped[dict] = mapped_column(JSON)
