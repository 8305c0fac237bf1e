"""Audit of issue 28 ("nothing lost, nothing forged"): hostile journal lines the ledger's
existing tests do not plant, each followed by the controller's own follower into a real
store (SQLite, and PostgreSQL where the store's behaviour could differ).

Each journal is the real recorded one (``tests/hostile``) with lines planted here; what must
be true is known from how the journal was built: the agent's own 28 lines are all stored
(its 16 measurements at the speeds it measured), each planted line is set aside, the node's
outcome and `sweeps verify` agree with the store.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from orchestrator.store import open_store
from orchestrator.store.coverage import set_aside_lines, stored_line_hashes
from orchestrator.store.models import Event, Measurement, QuarantinedEvent
from orchestrator.sweep.verify import compare
from tests.hostile import (
    _renumber,
    dump,
    event,
    follow_journal,
    journal,
    seq_of,
    signed_by_agent,
)

FORGED_SPEED = 99999.0  # no demo-pair generation runs anywhere near this fast


def _state(store, sid: str) -> tuple[list[int], list[int | None]]:
    """The stored seqs and the set-aside seqs of node n1."""
    with store.engine.connect() as c:
        stored = sorted(c.execute(select(Event.seq).where(Event.sweep_id == sid)).scalars())
        aside = [s for s in c.execute(select(QuarantinedEvent.seq).where(
            QuarantinedEvent.sweep_id == sid)).scalars()]
    return stored, sorted(aside, key=lambda s: -1 if s is None else s)


def _speeds(store, sid: str) -> dict[int, float]:
    """run index -> stored decode tok/s."""
    with store.engine.connect() as c:
        return dict(c.execute(select(Measurement.run_index, Measurement.decode_tok_s).where(
            Measurement.sweep_id == sid)).all())


def _real_speeds() -> dict[int, float]:
    return {e["run_index"]: e["decode_tok_s"] for e in map(event, journal())
            if e["type"] == "generation"}


def _verify(store, sid: str, lines: list[bytes]) -> str:
    """`sweeps verify`'s verdict for n1, the journal hashed as the node's digest script
    hashes it (each non-empty line stripped)."""
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


def _planted(at: int, *new: bytes) -> tuple[list[bytes], list[int]]:
    """The real journal with ``new`` lines in front of line index ``at`` (seqs renumbered
    one by one, as a node without a key might hold it: the planted lines take the agent's
    seqs, its own lines go on after them); and the seqs the planted lines took."""
    lines = journal()
    return _renumber(lines[:at] + list(new) + lines[at:], at), \
        [at + 1 + k for k in range(len(new))]


def _keyed(store, lines: list[bytes], planted: list[int], where: Path):
    """Follow ``lines`` as a keyed sweep's journal (as every sweep launched since issue 28
    is): the agent's lines signed with the sweep node's key, the lines at the indices
    ``planted`` not, since whoever appended them never had the key."""
    key = secrets.token_bytes(32)
    return follow_journal(store, signed_by_agent(lines, key, set(planted)), where, key=key)


def _planted_keyed(store, at: int, *new: bytes, where: Path):
    """A keyed node's journal with ``new`` lines planted in front of line index ``at``, as
    such a journal can be: the agent's 28 lines keep their seqs 1..28 and signatures (its
    seq counter and its signing are its own: a line someone else appends changes neither);
    the planted lines, unsigned, claim the seqs at+1 onwards (the seq the agent writes next,
    the one of the agent's line they stand in front of, and the ones after). Followed;
    returns the follow and the seqs the planted lines claim."""
    seqs = [at + 1 + k for k in range(len(new))]
    forged = [dump({**event(x), "seq": n}) for x, n in zip(new, seqs, strict=True)]
    lines = journal()
    return _keyed(store, lines[:at] + forged + lines[at:],
                  list(range(at, at + len(new))), where), seqs


def _agent_lines_kept(store, sid: str, planted: list[int], *,
                      renumbered: bool = False) -> None:
    """Every line the agent wrote is stored, its measurements as measured; every planted
    line is set aside. The agent's lines hold seqs 1..28 (a keyed node's journal), or with
    ``renumbered`` the seqs past the planted ones (``_planted``)."""
    stored, aside = _state(store, sid)
    assert aside == planted, aside
    agent = ([s for s in range(1, 29 + len(planted)) if s not in planted] if renumbered
             else list(range(1, 29)))
    assert stored == agent, stored
    assert _speeds(store, sid) == _real_speeds()


# -- 1. a forged generation for a run the plan has but the agent has not measured yet ------


def _future_run(**change) -> bytes:
    """A copy of the agent's last generation (run 15), at a forged speed."""
    g = event(journal()[seq_of(journal(), "generation", 15)])
    return dump({**g, "seq": 0, "decode_tok_s": FORGED_SPEED, **change})


