"""Fourth audit of issue 28: what earlier audits (test_audit_28, 28b, 28c) did not plant.

A node launched before keys (unkeyed: its rows' journal_key is NULL) whose forged line took
a set-aside row of the agent's seq; a journal truncated on the node and then a forged line
claiming a seq only the store still holds (is `sweeps verify`'s advice safe?); lines whose
seq is no seq (0, negative) appended after a read; a line over the limit that is not the
agent's; a store restored from an older backup; a forged announcement of another schema.

Each journal is the real recorded one (``tests/hostile``: 28 lines, 16 measurements),
signed as its agent signs it where the node is keyed; what must come of it is counted from
how it was built, never read from the code under test.
"""

from __future__ import annotations

import json
import secrets

import pytest
from sqlalchemy import delete, func, select

from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement, QuarantinedEvent
from tests.hostile import dump, event, follow_journal, journal, seq_of, signed_by_agent
from tests.test_audit_28 import FORGED_SPEED, _cli_verify, _real_speeds, _speeds, _state
from tests.test_audit_28b import _follow_placed
from tests.test_audit_28c import ALL, _journal_path, _lose, _node


def _forged(k: int, **change) -> bytes:
    """A copy of the agent's line at index ``k`` (seq k + 1) at a forged speed, unsigned."""
    return dump({**event(journal()[k]), "decode_tok_s": FORGED_SPEED, **change})


def _lines(key: bytes | None) -> list[bytes]:
    """The agent's 28 lines as its journal holds them: signed when the node is keyed."""
    return signed_by_agent(journal(), key, set()) if key else journal()


def _aside_rows(store, sid: str) -> int:
    with store.engine.connect() as c:
        return c.execute(select(func.count()).select_from(QuarantinedEvent).where(
            QuarantinedEvent.sweep_id == sid)).scalar()


# -- 1. an unkeyed node: a row of seq 7 that is not its event covers the lost event ---------

K7 = seq_of(journal(), "generation", 2)  # index 6: the agent's seq 7, run 2 (666.62 tok/s)


def _unkeyed_row_then_lost(url: str, tmp_path, kind: str):
    """An unkeyed node whose journal holds a row of seq 7 besides its event: after the
    agent's 28 lines, a forged line claiming seq 7 (set aside as a conflict); or seq 7's
    line holding a key twice (stored written again, the line kept beside it). Then seq 7's
    event is lost from the store (a lost batch, a restore, rows deleted by hand) with its
    measurement."""
    store = open_store(url)
    where = tmp_path / "node"
    lines = journal()
    if kind == "conflict":
        lines.append(_forged(K7))
    else:
        lines[K7] = lines[K7].replace(b'{"schema":1,', b'{"schema":1,"schema":1,', 1)
    f = follow_journal(store, lines, where)  # no key: a node launched before keys
    assert _state(store, f.sweep_id) == (ALL, [K7 + 1])  # the forged line, or seq 7's own
    assert _speeds(store, f.sweep_id) == _real_speeds()
    with store.engine.begin() as c:
        _lose(c, f.sweep_id, K7 + 1)
    return store, f.sweep_id, where


# reaudit 28d: on an unkeyed node the conflict row of the forged line (its reason starts
# "conflict:", which coverage.coverage and verify's stands_in both count) covers seq 7 once
# the agent's event of seq 7 is gone: `sweeps verify` says "complete" (exit 0, no hole,
# "2 set aside" against 1 row: the agent's line counted "set aside under its seq" against
# the forged line's row, which the forged line itself already used). Likewise the
# "rewritten:" row of a line stored written again (a key twice): the line is counted against
# it, though that row stands for a stored event, not a line set aside.
# Closed: a conflict: or rewritten: row covers no seq and stands in for no other line of it
# (coverage.NEVER_COVER), keyed or not; a rewritten: row beside a lost event accounts for no
# line unless the event it became was itself set aside (coverage._refused_as_written).
KINDS = pytest.mark.parametrize("kind", ["conflict", "rewritten"])


