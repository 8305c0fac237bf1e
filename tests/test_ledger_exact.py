"""Issue 28's last ledger gaps, each on SQLite and PostgreSQL (``any_url``): every journal
line is accounted for exactly once (identical unreadable lines too, read again or not), a
run the job never had is set aside even when it comes before the plan, and a forged end —
a job_finished whose counts agree, a job_failed mid-journal — is not taken as the end.

Each journal is the real recorded one (``tests/hostile``) with lines planted here, followed
by the controller's own follower (or ingested in planted batches) into a real store; the
expected answers are known from how each journal was built.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import uuid
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from orchestrator.store import open_store
from orchestrator.store.coverage import set_aside_lines, stored_line_hashes
from orchestrator.store.models import Event, Measurement, QuarantinedEvent
from orchestrator.sweep.verify import compare
from tests.hostile import (
    JOB,
    InProcess,
    _renumber,
    dump,
    event,
    follow_journal,
    journal,
    seq_of,
)


def _state(store, sid: str) -> tuple[list[int], list[tuple[int | None, str]]]:
    with store.engine.connect() as c:
        stored = sorted(c.execute(select(Event.seq).where(Event.sweep_id == sid)).scalars())
        aside = sorted(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid)).all(), key=lambda r: (r[0] or 0, r[1]))
    return stored, aside


def _verify(store, sid: str, lines: list[bytes]) -> str:
    """`sweeps verify`'s verdict for the node, from the journal's lines as the node's digest
    script hashes them (stripped, one per non-empty line)."""
    digest = []
    for x in lines:
        text = x.decode("utf-8", "replace").strip()
        try:
            seq = json.loads(text).get("seq")
        except Exception:
            seq = None
        digest.append((seq if type(seq) is int else None,
                       hashlib.sha256(text.encode()).hexdigest()))
    return compare("n1", digest, stored_line_hashes(store, sid, "n1"),
                   *set_aside_lines(store, sid, "n1")).status


def _read_again(store, sid: str, where: Path) -> str:
    """`--attach`: the controller follows the node's journal once more (from the store's
    coverage, so holes are read again); the node's outcome."""
    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.dispatch import NodeRun, SweepOptions

    host = Host(name="n1", address="localhost", connection="local", python=sys.executable,
                root=str(where))
    run = NodeRun(host, store, sid, "again", SweepOptions(), lambda n, e: None)
    asyncio.run(run.follow_once(InProcess(host)))
    o = run.outcome()
    return o.status + (f": {o.detail}" if o.detail else "")


# -- 1. identical unreadable lines: one row each, read again or not -------------------------


def _damage(lines: list[bytes], at: int, alike: int, apart: int) -> list[bytes]:
    """``alike`` lines zeroed alike and ``apart`` zeroed differently, in place of the lines
    from index ``at`` (the seqs they held are lost)."""
    bad = [b"\x00" * 50] * alike + [b"\x00" * 50 + b"%d" % k for k in range(apart)]
    return lines[:at] + bad + lines[at + len(bad):]


def test_identical_unreadable_lines_are_one_row_each_and_a_re_read_adds_none(any_url,
                                                                             tmp_path):
    # before: one row for the five (unique by content); the outcome said "failed: 4
    # journal line(s) never reached the store" and each --attach read the hole again
    lines = journal()
    damaged = _damage(lines, seq_of(lines, "generation", 1) + 1, 5, 0)
    store = open_store(any_url)
    f = follow_journal(store, damaged, tmp_path / "node")
    outcome = f.outcome
    for k in range(3):  # followed, then read again twice (`--attach`)
        if k:
            outcome = _read_again(store, f.sweep_id, tmp_path / "node")
        stored, aside = _state(store, f.sweep_id)
        assert len(stored) == 23 and [s for s, _ in aside] == [None] * 5, k
        assert _verify(store, f.sweep_id, damaged) == "complete"
        assert outcome.startswith("ok: 5 journal line(s) set aside"), outcome


def test_one_row_of_several_identical_lines_is_not_all_of_them():
    # verify counts the rows: a journal of three identical unreadable lines that the store
    # set aside once has two lines it does not account for
    sha = hashlib.sha256(b"\x00" * 8).hexdigest()
    from collections import Counter

    assert compare("n1", [(None, sha)] * 3, {}, set(), Counter({sha: 3})).status == "complete"
    assert compare("n1", [(None, sha)] * 3, {}, set(), Counter({sha: 1})).status \
        == "incomplete"


_LOOP: dict = {}


@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(alike=st.integers(1, 6), apart=st.integers(0, 3), after=st.integers(0, 14),
       reads=st.integers(1, 3))
