"""What a node sends is input, not truth: every journal line passes one decode boundary.

A planted journal (written here by hand, not by the agent) with malformed lines is followed
through the real follower (`python -m agent follow` on the controller's own machine) into
SQLite and PostgreSQL: the good events are stored, each bad line is set aside with its reason,
nothing crashes, and following again stores nothing twice. An agent of another major event
schema is refused with its version named.
"""

import asyncio
import json
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from agent.protocol import EVENT_SCHEMA
from orchestrator.fleet.inventory import Host
from orchestrator.fleet.transport import LocalTransport
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement
from orchestrator.sweep.decode import Decoder, ProtocolMismatch, Quarantined
from orchestrator.sweep.dispatch import NodeRun, SweepOptions

ROOT = Path(__file__).resolve().parents[1]


def generation(seq: int, **over) -> dict:
    e = {"schema": 1, "seq": seq, "type": "generation", "ts": 1000.0 + seq, "job_id": "j",
         "run_index": seq, "workload": "code", "prompt_sha256": "a" * 64, "mode": "baseline",
         "knob": "num_draft_tokens", "knob_value": 2, "num_draft_tokens": 0, "repetition": 0,
         "config": {"temperature": 0.0, "num_draft_tokens": 0}, "generated_tokens": 8,
         "ttft_ms": 3.5, "decode_tok_s": 410.0, "itl_p50_ms": 2.4, "itl_p95_ms": 2.9,
         "output_text": "def f(x):", "token_ids": [1, 2, 3], "unreliable": False,
         "unreliable_reasons": [], "telemetry": [{"ts": 1.0, "rss_bytes": 1 << 27,
                                                  "memory_pressure": "normal"}]}
    e.update(over)
    return e


PLANTED = [
    ({"schema": 1, "seq": 1, "type": "job_started", "ts": 1000.0, "job_id": "j",
      "agent_version": "0.1.0", "event_schema": EVENT_SCHEMA}, None),
    ({"schema": 1, "seq": 2, "ts": 1001.0}, "unknown event type None"),
    ({"schema": 1, "seq": "3", "type": "plan", "ts": 1.0, "total_generations": 1},
     "seq '3' is not an integer"),
    ({"schema": 1, "seq": 2**40, "type": "plan", "ts": 1.0, "total_generations": 1},
     "seq 1099511627776 is not an integer in 1..2147483647"),
    (generation(5, workload="co\x00de"), "generation: workload holds a NUL character"),
    (generation(6, workload="w" * 200),
     "generation: workload is 200 characters long; the store holds 128"),
    (generation(7, ttft_ms="fast"),
     "generation: field 'ttft_ms' must be integer/number/null, got string"),
    (generation(11, generated_tokens=2**40),
     "generation: generated_tokens=1099511627776 is out of range"),
    (generation(8, output_text="ok\x00then"), None),        # kept, NUL replaced in the text
    (generation(9, output_text="x" * (3 << 20)), None),     # a 3 MiB line is read, not lost
    ("this is not json", "not JSON"),
    ([1, 2], "an event must be a JSON object, got list"),
    ({"schema": 1, "seq": 10, "type": "job_finished", "ts": 1010.0, "status": "ok",
      "generations": 2}, None),
]


def plant(journal: Path) -> None:
    with open(journal, "w") as f:
        for item, _ in PLANTED:
            f.write((item if isinstance(item, str) else json.dumps(item)) + "\n")


