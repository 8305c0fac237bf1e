"""Which of a node's journal lines the store holds: its contiguous seq coverage and holes.

A seq is covered when its event is stored or its line was set aside (quarantined) with that
seq; on a keyed node, only by a line the agent signed (a forged or damaged line claiming
that seq does not cover it). The follower resumes a node's journal after ``through``, the
last seq up to which everything is covered, never after the highest stored one: a hole
below it (a batch the store lost, rows deleted by hand) is read again from the node.
Derived from the stored rows each time it is asked, so there is no second record that
could disagree with them.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

import orjson
from sqlalchemy import Text, and_, cast, exists, func, or_, select

from .dupkeys import REWRITTEN
from .models import Event, QuarantinedEvent, SweepNode

# how the reason of a journal line that repeats a stored event begins (the same event again:
# accounted for, not lost, not a conflict)
REPEAT = "repeat:"
# rows of the quarantine table that are no line set aside from the job: a repeat of a stored
# event, and the journal line of an event stored written again
NOT_ASIDE = (REPEAT, REWRITTEN)
# reasons of lines a keyed node's agent did not write (sweep.decode)
UNSIGNED = "not written by this job's agent (no valid signature)"
GLUED = "foreign bytes:"
# a line claiming a seq whose stored (or earlier read) event it is not (ledger.py): it
# stands for no other line of its seq, keyed or not
CONFLICT = "conflict:"
# rows that cover no seq on any node: a repeat or the line beside a stored event (with that
# event gone nothing holds the seq), a conflicting line (another line's seq)
NEVER_COVER = (REPEAT, REWRITTEN, CONFLICT)


def repeat_reason(seq: int) -> str:
    return (f"{REPEAT} a repeat of stored seq {seq} (the same event again; the journal "
            "holds it twice, the store once)")


def seq_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct seqs as inclusive ranges: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for n in sorted(set(seqs)):
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def holes_below(covered: set[int] | frozenset[int], last: int) -> list[tuple[int, int]]:
    """The seqs in 1..last not covered, as ranges."""
    ranges, start = [], 1
    for lo, hi in seq_ranges([n for n in covered if 1 <= n <= last]):
        if lo > start:
            ranges.append((start, lo - 1))
        start = hi + 1
    if start <= last:
        ranges.append((start, last))
    return ranges


def ranges_text(ranges: list[tuple[int, int]], most: int = 20) -> str:
    """"5, 9-12 …" for people."""
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges[:most])
    return text + (" …" if len(ranges) > most else "")


@dataclass(frozen=True)
class Coverage:
    """One node's journal in the store: what is covered, up to the last stored event."""

    covered: frozenset[int]  # seqs stored as events or set aside with their seq
    last: int                # the highest stored event's seq (0: none yet)
    unnumbered: int          # lines set aside with no readable seq

    @property
    def holes(self) -> list[tuple[int, int]]:
        return holes_below(self.covered, self.last)

    @property
    def missing(self) -> int:
        return sum(b - a + 1 for a, b in self.holes)

    @property
    def through(self) -> int:
        """Every seq up to this one is covered: the journal is read again after it."""
        holes = self.holes
        return holes[0][0] - 1 if holes else self.last


def stands_in(reason: str) -> bool:
    """Whether a set-aside row of this reason accounts for a journal line of its seq that is
    neither stored nor its own (`sweeps verify`). Not a repeat (it repeats a stored event:
    with that event gone, nothing holds the seq), nor a line the agent did not write
    (unsigned, glued): the agent's own line of that seq must be stored or set aside itself."""
    return not reason.startswith((*NEVER_COVER, UNSIGNED, GLUED))