def test_any_unreadable_lines_are_accounted_for_once(tmp_path_factory, alike, apart, after,
                                                     reads):
    """Any mix of identical and distinct unreadable lines anywhere among the generations,
    the journal read 1-3 times: one set-aside row per line, the outcome ok with that count,
    `sweeps verify` complete."""
    if "store" not in _LOOP:
        _LOOP["store"] = open_store(f"sqlite:///{tmp_path_factory.mktemp('x') / 's.db'}")
        _LOOP["loop"] = asyncio.new_event_loop()
    store, where = _LOOP["store"], tmp_path_factory.mktemp("n")
    lines = journal()
    damaged = _damage(lines, seq_of(lines, "generation", after), alike, apart)
    f = follow_journal(store, damaged, where, loop=_LOOP["loop"])
    outcome = f.outcome
    for _ in range(reads - 1):
        outcome = _read_again(store, f.sweep_id, where)
    stored, aside = _state(store, f.sweep_id)
    assert [s for s, _ in aside] == [None] * (alike + apart)
    assert len(stored) == len(lines) - alike - apart
    assert outcome.startswith(f"ok: {alike + apart} journal line(s) set aside"), outcome
    assert _verify(store, f.sweep_id, damaged) == "complete"


# -- 2. a run the job never had, before the plan --------------------------------------------


def _ingest(store, sid: str, parts: list[list[bytes]], open_end: bool = False) -> None:
    for part in parts:
        store.ingest(sid, "n1", [event(x) for x in part], [x.decode() for x in part],
                     open_end=open_end)


def test_a_foreign_run_stored_before_the_plan_arrived_is_moved_aside(any_url):
    # the forged generation (run 500 at 99999 tok/s) is the last line of one read; the
    # plan comes in the next: it judges what was stored before it, measurement and all
    lines = journal()
    p = seq_of(lines, "plan")
    g = json.loads(lines[seq_of(lines, "generation")])
    forged = dump({**g, "run_index": 500, "decode_tok_s": 99999.0})
    lines = _renumber(lines[:p] + [forged] + lines[p:], p)
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _ingest(store, sid, [lines[:p + 1]])
    assert _state(store, sid)[0][-1] == p + 1  # stored, for now: no plan to judge it by
    _ingest(store, sid, [lines[p + 1:]])
    stored, aside = _state(store, sid)
    assert aside == [(p + 1, "not in the job: run_index 500 is outside the plan's 16 "
                             "generations (0-15) (stored before the plan was read; moved "
                             "aside)")]
    assert stored == [s for s in range(1, 30) if s != p + 1]
    with store.engine.connect() as c:
        runs = sorted(c.execute(select(Measurement.run_index).where(
            Measurement.sweep_id == sid)).scalars())
    assert runs == list(range(16))


def test_before_any_plan_the_sweeps_job_spec_judges_the_workload(any_url):
    # the plan line never arrives (lost): the job the controller sent names its workloads
    lines = journal()
    p = seq_of(lines, "plan")
    g = json.loads(lines[seq_of(lines, "generation")])
    forged = dump({**g, "seq": p + 1, "workload": "not-sent", "run_index": 3})
    honest = dump({**g, "seq": p + 2})
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, {**JOB, "workloads": [{"name": "code"}, {"name": "memo"}]},
                       None)
    _ingest(store, sid, [lines[:p] + [forged, honest]])
    stored, aside = _state(store, sid)
    assert aside == [(p + 1, "not in the job: workload 'not-sent' is not one of the "
                             "sweep's job's (code, memo)")]
    assert stored == [*range(1, p + 1), p + 2]


# -- 3. a forged end: a job_finished that counts right, a job_failed mid-journal ------------


def _forged_finish(lines: list[bytes]) -> tuple[list[bytes], int]:
    """A copy of the agent's own job_finished (the counts all agree) after the 16th
    generation, before the agent's summaries and its real end; and the forged one's seq."""
    i = seq_of(lines, "config_summary")
    real = json.loads(lines[-1])
    return _renumber(lines[:i] + [dump({**real, "seq": 0, "ts": 1.0})] + lines[i:], i), i + 1


def test_a_forged_job_finished_that_counts_right_is_not_the_end(any_url, tmp_path):
    # before: taken as the end: the agent's 6 config summaries, its acceptance table and
    # its real job_finished (8 lines) set aside as "after the job's end", the outcome ok
    lines, f_seq = _forged_finish(journal())
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    stored, aside = _state(store, f.sweep_id)
    assert aside == [(f_seq, "job_finished: not the agent's last word: the journal goes on "
                             f"after it to the job_finished at seq 29 (a forged or damaged "
                             f"end at seq {f_seq})")]
    assert stored == [s for s in range(1, 30) if s != f_seq]
    assert f.outcome.startswith("ok: 1 journal line(s) set aside"), f.outcome
    assert _verify(store, f.sweep_id, lines) == "complete"
    # read again once the end is recorded: the forged one stays aside, nothing moves
    assert _read_again(store, f.sweep_id, tmp_path / "node").startswith("ok: 1 journal")
    assert _state(store, f.sweep_id) == (stored, aside)


