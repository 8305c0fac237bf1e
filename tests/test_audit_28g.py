"""Seventh audit of issue 28: the re-judging of conflicts with a forged end (``_rejudged``).

A forged end claiming the seq the agent writes next, on an unkeyed journal, with more than
one line at that seq before or after it, read over several reads; what must come of each
journal is counted from how it was built (the agent's 28 events stored, every other line
set aside once), never read from the code under test.
"""

from __future__ import annotations

import pytest

from orchestrator.store import open_store
from tests.hostile import dump, event, follow_journal, journal
from tests.test_audit_28 import _state
from tests.test_audit_28b import _follow_placed
from tests.test_audit_28c import ALL, _journal_path, _node
from tests.test_audit_28e import _forged_end_at_the_agents_next_seq


def _store_rows(store) -> list:
    """What a read may change: events, the lines set aside, measurements, runs (not the
    node's row: each read stamps its time)."""
    from sqlalchemy import MetaData, select

    md = MetaData()
    md.reflect(store.engine)
    with store.engine.connect() as c:
        return [(t, sorted(map(repr, c.execute(select(md.tables[t])).all())))
                for t in sorted(md.tables) if "event" in t or t in ("measurements", "runs")]


def _append(where, lines: list[bytes]) -> None:
    with open(_journal_path(where), "ab") as out:
        out.write(b"".join(x + b"\n" for x in lines))


def _running(store, sid: str) -> None:
    """The node's agent still running as a read ends (the harness's agent has no process:
    its follower marks the node finished at the end of each read; a live one streams on)."""
    store.set_sweep_node(sid, "n1", state="running")


def _two_reads(url: str, tmp_path, first: list[bytes], rest: list[bytes]):
    store = open_store(url)
    where = tmp_path / "node"
    f = follow_journal(store, first, where)
    _running(store, f.sweep_id)
    _append(where, rest)
    outcome = _follow_placed(store, f.sweep_id, where)
    return store, f.sweep_id, where, outcome


# reaudit 28g: the agent's seq 21 written twice (byte-identical) after a forged end at 21,
# read before the agent's end: both copies set aside as conflicts. When the agent's end is
# read, the forged end is set aside and _rejudged stores the first copy and DELETES BOTH
# rows: the second copy is in the journal, neither stored nor set aside.
@pytest.mark.parametrize("kind", ["job_finished", "job_failed"])
def test_two_copies_of_the_agents_line_set_aside_earlier_leave_one_accounted(
        any_url, tmp_path, kind):
    lines, forged, at = _forged_end_at_the_agents_next_seq(kind)
    store, sid, where, outcome = _two_reads(
        any_url, tmp_path, lines[:at] + [forged, lines[at], lines[at]], lines[at + 1:])
    stored, aside = _state(store, sid)
    assert stored == ALL, stored
    code, node = _node(any_url, sid, where)
    assert (code, node["status"]) == (0, "complete"), (outcome, aside, node)
    assert aside == [21, 21], aside  # the forged end and the repeat


@pytest.mark.parametrize("kind", ["job_finished", "job_failed"])
def test_the_agents_line_in_a_third_read_after_a_forged_end(sqlite_url, tmp_path, kind):
    """The forged end read alone, the agent's seq 21-23 in a second read, the rest in a
    third: the agent's 28 events stored, the forged end alone aside, verify complete; a
    further --attach changes no row."""
    lines, forged, at = _forged_end_at_the_agents_next_seq(kind)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:at] + [forged], where)
    _running(store, f.sweep_id)
    _append(where, lines[at:at + 3])
    _follow_placed(store, f.sweep_id, where)
    _running(store, f.sweep_id)
    _append(where, lines[at + 3:])
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, [21])
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"]) == (0, "complete"), node
    before = _store_rows(store)
    _follow_placed(store, f.sweep_id, where)
    assert _store_rows(store) == before


def _forged_summary() -> bytes:
    x = event(journal()[20])
    return dump({**x, "decode_tok_s_mean": 1e6} if "decode_tok_s_mean" in x else
                {**x, "forged": True})