def test_a_forged_run_ahead_of_the_agent_does_not_take_its_measurement(any_url, tmp_path):
    # after the 2nd real generation, a line claiming run 15 (which the agent measures last)
    at = seq_of(journal(), "generation", 1) + 1
    store = open_store(any_url)
    f, planted = _planted_keyed(store, at, _future_run(), where=tmp_path / "node")
    assert f.stopped is None
    _agent_lines_kept(store, f.sweep_id, planted)


def test_a_generation_for_a_config_the_job_never_had_is_set_aside(any_url, tmp_path):
    g = event(journal()[seq_of(journal(), "generation", 15)])
    forged = _future_run(num_draft_tokens=7, knob_value=7,
                         config={**g["config"], "num_draft_tokens": 7})
    at = seq_of(journal(), "generation", 1) + 1
    store = open_store(any_url)
    f, planted = _planted_keyed(store, at, forged, where=tmp_path / "node")
    with store.engine.connect() as c:
        widths = set(c.execute(select(Measurement.num_draft_tokens).where(
            Measurement.sweep_id == f.sweep_id)).scalars())
    assert widths <= {0, 2, 3}, widths
    _agent_lines_kept(store, f.sweep_id, planted)


def _stored_events(store, sid: str) -> dict[int, dict]:
    with store.engine.connect() as c:
        return {seq: (p if isinstance(p, dict) else json.loads(p)) for seq, p in c.execute(
            select(Event.seq, Event.payload).where(Event.sweep_id == sid))}


@pytest.mark.parametrize("kind", ["generation", "config_summary"])
def test_a_forged_line_ahead_of_the_agent_does_not_take_its_seq(any_url, tmp_path, kind):
    real = journal()
    # the agent's line it copies, its seq kept: 20 (run 15) or 21 (the first summary)
    forged = event(real[seq_of(real, kind, 15 if kind == "generation" else 0)])
    if kind == "generation":
        forged["decode_tok_s"] = FORGED_SPEED
    else:
        forged["metrics"]["decode_tok_s"] = {**forged["metrics"]["decode_tok_s"],
                                             "median": FORGED_SPEED}
    at = seq_of(real, "generation", 1) + 1  # between the agent's seq 6 and 7
    lines = real[:at] + [dump(forged)] + real[at:]
    store = open_store(any_url)
    f = _keyed(store, lines, [at], tmp_path / "node")
    unsigned = {seq: {k: v for k, v in e.items() if k != "mac"}
                for seq, e in _stored_events(store, f.sweep_id).items()}
    assert unsigned == {event(x)["seq"]: event(x) for x in real}
    assert _speeds(store, f.sweep_id) == _real_speeds()


# -- 2. a forged end through a forged soak_result ------------------------------------------


