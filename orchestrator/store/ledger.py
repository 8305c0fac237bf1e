"""The store is a ledger of each node's journal: append-only, checked against itself.

The decode boundary judges one line alone; what it cannot see is the journal around it.
``admit`` judges a decoded batch against what the store already holds for that node:

- a seq already stored (or earlier in the batch) with other content is a *conflict*: the
  stored event is kept, the new line set aside (the stored bytes again are a harmless
  re-read; the same JSON in other bytes is a copy, set aside as a repeat). When the event
  it conflicted with is an end set aside since (not the agent's last word), the line is
  judged again: the agent's next line after a forged end claiming its seq is stored, and
  another copy of that line kept aside (the same JSON) is relabelled a repeat;
- a generation for a run index already measured, or outside the job's plan (its run index,
  its workload), is set aside: it would replace or add a measurement the job never made.
  Before the plan event is read, the workloads of the sweep's job spec judge it; once the
  plan is read, the generations admitted before it are judged again by it;
- a line after the stored ``job_finished`` (the agent writes nothing after it) is set aside;
- a ``job_finished`` whose ``generations`` disagrees with the journal before it, or that
  does not account for its plan (generations + failed + skipped), is set aside (a forged or
  damaged end would end following early, set the real job after it aside, call it ok);
- a seq far past the journal read so far, an event past an admitted ``job_finished``, and a
  ``job_failed`` the journal goes on after are set aside (``journal_ends``).

Every refusal is a ``Quarantined`` (seq, reason, line), stored in the same transaction.
"""

from __future__ import annotations

import orjson
from sqlalchemy import Text, delete, func, select, type_coerce, update

from .coverage import NOT_ASIDE, kept_whole, repeat_reason
from .job_configs import Allowed, allowed_values, config_problem
from .journal_ends import (
    END_REASONS,
    NOT_LAST,
    Refused,
    failed_ends,
    gone_on,
    gone_on_reason,
    jump_reason,
    last_word,
    move_aside,
    past_end,
    reach,
    unseat,
    with_set_aside,
    withdraw_jumps,
)
from .ledger_context import Context, read_context
from .models import Event, QuarantinedEvent, Sweep

# how the ledger's reasons begin (a line it refuses is an extra line, not one of the job's)
CONFLICT = "conflict:"
LEDGER_REASONS = (CONFLICT, "already measured:", "not in the job:", "job_finished:",
                  *END_REASONS, *NOT_ASIDE)


def _same(stored: str, line: str) -> bool:
    """The same event: the same text, or (written apart) the same JSON."""
    if stored == line:
        return True
    try:
        return orjson.loads(stored) == orjson.loads(line)
    except orjson.JSONDecodeError:
        return False


def _names(workloads) -> list[str]:
    """The workload names a plan event or a job spec lists."""
    return [n for w in workloads or [] if isinstance(w, dict)
            and isinstance(n := w.get("name"), str)]


