"""Any interleaving of an agent's lines with forged ones, then any loss from the store, then
`--attach`: every line the agent wrote ends in the store exactly once at its measured
speed, every forged line set aside with a reason, `sweeps verify` complete (issue 28).

A forged line here is a copy of one of the agent's lines at a forged speed (claiming its
seq), placed anywhere after the agent's line of that seq (before it, on a node launched
before keys, nothing can tell the two apart), or a line claiming a seq that is no seq
(0, -1) anywhere; some are appended only after the first read. Then generation events are
lost from the store with their measurements (a lost batch, a restore, a hand edit). Keyed
(the agent signs its lines) and unkeyed alike. What must come of it is counted from how
the journal was built, never read from the code under test.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from orchestrator.store import open_store
from orchestrator.store.models import QuarantinedEvent
from tests.hostile import dump, event, follow_journal, journal, signed_by_agent
from tests.test_audit_28 import FORGED_SPEED, _real_speeds, _speeds, _state
from tests.test_audit_28b import _follow_placed
from tests.test_audit_28c import ALL, _journal_path, _lose, _node

AGENT = journal()
GENERATIONS = [i for i, x in enumerate(AGENT) if event(x)["type"] == "generation"]


def _forged(k: int | None, seq: int) -> bytes:
    """A copy of the agent's line ``k`` at a forged speed; with ``k`` None, a notice
    claiming ``seq`` (0 or -1: no seq the agent writes)."""
    if k is None:
        return dump({"schema": 1, "seq": seq, "type": "notice", "ts": 1.0,
                     "message": "forged"})
    return dump({**event(AGENT[k]), "decode_tok_s": FORGED_SPEED})


@st.composite
def _cases(draw):
    """(keyed, journal lines as first read, lines appended later, forged count, lost seqs)."""
    keyed = draw(st.booleans())
    key = secrets.token_bytes(32) if keyed else None
    agents = signed_by_agent(AGENT, key, set()) if key else list(AGENT)
    tagged: list[tuple[int | None, bytes]] = list(enumerate(agents))  # (agent's k, line)
    n_forged = 0
    for k in draw(st.lists(st.one_of(st.integers(0, 27), st.none()), max_size=4)):
        seq = draw(st.sampled_from([0, -1]))
        # anywhere after the agent's line k
        after = 0 if k is None else [i for i, _ in tagged].index(k) + 1
        tagged.insert(draw(st.integers(after, len(tagged))), (None, _forged(k, seq)))
        n_forged += 1
    lines = [x for _, x in tagged]
    late = [_forged(k, draw(st.sampled_from([0, -1]))) for k in draw(
        st.lists(st.one_of(st.integers(0, 27), st.none()), max_size=2))]
    lost = draw(st.lists(st.sampled_from(GENERATIONS), max_size=3, unique=True))
    return key, lines, late, n_forged + len(late), [k + 1 for k in lost]


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    from tests import store_templates

    return store_templates.fresh_sqlite(tmp_path_factory.mktemp("forged") / "store.db")


@settings(max_examples=25, deadline=None)
@given(case=_cases())
def test_every_agent_line_stored_once_every_forged_line_set_aside(store_url, case):
    key, lines, late, forged, lost = case
    store = open_store(store_url, migrate=False)
    with tempfile.TemporaryDirectory() as d:
        where = Path(d) / "node"
        f = follow_journal(store, lines, where, key=key)
        sid = f.sweep_id
        if late:
            with open(_journal_path(where), "ab") as out:
                out.write(b"".join(x + b"\n" for x in late))
        with store.engine.begin() as c:
            for seq in lost:
                _lose(c, sid, seq)
        outcome = _follow_placed(store, sid, where)  # `specfleet sweep --attach`
        assert _state(store, sid)[0] == ALL, outcome
        assert _speeds(store, sid) == _real_speeds(), outcome
        with store.engine.connect() as c:
            rows = c.execute(select(func.count()).select_from(QuarantinedEvent).where(
                QuarantinedEvent.sweep_id == sid)).scalar()
        assert rows == forged, (rows, forged, outcome)
        code, node = _node(store_url, sid, where)
        assert (code, node["status"], node["set_aside"]) == (0, "complete", forged), node


def test_a_gap_left_by_a_damaged_keyed_line_leaves_verify_incomplete(sqlite_url, tmp_path):
    """The integrator's decision: a seq no stored event and no covering row holds is a hole,
    incomplete (exit 1), even where no read can fill it: here the agent's seq 7, one byte of
    it changed on the node (JSON still, its MAC broken: set aside as unsigned)."""
    from tests.hostile import seq_of
    from tests.test_audit_28 import _cli_verify

    key = secrets.token_bytes(32)
    s = signed_by_agent(AGENT, key, set())
    k = seq_of(AGENT, "generation", 2)
    s[k] = s[k].replace(b',"type"', b', "type"', 1)
    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, s, where, key=key)
    code, node = _node(sqlite_url, f.sweep_id, where)
    assert (code, node["status"], node["journal_gaps"]) == (1, "incomplete", [[k + 1, k + 1]])
    flat = " ".join(_cli_verify(sqlite_url, f.sweep_id, where).output.split())
    assert f"seq {k + 1} is in neither the journal nor the store" in flat, flat
    assert "delete those events" not in flat, flat


@pytest.mark.parametrize("seq", [1, 29])
def test_a_forged_other_schema_appended_after_a_read_is_set_aside(sqlite_url, tmp_path, seq):
    """A job_started of schema 2 appended after the whole journal was read (claiming seq 1,
    the agent's announcement's, or the next seq), unkeyed: `--attach` reads it in a fresh
    controller, whose decoder has not seen the agent's own announcement in that read; the
    store holds it, so the line is set aside, never taken for the agent."""
    from tests.test_audit_28 import _cli_verify

    store = open_store(sqlite_url)
    where = tmp_path / "node"
    f = follow_journal(store, AGENT, where)
    with open(_journal_path(where), "ab") as out:
        out.write(dump({"schema": 2, "seq": seq, "type": "job_started", "ts": 1.0,
                        "agent_version": "9.9.9"}) + b"\n")
    outcome = _follow_placed(store, f.sweep_id, where)
    assert _state(store, f.sweep_id) == (ALL, [seq]), outcome
    assert _speeds(store, f.sweep_id) == _real_speeds()
    assert _cli_verify(sqlite_url, f.sweep_id, where).exit_code == 0