@KINDS
def test_unkeyed_verify_sees_the_agents_lost_event_past_another_row_of_its_seq(any_url,
                                                                              tmp_path, kind):
    store, sid, where = _unkeyed_row_then_lost(any_url, tmp_path, kind)
    assert _aside_rows(store, sid) == 1
    code, node = _node(any_url, sid, where)
    # the agent's line of seq 7 is neither stored nor set aside (the one row is the
    # forged line's): a hole, and the json agrees with the exit code
    assert (code, node["status"], node["holes"]) == (1, "incomplete", [[K7 + 1, K7 + 1]]), node
    assert node["set_aside"] <= 1, node


# What --attach then does (measured): "conflict": the forged line, a second line claiming a
# stored seq, goes out on every re-read while the agent's first line stays back, so with
# event 7 gone the forged line is stored as seq 7: run 2 at 99999 tok/s, outcome "ok".
# "rewritten": seq 7 counts as covered and is never read: 27 of 28 events, 15 of 16
# measurements, outcome "ok".
# Closed: with those rows covering nothing, --attach reads from seq 6 again: the agent's
# line (the first of seq 7) is stored, the forged one set aside again as a conflict.
@KINDS
def test_unkeyed_attach_reads_the_agents_lost_event_past_another_row_of_its_seq(any_url,
                                                                               tmp_path, kind):
    store, sid, where = _unkeyed_row_then_lost(any_url, tmp_path, kind)
    outcome = _follow_placed(store, sid, where)  # `specfleet sweep --attach`
    assert _state(store, sid)[0] == ALL, outcome
    assert _speeds(store, sid) == _real_speeds(), outcome


def test_unkeyed_control_a_lost_event_with_no_forged_line_is_read_again(any_url, tmp_path):
    """The control: the same loss, no forged line claiming seq 7: read again, complete."""
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, journal(), where)
    with store.engine.begin() as c:
        _lose(c, f.sweep_id, K7 + 1)
    code, node = _node(any_url, f.sweep_id, where)
    assert (code, node["status"], node["holes"]) == (1, "incomplete", [[K7 + 1, K7 + 1]])
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, [])
    assert _speeds(store, f.sweep_id) == _real_speeds()
    assert _node(any_url, f.sweep_id, where)[0] == 0


# -- 2. a journal truncated on the node, then a forged line claiming a seq only the store has --

K15 = seq_of(journal(), "generation", 10)  # index 14: the agent's seq 15, run 10 (661.99)


# reaudit 28d: verify says both "no journal line holds seq 11-28 ... the store holds the only
# copy, keep it" and, for the forged line claiming seq 15, "delete those events of the node
# from the store and --attach reads them again from the journal". Doing the latter: the
# agent's seq 15 is gone for good (keyed: the forged line is set aside as unsigned, run 10
# lost), or the forged line is stored in its place (unkeyed: 99999 tok/s for run 10).
# Closed: verify advises deleting a stored event only where the journal holds the agent's
# own line of its seq (a line the key verifies, or a second copy of the stored event);
# otherwise it says the store holds the only copy (verify.compare's "mendable").
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_verifys_advice_after_a_truncation_and_a_forged_line_loses_nothing(sqlite_url,
                                                                           tmp_path, keyed):
    key = secrets.token_bytes(32) if keyed else None
    s = _lines(key)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, s, where, key=key)
    assert _state(store, f.sweep_id) == (ALL, [])
    # on the node: the journal cut after seq 10 (disk full, an operator's `head`), then a
    # line someone without the key appends claiming seq 15
    _journal_path(where).write_bytes(b"".join(x + b"\n" for x in s[:10] + [_forged(K15)]))
    _follow_placed(store, f.sweep_id, where)
    r = _cli_verify(sqlite_url, f.sweep_id, where)
    flat = " ".join(r.output.split())
    assert r.exit_code == 1, flat
    assert "the store holds the only copy" in flat, flat
    if "delete those events" in flat:  # an operator follows the advice, as written
        with store.engine.begin() as c:
            _lose(c, f.sweep_id, K15 + 1)
        _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id)[0] == ALL, flat
    assert _speeds(store, f.sweep_id) == _real_speeds(), flat