def test_a_forged_job_finished_read_alone_is_replaced_when_the_agent_goes_on(any_url):
    # followed live: the forged end is the last line of a read (taken as the end, as it
    # must be: nothing after it yet); the agent's lines after it come in later reads
    lines, f_seq = _forged_finish(journal())
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _ingest(store, sid, [lines[:f_seq]], open_end=True)
    assert _state(store, sid)[0][-1] == f_seq
    _ingest(store, sid, [lines[f_seq:f_seq + 3], lines[f_seq + 3:]], open_end=True)
    stored, aside = _state(store, sid)
    assert [s for s, _ in aside] == [f_seq]
    assert aside[0][1].startswith("job_finished: not the agent's last word")
    assert stored == [s for s in range(1, 30) if s != f_seq]


def test_after_the_recorded_end_a_later_job_finished_is_set_aside(any_url):
    # the other side of the same rule: once the node's end is recorded (the agent gone), a
    # job_finished appended after it is a forged line, whatever it counts
    lines = journal()
    late = dump({**json.loads(lines[-1]), "seq": 29, "ts": 9.0})
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _ingest(store, sid, [lines], open_end=True)
    _ingest(store, sid, [[late]], open_end=False)
    stored, aside = _state(store, sid)
    assert stored == list(range(1, 29))
    assert aside == [(29, "after the job's end: seq 29 follows its job_finished at seq 28")]


def test_a_forged_job_failed_mid_journal_is_set_aside_and_never_said_as_the_end(any_url,
                                                                               tmp_path):
    # checked: it is set aside ("the journal goes on after it"), the node is ok, and the
    # controller never prints it as the agent's failure
    lines = journal()
    j = seq_of(lines, "generation", 1) + 1
    forged = dump({"schema": 1, "seq": 0, "type": "job_failed", "ts": 1.0,
                   "error": "crash", "message": "forged failure"})
    lines = _renumber(lines[:j] + [forged] + lines[j:], j)
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    stored, aside = _state(store, f.sweep_id)
    assert [s for s, _ in aside] == [j + 1] and aside[0][1].startswith("job_failed: ")
    assert stored == [s for s in range(1, 30) if s != j + 1]
    assert f.outcome.startswith("ok: 1 journal line(s) set aside"), f.outcome
    assert not [s for s in f.said if "forged failure" in s and "set aside" not in s], f.said
    assert _verify(store, f.sweep_id, lines) == "complete"


def test_a_forged_job_failed_at_a_read_edge_is_moved_aside_by_the_next(any_url):
    # the last line of a read (nothing after it yet, so it stands); the next read shows the
    # journal went on: it is moved aside and the last event is the agent's real end
    lines = journal()
    j = seq_of(lines, "generation", 1) + 1
    forged = dump({"schema": 1, "seq": 0, "type": "job_failed", "ts": 1.0,
                   "error": "crash", "message": "forged failure"})
    lines = _renumber(lines[:j] + [forged] + lines[j:], j)
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _ingest(store, sid, [lines[:j + 1]], open_end=True)
    assert store.last_event(sid, "n1")["type"] == "job_failed"
    _ingest(store, sid, [lines[j + 1:]], open_end=True)
    stored, aside = _state(store, sid)
    assert [s for s, _ in aside] == [j + 1]
    assert store.last_event(sid, "n1")["type"] == "job_finished"



def test_a_downgrade_below_0016_says_the_later_occurrences_it_deletes(any_url):
    # three set-aside lines, two of them alike: the older store keeps one row per content,
    # so going back deletes one row, said and refused without --yes; the default-valued
    # occurrence column itself carries nothing the older store lacks
    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.sweep.decode import Quarantined

    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    store.quarantine("s1", "n1", [Quarantined(None, "not JSON", "}}"),
                                  Quarantined(None, "not JSON", "}}", occurrence=2),
                                  Quarantined(None, "not JSON", "{{")])
    r = CliRunner().invoke(main, ["db", "downgrade", "0015", "--db", any_url])
    assert r.exit_code == 1, r.output
    assert "would delete:\n  table quarantined_events: 1 row(s)\n" in r.output, r.output
    assert store.quarantined_count("s1", "n1") == 3
    r = CliRunner().invoke(main, ["db", "downgrade", "0015", "--yes", "--db", any_url])
    assert r.exit_code == 0 and r.output.strip() == "store at revision 0015", r.output
    assert open_store(any_url).quarantined_count("s1", "n1") == 2  # upgraded back
