"""A keyed journal with foreign bytes in it, read in two parts: every line the agent wrote
is stored exactly once, every other run of bytes is set aside with its reason, and the
node's outcome, `sweeps verify` and the store agree on how many (issue 28, audit 28b).

The journal is the real recorded one (``tests/hostile``), signed as the agent signs it;
what each case must come to is counted here from how it was built, never from the code
under test: runs of bytes = one per line, plus one per line whose glued prefix is not
whitespace (whitespace around a line is no line's content anywhere in the ledger, as a
blank line was never a row).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Text, select, type_coerce

from orchestrator.store import open_store
from orchestrator.store.coverage import GLUED, REPEAT, UNSIGNED
from orchestrator.store.models import Event, QuarantinedEvent
from tests.hostile import dump, event, follow_journal, journal, seq_of, signed_by_agent
from tests.test_audit_28 import FORGED_SPEED, _cli_verify
from tests.test_audit_28b import _follow_placed

KEY = bytes(range(32))
SIGNED = signed_by_agent(journal(), KEY, set())
# unsigned lines someone without the key appends: the agent's run 2 at another speed
# (claims seq 7, below what is stored), and a line past the journal's end
FORGED = [dump({**event(journal()[seq_of(journal(), "generation", 2)]),
                "decode_tok_s": FORGED_SPEED}),
          dump({"schema": 1, "seq": 29, "type": "notice", "ts": 1.0, "message": "forged"})]
_GLUES = st.one_of(
    st.binary(max_size=24).map(lambda b: b.replace(b"\n", b"")),  # any bytes but a newline
    st.sampled_from([b" ", b"\t", b"x", b'{"forged":', b'{"schema":', b'{"schema":1,"seq":7,',
                     SIGNED[3], FORGED[0], b"\xff\xfe", b"\x00"]))
_TAILS = st.text(alphabet=" \t\r", max_size=3).map(str.encode)


def _runs(line: bytes, agents: bool) -> int:
    """Runs of bytes a line holds: a glued prefix that is not whitespace is one more."""
    if not agents:
        return 1
    glue = line.strip()[:line.strip().rfind(b'{"schema":')]
    return 1 + bool(glue.decode("utf-8", "surrogateescape").strip())


@st.composite
def _journals(draw) -> tuple[list[bytes], list[bool], int]:
    """(the journal's lines, which hold an agent's line, where the first read stops)."""
    lines = list(SIGNED)
    for i in draw(st.lists(st.integers(0, 27), max_size=4, unique=True)):
        lines[i] = draw(_GLUES) + lines[i] + draw(_TAILS)
    agents = [True] * len(lines)
    for x in draw(st.lists(st.sampled_from(FORGED), max_size=3)):
        at = draw(st.integers(1, len(lines)))
        lines.insert(at, x)
        agents.insert(at, False)
    for _ in range(draw(st.integers(0, 4))):  # copies of earlier lines, appended later on
        src = draw(st.integers(0, len(lines) - 1))
        at = draw(st.integers(src + 1, len(lines)))
        lines.insert(at, lines[src])
        agents.insert(at, agents[src])
    # the first read takes the lines before `cut`; the rest is appended before the second
    return lines, agents, draw(st.integers(1, len(lines)))


def _rows(store, sid: str) -> list[tuple[int | None, str]]:
    with store.engine.connect() as c:
        return list(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sid)).all())


def _check(url: str, lines: list[bytes], agents: list[bool], cut: int, where: Path) -> None:
    store = open_store(url)
    f = follow_journal(store, lines[:cut], where, key=KEY)
    path = next((where / "jobs").glob("*.events.jsonl"))
    with open(path, "ab") as out:  # the agent goes on; whoever else appends goes on too
        out.write(b"".join(x + b"\n" for x in lines[cut:]))
    outcome = _follow_placed(store, f.sweep_id, where)
    again = _follow_placed(store, f.sweep_id, where)  # a third read adds nothing
    with store.engine.connect() as c:
        stored = c.execute(select(Event.seq, type_coerce(Event.payload, Text)).where(
            Event.sweep_id == f.sweep_id).order_by(Event.seq)).all()
    # each agent-written event exactly once, as the agent signed it
    assert [n for n, _ in stored] == list(range(1, 29)), (outcome, _rows(store, f.sweep_id))
    assert [json.loads(x) for _, x in stored] == [event(x) for x in SIGNED]
    rows = _rows(store, f.sweep_id)
    runs = sum(_runs(x, a) for x, a in zip(lines, agents, strict=True))
    assert len(rows) == runs - 28, (rows, outcome)
    assert all(why.startswith((REPEAT, GLUED, UNSIGNED)) for _, why in rows), rows
    aside = sum(not why.startswith(REPEAT) for _, why in rows)
    want = "ok" + (f": {aside} journal line(s) set aside" if aside else "")
    assert outcome.startswith(want) and again.startswith(want), (outcome, again, want)
    r = _cli_verify(url, f.sweep_id, where, "--json")
    node = json.loads(r.stdout)["nodes"][0]
    assert (r.exit_code, node["status"], node["journal_lines"], node["stored"],
            node["set_aside"]) == (0, "complete", runs, 28, runs - 28), r.output


@pytest.fixture(scope="module")
def sqlite_store_url(tmp_path_factory):
    from tests import store_templates

    return store_templates.fresh_sqlite(tmp_path_factory.mktemp("glue") / "store.db")


@settings(max_examples=60, deadline=None)
@given(case=_journals())
def test_glued_bytes_and_copies_are_each_accounted_for_once(sqlite_store_url, case):
    with tempfile.TemporaryDirectory() as d:
        _check(sqlite_store_url, *case, Path(d) / "node")


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_journals())
def test_glued_bytes_and_copies_on_postgresql(pg_url, case):
    with tempfile.TemporaryDirectory() as d:
        _check(pg_url, *case, Path(d) / "node")


def test_bytes_glued_past_the_line_limit_lose_the_agents_line_loudly(sqlite_url, tmp_path):
    """Glue that makes the agent's line longer than any event: the follower can keep only
    its head, so the agent's seq 7 is lost; the outcome and `sweeps verify` say so."""
    from agent.protocol import MAX_EVENT_BYTES

    lines = list(SIGNED)
    k = seq_of(journal(), "generation", 2)  # seq 7
    lines[k] = b"x" * MAX_EVENT_BYTES + lines[k]
    store = open_store(sqlite_url)
    f = follow_journal(store, lines, tmp_path / "node", key=KEY)
    assert f.outcome.startswith("failed: 1 journal line(s) never reached the store: seq 7"), \
        f.outcome
    r = _cli_verify(sqlite_url, f.sweep_id, tmp_path / "node", "--json")
    node = json.loads(r.stdout)["nodes"][0]
    assert (r.exit_code, node["status"]) == (1, "incomplete"), r.output


@pytest.mark.parametrize("lines,from_seq,sent", [
    # the first lines of seqs 1 and 2 stay out (stored); a copy of seq 1's brings it along
    ([SIGNED[0], SIGNED[1], SIGNED[0], SIGNED[2]], 2, [SIGNED[0], SIGNED[0], SIGNED[2]]),
    # a copy glued after foreign bytes brings it along too, before the glued line
    ([SIGNED[0], SIGNED[1], b"x" + SIGNED[1]], 2, [SIGNED[1], b"x" + SIGNED[1]]),
    # a second line claiming a stored seq (a forged one) goes out on every read
    ([SIGNED[6], FORGED[0], SIGNED[7]], 8, [FORGED[0]]),
    # from the top: everything
    ([SIGNED[0], SIGNED[0]], 0, [SIGNED[0], SIGNED[0]]),
])
def test_a_reread_sends_what_the_store_may_not_account_for(tmp_path, lines, from_seq, sent):
    import io

    from agent.follow import follow

    path = tmp_path / "j.events.jsonl"
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    out = io.BytesIO()
    follow(path, from_seq, None, out=out)
    assert out.getvalue().splitlines() == sent
