"""Issue 28's audit findings 7, 9, 10 and 12, below the follower: what the ledger, the
boundary and `sweeps verify` each decide for one line, on planted inputs whose answer is
known without the code under test, and properties that must hold for any input."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.store.coverage import kept_line_sha256
from orchestrator.store.dupkeys import duplicate_key
from orchestrator.store.job_configs import allowed_values, config_problem
from orchestrator.sweep.verify import DIGEST_SCRIPT, compare, parse_digest
from tests.hostile import JOB, event, journal

# -- finding 12: a key twice in one object ------------------------------------------------

KEYS = st.text(alphabet='ab:"\\é', min_size=1, max_size=3)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.text(alphabet='xy:" é\\', max_size=6))
# an object as the pairs its text lists (a key may come twice); arrays of values
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.lists(st.tuples(KEYS, inner), max_size=4).map(lambda ps: ("obj", ps))), max_leaves=12)


def _write(v, seps: tuple[str, str], escape: bool) -> str:
    """JSON text of ``v``, pairs written as listed (duplicates too); ``escape``: a colon
    inside a string written as \\u003a (the one escape that hides it from a count)."""
    if isinstance(v, tuple):
        return "{" + seps[0].join(_write(k, seps, escape) + seps[1] + _write(x, seps, escape)
                                  for k, x in v[1]) + "}"
    if isinstance(v, list):
        return "[" + seps[0].join(_write(x, seps, escape) for x in v) + "]"
    text = json.dumps(v)
    return text.replace(":", "\\u003a") if escape and isinstance(v, str) else text


def _twice(v) -> bool:
    if isinstance(v, tuple):
        keys = [k for k, _ in v[1]]
        return len(set(keys)) < len(keys) or any(_twice(x) for _, x in v[1])
    return isinstance(v, list) and any(_twice(x) for x in v)


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(KEYS, VALUES), max_size=5),
       seps=st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : "), (",", " :")]),
       escape=st.booleans())
def test_a_key_twice_is_found_at_any_depth_and_only_then(pairs, seps, escape):
    top = ("obj", pairs)
    text = _write(top, seps, escape)
    found = duplicate_key(text, orjson.loads(text))
    assert (found is not None) == _twice(top), (text, found)


def test_a_planted_duplicate_telemetry_key_is_named():
    line = journal()[4].decode()
    assert event(line.encode())["type"] == "generation"
    assert duplicate_key(line, orjson.loads(line)) is None  # the agent's own line
    forged = '{"telemetry":[],' + line[1:]
    assert duplicate_key(forged, orjson.loads(forged)) == "telemetry"


# -- finding 9: a line that is not UTF-8, hashed alike on the node and in the store --------


def _digest_of(data: bytes, tmp_path) -> list:
    path = tmp_path / "j.events.jsonl"
    path.write_bytes(data)
    out, argv = io.StringIO(), sys.argv
    try:
        sys.argv = ["-c", str(path)]
        with contextlib.redirect_stdout(out):
            exec(DIGEST_SCRIPT, {"__name__": "__main__"})
    finally:
        sys.argv = argv
    return parse_digest(out.getvalue())[0]


def test_a_line_that_is_not_utf8_is_hashed_as_the_journal_holds_it(tmp_path):
    raw = b'{"seq":5,"type":"generation","workload":"c\xffde"}'
    want = hashlib.sha256(raw).hexdigest()  # its bytes, as written
    assert _digest_of(raw + b"\n", tmp_path) == [(5, want)]
    # the follower hands the boundary the line with that byte escaped; its row's hash
    assert kept_line_sha256(raw.decode("utf-8", "surrogateescape")) == want
    # and with whitespace around it, both strip it alike
    assert _digest_of(b" " + raw + b"\r\n", tmp_path) == [(5, want)]
    assert kept_line_sha256(" " + raw.decode("utf-8", "surrogateescape") + "\r") == want


# -- finding 10: a repeat of a stored event ------------------------------------------------


def test_verify_accounts_for_a_repeat_of_the_stored_bytes_and_not_for_other_content():
    a, b = "a" * 64, "b" * 64
    stored = {1: a, 2: b}
    # the journal holds seq 2 twice, byte for byte: nothing lost, nothing differs
    same = compare("n1", [(1, a), (2, b), (2, b)], stored, set(), [])
    assert (same.status, same.repeats, same.conflicts) == ("complete", [2], [])
    # a second line of seq 2 with other content, not set aside: a conflict
    other = compare("n1", [(1, a), (2, b), (2, "c" * 64)], stored, set(), [])
    assert other.status == "incomplete" and [c["seq"] for c in other.conflicts] == [2]
    # ... accounted for once its row (a repeat of the stored event) is kept
    kept = compare("n1", [(1, a), (2, b), (2, "c" * 64)], stored, set(), ["c" * 64])
    assert (kept.status, kept.set_aside) == ("complete", 1)


def test_verify_names_the_seqs_the_journal_itself_lacks():
    # the audit's "a line skipped": the journal has no seq 3 or 4 (lost on the node); the
    # store lacks those events too, so it says which seqs neither holds and is incomplete
    # (the integrator's decision on issue 28: every hole below the last seq is incomplete,
    # even one no read can fill); a row set aside with that seq covers it
    sha = {n: f"{n:064x}" for n in (1, 2, 5, 6)}
    out = compare("n1", list(sha.items()), dict(sha), set(), [])
    assert (out.status, out.journal_gaps) == ("incomplete", [(3, 4)])
    covered = compare("n1", list(sha.items()), dict(sha), {3, 4}, [])
    assert (covered.status, covered.journal_gaps) == ("complete", [])
    # two unreadable lines set aside on a node launched before keys may be seqs 3 and 4
    # (the node's outcome counts them so); on a keyed node no unreadable line is the agent's
    lines = [*list(sha.items())[:2], (None, "e" * 64), (None, "f" * 64), *list(sha.items())[2:]]
    unkeyed = compare("n1", lines, dict(sha), set(), ["e" * 64, "f" * 64])
    keyed = compare("n1", lines, dict(sha), set(), ["e" * 64, "f" * 64], keyed=True)
    assert (unkeyed.status, keyed.status) == ("complete", "incomplete")
    assert "no journal line is numbered seq 3-4" in out.line()
    whole = compare("n1", list(sha.items())[:2], {1: sha[1], 2: sha[2]}, set(), [])
    assert whole.journal_gaps == []


# -- finding 7: the knob values a job gives ------------------------------------------------


def test_the_recorded_jobs_generations_are_its_own_and_a_foreign_width_is_not():
    allowed = allowed_values(JOB)
    assert allowed is not None
    gens = [event(x) for x in journal() if event(x)["type"] == "generation"]
    assert len(gens) == 16 and all(config_problem(allowed, g) is None for g in gens)
    g = gens[-1]
    forged = {**g, "num_draft_tokens": 7, "knob_value": 7,
              "config": {**g["config"], "num_draft_tokens": 7}}
    why = config_problem(allowed, forged)
    assert why is not None and why.startswith("not in the job:") and " 7 " in why, why
    hot = {**g, "config": {**g["config"], "temperature": 0.7}}  # a knob the job fixes at 0
    assert config_problem(allowed, hot) is not None
    assert allowed_values({}) is None  # no job kept: nothing judged


@given(widths=st.lists(st.integers(1, 12), min_size=1, max_size=4, unique=True),
       base=st.integers(1, 12), other=st.integers(1, 40))
def test_a_width_is_the_jobs_exactly_when_the_job_gives_it(widths, base, other):
    job = {**JOB, "base": {**JOB["base"], "num_draft_tokens": base},
           "knobs": {"num_draft_tokens": widths}}
    allowed = allowed_values(job)
    assert allowed is not None
    g = next(event(x) for x in journal() if event(x)["type"] == "generation")

    def at(w: int) -> dict:
        return {**g, "num_draft_tokens": w, "knob_value": w,
                "config": {**g["config"], "num_draft_tokens": w}}

    for w in [*widths, base]:
        assert config_problem(allowed, at(w)) is None
    assert (config_problem(allowed, at(other)) is None) == (other in [*widths, base])


def _digest_pairs(lines: list[bytes]) -> list:
    out = []
    for x in lines:
        text = x.decode("utf-8", "surrogateescape").strip()
        out.append((json.loads(text)["seq"], hashlib.sha256(
            text.encode("utf-8", "surrogateescape")).hexdigest()))
    return out


def test_a_line_with_a_key_twice_is_stored_as_checked_and_verify_accounts_for_it(
        any_url, tmp_path):
    """The agent's generation with 'telemetry' twice (forged first): the store holds the
    object the boundary checked (the agent's telemetry), verify finds the journal line;
    the same forged line reusing that seq after it is set aside, and verify agrees."""
    from sqlalchemy import select

    from orchestrator.store import open_store
    from orchestrator.store.coverage import set_aside_lines, stored_line_hashes
    from orchestrator.store.models import Event
    from tests.hostile import follow_journal, seq_of

    lines = journal()
    k = seq_of(lines, "generation")
    real = event(lines[k])
    lines[k] = b'{"telemetry":[{"ts":"evil"}],' + lines[k][1:]
    again = b'{"decode_tok_s":1,' + lines[k + 1][1:]  # seq k+2's line, a key twice
    forged = (b'{"telemetry":[],' + json.dumps({**real, "decode_tok_s": 99999.0},
                                               separators=(",", ":")).encode()[1:])
    lines = lines[:k + 2] + [forged] + lines[k + 2:]
    lines[k + 1] = again
    store = open_store(any_url)
    f = follow_journal(store, lines, tmp_path / "node")
    assert f.stopped is None
    with store.engine.connect() as c:
        payload = dict(c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == f.sweep_id)).all())
    got = {s: p if isinstance(p, dict) else json.loads(p) for s, p in payload.items()}
    assert got[real["seq"]] == real  # the agent's own values, as the boundary checked them
    assert got[real["seq"] + 1] == event(journal()[k + 1])
    assert sorted(got) == list(range(1, 29))  # the forged line (seq 5 again) set aside
    status = compare("n1", _digest_pairs(lines), stored_line_hashes(store, f.sweep_id, "n1"),
                     *set_aside_lines(store, f.sweep_id, "n1"))
    assert status.status == "complete", status.line()
