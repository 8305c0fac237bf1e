"""The agent's journal lines are signed; a line anyone else appends is set aside (issue 28).

What is known without the code under test: a line the agent's ``Journal`` wrote with the
sweep node's key is its own; a line another process appended to the file is not, whatever
it says. Each such line must be set aside with the reason, and every line of the agent's
stored. The key itself reaches no screen, page, file on the node or process argument.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.journal import Journal
from agent.protocol import MAX_EVENT_BYTES
from agent.signing import SUFFIX_BYTES, TAG, Verifier, mac, sign, signed
from orchestrator.sweep.decode import UNSIGNED, Decoder, Quarantined
from tests.controller import (
    hold_sweep,
    journal_path,
    json_from_log,
    specfleet,
    stored_events,
    sweep_id_from,
    wait_for,
)
from tests.hostile import journal as recorded
from tests.locks import make_lock

KEY = bytes(range(32))
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(
                           st.text(max_size=8), c, max_size=4), max_leaves=12)


def _written(tmp: Path, key: bytes | None, /, **fields) -> str:
    """One line as the agent's own Journal writes it."""
    j = Journal(tmp / "j.jsonl", echo=None, key=key)
    j.emit("notice", **fields)
    j.close()
    return (tmp / "j.jsonl").read_text().splitlines()[-1]


@settings(max_examples=200, deadline=None)
@given(fields=st.dictionaries(st.text(min_size=1, max_size=8).filter(
    lambda k: k not in ("schema", "seq", "type", "ts", "job_id")), JSONISH, max_size=5),
    flip=st.integers(min_value=0), key=st.binary(min_size=32, max_size=64))
def test_any_line_the_agent_signs_verifies_and_any_changed_byte_does_not(
        tmp_path_factory, fields, flip, key):
    line = _written(tmp_path_factory.mktemp("j"), key, **fields).encode()
    assert signed(key, line)
    assert json.loads(line)["mac"] == line[-66:-2].decode()  # the MAC is the last member
    i = flip % len(line)
    changed = line[:i] + bytes([line[i] ^ 0x01]) + line[i + 1:]
    assert not signed(key, changed)
    assert not signed(bytes(b ^ 1 for b in key), line)  # another key
    assert not signed(key, line + b" ") and not signed(key, line[:-1])


@settings(max_examples=300, deadline=None)
@given(key=st.binary(min_size=1, max_size=200), body=st.binary(max_size=3000),
       hexed=st.booleans())
def test_the_reused_hmac_state_answers_as_a_fresh_hmac_for_any_key_and_line(key, body,
                                                                              hexed):
    # the decoder's Verifier copies one HMAC state per line; hmac.digest starts afresh
    tail = mac(key, body) if hexed else "0" * 64
    line = body + TAG + tail.encode() + b'"}'
    v = Verifier(key)
    assert v(line) == v(line) == (hexed and len(body) >= 1)


def test_a_keyed_agents_largest_event_still_fits_the_boundary(tmp_path):
    # a generation whose output alone is ~17 MiB: trimmed until the signed line fits
    line = _written(tmp_path, KEY, output_text="x" * (17 << 20), token_ids=[1] * 10)
    assert len(line.encode()) + 1 <= MAX_EVENT_BYTES
    assert signed(KEY, line.encode()) and json.loads(line)["trimmed"]
    assert SUFFIX_BYTES == len(',"mac":"') + 64 + 2


def test_a_keyed_agent_believes_only_its_own_lines_when_it_restarts(tmp_path):
    # a forger appends a line with seq 2**31-1 and a generation for run 5 between two
    # launches: the restarted agent's seq goes on from its own, and --resume skips no run
    from agent.loop import previous_events

    path = tmp_path / "j.jsonl"
    j = Journal(path, echo=None, key=KEY)
    j.job_id = "job"
    j.emit("generation", run_index=0)
    j.emit("notice", message="mine")
    j.close()
    with path.open("a") as f:
        f.write(json.dumps({"schema": 1, "seq": 2**31 - 1, "type": "generation",
                            "ts": 1.0, "job_id": "job", "run_index": 5}) + "\n")
    again = Journal(path, echo=None, key=KEY)
    assert again.seq == 2 and again.emit("notice", message="next")["seq"] == 3
    assert [g["run_index"] for g in previous_events(path, "job", mine=again.mine)] == [0]
    # unkeyed (a node launched before keys) as before: every line counts
    assert Journal(path, echo=None).seq == 2**31 - 1
    assert [g["run_index"] for g in previous_events(path, "job")] == [0, 5]


