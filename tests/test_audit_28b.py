"""Second audit of issue 28: the mechanisms added after the first (tests/test_audit_28.py):
signed journal lines (``agent.signing``), the job's configs (``store.job_configs``),
repeats and set-aside lines counted per occurrence, `sweeps verify`.

Each journal is the real recorded one (``tests/hostile``), signed with a sweep node's key
as the agent signs it, then damaged here; what must be true is known from how it was built:
the agent's own lines stored (or, when a line was damaged, accounted for), no planted line
stored, the key nowhere but its column, the outcome and `sweeps verify` agreeing.
"""

from __future__ import annotations

import json
import secrets
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from agent.signing import sign
from orchestrator.store import open_store
from orchestrator.store.models import SweepNode
from orchestrator.sweep.decode import UNSIGNED, Decoder, Quarantined
from tests.hostile import ROOT, dump, event, follow_journal, journal, seq_of, signed_by_agent
from tests.test_audit_28 import FORGED_SPEED, _cli_verify, _real_speeds, _speeds, _state

KEY = bytes(range(32))


def _reasons(store, sid: str) -> list[str]:
    from orchestrator.store.models import QuarantinedEvent

    with store.engine.connect() as c:
        return list(c.execute(select(QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid)).scalars())


def _signed_line(n: int = 0, key: bytes = KEY) -> bytes:
    """The agent's n-th generation, signed with ``key`` as the agent signs it."""
    lines = journal()
    return sign(key, lines[seq_of(lines, "generation", n)].decode()).encode()


# -- 1. what a forger can do with a signed line: every change is set aside ---------------


def _mutations() -> dict[str, bytes]:
    s = _signed_line()
    body, mac = s[:-74], s[-66:-2]  # s = body + ',"mac":"' + mac + '"}'
    assert s == body + b',"mac":"' + mac + b'"}'
    e = event(s)
    moved = dump({"mac": e["mac"], **{k: v for k, v in e.items() if k != "mac"}})
    return {
        "cut by one byte": s[:-1],
        "cut inside the mac": s[:-10],
        "the body cut, its mac kept": body[:-30] + s[-74:],
        "a member after the mac": s[:-1] + b',"decode_tok_s":99999.0}',
        "the mac member moved first": moved,
        "a second mac after it": s[:-1] + b',"mac":"' + mac + b'"}',
        "a forged mac before the agent's": body + b',"mac":"' + b"0" * 64 + b'"'
        + b',"mac":"' + mac + b'"}',
        "the mac in upper case": body + b',"mac":"' + mac.upper() + b'"}',
        "a speed changed, mac kept": s.replace(
            b'"decode_tok_s":' + str(e["decode_tok_s"]).encode(), b'"decode_tok_s":99999.0'),
        "signed with another node's key": _signed_line(key=bytes(32)),
        "no mac at all": journal()[seq_of(journal(), "generation")],
        "a space after the closing brace": s + b" ",
        "a CR after the closing brace": s + b"\r",
    }


@pytest.mark.parametrize("how", list(_mutations()))
def test_a_changed_signed_line_is_not_the_agents(how):
    line = _mutations()[how]
    out = Decoder("n1", key=KEY).decode(line)
    assert type(out) is Quarantined and out.reason == UNSIGNED, (how, out)


def test_the_agents_signed_line_is_read():
    out = Decoder("n1", key=KEY).decode(_signed_line())
    assert type(out) is dict and out["type"] == "generation"


# -- 2. the key never leaves its column --------------------------------------------------


def _every_text(db_path: str, but: tuple[str, str]) -> str:
    """Every value of every table of the SQLite store, but one column, as text."""
    c = sqlite3.connect(db_path)
    out = []
    for (table,) in c.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')"):
        cols = [r[1] for r in c.execute(f'PRAGMA table_info("{table}")')]
        keep = [x for x in cols if (table, x) != but]
        if keep:
            q = ", ".join(f'CAST("{x}" AS TEXT)' for x in keep)
            for row in c.execute(f'SELECT {q} FROM "{table}"'):
                out.extend(str(v) for v in row)
    c.close()
    return "\n".join(out)


