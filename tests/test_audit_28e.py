"""Fifth audit of issue 28: what earlier audits (test_audit_28 … 28d) did not plant.

Copies of a stored line written differently (the same JSON, other bytes), read in the same
read or a later one; a stored line edited in place on the node; two controllers following
one node at once; numbers at the edges of what SQLite and PostgreSQL hold (denormals,
integers past 64 bits signed, -0.0) in fields no column checks; event fields of the right
JSON type whose values no agent writes.

Each journal is the real recorded one (``tests/hostile``: 28 lines, 16 measurements); what
must come of it is counted from how it was built, never read from the code under test.
"""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import sys
import threading
import uuid

import pytest
from sqlalchemy import func, select

from orchestrator.store import open_store
from orchestrator.store.models import QuarantinedEvent
from tests.hostile import (
    ROOT,
    InProcess,
    dump,
    event,
    follow_journal,
    journal,
    new_sweep,
    placed,
    seq_of,
    signed_by_agent,
)
from tests.test_audit_28 import FORGED_SPEED, _cli_verify, _real_speeds, _speeds, _state
from tests.test_audit_28b import _follow_placed
from tests.test_audit_28c import ALL, _journal_path, _lose, _node

K7 = seq_of(journal(), "generation", 2)  # index 6: the agent's seq 7, run 2


def _aside_rows(store, sid: str) -> int:
    with store.engine.connect() as c:
        return c.execute(select(func.count()).select_from(QuarantinedEvent).where(
            QuarantinedEvent.sweep_id == sid)).scalar()


# -- 1. the same JSON in other bytes: a copy of a stored line, re-written ---------------------

def _spaced(x: bytes) -> bytes:
    return json.dumps(event(x)).encode()  # Python's default separators: ", " and ": "


def _reordered(x: bytes) -> bytes:
    return dump(dict(reversed(list(event(x).items()))))


def _escaped(x: bytes) -> bytes:
    return x.replace(b'"generation"', b'"gener\\u0061tion"', 1)  # "a" as a \u escape


COPIES = pytest.mark.parametrize("rewrite", [_spaced, _reordered, _escaped],
                                 ids=["spaced", "keys reordered", "a letter escaped"])


def _copy_after_a_read(url: str, tmp_path, rewrite, key: bytes | None = None):
    """The agent's 28 lines followed; then a copy of seq 7's line, re-written as the same
    JSON in other bytes, appended on the node; followed again (`sweep --attach`)."""
    store = open_store(url)
    where = tmp_path / "node"
    lines = signed_by_agent(journal(), key, set()) if key else journal()
    f = follow_journal(store, lines, where, key=key)
    assert f.outcome == "ok"
    with open(_journal_path(where), "ab") as out:
        out.write(rewrite(journal()[K7]) + b"\n")
    outcome = _follow_placed(store, f.sweep_id, where)
    return store, f.sweep_id, where, outcome


@COPIES
def test_a_rewritten_copy_in_the_same_read_is_set_aside_as_a_repeat(sqlite_url, tmp_path,
                                                                    rewrite):
    """The control: read with the line it copies, the copy is a repeat, set aside once (a
    repeat, not a line the outcome counts); `sweeps verify` says complete."""
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, [*journal(), rewrite(journal()[K7])], where)
    assert _state(store, f.sweep_id) == (ALL, [K7 + 1])
    assert f.outcome == "ok", f.outcome
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


