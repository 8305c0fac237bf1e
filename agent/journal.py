"""The event journal: one versioned JSON object per line, fsynced per event.

Every event carries ``schema``, ``seq`` (1, 2, …; continues after a restart so
ingest stays idempotent) and ``ts``. It is written to the journal file first,
then echoed to stdout for a live controller.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from . import SCHEMA
from .protocol import MAX_EVENT_BYTES
from .signing import SUFFIX_BYTES, Verifier, sign

# per-token and per-sample arrays, largest first: what an event too long for the
# controller's boundary gives up (named in ``trimmed``) so that the rest of it is stored
BULKY = ("token_times_us", "token_ids", "telemetry", "acceptance_by_position", "from_draft",
         "output_text")


def _bounded(event: dict, limit: int = MAX_EVENT_BYTES) -> tuple[dict, str]:
    """The event without its bulkiest arrays until its line fits ``limit`` (MAX_EVENT_BYTES,
    less its signature's room): the controller stores a line that long whole, and sets a
    longer one aside entirely."""
    event = dict(event)
    trimmed: list[str] = []
    for name in BULKY:
        if name in event:
            del event[name]
            trimmed.append(name)
            line = json.dumps({**event, "trimmed": trimmed}, separators=(",", ":"),
                              allow_nan=False) + "\n"
            if len(line) <= limit:  # ASCII (json.dumps escapes the rest): chars are bytes
                return {**event, "trimmed": trimmed}, line
    raise ValueError(f"a {event.get('type')} event is longer than {limit} bytes "
                     "even without its per-token arrays")


def recover(path: Path, mine: Callable[[bytes], bool] | None = None) -> int:
    """Cut a torn last line (a crash mid-write) and return the highest sequence number;
    with ``mine`` (a keyed journal's check) of the agent's own lines only: a line another
    process appended cannot move the seq on."""
    if not path.exists():
        return 0
    seq = 0
    with open(path, "r+b") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # never fsynced as a whole event: drop it
            f.truncate(end)
        for line in data[:end].splitlines():
            if mine is not None and not mine(line):
                continue
            try:
                seq = max(seq, int(json.loads(line)["seq"]))
            except (ValueError, KeyError, TypeError):
                continue
    return seq


class Journal:
    """Appends events; with ``key`` (the controller's secret for this sweep node,
    ``signing``) each line ends with its MAC, so the controller can tell the agent's lines
    from any other process's that appends to the file."""

    def __init__(self, path: Path, echo: IO[str] | None = sys.stdout, key: bytes | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        # which lines in the file are this job's agent's (None: unkeyed, all of them)
        self.mine: Callable[[bytes], bool] | None = None if key is None else Verifier(key)
        self.seq = recover(path, self.mine)
        self._f = open(path, "a", encoding="utf-8")
        self._echo = echo
        self.job_id: str | None = None  # stamped on every event once the job is known
        self._key = key
        self._limit = MAX_EVENT_BYTES - (SUFFIX_BYTES if key else 0)

    def emit(self, type_: str, **fields) -> dict:
        self.seq += 1
        event = {"schema": SCHEMA, "seq": self.seq, "type": type_, "ts": time.time(),
                 "job_id": self.job_id, **fields}
        line = json.dumps(event, separators=(",", ":"), allow_nan=False)
        if len(line) + 1 > self._limit:
            event, line = _bounded(event, self._limit)
            line = line[:-1]
        if self._key is not None:
            line = sign(self._key, line)
        line += "\n"
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())
        if self._echo is not None:
            self._echo.write(line)
            self._echo.flush()
        return event

    def close(self) -> None:
        self._f.close()