def test_the_key_is_nowhere_but_its_column(sqlite_url, tmp_path):
    lines = journal()
    k = seq_of(lines, "generation", 1) + 1
    forged = dump({**event(lines[k - 1]), "decode_tok_s": FORGED_SPEED})
    key = secrets.token_bytes(32)
    signed = signed_by_agent(lines, key, set())
    signed = signed[:k] + [forged] + signed[k:]
    store = open_store(sqlite_url)
    f = follow_journal(store, signed, tmp_path / "node", key=key)
    r = _cli_verify(sqlite_url, f.sweep_id, tmp_path / "node", "--json")
    seen = "\n".join([*f.said, f.outcome, r.output, _every_text(
        sqlite_url.removeprefix("sqlite:///"), ("sweep_nodes", "journal_key"))])
    for form in (key.hex(), key.hex().upper()):
        assert form not in seen
    assert json.loads(r.stdout)["complete"], r.output


# -- 3. a replayed signed line -------------------------------------------------------------


def test_a_line_signed_for_another_sweep_node_is_set_aside(any_url, tmp_path):
    lines = journal()
    k = seq_of(lines, "generation", 1) + 1
    mine, theirs = secrets.token_bytes(32), secrets.token_bytes(32)
    # the other node's (or sweep's) run 15 at a forged speed, with the seq the agent's next
    # line takes: a valid line under its own key
    g = event(lines[seq_of(lines, "generation", 15)])
    other = sign(theirs, dump({**g, "seq": k + 1, "decode_tok_s": FORGED_SPEED}).decode())
    signed = signed_by_agent(lines, mine, set())
    signed = signed[:k] + [other.encode()] + signed[k:]
    store = open_store(any_url)
    f = follow_journal(store, signed, tmp_path / "node", key=mine)
    stored, aside = _state(store, f.sweep_id)
    assert (stored, aside) == (list(range(1, 29)), [k + 1])
    assert _speeds(store, f.sweep_id) == _real_speeds()


def test_the_agents_own_line_replayed_later_is_stored_once(any_url, tmp_path):
    key = secrets.token_bytes(32)
    signed = signed_by_agent(journal(), key, set())
    k = seq_of(journal(), "generation", 2)
    signed = signed[:-1] + [signed[k]] + signed[-1:]  # its run 2 again before the end
    store = open_store(any_url)
    f = follow_journal(store, signed, tmp_path / "node", key=key)
    # the store holds it once; the journal's second copy is accounted for as a repeat
    assert _state(store, f.sweep_id) == (list(range(1, 29)), [k + 1])
    assert _reasons(store, f.sweep_id)[0].startswith("repeat:")
    assert f.outcome == "ok", f.outcome
    r = _cli_verify(any_url, f.sweep_id, tmp_path / "node", "--json")
    assert (r.exit_code, json.loads(r.stdout)["complete"]) == (0, True), r.output


# -- 4. bytes glued in front of the agent's next line ------------------------------------


@pytest.mark.parametrize("glue,tail", [(b" ", b""), (b"\t", b""), (b"x", b""),
                                       (b'{"forged":', b""), (b"", b"\r"), (b"", b" ")])
def test_bytes_appended_before_the_agents_line_do_not_lose_its_measurement(
        sqlite_url, tmp_path, glue, tail):
    # whoever can append to the journal writes a few bytes with no newline; the agent's
    # next line (run 2, seq 7) lands after them on the same line. Its own bytes, MAC and
    # all, are intact at the line's end: the measurement is the agent's
    key = secrets.token_bytes(32)
    signed = signed_by_agent(journal(), key, set())
    k = seq_of(journal(), "generation", 2)
    signed[k] = glue + signed[k] + tail
    store = open_store(sqlite_url)
    f = follow_journal(store, signed, tmp_path / "node", key=key)
    stored, _ = _state(store, f.sweep_id)
    # what the user is told today: an ok sweep, a complete verify, 15 of 16 measurements
    assert k + 1 in stored or not f.outcome.startswith("ok"), (
        f.outcome, _reasons(store, f.sweep_id))
    assert _speeds(store, f.sweep_id) == _real_speeds()


# -- 5. the job's configs: every generation the agent's plan runs is the job's ---------------

_VALUES = {  # knob -> values a plan may sweep (each valid for the knob)
    "num_draft_tokens": st.sampled_from([1, 2, 4, 6, 8]),
    "temperature": st.sampled_from([0.0, 0.2, 0.7, 1, 1.5]),
    "top_p": st.sampled_from([0.5, 0.9, 1.0, 1]),
    "top_k": st.sampled_from([0, 20, 40]),
    "kv_bits": st.sampled_from([None, 4, 8]),
    "kv_group_size": st.sampled_from([32, 64, 128]),
    "max_kv_size": st.sampled_from([None, 512]),
    "repetition_penalty": st.sampled_from([None, 1.1]),
}