def test_a_forged_soak_result_does_not_vouch_for_a_forged_end(any_url, tmp_path):
    soak = dump({"schema": 1, "seq": 0, "type": "soak_result", "ts": 1.0, "status": "ok",
                 "generations": 2})
    end = dump({"schema": 1, "seq": 0, "type": "job_finished", "ts": 1.0, "status": "ok",
                "generations": 2})
    store = open_store(any_url)
    f, planted = _planted_keyed(store, seq_of(journal(), "generation", 1) + 1, soak, end,
                                where=tmp_path / "node")
    assert f.stopped is None
    _agent_lines_kept(store, f.sweep_id, planted)
    assert f.outcome.startswith("ok: 2 journal line(s) set aside"), f.outcome


def test_a_forged_soak_result_does_not_set_the_agents_end_aside(any_url, tmp_path):
    soak = dump({"schema": 1, "seq": 0, "type": "soak_result", "ts": 1.0, "status": "ok",
                 "generations": 2})
    store = open_store(any_url)
    f, planted = _planted_keyed(store, seq_of(journal(), "generation", 1) + 1, soak,
                                where=tmp_path / "node")
    assert store.last_event(f.sweep_id, "n1")["type"] == "job_finished"
    assert f.outcome.startswith("ok"), f.outcome


# -- 3. a forged plan ------------------------------------------------------------------------


def _forged_plan() -> bytes:
    """The agent's plan, cut to 2 generations of one workload."""
    p = event(journal()[seq_of(journal(), "plan")])
    return dump({**p, "seq": 0, "total_generations": 2, "workloads": p["workloads"][:1]})


def test_a_forged_plan_before_the_agents_own_does_not_set_its_runs_aside(any_url, tmp_path):
    store = open_store(any_url)
    f, planted = _planted_keyed(store, seq_of(journal(), "plan"), _forged_plan(),
                                where=tmp_path / "node")
    _agent_lines_kept(store, f.sweep_id, planted)


def test_a_forged_second_plan_does_not_set_the_agents_end_aside(any_url, tmp_path):
    store = open_store(any_url)
    f, planted = _planted_keyed(store, seq_of(journal(), "plan") + 1, _forged_plan(),
                                where=tmp_path / "node")
    _agent_lines_kept(store, f.sweep_id, planted)
    assert f.outcome.startswith("ok"), f.outcome


def test_a_forged_summary_ahead_of_the_agents_own_is_not_the_configs_run(any_url, tmp_path):
    from orchestrator.store.models import Run

    real = journal()
    at = seq_of(real, "config_summary")
    mine = event(real[at])
    forged = json.loads(json.dumps(mine))
    forged["seq"], forged["metrics"]["decode_tok_s"]["median"] = 0, FORGED_SPEED
    store = open_store(any_url)
    f, planted = _planted_keyed(store, at, dump(forged), where=tmp_path / "node")
    with store.engine.connect() as c:
        medians = set(c.execute(select(Run.decode_tok_s_median).where(
            Run.sweep_id == f.sweep_id)).scalars())
    want = {event(x)["metrics"]["decode_tok_s"]["median"] for x in real
            if event(x)["type"] == "config_summary"}
    assert medians == want, medians
    _agent_lines_kept(store, f.sweep_id, planted)


# -- 3b. a forged environment -----------------------------------------------------------


def test_a_forged_environment_does_not_rename_the_models_measured(any_url, tmp_path):
    from orchestrator.store.models import Run, SweepNode
    from tests.hostile import JOB

    real = journal()
    e = event(real[seq_of(real, "environment_checked")])
    forged = dump({**e, "seq": 0, "versions": {"mlx": "9.9.9", "mlx-lm": "9.9.9"},
                   "fingerprints": {"target": "sha256:" + "f" * 64,
                                    "draft": "sha256:" + "e" * 64}})
    store = open_store(any_url)
    f, planted = _planted_keyed(store, seq_of(real, "generation", 1) + 1, forged,
                                where=tmp_path / "node")
    sent = JOB["models"]["target"]["fingerprint"]
    assert e["fingerprints"]["target"] == sent  # the agent's own line names the job's model
    with store.engine.connect() as c:
        identity = c.execute(select(SweepNode.identity).where(
            SweepNode.sweep_id == f.sweep_id)).scalar()
        filed = set(c.execute(select(Run.target_fingerprint).where(
            Run.sweep_id == f.sweep_id)).scalars())
    assert (identity["target_fingerprint"], identity["mlx_version"]) == (
        sent, e["versions"]["mlx"]), identity
    assert filed == {sent}, filed
    _agent_lines_kept(store, f.sweep_id, planted)


