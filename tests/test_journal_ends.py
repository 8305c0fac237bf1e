"""Where a node's journal ends (issue 28, 3): a forged end, a seq far past the journal and a
line past the real end are set aside with their reason; an honest journal (read in any
batches, its holes read again, resumed after a failure) loses nothing to these rules.

The journals are the real recorded one (``tests/hostile``), changed as a hostile node would;
they go through the controller's own follower (``NodeRun.follow_once``) or the store's
ingest, into a real SQLite store.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select

from orchestrator.store import open_store
from orchestrator.store.coverage import coverage
from orchestrator.store.journal_ends import CONTINUED, MAX_SEQ_GAP
from orchestrator.store.journal_ends import _runs as seq_runs
from orchestrator.store.models import Event, QuarantinedEvent, Run
from tests.hostile import (
    JOB,
    InProcess,
    _gen,
    _insert_after,
    _renumber,
    dump,
    event,
    follow_journal,
    journal,
    new_sweep,
    placed,
    seq_of,
)
from tests.store_templates import fresh_sqlite

FAILED = {"schema": 1, "type": "job_failed", "ts": 1.0, "error": "crash", "message": "forged"}


def _aside(store, sid: str) -> dict[int | None, str]:
    with store.engine.connect() as c:
        return dict(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid)).all())


def _stored(store, sid: str) -> dict[int, str]:
    with store.engine.connect() as c:
        return dict(c.execute(select(Event.seq, Event.type).where(Event.sweep_id == sid)).all())


def _failed_after(reason_seq: int, next_seq: int, kind: str) -> str:
    return (f"job_failed: the journal goes on after it (seq {next_seq} is a {kind}, not a new "
            f"agent's job_started): a forged or damaged end at seq {reason_seq}")


def _jump(seq: int, top: int) -> str:
    return (f"past the journal: seq {seq} is {seq - top} past seq {top}, where its numbered "
            "lines end (an agent numbers its events one by one; at most 64 lines in a row "
            "may be unreadable)")


def _after_end(seq: int, end: int, moved: bool = False) -> str:
    return (f"after the job's end: seq {seq} follows its job_finished at seq {end}"
            + (" (stored before the end was read; moved aside)" if moved else ""))


# -- a forged job_failed in the middle of a real journal -----------------------------------

def _in_seq(lines):  # seq 7 after the 2nd generation; the agent's own lines go on from 8
    return _renumber(_insert_after(_gen(1), lambda ls: dump({**FAILED, "seq": 7}))(lines), 6)


def _at(seq: int):  # the same place, a seq the journal has not reached
    return _insert_after(_gen(1), lambda ls: dump({**FAILED, "seq": seq}))


@pytest.mark.parametrize("make, forged, reason", [
    (_in_seq, 7, _failed_after(7, 8, "generation")),
    (_at(29), 29, _after_end(29, 28)),
    (_at(29 + MAX_SEQ_GAP), 29 + MAX_SEQ_GAP, _jump(29 + MAX_SEQ_GAP, 28)),
], ids=["its own seq", "the next seq", "past the gap"])
def test_a_forged_job_failed_mid_journal_is_set_aside_and_the_node_ends_ok(
        make, forged, reason, tmp_path):
    # it was stored and the node's outcome was "failed: agent: forged" (the next seq: it was
    # the last event) or "ok" with a job_failed among the stored events (its own seq)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    f = follow_journal(store, make(journal()), tmp_path / "node")
    assert f.stopped is None
    assert f.outcome == ("ok: 1 journal line(s) set aside (`specfleet review --sweep "
                         f"{f.sweep_id}` lists why)")
    assert _aside(store, f.sweep_id) == {forged: reason}
    assert not any("agent failed" in x for x in f.said)  # never said as the node's end
    stored = _stored(store, f.sweep_id)
    assert "job_failed" not in stored.values() and len(stored) == 28
    assert coverage(store, f.sweep_id, "n1").missing == 0


class _Node:
    """One node's journal followed again and again as it grows (the agent still running
    between reads), by the controller's own follower, into one sweep."""

    def __init__(self, store, where: Path):
        from orchestrator.fleet.inventory import Host
        from orchestrator.sweep.dispatch import NodeRun, StderrProgress, SweepOptions

        self.sid = uuid.uuid4().hex[:12]
        self.path, folder = placed(where, self.sid, Path(__file__).resolve().parents[1])
        self.host = Host(name="n1", address="localhost", connection="local",
                         python=sys.executable, root=str(where))
        new_sweep(store, "n1", self.path, folder, sys.executable, self.sid, where)
        self.said = io.StringIO()
        self.run = NodeRun(self.host, store, self.sid, "test", SweepOptions(),
                           StderrProgress(self.said))

    def append_and_follow(self, lines: list[bytes]) -> str:
        with open(self.path, "ab") as f:
            f.write(b"".join(x + b"\n" for x in lines))
        asyncio.run(self.run.follow_once(InProcess(self.host)))
        o = self.run.outcome()
        return o.status + (f": {o.detail}" if o.detail else "")


