"""Sweeps across the fleet: lease each node, launch the agent detached, follow its journal.

The agent runs in its own session on the node and journals every event to disk, so
neither a dropped SSH link nor a dead controller loses anything: the controller
follows the journal from the last sequence number it stored, reconnecting with
backoff, and ``--attach`` / ``--resume`` pick a sweep up again later. One node's part is
``node_run.NodeRun``; this module starts and continues a sweep on many.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from agent.protocol import model_roles

from ..errors import SpecfleetError, StoreError
from ..fleet.fanout import Outcome, run_fan_out
from ..fleet.inventory import Host
from ..store import Store
from ..store.errors import StoreFailure, translated
from .lease import controller_id
from .node_run import NodeRun
from .options import SweepOptions
from .progress import StderrProgress

# what callers of a sweep take from here with it (the CLI, the demo, tests)
__all__ = ["NodeRun", "StderrProgress", "SweepOptions", "SweepResult", "continue_sweep",
           "controller_id", "start_sweep"]


@dataclass
class SweepResult:
    sweep_id: str
    status: str
    outcomes: list[Outcome] = field(default_factory=list)
    left_out: tuple[str, ...] = ()  # nodes an --attach/--resume left to finish later

    @property
    def ok(self) -> bool:
        """Ran to its end on every node, nothing failed (its runs may all have been set
        aside: ``status`` is then "unreliable")."""
        return self.status in ("ok", "unreliable")


def _run(hosts: list[Host], store: Store, sweep_id: str, opts: SweepOptions, progress,
         mode: str, doc: dict | None = None, job: dict | None = None) -> list[Outcome]:
    holder = controller_id()

    async def one(h: Host, t) -> Outcome:
        return await NodeRun(h, store, sweep_id, holder, opts, progress).run(t, mode, doc, job)

    return run_fan_out(hosts, one, opts.ssh)


def _finish(store: Store, sweep_id: str, outcomes: list[Outcome],
            pending: tuple[str, ...] = ()) -> str:
    try:
        with translated():
            return store.finish_sweep(sweep_id, {o.host: (o.status, o.detail)
                                                 for o in outcomes}, pending)
    except StoreFailure as e:
        # the outcomes are not stored: say them here, or their reasons are lost
        said = "; ".join(f"{o.host} {o.status}" + (f": {o.detail}" if o.detail else "")
                         for o in outcomes)
        raise StoreError(f"could not record the outcome of sweep {sweep_id} "
                         f"({str(e).splitlines()[0]}); the nodes' journals keep every event "
                         f"an agent wrote: `specfleet sweep --attach {sweep_id}` once the "
                         "store is back"
                         + (f". Outcomes: {said}" if said else "")) from None


def start_sweep(doc: dict, hosts: list[Host], store: Store, *, inventory: str | None = None,
                opts: SweepOptions | None = None, progress=None,
                announce=lambda sweep_id: None) -> SweepResult:
    """Create the sweep record and run the lock's job on every host."""
    opts = opts or SweepOptions()
    sweep_id = uuid.uuid4().hex[:12]
    job = doc["job"]
    store.record_lock(doc)
    store.create_sweep(sweep_id, {**job, "models": {r: {"fingerprint": doc["models"][r][
        "fingerprint"]} for r in model_roles(doc["models"])}}, inventory, plan_id=doc["lock_id"],
        trigger=opts.trigger, controller=controller_id())
    announce(sweep_id)
    try:
        outcomes = _run(hosts, store, sweep_id, opts, progress or (lambda n, e: None), "start",
                        doc, job)
    except Exception as e:  # never leave the record `running` for a sweep that stopped
        _finish(store, sweep_id, [Outcome(h.name, "failed", f"the controller stopped: "
                                          f"{type(e).__name__}: {e}") for h in hosts])
        raise
    return SweepResult(sweep_id, _finish(store, sweep_id, outcomes), outcomes)


def continue_sweep(sweep_id: str, hosts: list[Host], store: Store, *, resume: bool,
                   opts: SweepOptions | None = None, progress=None,
                   leave_out: bool = False, stop: bool = False) -> SweepResult:
    """``--attach``: follow running agents; ``--resume``: restart dead ones with --resume;
    ``stop``: end the agents (what they wrote is stored) and release the nodes.
    ``leave_out``: the user chose the nodes (--limit); the others are left as they are, and
    the sweep stays running until they finish too."""
    opts = opts or SweepOptions()
    if store.sweep(sweep_id) is None:
        raise SpecfleetError(f"no sweep {sweep_id!r} in the store")
    rows = {r.node: r for r in store.sweep_nodes(sweep_id)}
    if not rows:  # it failed before any node was placed (a store out of space, say)
        raise SpecfleetError(f"sweep {sweep_id} never placed a job on a node: nothing was "
                             "measured, so there is nothing to pick up; start the sweep "
                             "again (`specfleet sweep LOCK …`)")
    chosen = [h for h in hosts if h.name in rows]
    missing = set(rows) - {h.name for h in chosen}
    if missing and not leave_out:
        raise SpecfleetError(f"sweep {sweep_id} ran on {', '.join(sorted(missing))}, which the "
                             "inventory does not include (name the nodes to pick up with "
                             "--limit to leave the others out)")
    if not chosen:
        raise SpecfleetError(f"--limit selects none of the nodes sweep {sweep_id} ran on "
                             f"({', '.join(sorted(rows))})")
    # nodes left out whose agents have not finished: the sweep is not over
    pending = tuple(sorted(n for n in missing if rows[n].state not in ("finished", "failed")))
    outcomes = _run(chosen, store, sweep_id, opts, progress or (lambda n, e: None),
                    "stop" if stop else "resume" if resume else "attach")
    return SweepResult(sweep_id, _finish(store, sweep_id, outcomes, pending), outcomes,
                       left_out=pending)