class _Plan:
    """The job's plan as its first ``plan`` event said it (None until one is seen); before
    it, the workloads of the job the controller sent (the sweep's job spec)."""

    def __init__(self, c, sweep_id: str, node: str, stored: dict | None,
                 jobs: dict[str, object] | None = None):
        self.c, self.sweep_id, self.node = c, sweep_id, node
        self._jobs = jobs  # the store's jobs read so far, by sweep (a sweep's job is fixed)
        self._event: dict | None = None
        self._spec: list[str] | None = None
        self._total: int | None = None
        self._names: list[str] = []
        self._job: object = None
        self._allowed: Allowed | None = None
        if stored is not None:  # the node's stored plan event (ledger_context)
            self.saw(stored)

    def event(self) -> dict | None:
        return self._event

    def saw(self, e: dict) -> bool:
        """Take ``e`` as the plan when none was known; whether it was the first."""
        if self._event is not None:
            return False
        self._event = e
        # read once, not per generation judged (ingest's hot path)
        total = e.get("total_generations")
        self._total = total if type(total) is int else None
        self._names = _names(e.get("workloads"))
        return True

    def job(self) -> object:
        """The job the controller sent (the sweep's job spec), read once."""
        if self._job is None:
            jobs = self._jobs
            job = None if jobs is None else jobs.get(self.sweep_id)
            if job is None:  # one round trip per sweep, not per batch
                job = self.c.execute(select(Sweep.job).where(
                    Sweep.id == self.sweep_id)).scalar()
                if job is not None and jobs is not None:
                    jobs[self.sweep_id] = job
            self._job = job or {}
            self._allowed = allowed_values(self._job)
        return self._job

    def spec_workloads(self) -> list[str]:
        if self._spec is None:
            job = self.job()
            self._spec = _names(job.get("workloads") if isinstance(job, dict) else None)
        return self._spec

    def problem(self, e: dict) -> str | None:
        if self._event is None:  # not yet read (or a journal from before plans): the job sent
            names, whose = self.spec_workloads(), "sweep's job"
        else:
            total, i = self._total, e["run_index"]
            if total is not None and not 0 <= i < total:
                return (f"not in the job: run_index {i} is outside the plan's {total} "
                        f"generations (0-{total - 1})")
            names, whose = self._names, "plan"
        if names and e["workload"] not in names:
            return (f"not in the job: workload {str(e['workload'])[:60]!r} is not one of the "
                    f"{whose}'s ({', '.join(map(str, names))})")
        self.job()  # the knob values the job gives: a config it never had is not its run
        return config_problem(self._allowed, e) if self._allowed is not None else None


def _before_plan(c, sweep_id: str, node: str, plan: _Plan, events: list[dict],
                 lines: list[str]) -> tuple[list[dict], list[str], list[Refused]]:
    """The plan, first read now, judges the generations admitted before it (stored, or kept
    earlier in this read): an agent plans before it measures, so a run its plan does not
    have that came first is a forged or damaged line, set aside (stored ones moved aside)."""
    out: list[Refused] = []
    keep = []
    for i, (e, x) in enumerate(zip(events, lines, strict=True)):
        why = plan.problem(e) if e["type"] == "generation" else None
        if why is None:
            keep.append(i)
        else:
            out.append(Refused(e["seq"], why, x))
    rows = c.execute(select(Event.seq, Event.payload).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.type == "generation")).all()
    why_stored = {seq: f"{why} (stored before the plan was read; moved aside)"
                  for seq, g in rows if (why := plan.problem(g)) is not None}
    out += move_aside(c, sweep_id, node, list(why_stored), why_stored.__getitem__)
    return [events[i] for i in keep], [lines[i] for i in keep], out


def _stored_lines(c, sweep_id: str, node: str, seqs: list[int],
                  hits: set[int]) -> dict[int, str]:
    """seq -> stored line, for the seqs of this read the store holds already (``hits``:
    the stored seqs in the read's range, from ``ledger_context``)."""
    hits = hits & set(seqs)
    # usually none is stored (the follower reads on from the last stored seq): only the
    # events a line collides with are read back, as text: a re-read line is the stored
    # text exactly, compared without parsing
    return dict(c.execute(select(Event.seq, type_coerce(Event.payload, Text)).where(
        Event.sweep_id == sweep_id, Event.node == node,
        Event.seq.in_(hits))).all()) if hits else {}


def _context(c, sweep_id: str, node: str, events: list[dict]) -> Context:
    return read_context(c, sweep_id, node, [e["seq"] for e in events],
                        [e["run_index"] for e in events if e["type"] == "generation"],
                        END_REASONS[0])


Admitted = tuple[list[dict], list[str], list[Refused]]  # kept events, their lines, refused


def _past_end_too(c, sweep_id: str, node: str, end: int, events: list[dict],
                  payloads: list[str], ctx):
    """The read with the lines set aside past the stored end added (judged again), and its
    look-ups redone when that grew it."""
    grown = with_set_aside(c, sweep_id, node, end, events, payloads)
    if len(grown[0]) == len(events):
        return events, payloads, ctx
    return grown[0], grown[1], _context(c, sweep_id, node, grown[0])