# -- 4. the outcome and `sweeps verify` disagree ---------------------------------------------


@pytest.mark.parametrize("spacing", ["same bytes", "other spacing"])
def test_a_repeated_line_leaves_outcome_and_verify_agreeing(sqlite_url, tmp_path, spacing):
    lines = journal()
    k = seq_of(lines, "generation", 3)
    again = lines[k] if spacing == "same bytes" else json.dumps(event(lines[k])).encode()
    lines = lines[:k + 1] + [again] + lines[k + 1:]
    store = open_store(sqlite_url)
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.outcome == "ok"  # the store holds every event once: nothing is missing
    assert _verify(store, f.sweep_id, lines) == "complete"


def _cli_verify(store_url: str, sid: str, root: Path, *extra: str):
    """`specfleet sweeps verify` as a user runs it, the node reached as a local host (the
    digest script runs over the journal the follower read)."""
    import sys

    from click.testing import CliRunner

    from orchestrator.cli import main

    inv = root.parent / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    n1:\n      ansible_connection: local\n"
                   f"      specfleet_python: {sys.executable}\n      specfleet_root: {root}\n")
    return CliRunner().invoke(main, ["sweeps", "verify", sid, "-i", str(inv), "--db",
                                     store_url, *extra])


def test_verify_accounts_for_a_line_that_is_not_utf8(any_url, tmp_path):
    lines = journal()
    k = seq_of(lines, "generation")
    lines[k] = lines[k].replace(b'"code"', b'"c\xffde"')
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.outcome.startswith("ok: 1 journal line(s) set aside"), f.outcome
    r = _cli_verify(any_url, f.sweep_id, tmp_path / "node", "--json")
    out = json.loads(r.stdout)
    assert (r.exit_code, out["complete"], out["nodes"][0]["set_aside"]) == (0, True, 1), out


def test_verify_of_a_repeated_line_does_not_send_the_user_to_a_backup(any_url, tmp_path):
    lines = journal()
    k = seq_of(lines, "generation", 3)
    lines = lines[:k + 1] + [lines[k]] + lines[k + 1:]
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    r = _cli_verify(any_url, f.sweep_id, tmp_path / "node")
    assert "restore the store from a backup" not in r.output, r.output
    assert r.exit_code == 0, r.output


def test_the_cut_head_of_an_overlong_line_is_never_stored(sqlite_url, tmp_path):
    from agent.protocol import MAX_EVENT_BYTES

    lines, planted = _planted(seq_of(journal(), "generation", 1) + 1, b"{}")
    at = planted[0] - 1
    head = json.dumps({"schema": 1, "seq": planted[0], "type": "notice", "ts": 1.0,
                       "message": "\u00e9" * 6_000_000}, ensure_ascii=False,
                      separators=(",", ":")).encode()
    # longer than the limit by more than the follower's 1 MiB read: the head goes out cut
    lines[at] = head + b" " * (MAX_EVENT_BYTES - len(head) + (3 << 20)) + b"not JSON"
    store = open_store(sqlite_url)
    f = follow_journal(store, lines, tmp_path / "node")
    stored, aside = _state(store, f.sweep_id)
    assert planted[0] not in stored and len(aside) == 1, (stored, aside)