# reaudit 28e: read in a LATER read than the line it copies, the same copy is dropped in
# silence: ledger._seen_before finds its seq stored and _same() JSON-equal, "a re-read of
# what is stored", so no row is kept. The journal then holds a line the store neither
# stores nor sets aside: the outcome says "ok" (no line set aside), `sweeps verify` says
# "incomplete" (exit 1: "journal line 29 repeats seq 7, which is stored, and was not set
# aside", mendable) and sends the operator to "restore the store from a backup, or delete
# those events" -- for a harmless copy. Measured on SQLite and PostgreSQL, each rewrite.
# (A byte-identical copy is handled: test_audit_28's repeated-line tests.)
# Fixed: a stored event is stored as written, so only its very bytes are it read again
# (ledger._seen_before); the same JSON in other bytes is a copy, set aside as a repeat.
@COPIES
def test_a_rewritten_copy_read_later_is_set_aside_as_a_repeat(any_url, tmp_path, rewrite):
    store, sid, where, outcome = _copy_after_a_read(any_url, tmp_path, rewrite)
    assert _state(store, sid)[0] == ALL and _speeds(store, sid) == _real_speeds()
    code, node = _node(any_url, sid, where)
    # the outcome and verify agree: the copy is accounted for (set aside as a repeat)
    assert (outcome == "ok") == (code == 0), (outcome, node)
    assert (code, node["status"], _aside_rows(store, sid)) == (0, "complete", 1), node


@COPIES
def test_a_rewritten_copy_of_a_signed_line_read_later_is_set_aside(sqlite_url, tmp_path,
                                                                  rewrite):
    """Keyed: the copy carries no valid MAC (re-written, or never signed), so it is set
    aside before anything in it is believed; verify complete."""
    key = secrets.token_bytes(32)
    store, sid, where, outcome = _copy_after_a_read(sqlite_url, tmp_path, rewrite, key)
    assert _state(store, sid) == (ALL, [K7 + 1])
    assert outcome.startswith("ok: 1 journal line(s) set aside"), outcome
    code, node = _node(sqlite_url, sid, where)
    assert (code, node["status"]) == (0, "complete"), node


@pytest.mark.parametrize("edit", ["forged speed", "same JSON spaced"])
def test_an_unkeyed_line_edited_in_place_after_it_was_stored_is_kept(sqlite_url, tmp_path,
                                                                     edit):
    """Unkeyed: seq 7's line edited in place on the node after it was stored (a forged
    speed, or the same JSON re-written). --attach keeps the stored event; verify says
    incomplete and that the store holds the only copy: it never advises deleting it (doing
    so would store the forged speed)."""
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, journal(), where)
    lines = journal()
    lines[K7] = (dump({**event(lines[K7]), "decode_tok_s": FORGED_SPEED})
                 if edit == "forged speed" else _spaced(lines[K7]))
    _journal_path(where).write_bytes(b"".join(x + b"\n" for x in lines))
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, []) and _speeds(store, f.sweep_id) == \
        _real_speeds()
    r = _cli_verify(sqlite_url, f.sweep_id, where)
    flat = " ".join(r.output.split())
    assert r.exit_code == 1, r.output
    assert "delete those events" not in flat and "keep it" in flat, flat


# -- 2. a NUL in model output: a valid event whose stored line and measurement differ ---------

def _with_nul(lines: list[bytes], k: int = K7) -> list[bytes]:
    """The agent's line of seq k + 1 with a NUL in its output (model output may hold any
    character: the boundary keeps the event, the measurement's text with U+FFFD)."""
    lines = list(lines)
    e = event(lines[k])
    lines[k] = dump({**e, "output_text": e["output_text"] + "\x00z"})
    return lines


def _key_twice(lines: list[bytes], k: int = K7) -> list[bytes]:
    lines = list(lines)
    lines[k] = lines[k].replace(b'{"schema":1,', b'{"schema":1,"schema":1,', 1)
    return lines


# reaudit 28e: the stored event keeps the journal's line (NUL and all) while ingest stored
# the measurement's output_text with U+FFFD; verify's derivation (rows.measurement_row)
# kept the NUL, so on SQLite and PostgreSQL, keyed or not, a clean journal whose agent
# wrote one NUL in a model's output was "incomplete" forever (exit 1: "the measurement of
# run_index 2 differs from its stored event (output_text '…\ufffdz' stored, '…\x00z' in
# the event)"), the sweep "ok". Following the advice (--attach derives the measurement
# again): SQLite wrote the NUL into the measurement; PostgreSQL refused the write
# (psycopg.DataError "PostgreSQL text fields cannot contain NUL (0x00) bytes": --attach
# fails with "the store refused a write" on every run). A line stored written again (a key
# twice) with such a NUL: verify "incomplete" with no hole and no conflict named (its
# REWRITTEN row no longer matched the stored object).
# Fixed: rows.measurement_row replaces the NUL as ingest does; coverage.stored_line_hashes
# compares the rewritten line as the boundary stored it.
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("damage", [_with_nul, lambda ls: _key_twice(_with_nul(ls))],
                         ids=["NUL in output", "NUL in output and a key twice"])
