"""Where a node's journal ends, and what may stand past it (the ledger's seq rules).

An agent numbers its events one by one and writes nothing after its end, so:

- a seq further than ``MAX_SEQ_GAP`` past the journal read so far (the last stored event,
  then this read's lines and the numbered lines the boundary set aside, each within the gap
  of the one before) is a forged or damaged one: set aside, never stored. Lines that could
  not be read leave gaps, but not that many in a row, unless the journal visibly goes on
  past them: a seq that opens ``CONTINUED`` lines in a row, numbered one by one in the order
  read, stands (a disk block lost mid-journal must not set aside everything after it; a
  forged or bit-flipped seq is one line). An honest follower resumes after the store's
  contiguous coverage, so a hole it re-reads is below what is stored, never past it;
- a ``job_finished`` ends the journal at its own seq: an event stored past it before it
  arrived (a forged line read first) is moved aside, its measurement with it. One the
  journal goes on after, in order, to a later ``job_finished`` was not the agent's last
  word: set aside (moved aside when stored), and the lines after it are the journal's. So
  is one the journal goes on after from another line of its own seq, ``CONTINUED`` lines
  numbered one by one (an agent writes nothing after its end: those lines are its own);
- a ``job_failed`` is its agent's last line: the next event must be a new agent's first
  (``job_started``, or the ``job_failed`` of one that could not start: ``--resume``). A
  ``job_failed`` the journal goes on after is a forged or damaged end, set aside, and
  following goes on (the node-side follower stops only when the agent process is gone).

What is moved aside leaves the store in the transaction that stores what replaced it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson
from sqlalchemy import Text, and_, delete, or_, select, text, type_coerce

from .coverage import CONFLICT, kept_whole
from .models import Event, Measurement, QuarantinedEvent

MAX_SEQ_GAP = 64  # lines in a row a journal may lack (unreadable) before a seq is a jump
CONTINUED = 4  # lines in a row, numbered one by one, that show a journal going on past a jump
NEW_AGENT = ("job_started", "job_failed")  # what may follow a job_failed (a --resume)
# how the reasons of this module begin (extra lines, not the job's: see ledger)
END_REASONS = ("past the journal:", "after the job's end:", "job_failed:")
# literal SQL, not a bound value: both databases then use the partial index (migration 0017)
IS_FAILED = text("events.type = 'job_failed'")


@dataclass(frozen=True)
class Refused:
    """A decoded line the ledger set aside (the shape of ``decode.Quarantined``); ``moved``:
    the type of a stored event moved aside (its derived rows must go too)."""

    seq: int | None
    reason: str
    line: str
    moved: str | None = None
    occurrence: int = 1  # the how-manieth line of this content in the read (a repeat's)


def reach(base: int, aside: list[tuple[int, str]], seqs: list[int]) -> int:
    """The highest seq the journal reaches with no gap over MAX_SEQ_GAP, from the last
    stored event (``base``) through ``seqs`` (this read) and the numbered lines set aside
    past it (``aside``: seq and reason, as ``ledger_context`` reads them)."""
    # a jump set aside does not extend it
    beyond = {s for s, why in aside if not why.startswith(END_REASONS)}
    top, runs = base, _runs(seqs)
    for s in sorted({*seqs, *beyond}):
        if s > top + MAX_SEQ_GAP and s not in runs:
            break
        top = max(top, s)
    return top


def _runs(seqs: list[int]) -> set[int]:
    """The seqs of this read that sit in CONTINUED lines in a row numbered one by one, in
    the order read (a journal going on, not a stray line)."""
    if len(seqs) >= CONTINUED and seqs == list(range(seqs[0], seqs[0] + len(seqs))):
        return set(seqs)  # the usual read: one run (compared at C speed, per batch)
    # a seq sits in such a window exactly when it sits in a stretch of ≥ CONTINUED seqs,
    # each one past the one before: one pass over the stretches
    out: set[int] = set()
    start = 0
    for k in range(1, len(seqs) + 1):
        if k == len(seqs) or seqs[k] - seqs[k - 1] != 1:
            if k - start >= CONTINUED:
                out.update(seqs[start:k])
            start = k
    return out


def withdraw_jumps(c, events: list[dict], lines: list[str],
                   jumps: list[tuple[int, int, str]]) -> None:
    """A line set aside as a jump that a later read shows to be the journal (the run that
    went on from it arrived in the next batch) is stored now: its set-aside row goes, or
    `sweeps verify` would count the line twice (set aside and stored). ``jumps``: the lines
    set aside as jumps in the read's range (id, seq, line sha256: ``ledger_context``)."""
    if not jumps or not events:
        return
    sha = {e["seq"]: hashlib.sha256(x.encode("utf-8", "replace")).hexdigest()
           for e, x in zip(events, lines, strict=True)}
    gone = [i for i, seq, h in jumps if sha.get(seq) == h]
    if gone:
        c.execute(delete(QuarantinedEvent).where(QuarantinedEvent.id.in_(gone)))


def jump_reason(seq: int, top: int) -> str:
    return (f"past the journal: seq {seq} is {seq - top} past seq {top}, where its numbered "
            f"lines end (an agent numbers its events one by one; at most {MAX_SEQ_GAP} lines "
            "in a row may be unreadable)")