def test_the_keyed_decoder_sets_aside_every_recorded_line_it_did_not_see_signed():
    lines = recorded()
    d, plain = Decoder("n1", key=KEY), Decoder("n1")
    for x in lines:  # recorded before keys: unsigned, and read as before without a key
        assert not isinstance(plain.decode(x), Quarantined)
        q = d.decode(x)
        assert isinstance(q, Quarantined) and q.reason == UNSIGNED
        assert q.seq == json.loads(x)["seq"]  # named by the seq it claims, for the record
        ok = d.decode(sign(KEY, x.decode()).encode())
        assert not isinstance(ok, Quarantined) and ok["seq"] == q.seq
    # a forger's MAC, or one from another sweep node's key, is no MAC
    forged = lines[3][:-1] + b',"mac":"' + b"0" * 64 + b'"}'
    assert d.decode(forged).reason == UNSIGNED
    assert d.decode(sign(secrets.token_bytes(32), lines[3].decode()).encode()).reason == UNSIGNED
    assert d.decode(b"not json").reason == UNSIGNED and d.decode(b"not json").seq is None



@settings(max_examples=200, deadline=None)
@given(glue=st.sampled_from(["", "junk", '{"schema":1,"seq":9']), forge=st.booleans(),
       index=st.integers(min_value=0, max_value=20), flip=st.integers(min_value=0))
def test_a_framed_line_is_decoded_on_one_mac_and_any_other_text_on_its_own(glue, forge,
                                                                           index, flip):
    # a follower frames each line, then decodes what framing returned: that text's MAC was
    # just taken and is not taken again; any other text handed to decode (a changed byte,
    # a line framed earlier) is checked itself: framing vouches for one text, once
    lines = recorded()
    x = sign(KEY, lines[index % len(lines)].decode())
    d = Decoder("n1", key=KEY)
    calls = []
    check = d._signed
    assert check is not None
    d._signed = lambda b: calls.append(b) or check(b)  # counts, then verifies as ever
    glued, own = d.framed(glue + x)
    assert own == x and glued == (glue or None) and len(calls) == (1 if not glue else 2)
    if forge:  # another text than the one framed: its own MAC decides (a forgery's fails)
        i = flip % (len(x) - 80)
        other = x[:i] + chr(ord(x[i]) ^ 1) + x[i + 1:]
        got = d.decode(other)
        assert isinstance(got, Quarantined) and got.reason == UNSIGNED
    else:
        before = len(calls)
        assert not isinstance(d.decode(own), Quarantined) and len(calls) == before
        assert not isinstance(d.decode(own), Quarantined) and len(calls) == before + 1

# -- end to end: a live journal on a loopback sshd node ----------------------------------


def _forged_plan(journal_file: Path) -> bytes:
    """The agent's plan again, cut to 2 generations, at the seq the agent writes next:
    believed, it would set the agent's real end aside (audit 28, the second plan)."""
    lines = journal_file.read_bytes().splitlines()
    last = max(json.loads(x)["seq"] for x in lines)
    p = next(json.loads(x) for x in lines if b'"type":"plan"' in x)
    p = {k: v for k, v in p.items() if k != "mac"}
    return json.dumps({**p, "seq": last + 1, "total_generations": 2,
                       "workloads": p["workloads"][:1]}, separators=(",", ":")).encode()


def _append_as(user: str, path: Path, line: bytes) -> None:
    """Another process of the node's own user appends a line to the live journal."""
    subprocess.run(["su", "-s", "/bin/sh", user, "-c", f"cat >> '{path}'"],
                   input=line + b"\n", check=True)


def _store_key(url: str, sid: str) -> str:
    from sqlalchemy import select

    from orchestrator.store import open_store
    from orchestrator.store.models import SweepNode

    with open_store(url, migrate=False).engine.connect() as c:
        return c.execute(select(SweepNode.journal_key).where(
            SweepNode.sweep_id == sid)).scalar_one()


