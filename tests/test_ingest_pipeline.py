"""The follower's ingest path: decoded journal lines into a real store, in batches that
fill on a replay and go out by time on a live stream."""

import asyncio
import json

import pytest
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


def _follower(store, sweep_id: str, **kw):
    sizes: list[int] = []

    async def store_batch(batch, raw):
        sizes.append(len(batch))
        await asyncio.to_thread(store.ingest, sweep_id, "n1", batch, raw)

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

    asyncio.run(live())