# -- 3. a line whose seq is no seq, appended after a read ----------------------------------


# reaudit 28d: agent/reread.py holds back "the first line claiming a seq <= N"; a line
# claiming seq 0 or -1 appended after the last read is such a first line, though no read
# ever took it (the controller sets such lines aside with no seq). So `--attach` never sends
# it, it is never set aside, and `sweeps verify` says "incomplete: 1 missing: seq 0" for
# ever, advising the very --attach that cannot read it.
# Closed: a seq below 1 is never taken for a stored seq's first line (agent/reread.py).
@pytest.mark.parametrize("seq", [0, -1])
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_a_line_claiming_no_real_seq_appended_after_a_read_is_set_aside(sqlite_url, tmp_path,
                                                                        seq, keyed):
    key = secrets.token_bytes(32) if keyed else None
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    with open(_journal_path(where), "ab") as out:
        out.write(_forged(K7, seq=seq) + b"\n")
    _follow_placed(store, f.sweep_id, where)
    assert _aside_rows(store, f.sweep_id) == 1  # the line, set aside with its reason
    assert _state(store, f.sweep_id)[0] == ALL
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


@pytest.mark.parametrize("seq", [0, -1])
def test_a_line_claiming_no_real_seq_in_the_first_read_is_accounted_for(sqlite_url, tmp_path,
                                                                         seq):
    """The guard that holds: the same line read in the first read (from the top)."""
    key = secrets.token_bytes(32)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key) + [_forged(K7, seq=seq)], where, key=key)
    assert _state(store, f.sweep_id) == (ALL, [None])
    _follow_placed(store, f.sweep_id, where)  # and a re-read adds nothing
    assert _aside_rows(store, f.sweep_id) == 1
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


@pytest.mark.parametrize("seq", [2**31, 2**63, 10**30, 2.0, True])
def test_a_line_claiming_a_seq_no_column_holds_is_set_aside(any_url, tmp_path, seq):
    """Seqs past PostgreSQL's integer, past 64 bits, a float, a bool, appended after a
    read: set aside (no seq), the agent's lines untouched, verify complete."""
    key = secrets.token_bytes(32)
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    with open(_journal_path(where), "ab") as out:
        out.write(_forged(K7, seq=seq) + b"\n")
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, [None])
    assert _speeds(store, f.sweep_id) == _real_speeds()
    code, node = _node(any_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


# -- 4. a line over the limit that is not the agent's ---------------------------------------


def _overlong(extra: int) -> bytes:
    """A valid-looking notice claiming seq 29, padded to MAX_EVENT_BYTES + ``extra`` bytes."""
    from agent.protocol import MAX_EVENT_BYTES

    head = dump({"schema": 1, "seq": 29, "type": "notice", "ts": 1.0, "message": ""})
    pad = MAX_EVENT_BYTES + extra - len(head)
    return head.replace(b'"message":""', b'"message":"' + b"x" * pad + b'"')


# reaudit 28d: a hostile line longer than the limit by more than a read's chunk is set aside
# by its length (the follower sends its head, MAX + 1 bytes, and the row hashes that head), but
# `sweeps verify` hashes the whole line on the node: no row matches it, so verify reports a
# hole (or, for a line with no readable seq, a conflict) that no --attach can fill. The
# store is a faithful copy (every agent line stored, the line set aside; the outcome "ok: 1
# journal line(s) set aside") yet verify says "1 missing: seq 29" for ever, advising --attach.
# Closed: the follower sends any line over the limit as its head, however it was read, and
# the digest script hashes that head (never reading the line whole).
def test_a_hostile_line_over_the_limit_set_aside_leaves_verify_complete(sqlite_url, tmp_path):
    key = secrets.token_bytes(32)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key) + [_overlong(3 << 20)], where, key=key)
    assert _state(store, f.sweep_id) == (ALL, [None])
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