@pytest.mark.parametrize("order", ["end first", "summary first"])
def test_a_forged_end_and_a_forged_line_at_the_agents_seq(sqlite_url, tmp_path, order):
    """A forged end and a forged config_summary both at seq 21, before the agent's: the
    agent's 28 events... or, unkeyed, the first line of seq 21 that passes. What matters
    here: every line accounted (stored once or set aside once), verify and the outcome
    agree, and re-attach changes nothing."""
    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    two = [forged, _forged_summary()]
    if order == "summary first":
        two.reverse()
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:at] + two + lines[at:], where)
    stored, aside = _state(store, f.sweep_id)
    assert stored == ALL and aside == [21, 21], (stored, aside)
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code == 0) == f.outcome.startswith("ok"), (f.outcome, node)
    before = _store_rows(store)
    _follow_placed(store, f.sweep_id, where)
    assert _store_rows(store) == before


def _live_second_batch(store, sid: str, where, rest: list[bytes]) -> None:
    """The agent's further lines as the live follower takes them: the next batch of the same
    follow (no line read again), stored by the ingest the follower calls."""
    _append(where, rest)
    store.ingest(sid, "n1", [event(x) for x in rest], [x.decode() for x in rest],
                 open_end=True)


# reaudit 28g (measured, SQLite and PostgreSQL): two byte-identical copies of the agent's
# seq 21 after a forged end at 21, read live before the agent's end, are set aside as two
# conflicts. The next batch brings the agent's end: the forged end is set aside,
# ledger._rejudged stored the first copy and deleted BOTH rows (the second "a copy of the
# line just stored"), though it is another line of the journal, which a read of the whole
# journal keeps as a repeat. Fixed: the second copy's row stays, judged again as a repeat
# (the forged end and the repeat aside, as by --attach; verify complete, repeats [21]).
def _live_copies(url: str, tmp_path, kind: str):
    lines, forged, at = _forged_end_at_the_agents_next_seq(kind)
    store = open_store(url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:at] + [forged, lines[at], lines[at]], where)
    _running(store, f.sweep_id)
    _live_second_batch(store, f.sweep_id, where, lines[at + 1:])
    return store, f.sweep_id, where


@pytest.mark.parametrize("kind", ["job_finished", "job_failed"])
def test_two_copies_set_aside_earlier_read_live_stay_accounted(any_url, tmp_path, kind):
    store, sid, where = _live_copies(any_url, tmp_path, kind)
    assert _state(store, sid) == (ALL, [21, 21])  # the forged end and the repeat
    code, node = _node(any_url, sid, where)
    assert (code, node["status"], node["repeats"], node["journal_lines"]) == (
        0, "complete", [21], 30), node


# reaudit 28g (measured, SQLite and PostgreSQL): after that live follow, `sweep --attach`
# read seq 21 again and ADDED a row (the copy, "repeat: a repeat of stored seq 21"): the
# same journal left 1 row read live and 2 read by --attach (test_two_copies_set_aside_
# earlier_leave_one_accounted), and the first --attach after a live follow changed the
# store. Fixed with the above: the live follow keeps the copy's row as the repeat.
@pytest.mark.parametrize("kind", ["job_finished", "job_failed"])
def test_an_attach_after_the_live_follow_of_two_copies_changes_nothing(any_url, tmp_path,
                                                                       kind):
    store, sid, where = _live_copies(any_url, tmp_path, kind)
    before = _store_rows(store)
    _follow_placed(store, sid, where)
    assert _node(any_url, sid, where)[0] == 0
    assert _store_rows(store) == before


