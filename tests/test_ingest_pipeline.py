"""The follower's ingest path: decoded journal lines into a real store, in batches that
fill on a replay and go out by time on a live stream."""

import asyncio
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.exc import IntegrityError

from orchestrator.store import open_store
from orchestrator.sweep.decode import Decoder
from orchestrator.sweep.pipeline import IngestPipeline

JOB = {"models": {"target": {}, "draft": {}}}


def _line(seq: int, typ: str = "soak_sample") -> str:
    return json.dumps({"schema": 1, "seq": seq, "type": typ, "ts": 1e9 + seq, "job_id": "j",
                       "index": seq, "elapsed_s": seq * 0.5, "decode_tok_s": 40.0,
                       "rss_bytes": 1 << 27, "swap_used_bytes": 0,
                       "memory_pressure": "normal"})


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory):
    """One real SQLite store for a property test's many examples (each its own sweep)."""
    return open_store(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'store.db'}")


def _follower(store, sweep_id: str, finished: list | None = None, **kw):
    sizes: list[int] = []

    async def store_batch(batch, raw):
        sizes.append(len(batch))
        try:
            await asyncio.to_thread(store.ingest, sweep_id, "n1", batch, raw)
        finally:  # stored or refused: the attempt is over
            if finished is not None:
                finished.append(len(batch))

    return IngestPipeline(store_batch, **kw), sizes


def test_a_replayed_journal_goes_in_whole_batches(any_url):
    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    decoder = Decoder("n1")

    async def replay():
        pipeline, sizes = _follower(store, "s1", batch=1000, every_s=30)
        for seq in range(1, 2501):
            line = _line(seq)
            await pipeline.add(decoder.decode(line), line)
        await pipeline.close()
        return sizes

    assert asyncio.run(replay()) == [1000, 1000, 500]  # not one commit per event
    assert store.last_seq("s1", "n1") == 2500


def test_the_last_event_before_a_quiet_spell_is_stored_by_time(sqlite_url):
    store = open_store(sqlite_url)
    store.create_sweep("s1", JOB, None)
    decoder = Decoder("n1")

    async def live():
        pipeline, sizes = _follower(store, "s1", every_s=0.2)
        line = _line(1, "soak_sample")
        await pipeline.add(decoder.decode(line), line)
        stored_at_once = store.last_seq("s1", "n1")
        await asyncio.sleep(0.6)  # no further line arrives
        stored_later = store.last_seq("s1", "n1")
        await pipeline.close()
        return stored_at_once, stored_later, sizes

    at_once, later, sizes = asyncio.run(live())
    assert (at_once, later, sizes) == (0, 1, [1])


def test_a_batch_the_timer_sent_that_fails_is_reported_at_the_next_line(pg_url):
    store = open_store(pg_url)  # PostgreSQL checks the sweep exists: a real refusal
    decoder = Decoder("n1")

    async def live():
        pipeline, _ = _follower(store, "no-such-sweep", every_s=0.05)
        line = _line(1)
        await pipeline.add(decoder.decode(line), line)
        await asyncio.sleep(0.5)
        with pytest.raises(IntegrityError):
            await pipeline.add(decoder.decode(_line(2)), _line(2))
        return pipeline.pending

    assert asyncio.run(live()) == 1  # the refused event is still held, not dropped


def test_a_refused_batch_is_sent_again_not_dropped(pg_url):
    """The batch the timer sent while the store refused it (here: the sweep's row was not
    there yet, a real refusal) goes out again; the old pipeline lost it for good."""
    store = open_store(pg_url)
    decoder = Decoder("n1")

    async def live():
        finished: list[int] = []
        pipeline, sizes = _follower(store, "s1", finished, every_s=0.05)
        await pipeline.add(decoder.decode(_line(1)), _line(1))
        for _ in range(600):  # the timer's batch [1] is refused (bounded: 30 s on a busy host)
            if finished:
                break
            await asyncio.sleep(0.05)
        store.create_sweep("s1", JOB, None)
        with pytest.raises(IntegrityError):  # said at the next line...
            await pipeline.add(decoder.decode(_line(2)), _line(2))
        await pipeline.add(decoder.decode(_line(2)), _line(2))  # ...which is read again
        await pipeline.close()
        return sizes, pipeline.stored, pipeline.pending

    sizes, stored, pending = asyncio.run(live())
    assert (sizes, stored, pending) == ([1, 2], 2, 0)
    assert [json.loads(x)["seq"] for x in _stored_lines(store, "s1")] == [1, 2]


def _stored_lines(store, sweep_id):
    from sqlalchemy import Text, cast, select

    from orchestrator.store.models import Event

    with store.engine.connect() as c:
        return list(c.execute(select(cast(Event.payload, Text)).where(
            Event.sweep_id == sweep_id).order_by(Event.seq)).scalars())


class Refused(Exception):
    """The store said no (the schedule below decides when)."""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), batch=st.integers(1, 7), refuse=st.sets(st.integers(0, 30)),
       pauses=st.lists(st.booleans(), max_size=40))