def _ends(c, sweep_id: str, node: str, events: list[dict], payloads: list[str],
          open_end: bool):
    """The read's look-ups (one round trip; again only if the read grows) and the ends it
    judges: the read's last end the journal went on to (``last_word``), with what was set
    aside past the stored end; the ends refused on sight; a stored end moved aside now."""
    ctx = _context(c, sweep_id, node, events)
    end = ctx.end
    final, replaced = last_word(c, sweep_id, node, events, end, open_end)
    if final is not None and end is not None:  # what was set aside past the stored end
        events, payloads, ctx = _past_end_too(c, sweep_id, node, end, events, payloads, ctx)
    early: list[Refused] = []  # a stored end the journal went on after, moved aside
    if open_end and (final is None or end is None):  # (else a later end in order did it)
        events, payloads, ctx, early = _gone_on(c, sweep_id, node, events, payloads, ctx,
                                                replaced, final)
    return events, payloads, ctx, final, replaced, early


def _gone_on(c, sweep_id: str, node: str, events: list[dict], payloads: list[str], ctx,
             replaced: dict[int, str], final: int | None):
    """An end the journal went on after from another line of its seq (``gone_on``): this
    read's is refused when judged (``replaced``), a stored one moved aside now and the read
    (grown by the lines set aside after it) looked up again. One before the read's last
    end (``final``) is left to that end (``last_word``)."""
    at = gone_on(c, sweep_id, node, events, ctx.end)
    if at is None or final is not None and at != final:
        return events, payloads, ctx, []
    if at != ctx.end:
        replaced[at] = gone_on_reason(at)
        return events, payloads, ctx, []
    events, payloads, out = unseat(c, sweep_id, node, at, events, payloads)
    return events, payloads, _context(c, sweep_id, node, events), out


def admit(c, sweep_id: str, node: str, events: list[dict], payloads: list[str],
          open_end: bool = False, twice: frozenset[int] = frozenset(),
          nth: list[tuple[int, bool]] | None = None,
          jobs: dict[str, object] | None = None) -> Admitted:
    """The events (and their lines) the store may append, and the refused ones.
    ``open_end``: the node's agent may still be writing (its end not yet recorded), so a
    job_finished the journal goes on after, in order, to a later one is not its end; once
    the end is recorded, lines appended after it (a later job_finished too) are set aside.
    ``twice``: seqs the read has 2+ lines of (a stored event's line again: a repeat).
    ``nth``: each line's occurrence of its content in the read and whether it is the first
    (see ``_occurrences`` and ``_seen_before``). ``jobs``: sweep → job, read once."""
    occurrence = _occurrences(events, payloads, nth)
    events, payloads, ctx, final, replaced, early = _ends(c, sweep_id, node, events,
                                                          payloads, open_end)
    end = ctx.end
    seqs = [e["seq"] for e in events]
    stored = _stored_lines(c, sweep_id, node, seqs, ctx.hits)
    measured = ctx.measured
    plan = _Plan(c, sweep_id, node, ctx.plan, jobs)
    top, ended, olds = reach(ctx.base, ctx.aside, seqs), False, []
    batch: dict[int, str] = {}
    keep_e, keep_p, refused = list[dict](), list[str](), early
    for e, line in zip(events, payloads, strict=True):
        seq, kind = e["seq"], e["type"]
        # nearly every line's seq is new to the read and the store: nothing to look up
        seen = _seen_before(e, line, batch, stored, twice, nth, occurrence) \
            if seq in batch or seq in stored else None
        if seen is True:
            continue  # the stored event read again
        if isinstance(seen, Refused):
            refused.append(seen)
            continue
        why = None
        if isinstance(seen, str):
            why = seen
        elif end is not None and seq > end and (final is None or seq > final):
            why = f"after the job's end: seq {seq} follows its job_finished at seq {end}"
        elif seq > top:
            why = jump_reason(seq, top)
        elif kind == "generation":
            i = e["run_index"]
            # a measurement made from this very seq is this event read again (its event row
            # was lost, its measurement kept): the hole is filled, nothing is replaced
            if i in measured and measured[i] != seq:
                why = (f"already measured: run_index {i} was measured at seq {measured[i]}; "
                       "the stored measurement is kept")
            else:
                why = plan.problem(e)
        elif kind == "job_finished":
            why = replaced.get(seq) or _finish_problem(c, sweep_id, node, e, keep_e)
        if why is not None:
            refused.append(Refused(seq, why, line, occurrence=occurrence(e, line)[0]))
            continue
        batch[seq] = line
        if kind == "generation":
            measured[e["run_index"]] = seq
        elif kind == "plan" and plan.saw(e):
            keep_e, keep_p, out = _before_plan(c, sweep_id, node, plan, keep_e, keep_p)
            refused += out
            gone = {r.seq for r in out}
            measured = {i: s for i, s in measured.items() if s not in gone}
            batch = {s: x for s, x in batch.items() if s not in gone}
        elif kind == "job_finished":  # the earlier in seq, or the journal went on to it
            olds += [end] if end is not None and seq > end else []
            end, ended = seq, True
        keep_e.append(e)
        keep_p.append(line)
    if ended and end is not None:  # the journal ends there: nothing stored stands past it
        keep_e, keep_p, out = past_end(c, sweep_id, node, end, olds, keep_e, keep_p)
        refused += out
    # a plan or an end read may have moved stored events aside: then read them again
    moved = ended or any(r.moved for r in refused)
    ends = failed_ends(c, sweep_id, node, keep_e, keep_p, None if moved else ctx.failed)
    keep_e, keep_p, refused = _rejudged(c, sweep_id, node, ends, refused, end, measured, plan)
    withdraw_jumps(c, keep_e, keep_p, ctx.jumps)
    return keep_e, keep_p, refused