def test_a_nul_in_model_output_leaves_verify_complete_and_attach_working(any_url, tmp_path,
                                                                        keyed, damage):
    from orchestrator.store.derived import measurement_mismatches, rederive_measurements

    key = secrets.token_bytes(32) if keyed else None
    lines = damage(journal())
    lines = signed_by_agent(lines, key, set()) if key else lines
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines, where, key=key)
    assert f.stopped is None and f.outcome == "ok", f
    assert _state(store, f.sweep_id)[0] == ALL
    assert measurement_mismatches(store, f.sweep_id, "n1") == []
    assert rederive_measurements(store, f.sweep_id, "n1") == []  # what --attach runs
    code, node = _node(any_url, f.sweep_id, where)
    assert (code, node["status"], node["conflicts"]) == (0, "complete", []), node
    # lost from the store and read again: the same
    with store.engine.begin() as c:
        _lose(c, f.sweep_id, K7 + 1)
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id)[0] == ALL
    assert _node(any_url, f.sweep_id, where)[0] == 0


# -- 3. two controllers following one node at once ---------------------------------------

def _two_controllers(url: str, tmp_path, lines: list[bytes], key: bytes | None,
                     n: int = 2) -> tuple[object, str, object, list[str]]:
    """``n`` controllers (each its own store connection, in its own thread) follow one
    node's journal at the same moment, as two `sweep --attach` runs would."""
    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.dispatch import NodeRun, StderrProgress, SweepOptions

    store = open_store(url)
    where = tmp_path / "node"
    where.mkdir()
    sid = uuid.uuid4().hex[:12]
    path, folder = placed(where, sid, ROOT)
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    new_sweep(store, "n1", path, folder, sys.executable, sid, where, key)
    host = Host(name="n1", address="localhost", connection="local", python=sys.executable,
                root=str(where))
    said: list[str] = []
    start = threading.Barrier(n)

    def one() -> None:
        run = NodeRun(host, open_store(url), sid, "audit", SweepOptions(),
                      StderrProgress(io.StringIO()))
        start.wait()
        try:
            asyncio.run(run.follow_once(InProcess(host)))
            said.append(run.outcome().status)
        except Exception as e:  # noqa: BLE001 - what the user would see
            said.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return store, sid, where, said


# Two controllers on one node is what the node lease prevents (sweep/lease.py: "node
# busy"); they meet only past a lease's expiry (a controller suspended longer than its TTL
# and woken), and here the lease is bypassed (follow_once). On SQLite (one writer at a
# time) it held in every run. On PostgreSQL it held too but for a race (reaudit 28e, not
# closed, no strict test: it is a race): 1 run in 12 with three controllers (unkeyed), 1 in
# ~10 with two (keyed), left a second row for the agent's OWN job_finished, "job_finished:
# generations 16 disagrees with the journal before it (32 generation(s) stored)" -- under
# READ COMMITTED, ledger._finish_problem counts the generations another controller
# committed after this batch's context was read, on top of the same lines in this batch.
# The event itself was stored by the other controller; verify said complete.
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_two_controllers_at_once_store_each_line_once(sqlite_url, tmp_path, keyed):
    """Held (SQLite): with a forged line claiming seq 7 in the journal, two controllers at
    once store the agent's 28 events once, set the forged line aside once; verify
    complete."""
    key = secrets.token_bytes(32) if keyed else None
    forged = dump({**event(journal()[K7]), "decode_tok_s": FORGED_SPEED})
    lines = (signed_by_agent(journal(), key, set()) if key else journal()) + [forged]
    store, sid, where, said = _two_controllers(sqlite_url, tmp_path, lines, key)
    assert said == ["ok", "ok"], said
    assert _state(store, sid) == (ALL, [K7 + 1])
    assert _speeds(store, sid) == _real_speeds()
    code, node = _node(sqlite_url, sid, where)
    assert (code, node["status"], node["set_aside"]) == (0, "complete", 1), node


