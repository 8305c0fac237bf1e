"""The derived tables against the events they came from.

A generation event's measurement row is derived from it at ingest (``db.measurement_row``).
A row edited afterwards (``update measurements set decode_tok_s = …``) would be shown by
`runs show` and fed to every chart while the events still verify; so `sweeps verify`
derives each row again from its stored event and calls a difference a conflict, and
`sweep --attach` writes the derived values back (the event is the record).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from sqlalchemy import func, insert, select, update

from .models import Event, Measurement


def _same(a: object, b: object) -> bool:
    if isinstance(a, datetime) and isinstance(b, datetime):
        # to the millisecond: a timestamp filled by the migration rounds the event's time
        # in SQL, ingest in Python (a microsecond apart at most)
        return abs((_utc(a) - _utc(b)).total_seconds()) <= 1e-3
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False
    return a == b


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _derived(sweep_id: str, node: str, payload: dict) -> dict:
    from .db import measurement_row  # the one derivation ingest uses

    row = measurement_row(sweep_id, node, payload)
    if isinstance(row.get("unreliable_reasons"), str):  # pre-serialised for the bulk insert
        import json

        row["unreliable_reasons"] = json.loads(row["unreliable_reasons"])
    return row


def measurement_mismatches(store, sweep_id: str, node: str) -> list[dict]:
    """Each stored generation event whose measurement row is missing or differs from the
    row derived from the event again, and each measurement row no stored generation event
    holds ("orphan"): {seq, line, problem}."""
    out: list[dict] = []
    with store.engine.connect() as c:
        events = {seq: p for seq, p in c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == sweep_id, Event.node == node, Event.type == "generation"))}
        rows = {m["seq"]: m for m in c.execute(select(Measurement.__table__).where(
            Measurement.sweep_id == sweep_id, Measurement.node == node)).mappings()}
    for seq in sorted(events):
        try:
            want = _derived(sweep_id, node, events[seq])
        except (KeyError, TypeError):  # a payload the boundary would not have let in
            out.append({"seq": seq, "line": None, "problem": f"seq {seq}: the stored "
                        "generation event cannot be read as a measurement"})
            continue
        have = rows.get(seq)
        if have is None:
            out.append({"seq": seq, "line": None, "problem": f"seq {seq}: the stored "
                        "generation event has no measurement row"})
            continue
        wrong = [k for k, v in want.items() if not _same(have[k], v)]
        if wrong:
            k = wrong[0]
            out.append({"seq": seq, "line": None, "problem": (
                f"seq {seq}: the measurement of run_index {want['run_index']} differs from "
                f"its stored event ({k} {have[k]!r} stored, {want[k]!r} in the event"
                + (f"; {len(wrong) - 1} more column(s)" if len(wrong) > 1 else "") + ")")})
    # a measurement no stored generation event holds (a partial restore, a hand edit):
    # every reader of measurements shows it, though nothing in the journal vouches for it
    for seq in sorted(set(rows) - set(events)):
        out.append({"seq": seq, "line": None, "orphan": True, "problem": (
            f"the measurement of run_index {rows[seq]['run_index']} (seq {seq}) has no "
            "stored generation event")})
    return out


def rederive_measurements(store, sweep_id: str, node: str) -> list[int]:
    """Write each mismatched measurement again from its stored event; the seqs rewritten."""
    bad = [m["seq"] for m in measurement_mismatches(store, sweep_id, node)]
    if not bad:
        return []
    with store.engine.begin() as c:
        events = dict(c.execute(select(Event.seq, Event.payload).where(
            Event.sweep_id == sweep_id, Event.node == node, Event.seq.in_(bad))).all())
        fixed = []
        for seq in bad:
            try:
                row = _derived(sweep_id, node, events[seq])
            except (KeyError, TypeError):
                continue
            # in place (its id stays): the row of this seq, else the run's
            done = c.execute(update(Measurement).where(
                Measurement.sweep_id == sweep_id, Measurement.node == node,
                Measurement.seq == seq).values(**row)).rowcount
            if not done:
                done = c.execute(update(Measurement).where(
                    Measurement.sweep_id == sweep_id, Measurement.node == node,
                    Measurement.run_index == row["run_index"]).values(**row)).rowcount
            if not done:
                c.execute(insert(Measurement).values(**row))
            fixed.append(seq)
    return fixed


def nodes_without_row(store, sweep_id: str, placed: set[str]) -> dict[str, tuple[int, int]]:
    """node -> (events, measurements) the store holds for the sweep under a node the sweep
    has no node row for (a row deleted by hand, a partial restore, another store's rows
    merged in): no journal of the sweep's nodes vouches for them."""
    counts: list[dict[str, int]] = []
    with store.engine.connect() as c:
        for t in (Event.__table__, Measurement.__table__):
            counts.append({node: n for node, n in c.execute(
                select(t.c.node, func.count()).where(t.c.sweep_id == sweep_id)
                .group_by(t.c.node)) if node not in placed})
    events, measured = counts
    return {n: (events.get(n, 0), measured.get(n, 0)) for n in sorted({*events, *measured})}
