"""Each hostile or damaged line issue 28 names, in a real journal, and what the user sees.

One kind at a time (``tests/hostile.KINDS``) goes through the controller's own follower: the
line is set aside with the reason written here (planted, known without the code), the
progress says so, every other event of the journal is stored as the agent wrote it, the node
finishes, and the review, the site, the sweep page and compare render. The 3 MiB event goes
over a real sshd node (SSH is where it was lost); the NUL kinds into PostgreSQL (where they
stopped the node).
"""

from __future__ import annotations

import json

import pytest
from markupsafe import escape
from sqlalchemy import select

from orchestrator.fleet.transport import connect
from orchestrator.review.sweep_page import render_review
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement
from tests.hostile import KINDS, ROOT, follow_journal, journal, render_all
from tests.store_templates import fresh_sqlite

REAL = [json.loads(x) for x in journal()]

# kind → (the seq set aside, the reason the user reads); None: nothing is set aside
SEEN = {
    "generation without run_index": (5, "generation: field 'run_index' must be integer, "
                                        "got nothing"),
    "quality without passed": (29, "quality: field 'passed' must be integer, got nothing"),
    "soak_sample without index": (29, "soak_sample: field 'index' must be integer, got "
                                      "nothing"),
    "job_failed without message": (29, "job_failed: field 'message' must be string, got "
                                       "nothing"),
    "config_summary without metrics.decode_tok_s.p95": (
        21, "config_summary: metrics.decode_tok_s.p95 must be a number or null"),
    "line without schema": (5, "schema None is not this stream's event schema (this "
                               "controller reads 1.x)"),
    "1,000-deep nesting": (5, "generation: nested deeper than 32 levels"),
    "NUL in versions": (2, "environment_checked: versions.mlx holds a NUL character"),
    "NUL in fingerprints": (2, "environment_checked: fingerprints.draft holds a NUL "
                               "character"),
    "forged job_finished": (7, "job_finished: generations 16 disagrees with the journal "
                               "before it (2 generation(s) stored)"),
    "line reusing a stored seq": (6, "conflict: seq 6 arrived earlier in this read with "
                                     "other content"),
    "line reusing a run index": (29, "already measured: run_index 1 was measured at seq 6; "
                                     "the stored measurement is kept"),
    "generation for a run the job never had": (
        29, "not in the job: run_index 500 is outside the plan's 16 generations (0-15)"),
    "notice without message": (29, "notice: field 'message' must be string, got nothing"),
    "real 3 MiB agent event": None,
    "invalid UTF-8": (None, "not JSON (bytes that are not UTF-8)"),
    "truncated line": (None, "not JSON (unexpected end of data)"),
}


def _stored(store, sweep_id: str) -> dict[int, dict]:
    with store.engine.connect() as c:
        return dict(c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == sweep_id)).all())


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_hostile_line_is_set_aside_with_its_reason_and_the_node_goes_on(
        kind, request, tmp_path, shared_dir):
    assert set(SEEN) == {k.name for k in KINDS}
    url = (request.getfixturevalue("pg_url") if kind.store == "postgresql"
           else f"sqlite:///{tmp_path / 's.db'}")
    store = open_store(url)
    lines = kind.make(journal())
    if kind.transport == "ssh":  # the node's follower over a real SSH channel
        fleet = request.getfixturevalue("fleet")
        f = follow_journal(store, lines, shared_dir / "hostile", host=fleet.host(0),
                           transport=lambda h: connect(h, fleet.ssh_options()))
    else:
        f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    stored = _stored(store, f.sweep_id)
    kept = store.quarantined(f.sweep_id)
    want = SEEN[kind.name]
    if want is None:  # a valid event: stored whole, nothing set aside
        assert kept == [] and f.outcome == "ok"
        assert stored == {e["seq"]: e for e in (json.loads(x) for x in lines)}
        return
    seq, reason = want
    assert [(q.seq, q.reason) for q in kept] == [(seq, reason)]
    assert f"set aside a journal line{'' if seq is None else f' (seq {seq})'}: {reason}" \
        in " ".join(f.said)
    # every event of the real journal is stored as the agent wrote it, but the damaged one
    renumbered = kind.name == "forged job_finished"  # its seq 7 on are the agent's 8 on
    sent = set(lines)
    real = {e["seq"] + (1 if renumbered and e["seq"] >= 7 else 0): e for e, x in
            zip(REAL, journal(), strict=True) if x in sent or renumbered}
    for s, e in real.items():
        assert {**stored[s], "seq": e["seq"]} == e, f"seq {s}"
    assert len(stored) == len(real)
    # the node's outcome, as the sweep reports it: finished, the line named
    assert f.outcome == (f"ok: 1 journal line(s) set aside (`specfleet review --sweep "
                         f"{f.sweep_id}` lists why)")
    if "breaks" in kind.note:  # every reader renders (the property test renders them all)
        page = render_all(store, f.sweep_id, tmp_path / "out")["sweep page"]
    else:
        page = render_review(store, tmp_path / "sweep.html", f.sweep_id).read_text()
    assert str(escape(reason)) in page  # the sweep page lists why (as Jinja writes it)