def after_end(seq: int, end: int, moved: bool = False) -> str:
    return (f"after the job's end: seq {seq} follows its job_finished at seq {end}"
            + (" (stored before the end was read; moved aside)" if moved else ""))


def failed_reason(seq: int, next_seq: int, kind: str) -> str:
    return (f"job_failed: the journal goes on after it (seq {next_seq} is a {kind}, not a "
            f"new agent's job_started): a forged or damaged end at seq {seq}")


def move_aside(c, sweep_id: str, node: str, seqs: list[int], why) -> list[Refused]:
    """Stored events of ``seqs`` out of the store (with their measurements), as Refused."""
    if not seqs:
        return []
    rows = c.execute(select(Event.seq, Event.type, type_coerce(Event.payload, Text)).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.seq.in_(seqs))).all()
    c.execute(delete(Measurement).where(Measurement.sweep_id == sweep_id,
                                        Measurement.node == node, Measurement.seq.in_(seqs)))
    c.execute(delete(Event).where(Event.sweep_id == sweep_id, Event.node == node,
                                  Event.seq.in_(seqs)))
    return [Refused(seq, why(seq), line, moved=kind) for seq, kind, line in rows]


def last_word(c, sweep_id: str, node: str, events: list[dict], end: int | None,
              open_end: bool) -> tuple[int | None, dict[int, str]]:
    """The seq of this read's last job_finished when the journal went on to it (``open_end``:
    its agent may still be writing; it is the read's last in journal order and the highest,
    over the stored end too), and the ends already set aside as not the last word (read
    again, they stay aside). The lines up to that job_finished are judged as the journal's,
    not as lines after an earlier end: an agent writes one job_finished, as its last line,
    so an earlier one the journal goes on after was not its last word, whatever it counts."""
    ends = [e["seq"] for e in events if e["type"] == "job_finished"]
    if not ends:
        return None, {}
    replaced = dict(c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
        QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
        QuarantinedEvent.seq.in_(ends), QuarantinedEvent.reason.startswith(NOT_LAST))).all())
    if not open_end or ends[-1] != max(ends) or (end is not None and ends[-1] <= end):
        return None, replaced
    return ends[-1], replaced


def with_set_aside(c, sweep_id: str, node: str, end: int, events: list[dict],
                   lines: list[str]) -> tuple[list[dict], list[str]]:
    """This read, after the lines set aside as past the stored ``end`` in earlier reads
    (a later job_finished shows the journal went on: they are judged again as the
    journal's). A line kept whole comes back from its set-aside row; one kept cut or
    altered (64 KiB, NUL) stays a hole, which the follower reads again from the node."""
    rows = c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.line,
                            QuarantinedEvent.line_sha256).where(
        QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
        QuarantinedEvent.seq > end, QuarantinedEvent.seq < min(e["seq"] for e in events),
        QuarantinedEvent.reason.startswith(END_REASONS[1])).order_by(QuarantinedEvent.seq))
    back = [(orjson.loads(x), x) for _, x, h in rows if kept_whole(x, h)]
    return [e for e, _ in back] + events, [x for _, x in back] + lines


NOT_LAST = "job_finished: not the agent's last word:"


def not_last(seq: int, end: int) -> str:
    return (f"{NOT_LAST} the journal goes on after it to the "
            f"job_finished at seq {end} (a forged or damaged end at seq {seq})")


def gone_on_reason(seq: int) -> str:
    return (f"{NOT_LAST} the journal goes on after it from another line of its seq, "
            f"{CONTINUED}+ lines in a row (a forged or damaged end at seq {seq})")


def gone_on(c, sweep_id: str, node: str, events: list[dict], end: int | None) -> int | None:
    """The seq of a job_finished (the stored ``end``, or one of this read's) the journal goes
    on after from another line of its own seq: after it, in the order read (lines set aside
    since, then this read), a line other than an end claims its seq and CONTINUED lines in a
    row go on from there, numbered one by one. An agent writes nothing after its end and
    numbers its lines itself, so those are its lines, and the end a line someone put before
    them (an unkeyed journal): not its last word. Asked while the agent may still write."""
    if end is None and not any(e["type"] == "job_finished" for e in events):
        return None  # the usual batch: no end to judge
    seen = [(e["seq"], e["type"] == "job_finished") for e in events]
    if end is not None:
        rows = c.execute(select(QuarantinedEvent.seq).where(
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
            or_(and_(QuarantinedEvent.seq == end, QuarantinedEvent.reason.startswith(CONFLICT)),
                and_(QuarantinedEvent.seq > end,
                     QuarantinedEvent.reason.startswith(END_REASONS[1]))))
            .order_by(QuarantinedEvent.id)).scalars()
        if _goes_on([(s, False) for s in rows] + seen, end):
            return end
    return next((s for k, (s, is_end) in enumerate(seen)
                 if is_end and _goes_on(seen[k + 1:], s)), None)