def _engine_of(job):
    """The engine a node builds for ``job`` (http: the real HttpEngine; in-process: mlx-lm's
    variants for the job's lineup, without loading a model)."""
    if job.engine:
        from agent.httpruntime import HttpEngine

        return HttpEngine(job, None)
    from agent.mlxengine import MlxEngine, lineup_variants

    eng = MlxEngine.__new__(MlxEngine)
    eng.lineup, eng.variants = job.lineup, lineup_variants(job.lineup)
    return eng


@st.composite
def _jobs(draw, width=st.sampled_from([None, 2, 5, 5.0])) -> dict:
    from tests.hostile import JOB

    swept = draw(st.lists(st.sampled_from(sorted(_VALUES)), max_size=3, unique=True))
    knobs = {k: draw(st.lists(_VALUES[k], min_size=1, max_size=3)) for k in swept}
    raw = {**JOB, "knobs": knobs} if knobs or draw(st.booleans()) else \
        {k: v for k, v in JOB.items() if k != "knobs"}
    raw["workloads"] = [{"name": "code", "prompt": "def f():", "max_tokens": 32}]
    raw["base"] = {**JOB["base"], "temperature": draw(st.sampled_from([0.0, 0.7]))}
    if draw(st.booleans()):
        raw["baseline"] = {"temperature": draw(st.sampled_from([0.0, 0.3])),
                           **draw(st.sampled_from([{}, {"kv_bits": 8}, {"top_p": 0.8}]))}
    if draw(st.booleans()):  # an http engine: a baseline and speculative variants
        widths = draw(st.lists(width, min_size=1,
                               max_size=2))
        raw["engine"] = {"type": "http", "variants": [
            {"name": "plain", "base_url": "http://127.0.0.1:1"},
            *({"name": f"spec{i}", "base_url": "http://127.0.0.1:2", "speculative": True,
               **({} if w is None else {"num_draft_tokens": w})}
              for i, w in enumerate(widths))]}
        if draw(st.booleans()):
            raw["engine"]["knobs"] = {"speculative.n_max": [4, 8]}
        raw.pop("knobs", None) if "num_draft_tokens" in knobs else None
    return raw


@settings(max_examples=150, deadline=None)
@given(raw=_jobs())
def test_every_config_the_agents_plan_runs_is_the_jobs(raw):
    from hypothesis import assume

    from agent.errors import JobFileError
    from agent.job import parse_job
    from agent.loop import build_plan
    from orchestrator.store.job_configs import allowed_values, config_problem

    try:
        job = parse_job(raw)
    except JobFileError:
        assume(False)
    eng = _engine_of(job)
    allowed = allowed_values(raw)
    assert allowed is not None
    for s in build_plan(job, eng):
        _, cfg = eng.describe(s)
        e = {"config": cfg, "knob": s.knob, "knob_value": s.knob_value,
             "num_draft_tokens": s.config["num_draft_tokens"] if s.variant.speculative else 0}
        assert config_problem(allowed, e) is None, (raw, e)


def _judged(raw: dict) -> list[str | None]:
    """config_problem for each generation the agent's plan for ``raw`` runs."""
    from agent.job import parse_job
    from agent.loop import build_plan
    from orchestrator.store.job_configs import allowed_values, config_problem

    job = parse_job(raw)  # the agent (and `plan lock`, which runs its parser) accept it
    eng, allowed = _engine_of(job), allowed_values(raw)
    assert allowed is not None
    out = []
    for s in build_plan(job, eng):
        _, cfg = eng.describe(s)
        out.append(config_problem(allowed, {
            "config": cfg, "knob": s.knob, "knob_value": s.knob_value,
            "num_draft_tokens": s.config["num_draft_tokens"] if s.variant.speculative else 0}))
    return out


@pytest.mark.parametrize("width", ["5", 5.5])
def test_an_http_variants_width_as_the_agent_reads_it_is_the_jobs(width):
    from tests.hostile import JOB

    raw = {**{k: v for k, v in JOB.items() if k != "knobs"},
           "workloads": [{"name": "code", "prompt": "def f():", "max_tokens": 32}],
           "engine": {"type": "http", "variants": [
               {"name": "plain", "base_url": "http://127.0.0.1:1"},
               {"name": "spec", "base_url": "http://127.0.0.1:2", "speculative": True,
                "num_draft_tokens": width}]}}
    judged = _judged(raw)
    assert judged and judged == [None] * len(judged), judged


# -- 6. a keyed sweep read as an unkeyed one -------------------------------------------------