@pytest.mark.parametrize("extra", [0, 1])
def test_a_hostile_line_at_the_limit_and_one_byte_over(sqlite_url, tmp_path, extra):
    """Exactly MAX_EVENT_BYTES (read, and set aside past the job's end) and one byte over
    (set aside by its length, whole): either way the agent's 28 lines stored, verify
    complete."""
    key = secrets.token_bytes(32)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key) + [_overlong(extra)], where, key=key)
    stored, aside = _state(store, f.sweep_id)
    assert stored == ALL and len(aside) == 1, (stored, aside)
    assert _speeds(store, f.sweep_id) == _real_speeds()
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


# -- 5. a store restored from an older backup ----------------------------------------------


def _runs_after(seq: int) -> list[int]:
    return [event(x)["run_index"] for x in journal()
            if event(x)["type"] == "generation" and event(x)["seq"] > seq]


@pytest.mark.parametrize("measurements", ["lost with them", "kept"])
def test_a_store_restored_from_an_older_backup_reads_the_rest_once(any_url, tmp_path,
                                                                   measurements):
    """Events past seq 10 gone from the store (a backup from mid-sweep restored; or only
    the events table restored, the measurements kept): --attach reads them again, each
    stored once, 16 measurements at their measured speeds (none twice), verify complete."""
    key = secrets.token_bytes(32)
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    sid = f.sweep_id
    with store.engine.begin() as c:
        c.execute(delete(Event).where(Event.sweep_id == sid, Event.seq > 10))
        if measurements != "kept":
            c.execute(delete(Measurement).where(Measurement.sweep_id == sid,
                                                Measurement.run_index.in_(_runs_after(10))))
    outcome = _follow_placed(store, sid, where)
    assert outcome.startswith("ok"), outcome
    assert _state(store, sid) == (ALL, [])
    assert _speeds(store, sid) == _real_speeds()
    with store.engine.connect() as c:
        assert c.execute(select(func.count()).select_from(Measurement).where(
            Measurement.sweep_id == sid)).scalar() == 16
    code, node = _node(any_url, sid, where)
    assert (code, node["status"]) == (0, "complete"), node


# -- 6. a forged announcement of another schema, after the agent's own ---------------------


def _other_schema() -> bytes:
    return dump({"schema": 2, "seq": 29, "type": "job_started", "ts": 1.0,
                 "agent_version": "9.9.9"})


# reaudit 28d: on an unkeyed node, a line announcing schema 2 appended after the agent's
# job_started (schema 1, stored) raises ProtocolMismatch: that node's ingestion stops on this
# and every later --attach, and nothing after that line is ever read (measured: 10 of 28
# events stored, outcome "failed: the agent stopped before finishing").
# Closed: only a journal's first line (seq 1), before any job_started of this schema, may
# refuse the agent; any other job_started of another schema is set aside (decode.py).
def test_unkeyed_a_forged_other_schema_after_the_agents_start_does_not_stop_the_node(
        sqlite_url, tmp_path):
    store = open_store(sqlite_url)
    f = follow_journal(store, journal()[:10] + [_other_schema()] + journal()[10:],
                       tmp_path / "node")
    assert f.stopped is None, f.stopped
    stored, aside = _state(store, f.sweep_id)
    assert stored == ALL and len(aside) == 1, (stored, aside)
    assert _speeds(store, f.sweep_id) == _real_speeds()