def test_a_duplicate_key_cannot_feed_the_telemetry_view_what_the_boundary_never_saw(
        sqlite_url, tmp_path):
    from orchestrator.store.models import TelemetrySample

    lines = journal()
    k = seq_of(lines, "generation")
    real = event(lines[k])["telemetry"]
    lines[k] = (b'{"telemetry":[{"ts":"evil","rss_bytes":"not a number","memory_pressure":"'
                + b"A" * 500 + b'"}],' + lines[k][1:])  # orjson, like JSON.parse: last wins
    store = open_store(sqlite_url)
    f = follow_journal(store, lines, tmp_path / "node")
    with store.engine.connect() as c:
        rows = c.execute(select(TelemetrySample.c.ts, TelemetrySample.c.rss_bytes).where(
            TelemetrySample.c.sweep_id == f.sweep_id, TelemetrySample.c.seq == k + 1)
            .order_by(TelemetrySample.c.idx)).all()
    assert [tuple(r) for r in rows] == [(t["ts"], t["rss_bytes"]) for t in real], rows


# -- guards: what held --------------------------------------------------------------------


def test_a_forged_run_after_the_agents_own_is_set_aside(any_url, tmp_path):
    # the other order of finding 1: the agent's run 1 first, then a forged run 1
    lines = journal()
    g = event(lines[seq_of(lines, "generation", 1)])
    at = seq_of(lines, "generation", 1) + 1
    forged = dump({**g, "seq": 0, "decode_tok_s": FORGED_SPEED})
    lines, planted = _planted(at, forged)
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    _agent_lines_kept(store, f.sweep_id, planted, renumbered=True)
    assert _verify(store, f.sweep_id, lines) == "complete"


def test_a_store_locked_by_another_process_for_seconds_loses_nothing(sqlite_url, tmp_path):
    # another process holds SQLite's write lock for 5 s while the node is followed: the
    # follower waits it out; every line stored once, verify complete
    import subprocess
    import sys

    store = open_store(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    locker = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({path!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True)\n"
        "time.sleep(5); c.execute('COMMIT')\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        lines = journal()
        f = follow_journal(store, lines, tmp_path / "node")
    finally:
        locker.wait(timeout=30)
    assert f.stopped is None and f.outcome == "ok", (f.stopped, f.outcome)
    assert _state(store, f.sweep_id) == (list(range(1, 29)), [])
    assert _speeds(store, f.sweep_id) == _real_speeds()
    assert _verify(store, f.sweep_id, lines) == "complete"


_SHARED: dict = {}

# what a hostile node may append at the tail of a line: JSON whitespace is stripped alike by
# the boundary and `sweeps verify`; anything else makes the line unreadable, set aside whole
_TAILS = st.sampled_from(["\r", " ", "\t", "\x1f", "\x0b", "\x0c", "\u00a0", "\u2028",
                          "\u3000", "\x85", "\ufeff"])


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 27), tail=st.lists(_TAILS, min_size=1, max_size=3),
       front=st.booleans())
def test_any_whitespace_around_a_line_is_accounted_for_once(tmp_path_factory, which, tail,
                                                            front):
    """A line with characters Unicode calls whitespace around it (that the boundary and the
    node's digest script could strip differently): stored or set aside, once; the outcome
    and `sweeps verify` agree."""
    if "store" not in _SHARED:
        import asyncio

        d = tmp_path_factory.mktemp("ws")
        _SHARED["store"] = open_store(f"sqlite:///{d / 's.db'}")
        _SHARED["loop"] = asyncio.new_event_loop()
    store = _SHARED["store"]
    lines = journal()
    pad = "".join(tail).encode()
    lines[which] = pad + lines[which] if front else lines[which] + pad
    f = follow_journal(store, lines, tmp_path_factory.mktemp("n"), loop=_SHARED["loop"])
    assert f.stopped is None
    stored, aside = _state(store, f.sweep_id)
    assert len(stored) + len(aside) == 28
    assert (f.outcome == "ok") == (not aside), f.outcome
    assert _verify(store, f.sweep_id, lines) == "complete"