@pytest.mark.parametrize("parts", ["one read", "the second end alone"])
def test_two_forged_ends_at_the_agents_next_seq(sqlite_url, parts):
    """A forged job_finished and a forged job_failed (or a second job_finished) both at
    seq 21 before the agent's line of it, read live: the agent's 28 events stored, the two
    forged ends set aside once each."""
    import uuid

    from tests.hostile import JOB
    from tests.test_ledger_exact import _ingest

    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    other = forged.replace(b'"job_finished"', b'"job_failed"')
    store = open_store(sqlite_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    _ingest(store, sid, {"one read": [lines[:at] + [forged, other] + lines[at:]],
                         "the second end alone": [lines[:at] + [forged], [other],
                                                  lines[at:]]}[parts], open_end=True)
    assert _state(store, sid) == (ALL, [21, 21])


def test_a_forged_end_on_a_keyed_journal_is_set_aside_at_the_boundary(sqlite_url, tmp_path):
    """Keyed: the forged end carries no valid MAC; set aside before the ledger sees it, the
    agent's seq 21 stored, verify complete, a second --attach changes nothing."""
    import secrets

    from tests.hostile import signed_by_agent

    key = secrets.token_bytes(32)
    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    signed = signed_by_agent(lines, key, set())
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, signed[:at] + [forged] + signed[at:], where, key=key)
    assert _state(store, f.sweep_id) == (ALL, [21])
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"]) == (0, "complete"), node
    before = _store_rows(store)
    _follow_placed(store, f.sweep_id, where)
    assert _store_rows(store) == before


# reaudit 28g (measured, SQLite): the agent killed after its seq 27 (no end of its own);
# a forged job_finished at seq 21 that IS consistent with the counts (16 generations, the
# plan's 16) stood as the job's end: no later job_finished set it aside, so the agent's
# seq 21 (a conflict) and 22-27 ("after the job's end") were set aside, outcome "ok: 7
# journal line(s) set aside", verify complete. The same journal without the forged line:
# "failed: the agent stopped before finishing … run `specfleet sweep --resume`". An
# unkeyed limit (a forged end appended after seq 27 still reads "ok"), but the journal
# here says more: a second line at the end's own seq, going on in order from it. Fixed
# (journal_ends.gone_on): while the agent may still write, a job_finished the journal goes
# on after from another line of its seq, CONTINUED (4) lines in a row, is not its last
# word: set aside, the agent's lines stored, the node "failed … --resume".
def test_a_forged_end_before_a_killed_agents_last_lines_does_not_read_ok(sqlite_url,
                                                                        tmp_path):
    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    store = open_store(sqlite_url)
    f = follow_journal(store, lines[:at] + [forged] + lines[at:27], tmp_path / "node")
    assert _state(store, f.sweep_id) == (ALL[:27], [21]), f.outcome
    assert not f.outcome.startswith("ok"), f.outcome


@pytest.mark.parametrize("cut", [0, 1, 2, 5], ids=["end alone", "its seq 21 with it",
                                                   "21-22 with it", "21-25 with it"])
def test_a_forged_end_before_a_killed_agents_last_lines_read_live(any_url, tmp_path, cut):
    """The same journal read live in two batches (the end stored, the agent's lines kept
    aside after it, then the rest): the same store as one read, the node not ok, and an
    --attach after it changes nothing."""
    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:at] + [forged] + lines[at:at + cut], where)
    _running(store, f.sweep_id)
    _live_second_batch(store, f.sweep_id, where, lines[at + cut:27])
    assert _state(store, f.sweep_id) == (ALL[:27], [21])
    before = _store_rows(store)
    assert not _follow_placed(store, f.sweep_id, where).startswith("ok")
    assert _store_rows(store) == before


# reaudit 28g (measured, SQLite): as above, but the second copy is the same JSON in other
# bytes. Re-judged, it was neither stored (its seq now held) nor re-labelled: its row kept
# "conflict: seq 21 arrived earlier in this read with other content", though the event
# stored at 21 is the same event (read by --attach in one read it is "repeat: …"). Fixed:
# a copy (the same JSON) of the line the re-judging stores is relabelled a repeat.
def test_a_rewritten_copy_kept_aside_earlier_is_a_repeat_once_its_line_is_stored(
        sqlite_url, tmp_path):
    import json

    from sqlalchemy import select

    from orchestrator.store.models import QuarantinedEvent

    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    copy = json.dumps(event(lines[at])).encode()
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:at] + [forged, lines[at], copy], where)
    _running(store, f.sweep_id)
    _live_second_batch(store, f.sweep_id, where, lines[at + 1:])
    assert _state(store, f.sweep_id) == (ALL, [21, 21])
    assert _node(sqlite_url, f.sweep_id, where)[0] == 0
    with store.engine.connect() as c:
        why = [r for r in c.execute(select(QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == f.sweep_id)).scalars() if "job_finished" not in r]
    assert len(why) == 1 and why[0].startswith("repeat:"), why
