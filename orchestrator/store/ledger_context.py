"""What the ledger must know of a node's stored journal to judge one batch, read in one
round trip.

The ledger's rules (``ledger``, ``journal_ends``) ask the store seven things per batch:
which of its seqs are stored, which of its run indexes are measured, where the node's plan,
end and last event are, its stored job_failed events, and the lines set aside past its last
event or as jumps in the batch's range. Asked one statement at a time they cost seven round
trips and seven compiled statements per batch (on PostgreSQL most of the ledger's time:
bench/ingest.py); here they are one ``UNION ALL`` of index look-ups, each row tagged with
the question it answers. Plain SQL both databases run as written, kept to this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
from sqlalchemy import text

# each part: (tag, a, b, t), a and b integers, t text; :s and :n are the sweep and node.
# A null is typed: PostgreSQL types a union's columns from its first parts
_NODE = "sweep_id = :s AND node = :n"
_I, _T = "CAST(NULL AS BIGINT)", "CAST(NULL AS TEXT)"
_PARTS = {
    "hit": f"SELECT 'hit', seq, {_I}, {_T} FROM events WHERE {_NODE} "
           "AND seq BETWEEN :lo AND :hi",
    # the type as literal SQL: both databases then use its partial index (0015, 0017)
    "end": f"SELECT 'end', (SELECT min(seq) FROM events WHERE {_NODE} "
           f"AND type = 'job_finished'), {_I}, {_T}",
    "plan": f"SELECT 'plan', {_I}, {_I}, (SELECT payload FROM events WHERE {_NODE} "
            "AND type = 'plan' ORDER BY seq LIMIT 1)",
    "base": f"SELECT 'base', (SELECT max(seq) FROM events WHERE {_NODE}), {_I}, {_T}",
    "aside": f"SELECT 'aside', seq, {_I}, reason FROM quarantined_events WHERE {_NODE} "
             f"AND seq > (SELECT COALESCE(max(seq), 0) FROM events WHERE {_NODE})",
    "failed": f"SELECT 'failed', seq, {_I}, {_T} FROM events WHERE {_NODE} "
              "AND type = 'job_failed'",
    "jump": f"SELECT 'jump', id, seq, line_sha256 FROM quarantined_events WHERE {_NODE} "
            "AND seq BETWEEN :lo AND :hi AND reason LIKE :jump",
    "measured": f"SELECT 'measured', run_index, seq, {_T} FROM measurements WHERE {_NODE} "
                "AND run_index BETWEEN :rlo AND :rhi",
}
_WITHOUT_GENERATIONS = text(" UNION ALL ".join(v for k, v in _PARTS.items() if k != "measured"))
_WITH_GENERATIONS = text(" UNION ALL ".join(_PARTS.values()))


@dataclass
class Context:
    """The stored journal around a batch, as the ledger's rules ask for it."""

    hits: set[int] = field(default_factory=set)  # seqs in the batch's range, stored
    measured: dict[int, int] = field(default_factory=dict)  # run index → the seq measuring it
    end: int | None = None  # the first stored job_finished
    plan: dict | None = None  # the first stored plan event
    base: int = 0  # the last stored seq
    aside: list[tuple[int, str]] = field(default_factory=list)  # set aside past it: seq, why
    failed: set[int] = field(default_factory=set)  # stored job_failed events
    jumps: list[tuple[int, int, str]] = field(default_factory=list)  # id, seq, line sha256


def read_context(c, sweep_id: str, node: str, seqs: list[int], run_indexes: list[int],
                 jump_reason_start: str) -> Context:
    """One round trip: every look-up the ledger makes for a batch of ``seqs`` (and, for its
    generations, ``run_indexes``)."""
    params = {"s": sweep_id, "n": node, "lo": min(seqs), "hi": max(seqs),
              "jump": jump_reason_start + "%"}
    if run_indexes:
        params.update(rlo=min(run_indexes), rhi=max(run_indexes))
    stmt = _WITH_GENERATIONS if run_indexes else _WITHOUT_GENERATIONS
    ctx = Context()
    for tag, a, b, t in c.execute(stmt, params):
        if tag == "hit":
            ctx.hits.add(a)
        elif tag == "measured":
            ctx.measured[a] = b
        elif tag == "end":
            ctx.end = a
        elif tag == "plan":
            ctx.plan = None if t is None else orjson.loads(t)
        elif tag == "base":
            ctx.base = a or 0
        elif tag == "aside":
            ctx.aside.append((a, t))
        elif tag == "failed":
            ctx.failed.add(a)
        else:
            ctx.jumps.append((a, b, t))
    return ctx