# -- 4. numbers at the edges of what the two stores hold, in fields no column checks ---------

EDGES = {
    "denormal ttft_ms": {"ttft_ms": 5e-324},
    "-0.0 ttft_ms": {"ttft_ms": -0.0},
    "2**64-1 in an unknown field": {"x_big": 2**64 - 1},
    "-(2**63)-1 in an unknown field": {"x_neg": -(2**63) - 1},
    "2**64-1 in the config": {"config": {**event(journal()[K7])["config"], "x": 2**64 - 1}},
    "largest float in an unknown field": {"x_f": 1.7976931348623157e308},
    "a 300k-character key": {"k" * 300_000: 1},
}


@pytest.mark.parametrize("change", list(EDGES))
def test_numbers_at_the_stores_edges_are_stored_whole(any_url, tmp_path, change):
    """Held: SQLite and PostgreSQL alike store the line whole (or, past 64 bits, orjson
    reads a float); every reader renders; verify complete."""
    from tests.hostile import render_all

    lines = journal()
    lines[K7] = dump({**event(lines[K7]), **EDGES[change]})
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    assert (f.stopped, f.outcome) == (None, "ok")
    assert _state(store, f.sweep_id) == (ALL, [])
    render_all(store, f.sweep_id, tmp_path / "out")
    assert _node(any_url, f.sweep_id, tmp_path / "node")[0] == 0


# -- 5. a forged end claiming the seq the agent writes next (unkeyed) ------------------------

def _forged_end_at_the_agents_next_seq(kind: str) -> tuple[list[bytes], bytes, int]:
    """An unkeyed journal as an appender leaves it: after the agent's 16th generation (seq
    20) someone appends a forged end claiming seq 21, the seq the agent writes next; the
    agent's counter is its own, so its lines go on at 21..28 (its first config_summary at
    21). Returns the agent's lines, the forged one, and where it goes."""
    lines = journal()
    at = 20
    assert event(lines[at])["type"] == "config_summary" and event(lines[at])["seq"] == 21
    forged = dump({"schema": 1, "seq": 21, "type": kind, "ts": 1.0, "status": "ok",
                   "generations": 16, "error": "crash", "message": "forged"})
    return lines, forged, at


# reaudit 28e (measured, SQLite and PostgreSQL): the forged end is recognised and set aside
# ("job_finished: not the agent's last word …", "job_failed: the journal goes on after it
# …") -- but only after the agent's own line of seq 21 was refused as a conflict with it
# ("conflict: seq 21 arrived earlier in this read with other content", or, read live in
# two batches, "… is stored with other content (job_finished); the stored event is kept",
# though that stored event is then moved aside). Seq 21 is stored by no one: the agent's
# first config_summary is lost (5 of 6 runs), the outcome "ok: 2 journal line(s) set
# aside", `sweeps verify` "complete" (exit 0). The existing forged-end tests renumber the
# agent's lines after the forged one, which an appender cannot do to the agent's counter.
# Fixed: an end set aside as not the agent's held its seq for no one; the lines refused
# as conflicts with it (in the same read, or kept aside by an earlier one) are judged again
# and the agent's stored (ledger._rejudged). "the end later": the agent's end is
# read after its seq 21, 22, 23 were set aside (a conflict, two after the forged end).
@pytest.mark.parametrize("kind", ["job_finished", "job_failed"])
@pytest.mark.parametrize("batches", [1, 2, 3],
                         ids=["one read", "read live in two", "the end later"])
