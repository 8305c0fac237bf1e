"""Decoded events into the store in batches: the controller's ingest path, which
``bench/ingest.py`` times as it is.

A batch goes out when it is full, or ``every_s`` after its first event arrived (a timer,
so the last event before a quiet spell is stored without waiting for the next). A
journal replayed after a reconnect fills whole batches; a live stream of a few events a
second goes out by time, so what the store shows lags the node by at most ``every_s``.

One batch is stored (in the caller's thread, ``store_batch``) while the next is decoded:
the database's own work (SQLite's steps and commit, PostgreSQL's COPY and round trips)
runs without the GIL, so the two overlap (bench/ingest.py: ~1.5x on SQLite on 2 busy
cores). At most one batch is in flight, so batches reach the store in journal order;
batches above ~1000 events were slower on SQLite, hence at most 1000.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable

INGEST_BATCH = 1000    # events per batch at most
INGEST_EVERY_S = 0.25  # a batch goes out at most this long after its first event
# The cyclic collector's thresholds while ingesting (``ingest_gc``): each decoded event is
# a few tracked containers held until its batch is stored, so at the default 700 the
# collector walked every held batch again and again as it aged (~10% of the controller's
# CPU per generation event: bench/ingest.py, measured with and without)
INGEST_GC_THRESHOLDS = (50_000, 50, 100)


def ingest_gc() -> None:
    """Raise the process's collector thresholds to ``INGEST_GC_THRESHOLDS`` (never lower
    them): what the collector frees is only cycles, which ingest does not make; they are
    still collected, less often."""
    now = gc.get_threshold()
    gc.set_threshold(*(max(a, b) for a, b in zip(now, INGEST_GC_THRESHOLDS, strict=True)))

StoreBatch = Callable[[list[dict], list[str]], Awaitable[None]]


class IngestPipeline:
    """``add`` each decoded event with its journal line; ``close`` when the stream ends.

    A batch the store refused is never dropped: it goes back to the front of what is held,
    in journal order, and the next flush (or ``close``) sends it again. Retrying while the
    store is down is ``store_batch``'s job; an error it gives up with surfaces at the next
    ``add`` or at ``close``, and what was not stored is still held (``pending``), so the
    follower's next read of the journal starts before it."""

    def __init__(self, store_batch: StoreBatch, *, batch: int = INGEST_BATCH,
                 every_s: float = INGEST_EVERY_S):
        ingest_gc()  # the controller ingests for its whole run: for good, once set
        self._store = store_batch
        self._size, self._every = batch, every_s
        self._events: list[dict] = []
        self._lines: list[str] = []
        self._lock = asyncio.Lock()  # one batch at a time, in journal order
        self._timer: asyncio.TimerHandle | None = None
        # the one batch in flight (sent when full, or by the timer); the next waits for it
        self._timed: asyncio.Future[None] | None = None
        self.batches = 0  # how many batches went out (the bench reports their mean size)
        self.stored = 0   # events the store took

    @property
    def pending(self) -> int:
        """Events read but not (yet) stored."""
        return len(self._events)

    async def add(self, event: dict, line: str) -> None:
        self._surface()
        self._events.append(event)
        self._lines.append(line)
        if len(self._events) >= self._size:
            await self._settle()  # one batch in flight at most; its failure is said here
            # taken now, not when the task first runs: the next line must not count it
            self._timed = asyncio.ensure_future(self._send(*self._take()))
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._every, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._timed is not None and not self._timed.done():
            # the last timed flush is still storing (or retrying): one at a time, so none
            # is ever left unawaited; look again later for what came in meanwhile
            self._timer = asyncio.get_running_loop().call_later(self._every, self._on_timer)
            return
        if self._timed is not None and not self._timed.cancelled() and \
                self._timed.exception() is not None:
            return  # it failed: the next ``add`` or ``close`` reports it, nothing is dropped
        self._timed = asyncio.ensure_future(self.flush())

    async def _settle(self) -> None:
        """Wait for the batch in flight; raise what it failed with (it is held again).
        It stays ``_timed`` while awaited, so the timer starts no batch meanwhile: one
        batch in flight at most, taken in journal order."""
        timed = self._timed
        if timed is not None:
            try:
                await timed
            finally:
                if self._timed is timed:
                    self._timed = None

    def _surface(self) -> None:
        # a flush the timer started failed (the store stayed down): say so now
        if self._timed is not None and self._timed.done():
            timed, self._timed = self._timed, None
            if not timed.cancelled():
                timed.result()

    async def flush(self) -> None:
        if self._events:
            await self._send(*self._take())

    def _take(self) -> tuple[list[dict], list[str]]:
        """The oldest batch, out of what is held (a timer set for it is not needed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        n = min(len(self._events), self._size)
        events, lines = self._events[:n], self._lines[:n]
        del self._events[:n], self._lines[:n]
        return events, lines

    async def _send(self, events: list[dict], lines: list[str]) -> None:
        async with self._lock:
            try:
                await self._store(events, lines)
            except BaseException:
                # not stored: back in front of what came in meanwhile, in journal order
                self._events[:0], self._lines[:0] = events, lines
                raise
            self.batches += 1
            self.stored += len(events)

    async def close(self) -> None:
        """Store what is left. Also called when the stream failed: what was read is
        stored, and the next read starts after it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._settle()
        while self._events:
            await self.flush()