def coverage(store, sweep_id: str, node: str) -> Coverage:
    with store.engine.connect() as c:
        events = set(c.execute(select(Event.seq).where(
            Event.sweep_id == sweep_id, Event.node == node)).scalars())
        rows = c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason).where(
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node)).all()
        keyed = c.execute(select(SweepNode.journal_key).where(
            SweepNode.sweep_id == sweep_id, SweepNode.node == node)).scalar() is not None
    aside = [n for n, _ in rows]
    # a repeat row covers nothing its stored event does not: with the event gone (a batch
    # lost, rows deleted by hand) the seq is a hole, read again. On a keyed node a line the
    # agent did not write (unsigned: forged, or its own line damaged) covers nothing either:
    # the agent's signed line of that seq is what must be stored, so the seq stays a hole
    # that `--attach` reads again and, if that line is gone for good, the node is not ok
    # the same for the row of a line that conflicts with another line of its seq, or the
    # line kept beside an event stored written again: neither is the seq's event
    blind = (*NEVER_COVER, UNSIGNED, GLUED) if keyed else NEVER_COVER
    numbered = {n for n, why in rows if n is not None and not why.startswith(blind)}
    # on a keyed node a line with no readable seq is not one the agent wrote (each of its
    # lines is JSON with a seq) and stands for none that is missing: bytes glued before
    # the agent's line that made it longer than any event must not hide its loss
    unnumbered = 0 if keyed else len(aside) - len([n for n in aside if n is not None])
    return Coverage(frozenset(events | numbered), max(events, default=0), unnumbered)


def missing_by_node(store, sweep_ids: list[str]) -> dict[str, dict[str, int]]:
    """Per sweep, per node with holes: how many seqs below its last stored event are
    neither stored nor set aside. Aggregates only, for listings of many sweeps."""
    if not sweep_ids:
        return {}
    e, q = Event.__table__.alias("e"), QuarantinedEvent.__table__.alias("q")
    with store.engine.connect() as c:
        stored = c.execute(select(Event.sweep_id, Event.node, func.max(Event.seq),
                                  func.count()).where(Event.sweep_id.in_(sweep_ids))
                           .group_by(Event.sweep_id, Event.node)).all()
        # set-aside seqs that fill a hole: below the last stored event, not stored
        last = select(func.max(e.c.seq)).where(
            e.c.sweep_id == q.c.sweep_id, e.c.node == q.c.node).scalar_subquery()
        # on a keyed node a line its agent did not sign fills no hole (as in coverage())
        keyed = exists().where(SweepNode.sweep_id == q.c.sweep_id, SweepNode.node == q.c.node,
                               SweepNode.journal_key.is_not(None))
        fill = dict(((s, n), k) for s, n, k in c.execute(
            select(q.c.sweep_id, q.c.node, func.count(q.c.seq.distinct())).where(
                q.c.sweep_id.in_(sweep_ids), q.c.seq.is_not(None), q.c.seq >= 1,
                q.c.seq <= last,
                *[~q.c.reason.startswith(p) for p in NEVER_COVER],
                ~and_(keyed, or_(q.c.reason.startswith(UNSIGNED),
                                 q.c.reason.startswith(GLUED))),
                ~exists().where(and_(
                    e.c.sweep_id == q.c.sweep_id, e.c.node == q.c.node,
                    e.c.seq == q.c.seq))).group_by(q.c.sweep_id, q.c.node)).all())
    out: dict[str, dict[str, int]] = {}
    for sweep_id, node, top, count in stored:
        missing = top - count - fill.get((sweep_id, node), 0)
        if missing > 0:
            out.setdefault(sweep_id, {})[node] = missing
    return out


def line_sha256(text: str) -> str:
    """A journal line's content hash, as the store and `sweeps verify` compute it: the line
    as the follower stores it (UTF-8, surrounding whitespace stripped)."""
    return hashlib.sha256(text.strip().encode("utf-8", "replace")).hexdigest()


def kept_whole(line: str, digest: str) -> bool:
    """Whether a set-aside row holds its line whole (a cut one, 64 KiB of a longer line,
    hashes otherwise): only a whole line may be judged again as an event."""
    return hashlib.sha256(line.encode("utf-8", "replace")).hexdigest() == digest