def test_a_forged_end_at_the_agents_next_seq_takes_none_of_its_lines(any_url, kind,
                                                                    batches):
    from orchestrator.store.models import Run
    from tests.hostile import JOB
    from tests.test_ledger_exact import _ingest

    lines, forged, at = _forged_end_at_the_agents_next_seq(kind)
    store = open_store(any_url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    parts = {1: [lines[:at] + [forged] + lines[at:]],
             2: [lines[:at] + [forged], lines[at:]],
             3: [lines[:at] + [forged] + lines[at:at + 3], lines[at + 3:]]}[batches]
    _ingest(store, sid, parts, open_end=True)  # the agent still running: followed live
    stored, aside = _state(store, sid)
    assert aside == [21], aside  # the forged end only
    assert stored == ALL, stored  # every line the agent wrote, its seq 21 among them
    with store.engine.connect() as c:
        assert c.execute(select(func.count()).select_from(Run).where(
            Run.sweep_id == sid)).scalar() == 6


@pytest.mark.parametrize("copy", [False, True], ids=["once", "its seq 21 copied at the end"])
def test_a_forged_end_at_the_agents_next_seq_through_the_follower(sqlite_url, tmp_path,
                                                                  copy):
    """The same through the real follower and `sweeps verify` (before the fix: the agent's
    seq 21 set aside, outcome "ok: 2 journal line(s) set aside", verify exit 0): the
    agent's 28 events stored, the forged end alone set aside; verify complete, and a
    second read (`sweep --attach`) changes nothing. A copy of the agent's seq 21 appended
    after its end (the same bytes) is a repeat of the event stored, set aside as one."""
    lines, forged, at = _forged_end_at_the_agents_next_seq("job_finished")
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    extra = [lines[at]] if copy else []
    f = follow_journal(store, lines[:at] + [forged] + lines[at:] + extra, where)
    aside = [21, 21] if copy else [21]
    assert f.stopped is None and f.outcome.startswith("ok"), f
    assert _state(store, f.sweep_id) == (ALL, aside)
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"]) == (0, "complete"), node
    _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, aside)
    assert _node(sqlite_url, f.sweep_id, where)[0] == 0


# -- 6. `sweeps verify` on a sweep still running, and twice -----------------------------------

def _store_rows(store) -> str:
    """Every row of every table, hashed: what verify must leave as it found it."""
    import hashlib

    from sqlalchemy import MetaData

    md = MetaData()
    md.reflect(store.engine)
    h = hashlib.sha256()
    with store.engine.connect() as c:
        for name in sorted(md.tables):
            for r in c.execute(select(md.tables[name])).all():
                h.update(repr(tuple(r)).encode())
    return h.hexdigest()


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_verify_of_a_running_sweep_names_what_is_not_read_yet_and_changes_nothing(
        any_url, tmp_path, keyed):
    """Held: 20 lines read, 8 more written since and the agent mid-way through a line:
    verify says 8 missing (seq 21-28), that --attach reads them, advises no delete or
    backup; run twice (human, --json) it leaves every row of the store as it was."""
    key = secrets.token_bytes(32) if keyed else None
    lines = signed_by_agent(journal(), key, set()) if key else journal()
    store = open_store(any_url)
    where = tmp_path / "node"
    f = follow_journal(store, lines[:20], where, key=key)
    with open(_journal_path(where), "ab") as out:
        out.write(b"".join(x + b"\n" for x in lines[20:]) + lines[27][:50])
    before = _store_rows(store)
    r = _cli_verify(any_url, f.sweep_id, where)
    code, node = _node(any_url, f.sweep_id, where)
    assert _store_rows(store) == before
    flat = " ".join(r.output.split())
    assert r.exit_code == code == 1, flat
    assert "8 missing: seq 21-28" in flat and "--attach" in flat, flat
    assert "delete" not in flat and "backup" not in flat, flat
    assert (node["holes"], node["conflicts"]) == ([[21, 28]], []), node