def _goes_on(seen: list[tuple[int, bool]], n: int) -> bool:
    """Whether ``seen`` (seq, is an end; in the order read) holds a line of seq ``n`` that
    is no end, followed by n+1 … in a row: CONTINUED lines numbered one by one."""
    want = list(range(n, n + CONTINUED))
    return any(not is_end and [x for x, _ in seen[k:k + CONTINUED]] == want
               for k, (s, is_end) in enumerate(seen) if s == n)


def unseat(c, sweep_id: str, node: str, end: int, events: list[dict],
           lines: list[str]) -> tuple[list[dict], list[str], list[Refused]]:
    """The stored end at ``end`` the journal went on after (``gone_on``) moved aside; the
    lines set aside as after it are the journal's again: those before this read come back
    into it (kept whole), and every such row goes (judged again when read)."""
    out = move_aside(c, sweep_id, node, [end], gone_on_reason)
    events, lines = with_set_aside(c, sweep_id, node, end, events, lines)
    c.execute(delete(QuarantinedEvent).where(
        QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
        QuarantinedEvent.seq > end, QuarantinedEvent.reason.startswith(END_REASONS[1])))
    return events, lines, out


def past_end(c, sweep_id: str, node: str, end: int, olds: list[int], events: list[dict],
             lines: list[str]) -> tuple[list[dict], list[str], list[Refused]]:
    """Once a job_finished at ``end`` is admitted: this read's events past it, and the stored
    ones, set aside; so are the earlier ends ``olds`` the journal went on after, and the
    lines set aside as past those are read again (the follower resumes at the hole).
    Returns the events (and lines) kept, and those set aside."""
    keep = [i for i, e in enumerate(events) if e["seq"] <= end and e["seq"] not in olds]
    out = [Refused(e["seq"], after_end(e["seq"], end) if e["seq"] > end else
                   not_last(e["seq"], end), x)
           for i, (e, x) in enumerate(zip(events, lines, strict=True)) if i not in keep]
    stored = list(c.execute(select(Event.seq).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.seq > end)).scalars())
    out += move_aside(c, sweep_id, node, stored, lambda s: after_end(s, end, moved=True))
    if olds:
        out += move_aside(c, sweep_id, node, olds, lambda s: not_last(s, end))
        c.execute(delete(QuarantinedEvent).where(
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
            QuarantinedEvent.seq > min(olds), QuarantinedEvent.seq < end,
            QuarantinedEvent.reason.startswith(END_REASONS[1])))
    return [events[i] for i in keep], [lines[i] for i in keep], out


def _next_types(c, sweep_id: str, node: str, after: list[int],
                batch: dict[int, str]) -> dict[int, tuple[int, str]]:
    """For each seq in ``after``: the seq and type of the event next after it (stored or in
    this read), where there is one."""
    out = {}
    for f in after:
        row = c.execute(select(Event.seq, Event.type).where(
            Event.sweep_id == sweep_id, Event.node == node, Event.seq > f)
            .order_by(Event.seq).limit(1)).first()
        later = [(s, t) for s, t in batch.items() if s > f]
        cands = ([tuple(row)] if row else []) + later
        if cands:
            out[f] = min(cands)
    return out


def _adjacent(c, sweep_id: str, node: str, a: int, b: int) -> bool:
    """Whether seq ``b`` is the next the journal holds after ``a``: every seq between was
    set aside under its number. With a hole between (a lost row, a batch still to come) the
    next stored event need not be what the agent wrote next: not judged yet."""
    if b - a - 1 > MAX_SEQ_GAP:
        return False
    between = set(c.execute(select(QuarantinedEvent.seq).where(
        QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
        QuarantinedEvent.seq > a, QuarantinedEvent.seq < b)).scalars())
    return all(s in between for s in range(a + 1, b))


def failed_ends(c, sweep_id: str, node: str, events: list[dict], lines: list[str],
                stored: set[int] | None = None) -> tuple[list[dict], list[str], list[Refused]]:
    """A job_failed (stored, or in this read) that the journal goes on after with anything
    but a new agent's first event is set aside. Returns what is kept and what is not.
    ``stored``: the node's stored job_failed seqs, when already read (``ledger_context``)."""
    batch = {e["seq"]: e["type"] for e in events}
    failed = set(c.execute(select(Event.seq).where(
        Event.sweep_id == sweep_id, Event.node == node, IS_FAILED)).scalars()) \
        if stored is None else set(stored)
    failed |= {s for s, t in batch.items() if t == "job_failed"}
    if not failed:
        return events, lines, []
    bad = {f: n for f, n in _next_types(c, sweep_id, node, sorted(failed), batch).items()
           if n[1] not in NEW_AGENT and _adjacent(c, sweep_id, node, f, n[0])}
    if not bad:
        return events, lines, []
    out = [Refused(e["seq"], failed_reason(e["seq"], *bad[e["seq"]]), x)
           for e, x in zip(events, lines, strict=True) if e["seq"] in bad]
    keep = [i for i, e in enumerate(events) if e["seq"] not in bad]
    moved = [f for f in bad if f not in batch]
    out += move_aside(c, sweep_id, node, moved, lambda s: failed_reason(s, *bad[s]))
    return [events[i] for i in keep], [lines[i] for i in keep], out