def test_a_forged_job_failed_stored_before_the_journal_went_on_is_moved_aside(tmp_path):
    # read while the agent runs: the forged end is the last line for a while (stored, the
    # node would fail on it); the agent's next lines show it false, and it is moved aside
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _in_seq(journal())
    node = _Node(store, tmp_path / "node")
    assert node.append_and_follow(lines[:7]) == "failed: agent: forged"
    assert "[n1] agent failed: forged" in node.said.getvalue()  # the last line, for now
    assert node.append_and_follow(lines[7:]).startswith("ok: 1 journal line(s) set aside")
    assert _aside(store, node.sid) == {7: _failed_after(7, 8, "generation")}
    assert "job_failed" not in _stored(store, node.sid).values()
    assert "set aside a journal line (seq 7): job_failed: the journal goes on" in \
        node.said.getvalue()


def _resumed(lines: list[bytes]) -> list[bytes]:
    """The real journal as a crash after the 2nd generation and a --resume leave it: the
    first agent's job_failed, then a new agent's start and the rest of the job."""
    i = seq_of(lines, "generation", 2)
    head = [*lines[:i], dump({**FAILED, "message": "RuntimeError: out of memory"})]
    again = [x for x in lines[:i] if event(x)["type"] != "generation"] + lines[i:]
    return _renumber(head + again, i)


def test_an_honest_job_failed_before_a_resume_is_kept(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = _resumed(journal())
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None and f.outcome == "ok"
    assert _aside(store, f.sweep_id) == {}
    stored = _stored(store, f.sweep_id)
    assert len(stored) == len(lines) == 33 and stored[7] == "job_failed"
    assert stored[8] == "job_started"


def test_an_honest_job_failed_at_the_end_is_stored_and_said(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    lines = journal()
    i = seq_of(lines, "generation", 2)
    end = dump({**FAILED, "seq": i + 1, "message": "RuntimeError: out of memory"})
    f = follow_journal(store, [*lines[:i], end], tmp_path / "node")
    assert f.outcome == "failed: agent: RuntimeError: out of memory"
    assert f.said.count("[n1] agent failed: RuntimeError: out of memory") == 1
    assert _aside(store, f.sweep_id) == {} and _stored(store, f.sweep_id)[i + 1] == "job_failed"


# -- a forged line past the end, read before the end --------------------------------------

def _runs(store, sid: str) -> list[tuple]:
    with store.engine.connect() as c:
        return sorted(c.execute(select(Run.workload, Run.mode, Run.config_key,
                                       Run.decode_tok_s_median).where(Run.sweep_id == sid)))


def test_a_forged_summary_past_the_end_stored_first_is_moved_aside_with_its_run(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    real = journal()
    events = [event(x) for x in real]
    clean = uuid.uuid4().hex[:12]
    store.create_sweep(clean, JOB, None)
    store.ingest(clean, "n1", events, [x.decode() for x in real])
    summary = events[seq_of(real, "config_summary")]
    forged = {**summary, "seq": 29, "config": {**summary["config"], "num_draft_tokens": 9},
              "num_draft_tokens": 9, "metrics": {**summary["metrics"], "decode_tok_s": {
                  **summary["metrics"]["decode_tok_s"], "median": 99999.0}}}
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    store.ingest(sid, "n1", [*events[:-1], forged])  # read before the real end arrived
    assert len(_runs(store, sid)) == len(_runs(store, clean)) + 1
    refused: list = []
    store.ingest(sid, "n1", events[-1:], None, refused)
    assert _aside(store, sid) == {29: _after_end(29, 28, moved=True)}
    assert [r.seq for r in refused] == [29]
    assert _runs(store, sid) == _runs(store, clean)
    assert sorted(_stored(store, sid)) == list(range(1, 29))


# -- properties: an honest journal loses nothing; a forged seq never stands -----------------

BASE = journal()
_STORE: dict = {}


def _store(tmp_path_factory):
    if "s" not in _STORE:  # one store for every example (opening one migrates it)
        _STORE["s"] = open_store(fresh_sqlite(tmp_path_factory.mktemp('ends') / 's.db'))
    return _STORE["s"]


def _read(store, sid: str, lines: list[bytes], cuts: list[int]) -> None:
    """What the follower sends from the store's coverage on, stored in batches cut at
    ``cuts`` (a live stream goes out in pieces)."""
    start = coverage(store, sid, "n1").through
    sent = [x for x in lines if event(x)["seq"] > start]
    edges = [0, *sorted(c for c in set(cuts) if 0 < c < len(sent)), len(sent)]
    for a, b in zip(edges, edges[1:]):
        store.ingest(sid, "n1", [event(x) for x in sent[a:b]], [x.decode() for x in sent[a:b]])


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, 40), max_size=5),
       lost=st.sets(st.integers(1, 28), max_size=6), more=st.lists(st.integers(1, 40),
                                                                    max_size=3),
       resumed=st.booleans())