def test_the_stored_measurement_is_kept_and_the_forged_one_never_shown(tmp_path):
    """The store showed 99999 tok/s for a run a second line measured again."""
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    kind = next(k for k in KINDS if k.name == "line reusing a run index")
    f = follow_journal(store, kind.make(journal()), tmp_path / "node")
    with store.engine.connect() as c:
        speeds = dict(c.execute(select(Measurement.run_index, Measurement.decode_tok_s).where(
            Measurement.sweep_id == f.sweep_id)).all())
    assert speeds == {e["run_index"]: e["decode_tok_s"] for e in REAL
                      if e["type"] == "generation"}
    assert 99999.0 not in speeds.values()
    pages = render_all(store, f.sweep_id, tmp_path / "out")
    assert "99999" not in pages["sweep page"] and "99999" not in pages["review"]


def test_a_conflict_with_an_event_stored_earlier_keeps_the_stored_one(tmp_path):
    """A line reusing a seq stored in an earlier batch (a re-read, another follower)."""
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    store.create_sweep("s1", {"models": {"target": {}, "draft": {}}}, None)
    raw = [x.decode() for x in journal()]
    assert store.ingest("s1", "n1", REAL[:8], raw[:8]) == 8
    forged = {**REAL[5], "decode_tok_s": 99999.0}
    refused: list = []
    assert store.ingest("s1", "n1", [REAL[5], forged], [raw[5], json.dumps(forged)],
                        refused) == 0
    assert [(r.seq, r.reason) for r in refused] == [
        (6, "conflict: seq 6 is stored with other content (generation); the stored event is "
            "kept")]
    assert _stored(store, "s1")[6] == REAL[5]
    # the same conflicting line again is kept once, and said once
    again: list = []
    store.ingest("s1", "n1", [forged], [json.dumps(forged)], again)
    assert again == [] and len(store.quarantined("s1")) == 1


def test_following_goes_on_past_a_forged_end_while_the_agent_runs(tmp_path):
    """The node-side follower stops when the agent process is gone, not at a line saying
    the job finished: the agent's own events after a forged end reach the store."""
    import subprocess
    import sys
    import time

    path = tmp_path / "j.events.jsonl"
    forged = {"schema": 1, "seq": 2, "type": "job_finished", "ts": 1.0, "status": "ok",
              "generations": 0}
    path.write_text(json.dumps(REAL[0]) + "\n" + json.dumps(forged) + "\n")
    agent = subprocess.Popen(["sleep", "30"])  # stands in for the agent's process: its pid
    try:
        proc = subprocess.Popen([sys.executable, "-m", "agent", "follow", str(path),
                                 "--from-seq", "0", "--pid", str(agent.pid)],
                                stdout=subprocess.PIPE, cwd=ROOT)
        time.sleep(1.0)
        assert proc.poll() is None  # still following after the forged end
        with open(path, "a") as f:
            f.write(json.dumps({**REAL[1], "seq": 3}) + "\n")
        time.sleep(0.5)
        agent.kill()
        agent.wait()
        out, _ = proc.communicate(timeout=10)
    finally:
        agent.kill()
    assert [json.loads(x)["seq"] for x in out.splitlines()] == [1, 2, 3]


def test_the_agent_never_writes_an_event_longer_than_the_boundary_takes(tmp_path):
    """An event over 16 MiB would be set aside whole: the agent's journal gives up its
    per-token arrays (named in ``trimmed``) so that the numbers are stored."""
    from agent.journal import Journal
    from agent.protocol import MAX_EVENT_BYTES
    from orchestrator.sweep.decode import Decoder

    gen = {k: v for k, v in REAL[4].items() if k not in ("schema", "seq", "type", "ts",
                                                         "job_id")}
    times = list(range(10**7, 10**7 + 2_000_000))  # 2M tokens' timings: ~18 MB of JSON
    j = Journal(tmp_path / "j.jsonl", echo=None)
    j.emit("generation", **{**gen, "token_times_us": times})
    j.emit("generation", **{**gen, "run_index": 1})  # an ordinary one is written as it is
    j.close()
    big, small = (tmp_path / "j.jsonl").read_bytes().splitlines()
    assert len(big) <= MAX_EVENT_BYTES
    e = Decoder("n1").decode(big)
    # per-token timings go first, and only as many arrays as it takes
    assert isinstance(e, dict) and e["trimmed"] == ["token_times_us"]
    assert e["token_ids"] == gen["token_ids"] and e["decode_tok_s"] == gen["decode_tok_s"]
    assert json.loads(small) == {**json.loads(small), **gen, "run_index": 1}
    assert "trimmed" not in json.loads(small)


def test_lists_the_outcome_joins_into_a_sentence_are_strings():
    """The node's outcome reads a failed job's reasons as "; ".join(reasons)."""
    from orchestrator.sweep.decode import Decoder, Quarantined

    end = {"schema": 1, "seq": 9, "type": "job_finished", "ts": 1.0, "status": "soak_failed",
           "generations": 0}
    d = Decoder("n1")
    assert d.decode(json.dumps({**end, "reasons": ["swap grew"]}))["reasons"] == ["swap grew"]
    q = d.decode(json.dumps({**end, "reasons": [1, {"x": 2}]}))
    assert isinstance(q, Quarantined) and q.reason == ("job_finished: reasons must be a list "
                                                       "of strings")