def _follow_placed(store, sid: str, where, node: str = "n1"):
    """Follow sweep ``sid``'s node as `specfleet sweep --attach` does (its row as stored)."""
    import asyncio
    import io
    import sys

    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.dispatch import NodeRun, StderrProgress, SweepOptions
    from tests.hostile import InProcess

    host = Host(name=node, address="localhost", connection="local", python=sys.executable,
                root=str(where))
    run = NodeRun(host, store, sid, "audit", SweepOptions(), StderrProgress(io.StringIO()))
    asyncio.run(run.follow_once(InProcess(host)))
    o = run.outcome()
    return f"{o.status}" + (f": {o.detail}" if o.detail else "")


def test_a_store_downgraded_and_upgraded_still_checks_a_running_sweeps_lines(sqlite_url,
                                                                            tmp_path):
    import uuid

    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.hostile import new_sweep, placed

    lines = journal()
    k = seq_of(lines, "generation", 1) + 1
    g = event(lines[seq_of(lines, "generation", 15)])
    forged = dump({**g, "seq": k + 1, "decode_tok_s": FORGED_SPEED})  # ahead of the agent
    key = secrets.token_bytes(32)
    signed = signed_by_agent(lines, key, set())
    where, sid = tmp_path / "node", uuid.uuid4().hex[:12]
    path, folder = placed(where, sid, ROOT)
    path.write_bytes(b"".join(x + b"\n" for x in signed[:k] + [forged] + signed[k:]))
    new_sweep(open_store(sqlite_url), "n1", path, folder, sid=sid, root=where, key=key)
    # refused, --yes or not: the key is what tells the agent's lines from anyone's (the
    # audit found the downgrade dropped it and a later --attach read the journal unkeyed)
    r = CliRunner().invoke(main, ["db", "downgrade", "0017", "--yes", "--db", sqlite_url])
    assert r.exit_code == 1, r.output
    assert (f"downgrading to 0017 would drop the journal keys of 1 sweep node(s) still "
            f"running ({sid}/n1)") in r.output and "Nothing was changed" in r.output
    store = open_store(sqlite_url)
    with store.engine.connect() as c:
        kept = c.execute(select(SweepNode.journal_key).where(SweepNode.sweep_id == sid)).scalar()
    outcome = _follow_placed(store, sid, where)
    assert FORGED_SPEED not in _speeds(store, sid).values(), (kept, outcome)