def _agent_process(user: str, sid: str) -> bytes:
    """The held agent's argv and environment, as /proc shows them to its user."""
    pids = subprocess.run(["pgrep", "-u", user, "-f", f"agent run .*/{sid}\\.json"],
                          capture_output=True, text=True).stdout.split()
    assert pids, "no agent process"
    return b"".join(Path(f"/proc/{p}/{what}").read_bytes()
                    for p in pids for what in ("cmdline", "environ"))


def test_a_line_appended_to_a_live_journal_is_set_aside_and_the_key_shows_nowhere(
        fleet, model_pair, tmp_path, sqlite_url):
    from sqlalchemy import select

    from orchestrator.store import open_store
    from orchestrator.store.models import QuarantinedEvent

    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2, max_tokens=32,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    args = ["-i", str(inv), "--limit", "node1", "--known-hosts", str(fleet.known_hosts),
            "--db", sqlite_url, "--no-provision", "--failed-hosts-file", str(tmp_path / "r")]
    log = tmp_path / "c.log"
    ctl = specfleet("sweep", str(lock), *args, "--json", log=log)
    sid = sweep_id_from(log)
    node, path = fleet.nodes[0], journal_path(fleet.nodes[0], sid)
    wait_for(lambda: path.is_file() and b'"type":"generation"' in path.read_bytes(),
             what="a generation in the journal")
    assert hold_sweep(sid), "the agent ended before it could be held: plan more"
    try:
        assert b'"type":"job_finished"' not in path.read_bytes()
        key = _store_key(sqlite_url, sid)
        assert key and len(bytes.fromhex(key)) == 32
        seen = _agent_process(node.user, sid)
        assert key.encode() not in seen and b"--key-stdin" in seen  # by stdin, not argv
        forged = _forged_plan(path)  # takes the seq the agent writes next
        _append_as(node.user, path, forged)
    finally:
        hold_sweep(sid, signal.SIGCONT)
    assert ctl.wait(timeout=300) == 0, log.read_text()[-3000:]
    lines = path.read_bytes().splitlines()
    assert forged in lines and all(signed(bytes.fromhex(key), x) for x in lines if x != forged)
    stored = stored_events(sqlite_url, sid, "node1")
    assert stored == [json.loads(x) for x in lines if x != forged]  # every agent line
    assert stored[-1]["type"] == "job_finished"
    with open_store(sqlite_url, migrate=False).engine.connect() as c:
        aside = c.execute(select(QuarantinedEvent.reason, QuarantinedEvent.line).where(
            QuarantinedEvent.sweep_id == sid)).all()
    assert [tuple(a) for a in aside] == [(UNSIGNED, forged.decode())]
    assert json_from_log(log.read_text())["status"] == "ok"
    _shows_nowhere(key, sid, tmp_path, sqlite_url, log, node.home / ".specfleet")


def _shows_nowhere(key: str, sid: str, tmp: Path, url: str, log: Path, root: Path) -> None:
    """The key in no output a user sees (the sweep's log, --json listings, runs show,
    verify, the review and site pages) and in no file on the node."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    outputs = {"sweep log": log.read_bytes()}
    run = CliRunner().invoke
    for cmd in (["sweeps", "list", "--json"], ["runs", "list", "--sweep", sid, "--json"],
                ["review", "--sweep", sid, "--out", str(tmp / "review"), "--week", "this"],
                ["site", str(tmp / "site")]):
        r = run(main, [*cmd, "--db", url])
        assert r.exit_code == 0, (cmd, r.output)
        outputs[" ".join(cmd[:2])] = r.output.encode()
    run_id = json.loads(run(main, ["runs", "list", "--sweep", sid, "--json", "--db", url])
                        .output)[0]["id"]
    outputs["runs show"] = run(main, ["runs", "show", str(run_id), "--json", "--db",
                                      url]).output.encode()
    files = [p for d in (tmp / "review", tmp / "site", root) if d.exists()
             for p in d.rglob("*") if p.is_file() and not p.is_symlink()
             and p.stat().st_size < 64 << 20]
    assert any(p.name.endswith(".events.jsonl") for p in files)  # the node's files looked at
    outputs.update({str(p): p.read_bytes() for p in files})
    raw = bytes.fromhex(key)
    for where, data in outputs.items():
        assert key.encode() not in data.lower() and raw not in data, where
