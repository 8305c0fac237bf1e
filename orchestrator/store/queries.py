"""Stored events as readers get them: typed, or marked unreadable, never a bare dict.

Every stored event a reader asks for goes through the same check as the decode boundary
(``store.eventcheck``) and becomes its typed event (``agent.events``). An event that an
older, weaker boundary let in (a field missing or of another type, a row whose columns
disagree with its payload) comes back as ``Unreadable`` with the reason: a reader leaves
it out of its numbers and shows it, instead of failing on a missing key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from sqlalchemy import Text, select, type_coerce

from agent.events import Event

from .eventcheck import event_problem
from .models import Event as EventRow

ORDERS = {"sweep": EventRow.sweep_id, "node": EventRow.node, "seq": EventRow.seq}


@dataclass(frozen=True)
class Stored:
    """A stored event that reads as its type."""

    sweep_id: str
    node: str
    event: Event


@dataclass(frozen=True)
class Unreadable:
    """A stored event that does not read as a valid event of its type, and why."""

    sweep_id: str
    node: str
    seq: int
    type: str
    reason: str

    def message(self) -> str:
        return (f"stored event {self.type} seq {self.seq} is unreadable and left out: "
                f"{self.reason} (`specfleet sweeps verify {self.sweep_id}` compares it "
                "with the journal)")


def read_stored(sweep_id: str, node: str, seq: int, typ: str,
                text: str | None) -> Stored | Unreadable:
    """One stored row through the boundary's check: its payload text must be a valid event
    whose seq and type are the row's own."""
    def bad(reason: str) -> Unreadable:
        return Unreadable(sweep_id, node, seq, typ, reason)

    if text is None:
        return bad("no payload")
    try:
        e = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        return bad(f"not JSON ({str(err).split(':')[0]})")
    problem = event_problem(e, text)
    if problem:
        return bad(problem)
    if e["seq"] != seq or e["type"] != typ:
        return bad(f"its payload says {e['type']} seq {e['seq']}, its row {typ} seq {seq}")
    return Stored(sweep_id, node, Event.from_json(e))


def events(store, sweep_ids: Iterable[str], types: Iterable[str] | None = None,
           node: str | None = None, order: tuple[str, ...] = ("sweep", "node", "seq"),
           ) -> list[Stored | Unreadable]:
    """The stored events of ``sweep_ids`` (of ``types``, of ``node`` when given), each
    typed or unreadable, in ``order`` (names of ``ORDERS``)."""
    ids = list(sweep_ids)
    if not ids:
        return []
    q = select(EventRow.sweep_id, EventRow.node, EventRow.seq, EventRow.type,
               type_coerce(EventRow.payload, Text)).where(EventRow.sweep_id.in_(ids))
    if types is not None:
        q = q.where(EventRow.type.in_(list(types)))
    if node is not None:
        q = q.where(EventRow.node == node)
    with store.engine.connect() as c:
        rows = c.execute(q.order_by(*(ORDERS[o] for o in order))).all()
    return [read_stored(*r) for r in rows]


def typed(items: Iterable[Stored | Unreadable]) -> list[Stored]:
    """The readable ones."""
    return [i for i in items if isinstance(i, Stored)]


def unreadable(store, sweep_ids: Iterable[str], node: str | None = None) -> list[Unreadable]:
    """Every stored event of the sweeps (of ``node``) that does not read as its type (a
    full pass: what readers flag, whichever event types they read)."""
    return [i for i in events(store, sweep_ids, node=node) if isinstance(i, Unreadable)]