def test_an_honest_journal_in_any_batches_with_holes_read_again_is_stored_whole(
        tmp_path_factory, cuts, lost, more, resumed):
    # a link drop or a store that lost rows: holes below the last stored event, read again
    # from the coverage on (as `sweep --attach` does); none may look like a forgery
    store = _store(tmp_path_factory)
    lines = _resumed(BASE) if resumed else BASE
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _read(store, sid, lines, cuts)
    with store.engine.begin() as c:  # rows lost after they were stored
        c.execute(delete(Event).where(Event.sweep_id == sid, Event.seq.in_(lost)))
    _read(store, sid, lines, more)
    assert _aside(store, sid) == {}
    with store.engine.connect() as c:
        stored = dict(c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == sid)).all())
    assert stored == {event(x)["seq"]: event(x) for x in lines}


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 27), past=st.integers(1, 2**40), kind=st.sampled_from(
    ["notice", "job_failed"]), cuts=st.lists(st.integers(1, 30), max_size=4))
def test_a_forged_seq_past_the_end_never_stands(tmp_path_factory, at, past, kind, cuts):
    # any seq past the real end, anywhere before it, read in any batches: set aside with
    # the reason its distance gives (known without the code: the gap and where it stands)
    store = _store(tmp_path_factory)
    seq = 28 + past
    forged = dump({"schema": 1, "seq": seq, "type": kind, "ts": 1.0, "message": "forged",
                   "error": "crash"})
    lines = [*BASE[:at], forged, *BASE[at:]]
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _read(store, sid, lines, cuts)
    edges = sorted(c for c in set(cuts) if 0 < c < len(lines))
    # the numbered lines read up to and with the forged one's batch
    batch_end = next((c for c in edges if c > at), len(lines))
    top = max((event(x)["seq"] for x in lines[:batch_end] if x != forged), default=0)
    jumped = seq > top + MAX_SEQ_GAP
    moved = not jumped and batch_end < len(lines)  # stored first, the real end read later
    assert _aside(store, sid) == {seq: _jump(seq, top) if jumped else _after_end(
        seq, 28, moved=moved)}
    assert sorted(_stored(store, sid)) == list(range(1, 29))
    assert coverage(store, sid, "n1").missing == 0


def test_the_real_journal_has_no_gap_the_rule_would_refuse():
    # the rule's premise, on the journal the agent wrote: seqs 1, 2, 3 … one by one
    seqs = [json.loads(x)["seq"] for x in BASE]
    assert seqs == list(range(1, len(BASE) + 1))


def _runs_by_window(seqs: list[int]) -> set[int]:
    """The rule as worded: every seq in some CONTINUED lines in a row, each one past the
    one before (a window at a time, as the ledger first judged it)."""
    out: set[int] = set()
    for k in range(len(seqs) - CONTINUED + 1):
        w = seqs[k:k + CONTINUED]
        if all(b - a == 1 for a, b in zip(w, w[1:])):
            out.update(w)
    return out


def test_runs_planted():
    # 1-4 is a run, 7 alone is not, 10-12 is too short, 20-25 is one, 3 again breaks nothing
    seqs = [1, 2, 3, 4, 7, 10, 11, 12, 20, 21, 22, 23, 24, 25, 3]
    assert seq_runs(seqs) == {1, 2, 3, 4, 20, 21, 22, 23, 24, 25}
    assert seq_runs(list(range(5, 1005))) == set(range(5, 1005))
    assert seq_runs([1, 2, 3]) == set()


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.one_of(st.integers(1, 40), st.just(None)), max_size=60))
def test_runs_is_the_windowed_rule_for_any_read(steps):
    # reads built from runs and jumps (None: the next seq; a number: a jump to it)
    seqs: list[int] = []
    for s in steps:
        seqs.append(s if s is not None else (seqs[-1] + 1 if seqs else 1))
    assert seq_runs(seqs) == _runs_by_window(seqs)
