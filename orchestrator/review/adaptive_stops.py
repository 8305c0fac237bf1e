"""The adaptive sweep's stops as a reader wants them: which config stopped, after how many
of the plan's repetitions, and why ("num_draft_tokens=4 stopped after 5 of 6 repetitions:
settled as the best"). Read from the agents' ``notice`` events (``adaptive: true``, with the
rounds measured) and the sweep's lock (``job.repetitions``: the most an adaptive sweep runs).
"""

from __future__ import annotations

from agent.protocol import knob_words as what_words
from agent.protocol import stop_parts

from ..store import Store, queries
from ..store.weekly_rows import sweep_plans

BEST = "settled as the best"


def adaptive_stops(store: Store, sweep_ids: list[str],
                   locks: dict[str, dict] | None = None) -> list[dict]:
    """Per stop: sweep, node, workload, variant (the pair), ``what`` (knob=value or the
    variant), ``after`` (rounds measured) of ``of`` (the plan's repetitions), ``why``, ``best``
    (settled as the best: the sweep stopped on its winner) and ``text``. ``locks``: each
    sweep's lock, already read (else read here)."""
    if not sweep_ids:
        return []
    if locks is None:
        locks = {sid: lock for sid, (_, lock) in sweep_plans(store, sweep_ids).items()}
    most = {sid: (lock.get("job") or {}).get("repetitions") for sid, lock in locks.items()}
    out = []
    for s in queries.typed(queries.events(store, sweep_ids, ("notice",),
                                          order=("node", "seq"))):
        e = s.event
        parts = stop_parts(str(e.get("message") or "")) if e.get("adaptive") else None
        if parts is None:
            continue
        what, why = parts
        after, of = e.get("repetitions"), most.get(s.sweep_id)
        count = (f"after {after} of {of} repetitions" if isinstance(after, int) and of
                 else f"after {after} repetitions" if isinstance(after, int) else "early")
        out.append({"sweep_id": s.sweep_id, "node": s.node, "workload": e.get("workload"),
                    "variant": e.get("variant"), "pair": pair_words(e.get("variant")),
                    "what": what, "after": after, "of": of,
                    "why": why, "best": why.startswith(BEST),
                    "text": f"{what_words(what)} stopped {count}: {why}"})
    return out


def is_stop(adaptive: object, message: str) -> bool:
    """Whether an agent's notice is an adaptive stop (shown here, in words, not again among
    the notices)."""
    return bool(adaptive) and stop_parts(message) is not None


def pair_words(variant: object) -> str | None:
    """The pair a stop's variant runs ("speculative@target+draft" → "target+draft")."""
    return str(variant).split("@", 1)[-1] if variant else None


def stop_role(variant: object) -> str:
    """The lock's role of the target a stop's pair runs ("speculative@target-2+draft" →
    target-2); a variant naming no pair (one pair per sweep) is the plan's one target's."""
    v = str(variant or "")
    return v.split("@", 1)[1].split("+", 1)[0] if "@" in v else "target"


def marked_stops(stops: list[dict], marked: dict[str, set[str]]) -> list[dict]:
    """Each stop with ``calibration``: is its own pair's target a calibration target
    (``marked``: per sweep, the roles its lock marks)? Not the sweep's: in a lineup of a
    real and a calibration target, only the instrument's stops are the instrument's."""
    return [{**t, "calibration": stop_role(t.get("variant")) in marked.get(t["sweep_id"], set())}
            for t in stops]

