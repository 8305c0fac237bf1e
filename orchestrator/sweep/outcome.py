"""A node's outcome of a sweep, read from what the store holds of its journal."""

from __future__ import annotations

import re
import shlex

from ..errors import SpecfleetError
from ..fleet.fanout import Outcome
from ..fleet.inventory import Host
from ..store import Store
from ..store.coverage import coverage, ranges_text
from .options import SweepOptions, again_command


def node_row(store: Store, sweep_id: str, node: str):
    """The node's row of the sweep (placement, agent, state)."""
    rows = [r for r in store.sweep_nodes(sweep_id) if r.node == node]
    if not rows:
        raise SpecfleetError(f"{node}: not part of sweep {sweep_id}")
    return rows[0]


def node_outcome(store: Store, sweep_id: str, host: Host, opts: SweepOptions) -> Outcome:
    """ok / unreliable / failed / busy, from the node's last stored event; the node's row
    is marked finished, failed or died to match."""
    last = store.last_event(sweep_id, host.name) or {}
    kind = last.get("type")
    if kind == "job_finished":
        return _finished(store, sweep_id, host.name, opts, last)
    if kind == "job_failed":
        store.set_sweep_node(sweep_id, host.name, state="failed")
        if last.get("error") == "node_busy":  # nothing measured: not started, not failed
            return Outcome(host.name, "busy", busy_detail(store, sweep_id, host, opts,
                                                          last["message"]),
                           exit_status=last.get("exit_code"))
        return Outcome(host.name, "failed", f"agent: {last['message']}",
                       exit_status=last.get("exit_code"))
    store.set_sweep_node(sweep_id, host.name, state="died")
    return Outcome(host.name, "failed",
                   f"the agent stopped before finishing (last event: {kind or 'none'}); "
                   f"run `{again_command(sweep_id, opts, 'resume')}` to measure only what "
                   "is missing")


def _finished(store: Store, sweep_id: str, node: str, opts: SweepOptions,
              last: dict) -> Outcome:
    """The outcome of a node whose agent said job_finished."""
    store.set_sweep_node(sweep_id, node, state="finished")
    if last.get("status", "ok") != "ok":  # e.g. soak_failed
        why = "; ".join(last.get("reasons") or []) or "see the journal"
        return Outcome(node, "failed", f"{last['status']}: {why}",
                       exit_status=7 if last["status"] == "soak_failed" else None)
    if last.get("failed"):
        # a job that measured only part of its plan is not ok, whatever else it did
        return Outcome(node, "failed",
                       f"{last['failed']} planned generation(s) failed "
                       f"({last.get('generations', 0)} measured); the errors are on the "
                       f"sweep page: `specfleet review --sweep {sweep_id}`")
    cov = coverage(store, sweep_id, node)
    lost = cov.missing - cov.unnumbered  # set-aside lines fill some
    if lost > 0:  # never silent: say which never arrived
        return Outcome(node, "failed",
                       f"{lost} journal line(s) never reached the store: seq "
                       f"{ranges_text(cov.holes)}"
                       + (f" ({cov.unnumbered} set-aside line(s) had no readable seq)"
                          if cov.unnumbered else "")
                       + f"; the node's journal {node_row(store, sweep_id, node).journal_path}"
                         " holds what it wrote (`specfleet sweeps verify` says whether it "
                         "holds those seqs: a line lost there no read brings back)")
    measured, aside, reasons = store.set_aside_generations(sweep_id, node)
    if measured and aside == measured:  # nothing to judge by: not an ok result
        return Outcome(node, "unreliable", value={
            "events": store.last_seq(sweep_id, node),
            "generations": last.get("generations"), "set_aside": aside}, detail=(
            f"no reliable result: all {measured} generation(s) were set aside as "
            f"unreliable ({'; '.join(reason_ranges(reasons)[:3]) or 'see the sweep page'}); "
            "the sweep "
            f"page says why, run by run: `specfleet review --sweep {sweep_id}"
            f"{opts.db_hint}`. Run it again when the node is quiet"))
    kept = store.quarantined_count(sweep_id, node)
    return Outcome(node, "ok", value={
        "events": store.last_seq(sweep_id, node),
        "generations": last.get("generations"), "set_aside": kept},
        detail=f"{kept} journal line(s) set aside (`specfleet review --sweep "
               f"{sweep_id}` lists why)" if kept else None)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def reason_ranges(reasons: list[str]) -> list[str]:
    """Reasons that differ only in their numbers, said once with each number's range, in
    the order first met: "contended: other processes used 50–77% of the CPU (limit 25%)",
    not the same words three times with 52%, 77% and 75%."""
    groups: dict[str, list[list[float]]] = {}
    for r in reasons:
        groups.setdefault(_NUMBER.sub("#", r), []).append(
            [float(n) for n in _NUMBER.findall(r)])

    def said(values: list[float]) -> str:
        lo, hi = min(values), max(values)
        return f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"

    out = []
    for template, numbers in groups.items():
        parts = template.split("#")
        out.append(parts[0] + "".join(said([ns[i] for ns in numbers]) + part
                                      for i, part in enumerate(parts[1:])))
    return out


def busy_detail(store: Store, sweep_id: str, host: Host, opts: SweepOptions,
                message: str) -> str:
    """The agent found the machine lock taken: who holds it, and the three ways on."""
    ways = ["wait until it ends and run this again"]
    other = re.search(r"node is busy: job ([0-9a-f]{6,64}) ", message)
    if other and other.group(1) != sweep_id:  # e.g. a sweep left after Ctrl-C
        held = store.sweep(other.group(1))
        if held is not None:  # in this store: the hint names the inventory it ran with
            args = "".join(f" -i {shlex.quote(p)}" for p in (held.inventory or "").split(",")
                           if p) + opts.db_hint
            ways.append(f"if nobody follows that sweep any more, end it: "
                        f"`specfleet sweep --stop {other.group(1)}{args}`")
        else:
            ways.append(f"if it is a sweep of yours in another store that nobody follows "
                        f"any more, end it: `specfleet sweep --stop {other.group(1)}` with "
                        "that store's -i and --db")
    ways.append("if this node is a simulated one (tests, a demo beside another benchmark "
                "on this machine), give it a machine lock of its own: "
                + ("run the command with `SPECFLEET_MACHINE_LOCK=/tmp/specfleet-lock-NAME` "
                   "in front" if host.is_local else
                   "`specfleet_machine_lock: /tmp/specfleet-lock-NAME` in the inventory"))
    return (f"not started: {message.removeprefix('node is busy: ')}; the node is busy "
            f"with that job. Either " + "; or ".join(ways))