def _rejudged(c, sweep_id: str, node: str, kept: Admitted, refused: list[Refused],
              end: int | None, measured: dict[int, int], plan: _Plan) -> Admitted:
    """An end set aside now (a job_finished the journal went on after, a job_failed it went
    on after) held its seq for no one: the lines refused as conflicts with it, in this read
    or an earlier one (an appender's forged end at the seq the agent writes next comes
    first), are judged again, and the first that passes is stored; the rows of the other
    lines of the journal that copy it become repeats, as a read of them all judges them
    (a row of the line stored itself, read again now, goes). ``kept``: what
    ``failed_ends`` kept and set aside; ``refused``: what the read set aside before it."""
    keep_e, keep_p, out = kept
    refused = refused + out
    gone = {r.seq for r in refused if r.reason.startswith((NOT_LAST, END_REASONS[2]))}
    if not gone:
        return keep_e, keep_p, refused
    gone -= set(c.execute(select(Event.seq).where(  # an end set aside again: seq held
        Event.sweep_id == sweep_id, Event.node == node, Event.seq.in_(gone))).scalars())
    rows = c.execute(select(QuarantinedEvent.id, QuarantinedEvent.seq, QuarantinedEvent.line,
                            QuarantinedEvent.line_sha256, QuarantinedEvent.occurrence).where(
        QuarantinedEvent.sweep_id == sweep_id, QuarantinedEvent.node == node,
        QuarantinedEvent.seq.in_(gone), QuarantinedEvent.reason.startswith(CONFLICT))).all()
    again: list[tuple[int | None, Refused]] = [
        (None, r) for r in refused if r.seq in gone and r.reason.startswith(CONFLICT)]
    again += [(i, Refused(seq, CONFLICT, x, occurrence=n))
              for i, seq, x, h, n in rows if kept_whole(x, h)]
    held = {e["seq"]: ("", 0) for e in keep_e}  # seq -> line stored now, its occurrence
    rows_gone, taken, copies = list[int](), set[int](), dict[int, int]()  # copies: row->seq
    repeats = dict[int, Refused]()  # in-read refusals that are copies of a line stored
    for row, r in sorted(again, key=lambda a: a[1].seq or 0):  # this read's first
        now, n = held.get(r.seq, ("", 0))
        if now and _same(now, r.line):  # a copy of the line just stored
            if row is None:  # another line of this read: a repeat of it
                repeats[id(r)] = Refused(r.seq, repeat_reason(r.seq or 0), r.line,
                                         occurrence=r.occurrence)
            elif now == r.line and n == r.occurrence:  # kept aside earlier, read again now
                rows_gone.append(row)
            else:  # another line of the journal, kept aside earlier: a repeat, as a read
                copies[row] = r.seq or 0  # of the whole journal judges it (relabelled)
            continue
        e = orjson.loads(r.line)
        if r.seq in held or not _judged_again(e, end, measured, plan):
            continue
        held[r.seq] = (r.line, r.occurrence)
        at = next((k for k, x in enumerate(keep_e) if x["seq"] > r.seq), len(keep_e))
        keep_e.insert(at, e)
        keep_p.insert(at, r.line)
        if row is None:
            taken.add(id(r))
        else:
            rows_gone.append(row)
    _settle(c, rows_gone, copies)
    return keep_e, keep_p, [repeats.get(id(r), r) for r in refused if id(r) not in taken]