def test_whatever_the_store_refuses_every_line_ends_stored_once(sqlite_store, n, batch,
                                                                refuse, pauses):
    """Any schedule of refused batches, any batch size, timer or size flushes: a follower
    that starts again after the store's contiguous coverage (as dispatch does) stores every
    journal line exactly once, in order. The refusals are injected at the pipeline's store
    callback (the unit under test is the pipeline and the resume point); the store is real."""
    from orchestrator.store.coverage import coverage

    store = sqlite_store
    sid = f"s-{uuid.uuid4().hex[:8]}"
    store.create_sweep(sid, JOB, None)
    journal = [_line(i) for i in range(1, n + 1)]
    calls = [0]

    async def store_batch(events, raw):
        calls[0] += 1
        if calls[0] - 1 in refuse:
            await asyncio.sleep(0.004)  # a store that is down takes a while to say so
            raise Refused()
        await asyncio.to_thread(store.ingest, sid, "n1", events, raw)

    async def follow_once() -> None:
        start = coverage(store, sid, "n1").through  # what dispatch passes as --from-seq
        pipeline = IngestPipeline(store_batch, batch=batch, every_s=0.001)
        try:
            for i, line in enumerate(journal[start:]):
                await pipeline.add(Decoder("n1").decode(line), line)
                if i < len(pauses) and pauses[i]:
                    await asyncio.sleep(0.003)  # a quiet spell: the timer flushes
        finally:
            await pipeline.close()

    async def follow() -> int:
        for attempt in range(len(refuse) + 2):  # each refusal ends one pass, at most
            try:
                await follow_once()
                return attempt
            except Refused:
                continue
        raise AssertionError("the follower never finished")

    asyncio.run(follow())
    assert [json.loads(x)["seq"] for x in _stored_lines(store, sid)] == list(range(1, n + 1))
    assert _stored_lines(store, sid) == journal  # content as journaled, once each


def test_a_store_that_refuses_a_batch_is_an_error_at_once_not_a_wait(pg_url):
    """Waiting is for a store that is down or locked; one that refuses what it was sent
    (here: a sweep it does not have) will not change its mind: said at once, with the way
    to store the events later (the journal keeps them)."""
    import time

    from orchestrator.errors import StoreError
    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.dispatch import NodeRun, SweepOptions

    said: list[dict] = []
    run = NodeRun(Host(name="n1", address="localhost", connection="local"), open_store(pg_url),
                  "no-such-sweep", "t", SweepOptions(), lambda node, e: said.append(e))
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"the store refused a write \(.*ForeignKeyViolation.*"
                                         r"`specfleet sweep --attach no-such-sweep` stores them"):
        asyncio.run(run.ingest([Decoder("n1").decode(_line(1))], [_line(1)]))
    assert time.monotonic() - t0 < 5 and said == []


def test_the_next_batch_is_read_while_one_is_being_stored(sqlite_url):
    """A full batch goes out without the follower waiting for it: lines keep coming in
    while it is stored (the overlap bench/ingest.py measures), and the next full batch
    waits for it, so batches reach the store whole and in journal order."""
    store = open_store(sqlite_url)
    store.create_sweep("s1", JOB, None)
    decoder = Decoder("n1")
    release = asyncio.Event()
    sent: list[list[int]] = []

    async def store_batch(batch, raw):
        sent.append([e["seq"] for e in batch])
        if len(sent) == 1:
            await release.wait()  # the first batch is still being stored...
        await asyncio.to_thread(store.ingest, "s1", "n1", batch, raw)

    async def live():
        pipeline = IngestPipeline(store_batch, batch=2, every_s=30)
        for seq in (1, 2, 3):  # ...while line 3 is read and held
            await asyncio.wait_for(pipeline.add(decoder.decode(_line(seq)), _line(seq)), 2)
        await asyncio.sleep(0.05)
        held = (list(sent), store.last_seq("s1", "n1"), pipeline.pending)
        fourth = asyncio.ensure_future(pipeline.add(decoder.decode(_line(4)), _line(4)))
        await asyncio.sleep(0.05)
        waiting = not fourth.done()  # a second full batch waits for the first
        release.set()
        await fourth
        await pipeline.close()
        return held, waiting

    held, waiting = asyncio.run(live())
    assert held == ([[1, 2]], 0, 1) and waiting
    assert sent == [[1, 2], [3, 4]]
    assert store.last_seq("s1", "n1") == 4


def test_a_full_batch_the_store_refused_is_said_at_the_next_line_and_kept(pg_url):
    """A batch sent when full that the store refuses (no sweep row yet: PostgreSQL holds
    the foreign key) is held again, in front, and its error is said at the next line;
    nothing is dropped."""
    store = open_store(pg_url)
    decoder = Decoder("n1")

    async def live():
        pipeline, sizes = _follower(store, "s1", batch=2, every_s=30)
        for seq in (1, 2, 3):
            await pipeline.add(decoder.decode(_line(seq)), _line(seq))
        await asyncio.sleep(0.3)  # the first batch is refused meanwhile
        with pytest.raises(IntegrityError):
            await pipeline.add(decoder.decode(_line(4)), _line(4))
        held = pipeline.pending
        store.create_sweep("s1", JOB, None)
        await pipeline.add(decoder.decode(_line(4)), _line(4))  # the caller reads it again
        await pipeline.close()
        return held, sizes

    held, sizes = asyncio.run(live())
    assert held == 3  # 1 and 2 back in front of 3
    assert sizes == [2, 2, 2]
    assert store.last_seq("s1", "n1") == 4


@given(st.tuples(*[st.integers(0, 200_000)] * 3))
def test_ingest_raises_the_collectors_thresholds_and_never_lowers_them(before):
    import gc

    from orchestrator.sweep.pipeline import INGEST_GC_THRESHOLDS

    was = gc.get_threshold()
    try:
        gc.set_threshold(*before)

        async def store_batch(events, lines):
            pass

        IngestPipeline(store_batch)
        # each threshold: the larger of what the process had and ingest's
        assert gc.get_threshold() == tuple(max(a, b) for a, b in zip(
            before, INGEST_GC_THRESHOLDS, strict=True))
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.set_threshold(*was)
