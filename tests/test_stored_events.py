"""Nothing stored breaks a reader (issue 28, item 5): stored events read through the same
typed decode as the boundary (``store.queries``), so an event an older, weaker boundary let
in comes back ``Unreadable`` with its reason, and every reader shows it instead of failing.

The legacy rows are planted as they look: through ``Store.ingest`` (the store's own API,
which trusts its caller to have decoded), past today's boundary.
"""

from __future__ import annotations

import json
import random
from dataclasses import fields
from datetime import timedelta

import hypothesis.strategies as st
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

from agent.events import EVENT_CLASSES, Event, json_types
from agent.protocol import EVENTS
from orchestrator.cli import main
from orchestrator.review.load import load_ramps
from orchestrator.review.runtimes import agent_notices, stream_checks
from orchestrator.review.sweep_page import review_data, soak_results
from orchestrator.store import open_store, queries
from orchestrator.sweep.decode import Decoder, ProtocolMismatch, Quarantined
from tests.history import config_values as V
from tests.history import generation, ingest_lines, night
from tests.store_templates import fresh_sqlite
from tests.test_weekly_review import W20

MAC = dict(chip="Apple M2 Max", pair="gemma", workload="code")
AT = W20 + timedelta(days=1, hours=2)

# What an older boundary let in: (type, the fields beyond schema/seq/type/ts, why not valid)
LEGACY = [
    ("notice", {"workload": "code"}, "field 'message' must be string, got nothing"),
    ("knob_effect", {"message": None, "knob": "top_k"}, "field 'message' must be string"),
    ("quality", {"mode": "speculative", "num_draft_tokens": 3, "tasks": 10, "passed": 9,
                 "pass_rate": "high"}, "field 'pass_rate' must be integer/number"),
    ("generation_failed", {"error": 42, "workload": "code"}, "field 'error' must be string"),
    ("load_level", {"variant": "v", "mode": "baseline", "load": "concurrency", "level": 2,
                    "status": "ok"}, "field 'workload' must be string, got nothing"),
    ("soak_result", {"status": "ok", "generations": 3, "reasons": [1, {"x": 2}]},
     "reasons must be a list of strings"),
]