def _settle(c, gone: list[int], copies: dict[int, int]) -> None:
    """The rows of lines now stored go; those of other copies of them (row -> seq) stay,
    judged again as repeats."""
    if gone:
        c.execute(delete(QuarantinedEvent).where(QuarantinedEvent.id.in_(gone)))
    for seq in set(copies.values()):
        c.execute(update(QuarantinedEvent).where(QuarantinedEvent.id.in_(
            [i for i, s in copies.items() if s == seq])).values(reason=repeat_reason(seq)))


def _judged_again(e: dict, end: int | None, measured: dict[int, int], plan: _Plan) -> bool:
    """Whether a line refused as a conflict with an end since set aside may be stored: no
    end itself (judged as such only in journal order), nothing past the journal's end, no
    second measurement of a run, nothing outside the plan."""
    if not isinstance(e, dict) or e.get("type") in ("job_finished", "job_failed") or \
            end is not None and e["seq"] > end:
        return False
    if e["type"] == "generation":
        i = e["run_index"]
        if i in measured and measured[i] != e["seq"] or plan.problem(e) is not None:
            return False
        measured[i] = e["seq"]
    return True


def _seen_before(e: dict, line: str, batch: dict[int, str], stored: dict[int, str],
                 twice: frozenset[int], nth: list[tuple[int, bool]] | None,
                 occurrence) -> bool | Refused | str | None:
    """A line whose seq this read or the store already holds: True when it is the stored
    event read again (nothing to do), a repeat to keep aside, or a conflict's reason; None
    for a seq seen nowhere yet. A refused line is kept once per occurrence (three copies of
    a line are three rows, a re-read adds none); a stored event's first line in the read is
    that event read again, its later copies repeats."""
    seq = e["seq"]
    if seq in batch or seq in stored and seq in twice:  # the event twice: stored once
        if _same(batch.get(seq) or stored[seq], line):
            n, first = occurrence(e, line)
            if seq not in batch and nth and first and stored[seq] == line:
                return True  # the read's first line of it: the stored event, read again
            return Refused(seq, repeat_reason(seq), line, occurrence=n)
        return f"conflict: seq {seq} arrived earlier in this read with other content"
    if seq in stored:
        if stored[seq] == line:
            return True  # a re-read of what is stored (stored as written: the same bytes)
        if _same(stored[seq], line):  # the same JSON in other bytes: a copy, not a re-read
            return Refused(seq, repeat_reason(seq), line, occurrence=occurrence(e, line)[0])
        kind_stored = orjson.loads(stored[seq]).get("type")
        return (f"conflict: seq {seq} is stored with other content ({kind_stored}); "
                "the stored event is kept")
    return None


def _occurrences(events: list[dict], payloads: list[str],
                 nth: list[tuple[int, bool]] | None):
    """Each (event, line)'s (occurrence in the read, first event line of it), looked up by
    the line as given (the batch may grow by lines set aside before: kept with theirs)."""
    by = {(id(e), id(x)): n for e, x, n in zip(events, payloads, nth or [], strict=False)}
    return lambda e, x: by.get((id(e), id(x)), (1, True))


