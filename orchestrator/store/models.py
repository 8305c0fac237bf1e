"""SQLAlchemy 2 models of the result store. Migrations in ``migrations/`` must match."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Sweep(Base):
    __tablename__ = "sweeps"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running | ok | partial | failed
    inventory: Mapped[str | None] = mapped_column(Text)
    job: Mapped[dict] = mapped_column(JSON)
    target_fingerprint: Mapped[str | None] = mapped_column(String(80))
    draft_fingerprint: Mapped[str | None] = mapped_column(String(80))


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
    __table_args__ = (UniqueConstraint("sweep_id", "node", "seq", name="uq_events_seq"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    node: Mapped[str] = mapped_column(String(255))
    seq: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Float)
    payload: Mapped[dict] = mapped_column(JSON)


class Run(Base):
    """One measured generation: one config, one workload, one repetition, on one node."""

    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("sweep_id", "node", "run_index", name="uq_runs_index"),
        Index("ix_runs_series", "node", "workload", "mode", "num_draft_tokens"),
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
    repetition: Mapped[int] = mapped_column(Integer)
    generated_tokens: Mapped[int] = mapped_column(Integer)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    decode_tok_s: Mapped[float | None] = mapped_column(Float)
    itl_p50_ms: Mapped[float | None] = mapped_column(Float)
    itl_p95_ms: Mapped[float | None] = mapped_column(Float)
    drafted_tokens: Mapped[int] = mapped_column(Integer)
    accepted_tokens: Mapped[int] = mapped_column(Integer)
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
