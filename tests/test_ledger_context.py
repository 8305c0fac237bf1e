"""The ledger's look-ups for a batch, read in one round trip (store/ledger_context), give
what the stored journal holds, on SQLite and on PostgreSQL: planted through the real
ingest and quarantine, the expected answers read off the planted journal itself."""

from __future__ import annotations

import hashlib

from orchestrator.store import open_store
from orchestrator.store.journal_ends import END_REASONS
from orchestrator.store.ledger_context import read_context
from orchestrator.sweep.decode import Quarantined
from tests.hostile import JOB, event, journal

FAILED = [b'{"schema":1,"seq":1,"type":"job_started","ts":1.0}',
          b'{"schema":1,"seq":2,"type":"job_failed","ts":2.0,"error":"x","message":"crash"}']


def _ingest(store, sid: str, node: str, lines: list[bytes]) -> None:
    new = store.ingest(sid, node, [event(x) for x in lines], [x.decode() for x in lines])
    assert new == len(lines)


def test_a_batch_context_is_what_the_store_holds(any_url):
    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    lines = journal()
    _ingest(store, "s1", "n1", lines[:12])  # seq 1-12: plan at 4, run indexes 0-7 at 5-12
    _ingest(store, "s1", "n2", FAILED)
    aside = {13: "past the journal: planted", 14: "not JSON (planted)",
             30: "past the journal: far"}
    store.quarantine("s1", "n1", [Quarantined(s, why, f"line {s}") for s, why in aside.items()])
    with store.engine.connect() as c:
        ctx = read_context(c, "s1", "n1", list(range(10, 21)), list(range(5, 16)),
                           END_REASONS[0])
        other = read_context(c, "s1", "n2", [3], [], END_REASONS[0])
    assert ctx.hits == {10, 11, 12}
    assert ctx.measured == {5: 10, 6: 11, 7: 12}
    assert ctx.plan == event(lines[3]) and ctx.end is None and ctx.base == 12
    assert sorted(ctx.aside) == sorted(aside.items())  # all set aside past seq 12
    assert ctx.failed == set()  # n2's job_failed is not n1's
    # a jump in the batch's range (10-20) only, with the hash of its line
    assert [(seq, h) for _, seq, h in ctx.jumps] == [
        (13, hashlib.sha256(b"line 13").hexdigest())]
    assert other.failed == {2} and other.base == 2 and other.plan is None
    assert other.hits == set() and other.measured == {} and other.jumps == []
    store.engine.dispose()


def test_a_stored_end_is_in_the_context(any_url):
    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    lines = journal()
    _ingest(store, "s1", "n1", lines)
    end = event(lines[-1])
    assert end["type"] == "job_finished"
    with store.engine.connect() as c:
        ctx = read_context(c, "s1", "n1", [end["seq"] + 1], [], END_REASONS[0])
    assert ctx.end == end["seq"] == ctx.base and ctx.hits == set()
    store.engine.dispose()