def kept_line_sha256(line: str) -> str:
    """A set-aside line's content hash: the line as it is (a line that is UTF-8, as ever);
    one with bytes that were not UTF-8 (arrived escaped) as the journal holds those bytes,
    stripped, as `sweeps verify`'s digest script hashes it on the node."""
    try:
        return hashlib.sha256(line.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        pass
    try:
        return hashlib.sha256(line.strip().encode("utf-8", "surrogateescape")).hexdigest()
    except UnicodeEncodeError:  # a surrogate no byte was escaped to: as before, replaced
        return hashlib.sha256(line.encode("utf-8", "replace")).hexdigest()


def stored_line_hashes(store, sweep_id: str, node: str) -> dict[int, str]:
    """seq -> content hash of each stored event's line (kept as the text it arrived as; for
    an event stored written again, the hash of the journal's line kept beside it)."""
    with store.engine.connect() as c:
        texts = dict(c.execute(select(Event.seq, cast(Event.payload, Text)).where(
            Event.sweep_id == sweep_id, Event.node == node)).all())
        out = {seq: line_sha256(text) for seq, text in texts.items()}
        again = c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.line_sha256,
                                 QuarantinedEvent.line).where(
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
            QuarantinedEvent.reason.startswith(REWRITTEN)))
        for seq, digest, line in again:
            # only for the event that line became (kept whole, the same object): a line of
            # that seq the ledger refused must not stand for the event stored there
            if seq in texts and line_sha256(line) == digest and \
                    _as_stored(orjson.loads(line)) == orjson.loads(texts[seq]):
                out[seq] = digest
        return out


def _as_stored(e: object) -> object:
    """A line's object as the boundary stored it: a NUL in model output replaced
    (``eventcheck._check_generation``), so such a line written again is still its event."""
    text = e.get("output_text") if type(e) is dict else None
    if type(text) is str and "\x00" in text:
        e["output_text"] = text.replace("\x00", "\ufffd")  # type: ignore[index]
    return e


def repeated_seqs(store, sweep_id: str, node: str) -> list[int]:
    """The stored seqs the node's journal repeats (the same event again), in order."""
    with store.engine.connect() as c:
        return sorted(s for s in c.execute(select(QuarantinedEvent.seq).where(
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
            QuarantinedEvent.reason.startswith(REPEAT))).scalars() if s is not None)


def set_aside_lines(store, sweep_id: str, node: str) -> tuple[set[int], Counter[str]]:
    """The seqs and content hashes of the node's set-aside lines (the hash as the boundary
    recorded it, and of the kept text, which the boundary may have hashed unstripped), each
    hash with how many lines it was kept for (identical lines are one row each)."""
    seqs: set[int] = set()
    hashes: Counter[str] = Counter()
    with store.engine.connect() as c:
        stored = set(c.execute(select(Event.seq).where(
            Event.sweep_id == sweep_id, Event.node == node)).scalars())
        rows = c.execute(select(
            QuarantinedEvent.seq, QuarantinedEvent.line_sha256, QuarantinedEvent.line,
            QuarantinedEvent.reason).where(
            # the journal line of an event stored written again is among them: where
            # the ledger refused that event, the line is accounted for by it
            QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node)).all()
    for seq, digest, line, reason in rows:
        if seq is not None and stands_in(reason):
            seqs.add(seq)
        if reason.startswith(REPEAT) and seq not in stored:
            continue  # a repeat of an event no longer stored stands for no line
        if reason.startswith(REWRITTEN) and seq not in stored and \
                not _refused_as_written(seq, line, rows):
            continue  # beside an event no longer stored (lost): it accounts for no line
        hashes.update({digest, line_sha256(line)})
    return seqs, hashes


def _refused_as_written(seq: int | None, line: str, rows) -> bool:
    """Whether the event a line holding a key twice became was itself set aside (another
    row of its seq holds that very object): then the journal's line is accounted for."""
    try:
        written = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    for s, _, other, why in rows:
        if s == seq and not why.startswith(REWRITTEN):
            try:
                if orjson.loads(other) == written:
                    return True
            except orjson.JSONDecodeError:
                continue
    return False