@pytest.fixture
def legacy(tmp_path):
    """A night of real results (summaries, quality, generations), then legacy rows."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    sid = night(store, AT, node="mac-01", **MAC, quality={3: 0.9}, configs={
        ("baseline", 0): V(100.0, rng=random.Random(1)),
        ("speculative", 3): V(130.0, acceptance=0.7, rng=random.Random(2))})
    ingest_lines(store, sid, "mac-01", [
        generation("baseline", 0), generation("speculative", 3, acceptance_rate=0.7,
                                              acceptance_by_position=[
                                                  {"position": 1, "drafted": 4,
                                                   "accepted": 3}])], AT.timestamp())
    seq = store.last_seq(sid, "mac-01")
    planted = {}
    events = []
    for i, (typ, body, _) in enumerate(LEGACY, start=seq + 1):
        events.append({"schema": 1, "seq": i, "type": typ, "ts": AT.timestamp(),
                       "job_id": "old", **body})
        planted[i] = typ
    # a generation whose per-position acceptance a reader indexes, in another shape
    bad_gen = {"schema": 1, "seq": seq + len(LEGACY) + 1, "ts": AT.timestamp(), "job_id": "old",
               **generation("speculative", 3, acceptance_rate=0.7,
                            acceptance_by_position=[{"pos": 1}])}
    events.append(bad_gen)
    planted[bad_gen["seq"]] = "generation"
    refused: list = []
    store.ingest(sid, "mac-01", events, [json.dumps(e) for e in events], refused)
    assert not refused  # stored: this is how an older boundary's leftovers look
    return store, url, sid, planted


def _flagged(text: str, planted: dict) -> set[tuple[str, int]]:
    return {(t, s) for s, t in planted.items() if f"stored event {t} seq {s} is unreadable"
            in text}


def test_the_store_read_path_marks_each_legacy_event_unreadable_with_its_reason(legacy):
    store, _, sid, planted = legacy
    got = queries.unreadable(store, [sid])
    assert {(u.type, u.seq) for u in got} == {(t, s) for s, t in planted.items()}
    reasons = {u.type: u.reason for u in got}
    for typ, _, why in LEGACY:
        assert why in reasons[typ], (typ, reasons[typ])
    assert "acceptance_by_position must be objects" in reasons["generation"]
    # the rest reads typed: every declared field of the type it claims
    ok = queries.typed(queries.events(store, [sid]))
    assert ok and all(isinstance(s.event, EVENT_CLASSES[s.event.TYPE]) for s in ok)
    # the readers leave them out and do not fail
    assert all(n.get("unreadable") for n in agent_notices(store, [sid]))
    assert load_ramps(store, [sid]) == [] and soak_results(store, sid) == []
    assert stream_checks(store, sid) == []
    d = review_data(store, sid)
    assert d["failed_generations"] == []
    assert {r.task_pass_rate for x in d["sections"] for r in x["rows"]} >= {0.9}


def test_every_reader_renders_and_flags_them(legacy, tmp_path):
    _, url, sid, planted = legacy
    want = {(t, s) for s, t in planted.items()}
    run = CliRunner()
    r = run.invoke(main, ["review", "--week", "2026-W20", "--db", url, "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for fmt in ("html", "md", "json"):
        text = (tmp_path / f"review-2026-W20.{fmt}").read_text()
        if fmt == "md":
            text = text.replace("\\_", "_")
        assert _flagged(text, planted) == want, fmt
    page = tmp_path / "sweep.html"
    r = run.invoke(main, ["review", "--sweep", sid, "--db", url, "--out", str(page)])
    assert r.exit_code == 0, r.output
    assert _flagged(page.read_text(), planted) == want
    r = run.invoke(main, ["site", str(tmp_path / "site"), "--db", url, "--week", "2026-W20"])
    assert r.exit_code == 0, r.output
    assert _flagged((tmp_path / "site" / "index.html").read_text(), planted) == want
    r = run.invoke(main, ["compare", sid, sid, "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert _flagged(r.stdout, planted) == want
    r = run.invoke(main, ["compare", sid, sid, "--db", url, "--out", str(tmp_path / "c.html")])
    assert r.exit_code == 0, r.output
    assert _flagged(r.stdout, planted) == want
    assert _flagged((tmp_path / "c.html").read_text(), planted) == want
    rid = json.loads(run.invoke(main, ["runs", "list", "--db", url, "--json"]).output)[0]["id"]
    r = run.invoke(main, ["runs", "show", str(rid), "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    assert _flagged(r.stdout, planted) == want
    r = run.invoke(main, ["runs", "show", str(rid), "--db", url])
    assert r.exit_code == 0 and "UNREADABLE" in r.output


# -- properties ------------------------------------------------------------------------------

def _valid(typ: str) -> dict:
    """One valid event of ``typ``: each declared field at a value of its first JSON type."""
    sample = {int: 3, float: 1.5, str: "x", bool: True, dict: {}, list: []}
    req, _ = (EVENTS[typ].required, EVENTS[typ].optional)
    body = {name: sample.get(ts[0]) for name, ts in req.items()}
    extra = {
        "generation": {"config": {"temperature": 0.0}, "prompt_sha256": "p" * 64,
                       "repetition": 0, "output_text": "", "decode_tok_s": 10.0},
        "config_summary": {"metrics": {"decode_tok_s": {"median": 1, "p95": 1, "cv": 0},
                                       "acceptance_rate": {"median": None}}},
        "environment_checked": {"fingerprints": {"target": "a", "draft": "b"}},
        "load_level": {"load": "concurrency", "status": "ok", "level": 2},
    }.get(typ, {})
    return {"schema": 1, "seq": 5, "type": typ, "ts": 1.0, **body, **extra}


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                        st.floats(allow_nan=False), st.text(max_size=5),
                        st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def mutated(draw):
    typ = draw(st.sampled_from(sorted(EVENTS)))
    e = _valid(typ)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(e)))
        how = draw(st.sampled_from(("drop", "retype", "rename")))
        if how == "drop":
            e.pop(name, None)
        elif how == "retype":
            e[name] = draw(JSON_VALUES)
        elif name in e:
            e[name + "_"] = e.pop(name)
    return typ, e


def _refused(e: dict) -> bool:
    try:
        return isinstance(Decoder("n").decode(json.dumps(e)), Quarantined)
    except ProtocolMismatch:
        return True


def _types_hold(ev: Event) -> bool:
    """Every declared field has a value of one of its declared JSON types (None only where
    the declaration admits it)."""
    hints = EVENTS[ev.TYPE]
    for f in fields(ev):
        if f.name in ("seq", "ts", "raw"):
            continue
        ts = hints.required.get(f.name) or hints.optional[f.name] + (type(None),)
        if type(getattr(ev, f.name)) not in ts:
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_a_mutated_stored_event_reads_typed_or_unreadable_never_raises(case):
    typ, e = case
    text = json.dumps(e)
    got = queries.read_stored("s", "n", 5, typ, text)
    if isinstance(got, queries.Stored):
        assert got.event.TYPE == typ and _types_hold(got.event)
        assert got.event.to_json() == json.loads(text)
    else:
        assert got.reason and got.type == typ
    # the boundary agrees: what it would set aside never reads as an event, and back
    # (a stored row's own seq and type must also be its payload's)
    try:
        refused = isinstance(Decoder("n").decode(text), Quarantined)
    except ProtocolMismatch:
        refused = True
    refused = refused or e.get("seq") != 5 or e.get("type") != typ
    assert refused == isinstance(got, queries.Unreadable)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_readers_survive_any_mutated_stored_events(tmp_path_factory, cases):
    store = open_store(fresh_sqlite(tmp_path_factory.mktemp('m') / 's.db'))
    sid = night(store, AT, node="mac-01", **MAC, configs={
        ("baseline", 0): V(100.0, rng=random.Random(1))})
    seq = store.last_seq(sid, "mac-01")
    events = []
    for i, (typ, e) in enumerate(cases, start=seq + 1):
        if typ in ("generation", "config_summary", "environment_checked", "job_finished",
                   "job_failed"):
            continue  # these feed the store's own tables at ingest: the boundary's job
        events.append({**e, "seq": i, "ts": 2.0, "type": typ})
    if events:
        store.ingest(sid, "mac-01", events, [json.dumps(e) for e in events])
    bad = {u.seq for u in queries.unreadable(store, [sid])}
    assert bad == {e["seq"] for e in events if _refused(e)}
    agent_notices(store, [sid])
    load_ramps(store, [sid])
    soak_results(store, sid)
    review_data(store, sid)


def test_the_properties_start_from_valid_events():
    for typ in EVENTS:
        e = _valid(typ)
        assert isinstance(queries.read_stored("s", "n", 5, typ, json.dumps(e)),
                          queries.Stored), typ


def test_declared_fields_are_the_classes_annotations():
    """One definition: the boundary's per-type declaration is the typed classes'."""
    for typ, cls in EVENT_CLASSES.items():
        names = {f.name for f in fields(cls)} - {"seq", "ts", "raw"}
        assert names == set(EVENTS[typ].required) | set(EVENTS[typ].optional)
    assert json_types(float | None) == (int, float, type(None))
    assert json_types(int) == (int,)