def test_keyed_a_forged_other_schema_is_set_aside(any_url, tmp_path):
    key = secrets.token_bytes(32)
    store = open_store(any_url)
    s = _lines(key)
    f = follow_journal(store, s[:10] + [_other_schema()] + s[10:], tmp_path / "node", key=key)
    assert f.stopped is None, f.stopped
    assert _state(store, f.sweep_id) == (ALL, [29])
    assert _speeds(store, f.sweep_id) == _real_speeds()
    assert f.outcome.startswith("ok"), f.outcome


# -- 7. verify --json and the human line agree with the exit code ---------------------------


def test_verify_json_human_and_exit_code_agree_on_a_hole(sqlite_url, tmp_path):
    key = secrets.token_bytes(32)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    with store.engine.begin() as c:
        _lose(c, f.sweep_id, K7 + 1)
        _lose(c, f.sweep_id, K15 + 1)
    j = _cli_verify(sqlite_url, f.sweep_id, where, "--json")
    h = _cli_verify(sqlite_url, f.sweep_id, where)
    d = json.loads(j.stdout)
    node = d["nodes"][0]
    assert (j.exit_code, h.exit_code, d["complete"]) == (1, 1, False)
    assert node["holes"] == [[K7 + 1, K7 + 1], [K15 + 1, K15 + 1]] and node["missing"] == 2
    assert node["stored"] == 26 and node["journal_lines"] == 28
    assert node["journal_sha256"] != node["store_sha256"]
    flat = " ".join(h.output.split())
    assert f"2 missing: seq {K7 + 1}, {K15 + 1}" in flat, flat
    assert "incomplete" in flat and "--attach" in flat, flat


# -- 8. a measurement row no stored event holds --------------------------------------------


# reaudit 28d: `sweeps verify` checks each stored generation event's measurement
# (derived.measurement_mismatches walks the events), never a measurement row no event
# holds: a row planted in the store (a partial restore of the measurements table, a hand
# edit) for run 16, which the plan never had, at 99999 tok/s, leaves verify "complete" while
# every reader of measurements shows it.
# Closed: derived.measurement_mismatches names measurement rows no stored event holds.
def test_verify_sees_a_measurement_no_stored_event_holds(any_url, tmp_path):
    from sqlalchemy import insert

    key = secrets.token_bytes(32)
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    sid = f.sweep_id
    with store.engine.begin() as c:
        row = dict(c.execute(select(Measurement.__table__).where(
            Measurement.sweep_id == sid, Measurement.run_index == 15)).mappings().one())
        row.pop("id")
        c.execute(insert(Measurement).values(**{**row, "run_index": 16, "seq": 999,
                                                "decode_tok_s": FORGED_SPEED}))
    assert len(_speeds(store, sid)) == 17 and _speeds(store, sid)[16] == FORGED_SPEED
    code, node = _node(any_url, sid, where)
    assert (code, node["status"]) == (1, "incomplete"), node


# -- 9. events of a node the sweep has no row for ------------------------------------------


# reaudit 28d: `sweeps verify` compares the nodes the sweep's rows name; events stored under
# a node with no row (a row deleted by hand, a partial restore, a second store's events
# merged in) are compared with no journal at all: the sweep reads "complete", exit 0, while
# the store holds a generation (and its measurement) no node's journal vouches for.
# Closed: verify reports a node with stored events and no node row, incomplete.
def test_verify_sees_events_of_a_node_the_sweep_has_no_row_for(sqlite_url, tmp_path):
    from sqlalchemy import insert

    key = secrets.token_bytes(32)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, _lines(key), where, key=key)
    sid = f.sweep_id
    with store.engine.begin() as c:
        for table in (Event.__table__, Measurement.__table__):
            rows = [dict(r) for r in c.execute(select(table).where(
                table.c.sweep_id == sid, table.c.seq == K7 + 1)).mappings()]
            assert len(rows) == 1
            c.execute(insert(table).values(**{**{k: v for k, v in rows[0].items()
                                                   if k != "id"}, "node": "n2"}))
    r = _cli_verify(sqlite_url, sid, where, "--json")
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["complete"] is False
