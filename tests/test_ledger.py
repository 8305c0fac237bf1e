"""The store as a ledger of the nodes' journals: seq coverage, holes read again by
`--attach`, and `sweeps verify` comparing the two line by line."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Text, cast, delete, select, text, update

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.coverage import (
    Coverage,
    coverage,
    holes_below,
    line_sha256,
    missing_by_node,
    seq_ranges,
)
from orchestrator.store.models import Event, QuarantinedEvent
from orchestrator.sweep.decode import Quarantined
from orchestrator.sweep.verify import compare
from tests.controller import journal, journal_path
from tests.locks import make_lock
from tests.store_templates import fresh_sqlite

JOB = {"models": {"target": {}, "draft": {}}}


def _brute_holes(covered: set[int], last: int) -> list[int]:
    return [n for n in range(1, last + 1) if n not in covered]


@given(covered=st.sets(st.integers(-3, 80)), last=st.integers(0, 80))
def test_holes_and_resume_point_for_any_coverage(covered, last):
    holes = holes_below(covered, last)
    expanded = [n for a, b in holes for n in range(a, b + 1)]
    assert expanded == _brute_holes(covered, last)
    assert all(a <= b for a, b in holes)
    assert all(b + 1 < c for (_, b), (c, _) in zip(holes, holes[1:]))  # maximal ranges
    cov = Coverage(frozenset(covered), last, 0)
    # the follower reads again after `through`: everything up to it is covered, and the
    # seq after it (when not past the last stored event) is not
    assert all(n in covered for n in range(1, cov.through + 1))
    assert cov.through == last or cov.through + 1 not in covered
    assert cov.missing == len(expanded)


def test_seq_ranges_planted():
    assert seq_ranges([7, 1, 3, 2, 7, 9, 10]) == [(1, 3), (7, 7), (9, 10)]
    assert holes_below({1, 2, 5, 9}, 10) == [(3, 4), (6, 8), (10, 10)]
    assert Coverage(frozenset({1, 2, 5}), 5, 0).through == 2


FATES = ("stored", "deleted", "altered", "aside")


@settings(max_examples=300)
@given(fates=st.lists(st.sampled_from(FATES), max_size=60),
       forged=st.sets(st.integers(61, 90), max_size=3), repeat=st.sets(st.integers(1, 60)))
def test_verify_names_exactly_the_planted_holes_and_conflicts(fates, forged, repeat):
    """A journal of seqs 1..n; each line stored as written, deleted from the store, stored
    with other content, or set aside; some stored seqs no journal line has; some lines
    written twice (a second line reusing a stored seq, not set aside). The answer is known
    from the plan, not from the code."""
    journal_lines = [(i, f"h{i}") for i in range(1, len(fates) + 1)]
    stored = {i: f"h{i}" for i, f in enumerate(fates, 1) if f == "stored"}
    stored |= {i: f"other{i}" for i, f in enumerate(fates, 1) if f == "altered"}
    stored |= {s: f"forged{s}" for s in forged}
    aside = {f"h{i}" for i, f in enumerate(fates, 1) if f == "aside"}
    twice = sorted(s for s in repeat if s <= len(fates) and fates[s - 1] == "stored")
    journal_lines += [(s, f"again{s}") for s in twice]
    got = compare("n1", journal_lines, stored, set(), aside)
    deleted = [i for i, f in enumerate(fates, 1) if f == "deleted"]
    altered = [i for i, f in enumerate(fates, 1) if f == "altered"]
    assert got.holes == seq_ranges(deleted)
    assert sorted(c["seq"] for c in got.conflicts) == sorted(altered + sorted(forged) + twice)
    assert got.set_aside == fates.count("aside")
    assert got.journal_lines == len(journal_lines) and got.stored == len(stored)
    clean = not deleted and not altered and not forged and not twice
    assert (got.status == "complete") == clean
    assert (got.journal_sha256 == got.store_sha256) == (not deleted and not altered
                                                        and not forged)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored=st.sets(st.integers(1, 40), min_size=1),
       aside=st.sets(st.integers(1, 60), max_size=5))
def test_listing_counts_agree_with_coverage(tmp_path_factory, stored, aside):
    """The aggregate `sweeps list` uses and the per-node coverage the follower resumes from
    count the same missing seqs, for any stored / set-aside pattern (a real SQLite store)."""
    store = open_store(fresh_sqlite(tmp_path_factory.mktemp('cov') / 's.db'))
    store.create_sweep("s1", JOB, None)
    store.ingest("s1", "n1", [{"schema": 1, "seq": n, "type": "notice", "ts": 1.0,
                               "message": "x"} for n in sorted(stored)])
    store.quarantine("s1", "n1", [Quarantined(n, "planted", f"line {n}") for n in aside])
    cov = coverage(store, "s1", "n1")
    want = len(_brute_holes(stored | aside, max(stored)))
    assert cov.missing == want
    assert missing_by_node(store, ["s1"]) == ({"s1": {"n1": want}} if want else {})


_END: dict = {}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=st.integers(0, 6), after=st.lists(st.sampled_from(["notice", "job_finished"]),
                                                max_size=4),
       cuts=st.sets(st.integers(1, 12), max_size=3))
def test_nothing_after_the_stored_end_is_stored(tmp_path_factory, before, after, cuts):
    """A journal ending in job_finished, then lines appended after it, read in any batches:
    everything up to the end is stored, every line after it set aside with its seq and the
    reason "after the job's end" (a real SQLite store)."""
    import uuid

    if "store" not in _END:  # one store for every example (opening one migrates it)
        _END["store"] = open_store(fresh_sqlite(tmp_path_factory.mktemp('end') / 's.db'))
    store, sid = _END["store"], uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    end = before + 1
    lines = [{"schema": 1, "seq": n, "type": "notice", "ts": 1.0, "message": "x"}
             for n in range(1, end)]
    lines.append({"schema": 1, "seq": end, "type": "job_finished", "ts": 2.0, "status": "ok",
                  "generations": 0})
    lines += [{"schema": 1, "seq": end + i, "type": kind, "ts": 3.0, "message": "late",
               "status": "ok", "generations": 0} for i, kind in enumerate(after, 1)]
    edges = [0, *sorted(c for c in cuts if c < len(lines)), len(lines)]
    for a, b in zip(edges, edges[1:]):
        if b > a:
            store.ingest(sid, "n1", lines[a:b])
    with store.engine.connect() as c:
        stored = sorted(c.execute(select(Event.seq).where(Event.sweep_id == sid)).scalars())
        aside = dict(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid)).all())
    assert stored == list(range(1, end + 1))
    assert sorted(aside) == list(range(end + 1, end + len(after) + 1))
    assert all(why == f"after the job's end: seq {n} follows its job_finished at seq {end}"
               for n, why in aside.items())


# -- a real sweep, holes planted in its store ------------------------------------------


@pytest.fixture(scope="module")
def swept(fleet, model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("ledger")
    inv = d / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    db = f"sqlite:///{d / 'store.db'}"
    lock = make_lock(d, model_pair, widths=(2,), max_tokens=16,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")  # a busy host
    common = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", db]
    r = CliRunner().invoke(main, ["sweep", str(lock), *common, "--limit", "node1,node2",
                                  "--no-provision", "--failed-hosts-file",
                                  str(d / "retry"), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["sweep_id"], db, common


def _verify(common, sid):
    r = CliRunner().invoke(main, ["sweeps", "verify", sid, *common, "--json"])
    return r.exit_code, json.loads(r.stdout)


def _payloads(db, sid, node):
    with open_store(db, migrate=False).engine.connect() as c:
        return list(c.execute(select(cast(Event.payload, Text)).where(
            Event.sweep_id == sid, Event.node == node).order_by(Event.seq)).scalars())


def test_verify_names_the_deleted_lines_and_attach_reads_them_again(swept, fleet):
    sid, db, common = swept
    store = open_store(db)
    lines = journal_path(fleet.nodes[0], sid).read_text().splitlines()
    last = len(lines)
    code, out = _verify(common, sid)
    assert code == 0 and out["complete"] is True, out  # complete to begin with
    gone = [2, 5, 6, last]  # the tail too: only the journal can tell that one is missing
    with store.engine.begin() as c:
        c.execute(delete(Event).where(Event.sweep_id == sid, Event.node == "node1",
                                      Event.seq.in_(gone)))
        original = c.execute(select(cast(Event.payload, Text)).where(
            Event.sweep_id == sid, Event.node == "node2", Event.seq == 3)).scalar_one()
        c.execute(update(Event).where(Event.sweep_id == sid, Event.node == "node2",
                                      Event.seq == 3).values(payload={"forged": True}))

    code, out = _verify(common, sid)
    by = {n["node"]: n for n in out["nodes"]}
    assert code == 1 and out["complete"] is False
    assert by["node1"]["holes"] == [[2, 2], [5, 6], [last, last]]
    assert by["node1"]["missing"] == 4 and by["node1"]["conflicts"] == []
    assert by["node1"]["journal_lines"] == last and by["node1"]["stored"] == last - 4
    assert by["node2"]["holes"] == []
    assert [(c["seq"], c["line"]) for c in by["node2"]["conflicts"]] == [(3, 3)]
    (conflict,) = by["node2"]["conflicts"]  # the two hashes, each of its own text
    assert conflict["stored_sha256"] == line_sha256('{"forged":true}')
    assert conflict["journal_sha256"] == line_sha256(original)
    said = CliRunner().invoke(main, ["sweeps", "verify", sid, *common])
    assert said.exit_code == 1
    assert f"4 missing: seq 2, 5-6, {last}" in said.output
    assert "seq 3: the store holds other content than journal line 3 (stored sha256 " \
           f"{conflict['stored_sha256'][:16]}, journal sha256 " \
           f"{conflict['journal_sha256'][:16]})" in said.output
    assert f"sweep {sid}: incomplete on node1 (incomplete: 4 missing, 0 conflict(s)), " \
           "node2 (incomplete: 0 missing, 1 conflict(s))" in said.output
    # the conflict is not sent to an --attach that cannot mend it: what it is, what to do
    flat = " ".join(said.output.split())
    assert f"`specfleet sweep --attach {sid}` reads what is missing again" in flat
    assert f"on node2 the store differs from the node's journal at seq 3; the journal " \
           f"({journal_path(fleet.nodes[1], sid)}) is the record, and --attach keeps what " \
           "is stored, so it cannot mend this: restore the store from a backup" in flat

    # the store alone sees the holes below its last event: never listed as ok
    listed = CliRunner().invoke(main, ["sweeps", "list", "--db", db, "--json"])
    row = next(r for r in json.loads(listed.stdout) if r["sweep_id"] == sid)
    assert row["status"] == "incomplete" and row["missing"] == {"node1": 3}

    with store.engine.begin() as c:  # the conflict is the boundary's to judge: undone here
        c.execute(text("UPDATE events SET payload = :p WHERE sweep_id = :s AND node = 'node2' "
                       "AND seq = 3"), {"p": original, "s": sid})
    r = CliRunner().invoke(main, ["sweep", "--attach", sid, *common])
    assert r.exit_code == 0, r.output
    assert "reading 3 journal line(s) the store lacks again from the node (seq 2, 5-6)" \
        in r.output

    code, out = _verify(common, sid)
    assert code == 0 and out["complete"] is True, out
    for node in fleet.nodes[:2]:  # stored content equals the journal
        assert _payloads(db, sid, node.name) == \
            journal_path(node, sid).read_text().splitlines()
        assert [json.loads(x) for x in _payloads(db, sid, node.name)] == journal(node, sid)
    listed = CliRunner().invoke(main, ["sweeps", "list", "--db", db, "--json"])
    row = next(r for r in json.loads(listed.stdout) if r["sweep_id"] == sid)
    assert row["status"] == "ok" and row["missing"] == {}


def test_verify_refuses_an_unknown_sweep_and_marks_nodes_it_cannot_reach(swept, fleet,
                                                                         tmp_path):
    sid, db, common = swept
    r = CliRunner().invoke(main, ["sweeps", "verify", "nosuchsweep", *common])
    assert r.exit_code == 1
    assert "no sweep 'nosuchsweep' in the store" in r.output
    # an inventory without node2: node2 is unverified, never complete
    inv = tmp_path / "one.yml"
    inv.write_text(fleet.inventory_yaml().replace("node2", "other2"))
    r = CliRunner().invoke(main, ["sweeps", "verify", sid, "-i", str(inv), "--known-hosts",
                                  str(fleet.known_hosts), "--db", db])
    assert r.exit_code == 1
    assert "node2                unverified  not in the inventory" in r.output


@settings(max_examples=200, deadline=None)  # each case writes files: a busy host is slow
@given(lines=st.lists(st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    st.builds(lambda n, pad: (pad + json.dumps({"seq": n, "type": "x"}) + pad).encode(),
              st.one_of(st.integers(-5, 10**12), st.booleans(), st.none(), st.text(max_size=3)),
              st.sampled_from(["", " ", "\t", "\r"]))), max_size=30),
    tail=st.binary(max_size=10).filter(lambda b: b"\n" not in b))
def test_the_node_side_digest_hashes_each_line_as_the_store_keeps_it(tmp_path_factory, lines,
                                                                     tail):
    """DIGEST_SCRIPT (run on the node) against what the follower stores for the same bytes:
    the controller strips the line; a line with bytes that are not UTF-8 (set aside) is
    hashed as the journal holds them on both sides, never with U+FFFD in their place (audit
    28, finding 9); blank lines are skipped and a last line without its newline is not
    complete yet."""
    import contextlib
    import io
    import sys

    from orchestrator.store.coverage import kept_line_sha256, line_sha256
    from orchestrator.sweep.verify import DIGEST_SCRIPT, parse_digest

    path = tmp_path_factory.mktemp("digest") / "j.events.jsonl"
    path.write_bytes(b"".join(x + b"\n" for x in lines) + tail)
    out, argv = io.StringIO(), sys.argv
    try:
        sys.argv = ["-c", str(path)]
        with contextlib.redirect_stdout(out):
            exec(DIGEST_SCRIPT, {"__name__": "__main__"})
    finally:
        sys.argv = argv
    got, partial = parse_digest(out.getvalue())
    want = []
    for raw in lines:
        text = raw.decode("utf-8", "surrogateescape")  # as the transport hands it over
        if not text.strip():
            continue
        try:
            seq = json.loads(text)["seq"]
        except (ValueError, TypeError, KeyError):
            seq = None
        utf8 = raw.decode("utf-8", "ignore").encode() == raw
        # a UTF-8 line as the store keeps it (stripped); any other as its set-aside row
        want.append((seq if type(seq) is int else None,
                     line_sha256(text) if utf8 else kept_line_sha256(text)))
    assert got == want
    assert partial == bool(tail)


def test_a_stored_interpreter_or_agent_folder_is_never_run(swept, fleet):
    """Whoever can write the store must not choose what runs on a node: a python or agent
    folder in sweep_nodes that the inventory would not choose is refused, naming the node
    and both values, and the planted script never runs (F2)."""
    import os
    import shutil
    import tempfile

    from orchestrator.store.models import SweepNode

    sid, db, common = swept
    store = open_store(db)
    d = Path(tempfile.mkdtemp(prefix="specfleet-f2-"))
    os.chmod(d, 0o777)  # the node users run the script and would write the marker here
    marker, evil = d / "marker", d / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\nexec python3 \"$@\"\n")
    os.chmod(evil, 0o755)
    with store.engine.connect() as c:
        before = {r.node: (r.python, r.agent_dir) for r in c.execute(
            select(SweepNode.node, SweepNode.python, SweepNode.agent_dir)
            .where(SweepNode.sweep_id == sid))}
    try:
        with store.engine.begin() as c:
            c.execute(update(SweepNode).where(SweepNode.sweep_id == sid,
                                              SweepNode.node == "node1")
                      .values(python=str(evil)))
            c.execute(update(SweepNode).where(SweepNode.sweep_id == sid,
                                              SweepNode.node == "node2")
                      .values(agent_dir=str(d)))
        said = CliRunner().invoke(main, ["sweeps", "verify", sid, *common])
        assert said.exit_code == 1
        assert f"node1: refusing to run anything for sweep {sid}: its Python is " \
               f"'{evil}' in the store but the inventory would use '{fleet.python}'" \
            in said.output, said.output
        assert "unverified" in said.output
        r = CliRunner().invoke(main, ["sweep", "--attach", sid, *common])
        assert r.exit_code != 0
        assert f"its Python is '{evil}' in the store" in r.output, r.output
        assert f"node2: refusing to run anything for sweep {sid}: its agent folder is " \
               f"'{d}' in the store" in r.output, r.output
        assert not marker.exists()
    finally:
        with store.engine.begin() as c:
            for node, (py, ad) in before.items():
                c.execute(update(SweepNode).where(SweepNode.sweep_id == sid,
                                                  SweepNode.node == node)
                          .values(python=py, agent_dir=ad))
        shutil.rmtree(d)
    code, out = _verify(common, sid)  # the inventory's own choice still runs
    assert code == 0 and out["complete"] is True, out


def test_lines_after_the_end_are_set_aside_and_edited_measurements_derived_again(swept,
                                                                                fleet):
    """F8: lines appended to a journal after its job_finished (a forged generation at
    55555 tok/s, a notice, a second job_finished) are each set aside with their seq and
    reason by --attach (unsigned: the sweep's agent signs its lines), and verify is then
    complete; a measurement edited in the store is a conflict verify names, and --attach
    derives it again from its stored event."""
    from orchestrator.store.models import Measurement, QuarantinedEvent

    sid, db, common = swept
    node = fleet.nodes[0]
    path = journal_path(node, sid)
    events = journal(node, sid)
    end = events[-1]
    assert end["type"] == "job_finished"
    n = end["seq"]
    gen = next(e for e in events if e["type"] == "generation")
    forged = [{**gen, "seq": n + 1, "run_index": 2, "decode_tok_s": 55555.0},
              {"schema": 1, "seq": n + 2, "type": "notice", "ts": end["ts"] + 1,
               "message": "appended later"},
              {**end, "seq": n + 3, "ts": end["ts"] + 2}]
    with path.open("a") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in forged)

    code, out = _verify(common, sid)
    by = {x["node"]: x for x in out["nodes"]}
    assert code == 1 and by["node1"]["holes"] == [[n + 1, n + 3]]

    r = CliRunner().invoke(main, ["sweep", "--attach", sid, *common])
    assert r.exit_code == 0, r.output
    for e in forged:  # the sweep is keyed: lines its agent never signed go first
        assert f"set aside a journal line (seq {e['seq']}): not written by this job's agent " \
               "(no valid signature)" in r.output, r.output
    store = open_store(db)
    with store.engine.connect() as c:
        aside = dict(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid, QuarantinedEvent.node == "node1",
            QuarantinedEvent.seq > n)).all())
        assert sorted(aside) == [n + 1, n + 2, n + 3], aside
        assert not c.execute(select(Event.seq).where(
            Event.sweep_id == sid, Event.node == "node1", Event.seq > n)).all()
        assert c.execute(select(Measurement.decode_tok_s).where(
            Measurement.sweep_id == sid, Measurement.decode_tok_s == 55555.0)).all() == []
    code, out = _verify(common, sid)
    assert code == 0 and out["complete"] is True, out
    again = CliRunner().invoke(main, ["sweep", "--attach", sid, *common])  # nothing new
    assert again.exit_code == 0 and "set aside a journal line" not in again.output

    # a derived row edited in the store: verify names it, --attach derives it again
    node2 = [e for e in journal(fleet.nodes[1], sid) if e["type"] == "generation"][0]
    with store.engine.begin() as c:
        c.execute(update(Measurement).where(
            Measurement.sweep_id == sid, Measurement.node == "node2",
            Measurement.run_index == node2["run_index"]).values(decode_tok_s=99999.0))
    said = CliRunner().invoke(main, ["sweeps", "verify", sid, *common])
    flat = " ".join(said.output.split())
    assert said.exit_code == 1
    assert f"conflict: seq {node2['seq']}: the measurement of run_index " \
           f"{node2['run_index']} differs from its stored event (decode_tok_s 99999.0 " \
           f"stored, {node2['decode_tok_s']!r} in the event)" in flat, flat
    assert f"`specfleet sweep --attach {sid}` derives the differing measurements again" in flat
    assert "reads what is missing" not in flat and "cannot mend" not in flat
    r = CliRunner().invoke(main, ["sweep", "--attach", sid, *common])
    assert r.exit_code == 0, r.output
    assert f"1 measurement(s) differed from their stored events and were derived again " \
           f"from them (seq {node2['seq']})" in " ".join(r.output.split()), r.output
    with store.engine.connect() as c:
        assert c.execute(select(Measurement.decode_tok_s).where(
            Measurement.sweep_id == sid, Measurement.node == "node2",
            Measurement.run_index == node2["run_index"])).scalar_one() == node2["decode_tok_s"]
    code, out = _verify(common, sid)
    assert code == 0 and out["complete"] is True, out


_DERIVED: dict = {}
COLUMNS = ("decode_tok_s", "ttft_ms", "generated_tokens", "itl_p95_ms", "workload")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_verify_names_exactly_the_edited_measurements_and_attach_derives_them_again(
        tmp_path_factory, data):
    """A recorded journal stored as the follower stores it; any measurement rows edited in
    any columns: the check names exactly those seqs, and deriving again restores every row
    to what its event says (the answer is the event, known without the code)."""
    from orchestrator.store.derived import measurement_mismatches, rederive_measurements
    from orchestrator.store.models import Measurement
    from orchestrator.sweep.decode import Decoder
    from tests.journals import lines as recorded

    if "store" not in _DERIVED:
        store = open_store(fresh_sqlite(tmp_path_factory.mktemp('derived') / 's.db'))
        store.create_sweep("d1", JOB, None)
        raw = recorded()
        decoder = Decoder("n1")
        events = [decoder.decode(x) for x in raw]
        store.ingest("d1", "n1", events, raw)
        _DERIVED.update(store=store, gens={e["seq"]: e for e in events
                                           if e["type"] == "generation"})
    store, gens = _DERIVED["store"], _DERIVED["gens"]
    assert measurement_mismatches(store, "d1", "n1") == []
    edits = data.draw(st.dictionaries(st.sampled_from(sorted(gens)),
                                      st.sets(st.sampled_from(COLUMNS), min_size=1),
                                      max_size=4))
    with store.engine.begin() as c:
        for seq, cols in edits.items():
            c.execute(update(Measurement).where(Measurement.sweep_id == "d1",
                                                Measurement.seq == seq).values(**{
                col: "edited" if col == "workload" else 99999 for col in cols}))
    got = measurement_mismatches(store, "d1", "n1")
    assert [m["seq"] for m in got] == sorted(edits)
    assert rederive_measurements(store, "d1", "n1") == sorted(edits)
    assert measurement_mismatches(store, "d1", "n1") == []
    with store.engine.connect() as c:
        for seq in edits:
            row = c.execute(select(Measurement.decode_tok_s, Measurement.ttft_ms,
                                   Measurement.workload).where(
                Measurement.sweep_id == "d1", Measurement.seq == seq)).one()
            e = gens[seq]
            assert tuple(row) == (e["decode_tok_s"], e["ttft_ms"], e["workload"])