def test_a_store_whose_keyed_sweeps_are_finished_downgrades(sqlite_url, tmp_path):
    """The refusal above holds only while an agent may still write: a finished keyed sweep
    node's key is listed with what the downgrade deletes and dropped with --yes."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.hostile import new_sweep

    store = open_store(sqlite_url)
    sid = new_sweep(store, "n1", tmp_path / "j.jsonl", key=secrets.token_bytes(32))
    store.set_sweep_node(sid, "n1", state="finished")
    r = CliRunner().invoke(main, ["db", "downgrade", "0017", "--yes", "--db", sqlite_url])
    assert r.exit_code == 0 and "store at revision 0017" in r.output, r.output


# -- 7. a legitimate --resume: a new agent process, the same key -----------------------------


def test_a_resumed_agents_lines_verify_after_a_torn_line_and_a_forged_one(tmp_path):
    from agent.journal import Journal

    path = tmp_path / "j.events.jsonl"
    first = Journal(path, echo=None, key=KEY)
    for i in range(3):
        first.emit("notice", message=f"first agent {i}")
    first.close()
    with open(path, "ab") as f:  # a forged line far ahead, then the crash's torn write
        f.write(dump({"schema": 1, "seq": 1000, "type": "notice", "ts": 1.0,
                      "message": "forged"}) + b"\n" + b'{"schema":1,"seq":4,"ty')
    second = Journal(path, echo=None, key=KEY)  # what `agent run --resume` opens
    for i in range(2):
        second.emit("notice", message=f"resumed agent {i}")
    second.close()
    d = Decoder("n1", key=KEY)
    out = [d.decode(x) for x in path.read_bytes().splitlines()]
    read = [e["seq"] for e in out if type(e) is dict]
    aside = [e.seq for e in out if type(e) is Quarantined]
    assert (read, aside) == ([1, 2, 3, 4, 5], [1000]), (read, aside)


# -- 8. set-aside lines on a keyed sweep: outcome, verify and a second read agree ------------


def _planted_keyed(key: bytes) -> dict[str, list[bytes]]:
    """Lines someone without the key appends to a keyed journal, each kind by itself."""
    s = signed_by_agent(journal(), key, set())
    k = seq_of(journal(), "generation", 2)
    e = event(s[k])
    bare = dump({x: v for x, v in e.items() if x != "mac"})
    forged = dump({**e, "seq": 29, "decode_tok_s": FORGED_SPEED})
    return {
        "the agent's line, its mac cut off": [bare],
        "the agent's line, its mac upper case": [s[k][:-66] + s[k][-66:-2].upper() + b'"}'],
        "a forged line three times": [forged, forged, forged],
        "a forged line with a key twice": [forged[:-1] + b',"seq":29}'],
        "a forged line with bytes not UTF-8": [forged.replace(b'"code"', b'"c\xffde"')],
        "a forged line cut short": [forged[:120]],
    }


@pytest.mark.parametrize("kind", list(_planted_keyed(KEY)))
def test_set_aside_lines_are_counted_alike_by_outcome_verify_and_a_second_read(
        sqlite_url, tmp_path, kind):
    key = secrets.token_bytes(32)
    planted = _planted_keyed(key)[kind]
    signed = signed_by_agent(journal(), key, set())
    lines = signed[:-1] + planted + signed[-1:]
    store = open_store(sqlite_url)
    f = follow_journal(store, lines, tmp_path / "node", key=key)
    n = len(planted)
    want = f"ok: {n} journal line(s) set aside"
    assert f.outcome.startswith(want), f.outcome
    assert _state(store, f.sweep_id)[0] == list(range(1, 29))
    assert _speeds(store, f.sweep_id) == _real_speeds()
    again = _follow_placed(store, f.sweep_id, tmp_path / "node")  # --attach again
    assert again.startswith(want), again
    r = _cli_verify(sqlite_url, f.sweep_id, tmp_path / "node", "--json")
    node = json.loads(r.stdout)["nodes"][0]
    assert (r.exit_code, node["status"], node["stored"], node["set_aside"]) == (
        0, "complete", 28, n), r.output


def test_a_copy_of_a_set_aside_line_appended_between_reads_is_counted(sqlite_url, tmp_path):
    key = secrets.token_bytes(32)
    s = signed_by_agent(journal(), key, set())
    k = seq_of(journal(), "generation", 2)
    forged = dump({**event(journal()[k]), "decode_tok_s": FORGED_SPEED})  # claims seq 7
    store = open_store(sqlite_url)
    f = follow_journal(store, s[:10] + [forged, forged] + s[10:20], tmp_path / "node",
                       key=key)
    path = next((tmp_path / "node" / "jobs").glob("*.events.jsonl"))
    with open(path, "ab") as out:  # the agent goes on; a third copy lands before its lines
        out.write(forged + b"\n" + b"".join(x + b"\n" for x in s[20:]))
    outcome = _follow_placed(store, f.sweep_id, tmp_path / "node")  # --attach
    r = _cli_verify(sqlite_url, f.sweep_id, tmp_path / "node", "--json")
    node = json.loads(r.stdout)["nodes"][0]
    assert _state(store, f.sweep_id) == (list(range(1, 29)), [7, 7, 7]), outcome
    assert outcome.startswith("ok: 3 journal line(s) set aside"), outcome
    assert (node["status"], node["set_aside"]) == ("complete", 3), node


def test_set_aside_lines_claiming_the_agents_next_seqs_do_not_move_the_next_read(
        sqlite_url, tmp_path):
    # unsigned copies of the agent's seqs 21-28 written before the agent gets there: set
    # aside with the seqs they claim; the next read (--attach) still asks the node for the
    # agent's own 21-28 and stores them
    key = secrets.token_bytes(32)
    s = signed_by_agent(journal(), key, set())
    forged = [dump({**event(x), "decode_tok_s": FORGED_SPEED}) for x in journal()[20:]]
    store = open_store(sqlite_url)
    f = follow_journal(store, s[:20] + forged, tmp_path / "node", key=key)
    path = next((tmp_path / "node" / "jobs").glob("*.events.jsonl"))
    with open(path, "ab") as out:
        out.write(b"".join(x + b"\n" for x in s[20:]))
    outcome = _follow_placed(store, f.sweep_id, tmp_path / "node")
    assert _state(store, f.sweep_id) == (list(range(1, 29)), list(range(21, 29)))
    assert _speeds(store, f.sweep_id) == _real_speeds()
    assert outcome.startswith("ok: 8 journal line(s) set aside"), outcome
    r = _cli_verify(sqlite_url, f.sweep_id, tmp_path / "node", "--json")
    assert json.loads(r.stdout)["nodes"][0]["status"] == "complete", r.output
