"""`specfleet repro` verdicts, kept: recorded once per check, read back by the weekly review."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import insert, select

from .models import ReproCheck


def record_repro(store, sweep_id: str, report: dict) -> None:
    """Keep a repro check's report (its ``reproducible`` verdict beside it)."""
    with store.engine.begin() as c:
        c.execute(insert(ReproCheck).values(
            sweep_id=sweep_id, created_at=datetime.now(timezone.utc),
            reproducible=bool(report["reproducible"]), report=report))


def repro_reports(store, start: datetime, end: datetime) -> list[dict]:
    """The reports of repro checks made in [start, end)."""
    with store.engine.connect() as c:
        return list(c.execute(select(ReproCheck.report).where(
            ReproCheck.created_at >= start, ReproCheck.created_at < end)).scalars().all())
