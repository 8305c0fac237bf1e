"""Ingest writes the rows the ledger admitted with no savepoint (store/bulk.py, ``fresh``):
on PostgreSQL two round trips fewer per table. When another writer stores the same lines
between the ledger's read and the write, the batch is undone and run again, and the store
holds each line once: planted with a real second writer (a second store on the same
database) that commits at that very moment."""

from __future__ import annotations

from sqlalchemy import event as sa_event
from sqlalchemy import func, select

from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement
from tests.hostile import JOB, event, journal


def _counts(store, sid: str) -> tuple[int, int]:
    with store.engine.connect() as c:
        return (c.execute(select(func.count()).select_from(Event).where(
                    Event.sweep_id == sid)).scalar(),
                c.execute(select(func.count()).select_from(Measurement).where(
                    Measurement.sweep_id == sid)).scalar())


def test_a_writer_that_stores_the_batch_first_wins_and_nothing_is_doubled(pg_url):
    lines = journal()[:12]  # job_started .. plan (seq 4) .. generations (seq 5-12)
    events, raw = [event(x) for x in lines], [x.decode() for x in lines]
    first, other = open_store(pg_url), open_store(pg_url)
    first.create_sweep("s1", JOB, None)
    reads: list[str] = []

    def meanwhile(conn, cursor, statement, *_):
        # right after the ledger read this batch's context (nothing stored yet), the other
        # writer stores the same lines and commits, before ``first`` writes them
        if "'hit'" in statement:
            reads.append(statement)
            if len(reads) == 1:
                assert other.ingest("s1", "n1", events, raw) == len(lines)

    sa_event.listen(first.engine, "after_cursor_execute", meanwhile)
    refused: list = []
    assert first.ingest("s1", "n1", events, raw, refused=refused) == 0  # all stored already
    # the COPY collided: the batch was undone and judged again (the ledger's second read),
    # as the same lines read again: nothing set aside
    assert len(reads) == 2 and refused == []
    generations = sum(e["type"] == "generation" for e in events)
    assert generations == 8
    assert _counts(first, "s1") == (len(lines), generations)
    # and the next batch, nobody else writing, goes in at once
    more = journal()[12:14]
    sa_event.remove(first.engine, "after_cursor_execute", meanwhile)
    assert first.ingest("s1", "n1", [event(x) for x in more], [x.decode() for x in more]) \
        == len(more)
    first.engine.dispose()
    other.engine.dispose()


def test_a_sweeps_job_is_read_once_per_store(any_url):
    """The job a generation is judged against is read once per sweep, not per batch."""
    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    lines = journal()[:12]
    jobs: list[str] = []
    sa_event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cur, stmt, *_: jobs.append(stmt) if "sweeps.job" in stmt
                    else None)
    for i in range(0, len(lines), 3):
        part = lines[i:i + 3]
        assert store.ingest("s1", "n1", [event(x) for x in part],
                            [x.decode() for x in part]) == len(part)
    assert len(jobs) == 1
    store.engine.dispose()
