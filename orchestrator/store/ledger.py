"""The store is a ledger of each node's journal: append-only, checked against itself.

The decode boundary judges one line alone; what it cannot see is the journal around it.
``admit`` judges a decoded batch against what the store already holds for that node:

- a seq already stored (or earlier in the batch) with other content is a *conflict*: the
  stored event is kept, the new line set aside (the same line again is a harmless re-read);
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
from sqlalchemy import Text, func, select, text, type_coerce

from .journal_ends import (
    END_REASONS,
    Refused,
    failed_ends,
    jump_reason,
    last_word,
    move_aside,
    past_end,
    reach,
    with_set_aside,
    withdraw_jumps,
)
from .models import Event, Measurement, QuarantinedEvent, Sweep

# the type as literal SQL, not a bound value: both databases then use the partial index
# for it (migration 0015), where a parameter leaves the planner a scan of the node's events
IS_PLAN = text("events.type = 'plan'")
IS_FINISHED = text("events.type = 'job_finished'")

# how the ledger's reasons begin (a line it refuses is an extra line, not one of the job's)
LEDGER_REASONS = ("conflict:", "already measured:", "not in the job:", "job_finished:",
                  *END_REASONS)


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

    def __init__(self, c, sweep_id: str, node: str):
        self.c, self.sweep_id, self.node = c, sweep_id, node
        self._event: dict | None = None
        self._looked = False
        self._spec: list[str] | None = None

    def event(self) -> dict | None:
        if not self._looked:
            self._looked = True
            self._event = self.c.execute(select(Event.payload).where(
                Event.sweep_id == self.sweep_id, Event.node == self.node,
                IS_PLAN).order_by(Event.seq).limit(1)).scalar()
        return self._event

    def saw(self, e: dict) -> bool:
        """Take ``e`` as the plan when none was known; whether it was the first."""
        if self.event() is None:
            self._event = e
            return True
        return False

    def spec_workloads(self) -> list[str]:
        if self._spec is None:
            job = self.c.execute(select(Sweep.job).where(Sweep.id == self.sweep_id)).scalar()
            ws = job.get("workloads") if isinstance(job, dict) else None
            self._spec = _names(ws)
        return self._spec

    def problem(self, e: dict) -> str | None:
        plan = self.event()
        if plan is None:  # not yet read (or a journal from before plans): the job sent
            names, whose = self.spec_workloads(), "sweep's job"
        else:
            total, i = plan.get("total_generations"), e["run_index"]
            if type(total) is int and not 0 <= i < total:
                return (f"not in the job: run_index {i} is outside the plan's {total} "
                        f"generations (0-{total - 1})")
            names = _names(plan.get("workloads"))
            whose = "plan"
        if names and e["workload"] not in names:
            return (f"not in the job: workload {str(e['workload'])[:60]!r} is not one of the "
                    f"{whose}'s ({', '.join(map(str, names))})")
        return None


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


def _stored_lines(c, sweep_id: str, node: str, seqs: list[int]) -> dict[int, str]:
    """seq -> stored line, for the seqs of this read the store holds already."""
    # usually none is stored (the follower reads on from the last stored seq): look up the
    # numbers first, and read back only the events a line collides with
    hits = set(c.execute(select(Event.seq).where(
        Event.sweep_id == sweep_id, Event.node == node,
        Event.seq.between(min(seqs), max(seqs)))).scalars()) & set(seqs)
    # as text: a re-read line is the stored text exactly, compared without parsing
    return dict(c.execute(select(Event.seq, type_coerce(Event.payload, Text)).where(
        Event.sweep_id == sweep_id, Event.node == node,
        Event.seq.in_(hits))).all()) if hits else {}


def admit(c, sweep_id: str, node: str, events: list[dict], payloads: list[str],
          open_end: bool = False) -> tuple[list[dict], list[str], list[Refused]]:
    """The events (and their lines) the store may append, and the refused ones.
    ``open_end``: the node's agent may still be writing (its end not yet recorded), so a
    job_finished the journal goes on after, in order, to a later one is not its end; once
    the end is recorded, lines appended after it (a later job_finished too) are set aside."""
    end = c.execute(select(func.min(Event.seq)).where(
        Event.sweep_id == sweep_id, Event.node == node, IS_FINISHED)).scalar()
    final, replaced = last_word(c, sweep_id, node, events, end, open_end)
    if final is not None and end is not None:  # what was set aside past the stored end
        events, payloads = with_set_aside(c, sweep_id, node, end, events, payloads)
    seqs = [e["seq"] for e in events]
    stored = _stored_lines(c, sweep_id, node, seqs)
    gens = [e["run_index"] for e in events if e["type"] == "generation"]
    measured: dict[int, int] = {}
    if gens:
        measured = dict(c.execute(select(Measurement.run_index, Measurement.seq).where(
            Measurement.sweep_id == sweep_id, Measurement.node == node,
            Measurement.run_index.between(min(gens), max(gens)))).all())
    plan = _Plan(c, sweep_id, node)
    top, ended, olds = reach(c, sweep_id, node, seqs), False, []
    batch: dict[int, str] = {}
    keep_e: list[dict] = []
    keep_p: list[str] = []
    refused: list[Refused] = []
    for e, line in zip(events, payloads, strict=True):
        seq, kind = e["seq"], e["type"]
        why = None
        if seq in batch:
            if _same(batch[seq], line):
                continue  # the same line twice: stored once
            why = f"conflict: seq {seq} arrived earlier in this read with other content"
        elif seq in stored:
            if _same(stored[seq], line):
                continue  # a re-read of what is stored
            kind_stored = orjson.loads(stored[seq]).get("type")
            why = (f"conflict: seq {seq} is stored with other content ({kind_stored}); "
                   "the stored event is kept")
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
            refused.append(Refused(seq, why, line))
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
    keep_e, keep_p, out = failed_ends(c, sweep_id, node, keep_e, keep_p)
    withdraw_jumps(c, sweep_id, node, keep_e, keep_p)
    return keep_e, keep_p, refused + out


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