def _finish_problem(c, sweep_id: str, node: str, e: dict, before: list[dict]) -> str | None:
    """A job_finished must count what the journal before it holds: its generations (or, for
    a soak, its soak_result's). Generation lines set aside by the decode boundary were in the
    journal too, so they may be among those counted."""
    claimed = e.get("generations")
    if claimed is None:
        return None
    seq = e["seq"]
    before = [x for x in before if x["seq"] < seq]  # what this read holds before it
    soak = [x for x in before if x["type"] == "soak_result"]
    if not soak:
        soak = list(c.execute(select(Event.payload).where(
            Event.sweep_id == sweep_id, Event.node == node, Event.type == "soak_result",
            Event.seq < seq).order_by(Event.seq.desc()).limit(1)).scalars())
    if soak:
        want = soak[-1].get("generations")
        if claimed != want:
            return (f"job_finished: generations {claimed} disagrees with the soak before it "
                    f"({want})")
        return None
    stored = c.execute(select(func.count()).select_from(Event).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.type == "generation",
        Event.seq < seq)).scalar() or 0
    have = stored + sum(1 for x in before if x["type"] == "generation")
    # what the journal before it may also have held: lines set aside as damaged (not by the
    # ledger: those are extra lines, not the job's), and seqs that never arrived
    numbered = set(c.execute(select(Event.seq).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.seq < seq)).scalars())
    numbered |= {x["seq"] for x in before}
    damaged = {n for n, why in c.execute(select(QuarantinedEvent.seq, QuarantinedEvent.reason)
                                         .where(QuarantinedEvent.sweep_id == sweep_id,
                                                QuarantinedEvent.node == node,
                                                QuarantinedEvent.seq < seq))
               if not why.startswith(LEDGER_REASONS)} - numbered
    holes = (seq - 1) - len(numbered) - len(damaged)
    unseen = len(damaged) + max(holes, 0)  # lines before it the store cannot read
    if not have <= claimed <= have + unseen:
        return (f"job_finished: generations {claimed} disagrees with the journal before it "
                f"({have} generation(s) stored"
                + (f", {len(damaged)} line(s) set aside" if damaged else "")
                + (f", {holes} missing" if holes > 0 else "") + ")")
    return _plan_problem(c, sweep_id, node, e, before, unseen)


def _plan_problem(c, sweep_id: str, node: str, e: dict, before: list[dict],
                  unseen: int) -> str | None:
    """The agent ends a sweep's job only once every generation of its plan is measured,
    failed or skipped (``agent/loop.py``), so a job_finished that accounts for less is a
    forged or damaged end: one that counts the two generations before it would otherwise
    set the rest of the real job aside. Its ``failed`` must have lines before it too."""
    seq = e["seq"]
    plans = [x for x in before if x["type"] == "plan"] or list(c.execute(
        select(Event.payload).where(Event.sweep_id == sweep_id, Event.node == node,
                                    Event.type == "plan", Event.seq < seq)
        .order_by(Event.seq.desc()).limit(1)).scalars())
    if not plans or type(total := plans[-1].get("total_generations")) is not int:
        return None  # no plan before it: a journal from before plans
    failed: int = e["failed"] if type(e.get("failed")) is int else 0
    adaptive = e.get("adaptive") if "adaptive" in plans[-1] else None
    skipped = adaptive.get("skipped") if isinstance(adaptive, dict) else 0
    skipped = skipped if type(skipped) is int else 0
    if e["generations"] + failed + skipped != total:
        return (f"job_finished: generations {e['generations']} + failed {failed} + skipped "
                f"{skipped} is not the plan's {total} generations")
    lines = c.execute(select(func.count()).select_from(Event).where(
        Event.sweep_id == sweep_id, Event.node == node, Event.type == "generation_failed",
        Event.seq < seq)).scalar() or 0
    lines += sum(1 for x in before if x["type"] == "generation_failed")
    if failed > lines + unseen:
        return (f"job_finished: failed {failed} disagrees with the journal before it "
                f"({lines} generation_failed line(s)"
                + (f", {unseen} unreadable or missing" if unseen else "") + ")")
    return None