def follow(url: str, journal: Path) -> tuple:
    store = open_store(url)
    from tests.hostile import placed

    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, {"models": {"target": {}, "draft": {}}}, None)
    root = journal.parent / "root"  # laid out as a launch lays it out: nothing else runs
    path, folder = placed(root, sid, ROOT)
    path.write_bytes(journal.read_bytes())
    host = Host(name="n1", address="localhost", connection="local", python=sys.executable,
                root=str(root))
    store.set_sweep_node(sid, "n1", state="running", journal_path=str(path),
                         agent_dir=str(folder), python=sys.executable, pid=0, root=str(root))
    said: list[str] = []
    run = NodeRun(host, store, sid, "test-holder", SweepOptions(),
                  lambda node, e: said.append(e.get("message", "")))

    async def twice():
        await run.follow_once(LocalTransport(host))
        await run.follow_once(LocalTransport(host))  # again: nothing stored twice

    asyncio.run(twice())
    return store, sid, said


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_bad_lines_are_set_aside_and_the_rest_is_stored(backend, tmp_path, request):
    url = (f"sqlite:///{tmp_path / 's.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    journal = tmp_path / "node.events.jsonl"
    plant(journal)
    store, sid, said = follow(url, journal)
    with store.engine.connect() as c:
        seqs = c.execute(select(Event.seq).where(Event.sweep_id == sid)
                         .order_by(Event.seq)).scalars().all()
        texts = dict(c.execute(select(Measurement.seq, Measurement.output_text)
                               .where(Measurement.sweep_id == sid)).all())
    assert seqs == [1, 8, 9, 10]
    assert texts[8] == "ok\ufffdthen" and len(texts[9]) == 3 << 20
    kept = store.quarantined(sid, "n1")
    want = [why for _, why in PLANTED if why]
    assert len(kept) == len(want)  # the second follow added nothing
    for reason in want:
        assert any(reason in q.reason for q in kept), (reason, [q.reason for q in kept])
    assert {q.seq for q in kept} >= {2, 5, 6, 7, 11}
    assert sum("set aside a journal line" in m for m in said) == len(want)
    # every line is accounted for (stored, or set aside with or without a readable seq)
    assert store.missing_seqs(sid, "n1") == ([(3, 4)], 4)
    run = NodeRun(Host(name="n1", address="localhost", connection="local"), store, sid, "t",
                  SweepOptions(), lambda n, e: None)
    assert run.outcome().status == "ok"


def test_a_line_that_never_arrived_is_named_by_its_seq(tmp_path, sqlite_url):
    journal = tmp_path / "node.events.jsonl"
    lines = [{"schema": 1, "seq": n, "type": "notice", "ts": 1000.0 + n, "message": "m"}
             for n in (1, 2, 5, 6)] + [{"schema": 1, "seq": 7, "type": "job_finished",
                                         "ts": 1010.0, "status": "ok", "generations": 0}]
    journal.write_text("".join(json.dumps(e) + "\n" for e in lines))  # 3 and 4 were lost
    store, sid, _ = follow(sqlite_url, journal)
    run = NodeRun(Host(name="n1", address="localhost", connection="local"), store, sid, "t",
                  SweepOptions(), lambda n, e: None)
    out = run.outcome()
    assert out.status == "failed"
    assert out.detail == (f"2 journal line(s) never reached the store: seq 3-4; the node's "
                          f"journal {tmp_path}/root/jobs/{sid}.events.jsonl holds what it "
                          "wrote (`specfleet sweeps verify` says whether it holds those seqs: "
                          "a line lost there no read brings back)")


def test_another_major_schema_is_refused_with_the_agent_version(tmp_path, sqlite_url):
    journal = tmp_path / "node.events.jsonl"
    journal.write_text(json.dumps({"schema": 2, "seq": 1, "type": "job_started", "ts": 1.0,
                                   "agent_version": "9.0.0"}) + "\n")
    with pytest.raises(ProtocolMismatch, match=r"n1: the agent \(version 9\.0\.0\) writes "
                                               r"event schema 2; this controller reads 1\.x"):
        follow(sqlite_url, journal)


def test_minor_versions_add_optional_fields_only():
    d = Decoder("n1")
    e = d.decode(json.dumps({**generation(3), "a_field_from_1_7": {"x": 1}}))
    assert isinstance(e, dict) and e["a_field_from_1_7"] == {"x": 1}
    missing = dict(generation(4))
    del missing["config"]
    q = d.decode(json.dumps(missing))
    assert isinstance(q, Quarantined) and "field 'config' must be object, got nothing" in q.reason


def test_an_environment_event_with_a_malformed_tier_is_set_aside():
    """events 1.2's optional quantization: strings that fit the store, or the line is
    quarantined with the reason; an event without it (an agent at 1.1) still decodes."""
    from orchestrator.sweep.decode import Decoder, Quarantined

    base = {"schema": 1, "seq": 2, "type": "environment_checked", "ts": 1.0, "job_id": "j",
            "versions": {"mlx": "0.1"}, "fingerprints": {"target": "sha256:t",
                                                         "draft": "sha256:d"}}
    d = Decoder("n1")
    assert not isinstance(d.decode(json.dumps(base)), Quarantined)
    ok = {**base, "quantization": {"target": "unquantised", "draft": "4-bit g64"}}
    assert d.decode(json.dumps(ok))["quantization"]["draft"] == "4-bit g64"
    for bad, reason in [({"draft": 4}, "quantization.draft must be a string of at most 32"),
                        ("4-bit", "field 'quantization' must be object/null, got string"),
                        ({"target": "x" * 40}, "quantization.target must be a string")]:
        q = d.decode(json.dumps({**base, "quantization": bad}))
        assert isinstance(q, Quarantined) and reason in q.reason, q
