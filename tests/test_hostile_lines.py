"""Nothing lost, nothing forged: a real journal, damaged every way a node can damage it.

The journal is one the agent wrote (``tests/journals.py``). Hypothesis mutates it — drops,
renames and retypes fields; duplicates, reorders and skips lines; forges terminal events;
nests deep; grows lines huge; puts NUL and bytes that are not UTF-8 in; truncates — and
every mutated journal goes through the node-side follower (``agent.follow``), the decode
boundary and the store's ledger. What must hold for any of them: no node stops; every line
is stored exactly once, as written, or set aside with a reason; a line known to be invalid
is never stored; the lines left untouched are all stored; and every reader renders the store
afterwards. 600 journals on SQLite (in-process, ~40 ms each), 40 on PostgreSQL through
the controller's own follower (``NodeRun.follow_once``).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape
from sqlalchemy import select

from agent.follow import follow as node_follow
from agent.protocol import EVENTS, MAX_EVENT_BYTES, MAX_EVENT_DEPTH
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement
from orchestrator.sweep.decode import Decoder, Quarantined
from orchestrator.sweep.dispatch import StderrProgress
from tests.hostile import follow_journal, journal, new_sweep, render_all

BASE = journal()
BASE_EVENTS = [json.loads(x) for x in BASE]
TERMINAL = len(BASE) - 1  # the real job_finished is the last line
GENERATIONS = {i for i, e in enumerate(BASE_EVENTS) if e["type"] == "generation"}
# 600, not 2,000 (~50 CPU-s less): each of the 13 damages is still drawn 90-200 times and
# each kind of invalid line 17-180 times (tallied over the repeatable draws); a hunt for
# rare cases sets SPECFLEET_HOSTILE_CASES=2000 and SPECFLEET_HYPOTHESIS=explore
CASES = int(os.environ.get("SPECFLEET_HOSTILE_CASES", "600"))

# -- mutations --------------------------------------------------------------------------

# values of another JSON type than any field of the real journal holds as an integer
OTHER_VALUES = st.one_of(st.none(), st.booleans(), st.text(max_size=8),
                         st.floats(allow_nan=False, allow_infinity=False).filter(
                             lambda f: not f.is_integer()),
                         st.lists(st.integers(), max_size=3),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@dataclass
class Line:
    data: bytes
    origin: int | None          # index in the real journal, None for a line added
    touched: bool = False       # changed in any way
    invalid: str | None = None  # why it must be set aside (known without the code under test)


@dataclass(repr=False)
class Case:
    lines: list[Line]
    skipped: set[int] = field(default_factory=set)
    reordered: bool = False
    ops: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # what was done to the real journal, not 50 kB of it
        return f"Case({'; '.join(self.ops)})"


def _obj(line: Line) -> dict | None:
    try:
        e = orjson.loads(line.data)
    except orjson.JSONDecodeError:  # not JSON, not UTF-8, or deeper than orjson reads
        return None
    return e if isinstance(e, dict) else None


def _set(line: Line, e: dict, invalid: str | None = None) -> None:
    line.data = json.dumps(e, separators=(",", ":")).encode()
    line.touched = True
    line.invalid = line.invalid or invalid


BASE_FIELDS = {"schema": (int,), "seq": (int,), "type": (str,), "ts": (int, float)}


def _required(e: dict) -> dict[str, tuple[type, ...]]:
    """The fields an event of its type must carry, with their types (the declaration)."""
    kind = EVENTS.get(e.get("type")) if isinstance(e.get("type"), str) else None
    return {**BASE_FIELDS, **(kind.required if kind else {})}


def _seq(line: Line):
    e = _obj(line)
    seq = e.get("seq") if e is not None else None
    return seq if type(seq) is int else None


@st.composite
def mutation(draw, case: Case) -> None:
    n = len(case.lines)
    # each line is damaged once at most: a second damage can undo the first (drop the
    # nesting that made it invalid) and the expected verdict would no longer be known
    fresh = [k for k, x in enumerate(case.lines) if not x.touched]
    if not fresh:
        return
    i = draw(st.sampled_from(fresh))
    line = case.lines[i]
    e = _obj(line)
    op = draw(st.sampled_from(["drop", "rename", "retype", "duplicate", "conflict", "reorder",
                               "skip", "forge", "nest", "grow", "nul", "utf8", "truncate"]))
    if op in ("drop", "rename", "retype", "nul", "nest", "grow", "conflict") and e is None:
        op = "truncate"
    case.ops.append(f"{op} line {i} (origin {line.origin})")
    if op in ("drop", "rename", "retype"):
        key = draw(st.sampled_from(sorted(e)))
        types = _required(e).get(key)
        value = e.pop(key)
        if op == "rename":
            e["x_" + key] = value
        elif op == "retype":
            e[key] = draw(OTHER_VALUES)
        # known invalid: a required field gone, or of a type the declaration does not allow
        # (a type renamed to another word may name another event type: not judged here)
        gone = types is not None and (op != "retype" or type(e[key]) not in types)
        _set(line, e, f"{op} of required {key}" if gone and not (
            key == "type" and op == "retype" and isinstance(e[key], str)) else None)
    elif op == "duplicate":  # the same line again: stored once
        case.lines.insert(draw(st.integers(i + 1, n)), Line(line.data, None))
    elif op == "conflict":  # the same seq, other content, after the first
        dup = Line(line.data, None, touched=True)
        _set(dup, {**e, "ts": (e.get("ts") if isinstance(e.get("ts"), (int, float))
                               else 0) + 1.5, "x_forged": True})
        case.lines.insert(draw(st.integers(i + 1, n)), dup)
    elif op == "reorder":
        j = draw(st.integers(0, n - 1))
        if TERMINAL not in (line.origin, case.lines[j].origin):
            case.lines[i], case.lines[j] = case.lines[j], line
            case.reordered = True
    elif op == "skip":
        if line.origin is not None:
            case.skipped.add(line.origin)
        del case.lines[i]
    elif op == "forge":
        kind = draw(st.sampled_from(["job_finished", "job_failed"]))
        seq = len(BASE) + 100 + draw(st.integers(0, 50))
        forged = ({"status": "ok", "generations": 10**6} if kind == "job_finished"
                  else {"error": "crash", "message": "forged"})
        case.lines.insert(i, Line(json.dumps({"schema": 1, "seq": seq, "type": kind,
                                              "ts": 1.0, **forged}).encode(), None,
                                  touched=True, invalid="forged job_finished"
                                  if kind == "job_finished" else None))
    elif op == "nest":
        depth = draw(st.integers(MAX_EVENT_DEPTH + 1, 3000))
        line.data = line.data[:-1] + b',"x_deep":' + b"[" * depth + b"]" * depth + b"}"
        line.touched, line.invalid = True, line.invalid or "nested too deep"
    elif op == "grow":
        # mostly small (fast), sometimes a real event's 3 MiB, rarely over the limit
        roll = draw(st.integers(0, 39))
        huge = roll == 0
        size = MAX_EVENT_BYTES + 10 if huge else 3 << 20 if roll < 4 else draw(
            st.sampled_from([1000, 70_000]))
        _set(line, {**e, "x_big": "y" * size}, "longer than the limit" if huge else None)
    elif op == "nul":
        strings = [k for k, v in e.items() if isinstance(v, str)]
        if strings:
            key = draw(st.sampled_from(strings))
            _set(line, {**e, key: e[key] + "\x00"},
                 None if key == "output_text" else "NUL outside output_text")
    elif op == "utf8":
        at = draw(st.integers(0, len(line.data)))
        line.data = line.data[:at] + b"\xff" + line.data[at:]
        line.touched, line.invalid = True, "not UTF-8"
    elif op == "truncate":
        at = draw(st.integers(1, max(1, len(line.data) - 1)))
        line.data = line.data[:at]
        line.touched = True
        line.invalid = line.invalid or "truncated"


@st.composite
def damaged_journal(draw) -> Case:
    case = Case([Line(x, i) for i, x in enumerate(BASE)])
    for _ in range(draw(st.integers(1, 4))):
        draw(mutation(case))
    return case


# -- the node and the controller, in-process -----------------------------------------------

def follow_in_process(store, case: Case, where) -> tuple[str, str | None]:
    """The node-side follower over the journal, then the decode boundary and the ledger, as
    ``NodeRun.follow_once`` drives them (set-aside lines said, progress lines printed, one
    batch stored); returns the sweep and why the node stopped, if it did."""
    path = where / "node.events.jsonl"
    path.write_bytes(b"".join(x.data + b"\n" for x in case.lines))
    sid = new_sweep(store, "n1", path)
    out = io.BytesIO()
    try:
        node_follow(path, 0, None, out=out)
        decoder, progress = Decoder("n1"), StderrProgress(io.StringIO())
        batch, raw = [], []
        for line in out.getvalue().split(b"\n")[:-1]:
            text = line.decode("utf-8", "surrogateescape")
            e = decoder.decode(text)
            if isinstance(e, Quarantined):
                store.quarantine(sid, "n1", [e])
                continue
            progress("n1", e)
            batch.append(e)
            raw.append(text)
        store.ingest(sid, "n1", batch, raw, [])
    except Exception as e:  # the node stopped: the property fails on it below
        return sid, f"{type(e).__name__}: {e}"
    return sid, None


def _digest(data: bytes) -> str:
    """A set-aside line's hash: a UTF-8 line's as it is; one with bytes that are not UTF-8
    as the journal holds them, stripped (as `sweeps verify` hashes it on the node)."""
    text = data.decode("utf-8", "surrogateescape")
    try:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        return hashlib.sha256(text.strip().encode("utf-8", "surrogateescape")).hexdigest()


def check(store, sid: str, case: Case, stopped: str | None) -> None:
    assert stopped is None, f"the node stopped: {stopped}"
    with store.engine.connect() as c:
        stored = dict(c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == sid)).all())
        runs = c.execute(select(Measurement.run_index).where(
            Measurement.sweep_id == sid)).scalars().all()
    from orchestrator.store.coverage import NOT_ASIDE, REPEAT

    kept = store.quarantined(sid)
    # a repeat of a stored event is kept as one (accounted for, not set aside): apart
    digests = {q.line_sha256 for q in kept if not q.reason.startswith(NOT_ASIDE)}
    repeated = [q.seq for q in kept if q.reason.startswith(REPEAT)]
    assert all(q.reason.strip() for q in kept)
    assert len(runs) == len(set(runs))  # one measurement per run index
    long_lines = sum(1 for q in kept if "longer than" in q.reason)
    matched = set()
    parsed = [_obj(x) for x in case.lines]
    seqs = [e.get("seq") if e is not None and type(e.get("seq")) is int else None
            for e in parsed]
    for line, e, seq in zip(case.lines, parsed, seqs, strict=True):
        is_stored = seq is not None and stored.get(seq) == e
        is_kept = _digest(line.data) in digests
        if len(line.data) > MAX_EVENT_BYTES:
            assert not is_stored and long_lines, "a line over the limit was not set aside"
            continue
        # every line: stored as written, or set aside (an identical line twice: once)
        assert is_stored or is_kept, (line.data[:300], line.invalid)
        assert not (is_stored and is_kept), line.data[:300]
        if line.invalid:
            assert not is_stored, f"{line.invalid}: stored {line.data[:300]!r}"
        if is_stored:
            matched.add(seq)
    assert set(stored) <= matched  # nothing stored that no line said
    for s in repeated:  # a repeat row: the journal holds its stored event twice at least
        assert sum(1 for e, seq in zip(parsed, seqs, strict=True)
                   if seq == s and stored.get(s) == e) >= 2, s
    generations_changed = case.reordered or bool(case.skipped & GENERATIONS) or any(
        x.touched and x.origin in GENERATIONS for x in case.lines)
    for pos, (line, e) in enumerate(zip(case.lines, parsed, strict=True)):
        if line.origin is None or line.touched:
            continue
        assert e is not None
        if line.origin == TERMINAL and generations_changed:
            continue  # the real end may then disagree with what the journal before it holds
        if e["seq"] in seqs[:pos]:
            continue  # an earlier line took its seq: the first one stored is kept
        assert stored.get(e["seq"]) == e, f"an untouched {e['type']} was not stored"


def test_damaged_real_journals_stop_no_node_and_lose_nothing(tmp_path_factory):
    where = tmp_path_factory.mktemp("hostile")
    store = open_store(f"sqlite:///{where / 'store.db'}")
    sweeps: list[str] = []

    @settings(max_examples=CASES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(damaged_journal())
    def one(case: Case) -> None:
        sid, stopped = follow_in_process(store, case, where)
        sweeps.append(sid)
        check(store, sid, case, stopped)

    one()
    # every reader renders the store that all of them went into; the sweep page says why
    # each line of its sweep was set aside
    written = render_all(store, sweeps[-1], where / "readers")
    for q in store.quarantined(sweeps[-1]):
        assert str(escape(q.reason)) in written["sweep page"]


@pytest.mark.parametrize("n", [40])
def test_damaged_journals_through_the_controllers_follower_on_postgresql(n, pg_url,
                                                                          tmp_path_factory):
    where = tmp_path_factory.mktemp("hostile-pg")
    store = open_store(pg_url)
    loop = asyncio.new_event_loop()
    last: list[str] = []

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(damaged_journal())
    def one(case: Case) -> None:
        f = follow_journal(store, [x.data for x in case.lines], where, loop=loop)
        last.append(f.sweep_id)
        check(store, f.sweep_id, case, f.stopped)

    try:
        one()
    finally:
        loop.close()
    render_all(store, last[-1], where / "readers")
