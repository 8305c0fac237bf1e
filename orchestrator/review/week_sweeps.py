"""The week's sweeps as the review names them: those that did not finish ok, the gates
each one's plan declared, and which of them swept a calibration target (an instrument).

A run is a calibration run when its sweep's lock (as stored with the sweep) marks its target
with the target's ``specfleet-calibration.json`` record: that, not the pair's name, puts it
in a calibration series (``series_key``), never pooled with a real pair of the same name."""

from __future__ import annotations

from datetime import datetime

from ..store import Store
from ..store.weekly_rows import calibration_locks, sweep_plans
from ..store.weekly_rows import failed_sweeps as failed_rows

# a series' parts, in its key's order; ``calibration`` is there (True) only for an
# instrument's series
SERIES_PARTS = ("chip", "model_pair", "workload", "context_bucket", "engine", "calibration")
# a calibration record's measured acceptance is its manifest's within this (issue 34)
ACCEPTANCE_TOLERANCE = 0.05


def failed_sweeps(store: Store, start: datetime, end: datetime) -> list[dict]:
    """Sweeps of the week that did not finish ok (a nightly that did not start included),
    each with the nodes that were not ok and why."""
    out: dict[str, dict] = {}
    for r in failed_rows(store, start, end):
        f = out.setdefault(r.sweep_id, {"sweep_id": r.sweep_id,
                                        "at": r.at.isoformat(timespec="minutes"),
                                        "status": r.status, "trigger": r.trigger or "manual",
                                        "plan": r.plan, "nodes": []})
        if r.node is not None:
            f["nodes"].append({"node": r.node, "status": r.node_status,
                               "reason": (r.detail or "")[:400]})
    return list(out.values())


def plan_gates(store: Store, sweep_ids: list[str]) -> dict[str, tuple[str | None, dict]]:
    """Each sweep's plan name and the gates its plan declared (``gates`` in the lock)."""
    return {sid: (name, dict(lock.get("gates") or {}))
            for sid, (name, lock) in sweep_plans(store, sweep_ids).items()}


def _calibrations(lock: dict) -> list[dict]:
    """The models a lock marks as calibration targets."""
    return [m for m in (lock.get("models") or {}).values()
            if isinstance(m, dict) and isinstance(m.get("calibration"), dict)]


def calibration_sweeps(store: Store, sweep_ids: list[str]) -> set[str]:
    """The week's sweeps whose lock swept a calibration target (their notices, e.g. the
    adaptive sweep's stops, are marked as the instrument's)."""
    return {sid for sid, (_, lock) in sweep_plans(store, sweep_ids).items()
            if _calibrations(lock)}


def calibration_roles(store: Store, sweep_ids: list[str]) -> dict[str, set[str]]:
    """Per sweep, the model roles its lock marks as calibration targets."""
    return {sid: {role for role, m in (lock.get("models") or {}).items()
                  if isinstance(m, dict) and isinstance(m.get("calibration"), dict)}
            for sid, (_, lock) in sweep_plans(store, sweep_ids).items()}


def series_key(names: tuple, calibration: object) -> tuple:
    """A series' key: its names (chip, pair, workload, bucket, engine) and, for a
    calibration target's runs, ``True``: a real pair of the same names is another series."""
    return (*names, True) if calibration else tuple(names)


def series_dict(key: tuple) -> dict:
    """A series key as the review's ``series`` (``calibration: true`` only when it is one)."""
    return dict(zip(SERIES_PARTS, key))


def target_role(pair: str | None) -> str:
    """The lock's role of a run's target: a lineup pair's ("target-2+draft" → target-2),
    else the plan's one target."""
    return pair.split("+", 1)[0] if pair else "target"


def calibration_marks(store: Store, start: datetime | None = None,
                      end: datetime | None = None,
                      sweep_id: str | None = None) -> dict[tuple[str, str], dict]:
    """{(sweep, model role): the calibration record the sweep's lock stored for that
    model, with the model's locked fingerprint and every fingerprint the lock holds} for
    sweeps created in [start, end) (or
    the one sweep asked)."""
    return {key: mark for sid, lock in calibration_locks(store, start, end, sweep_id).items()
            for key, mark in lock_marks(sid, lock).items()}


def lock_marks(sweep_id: str, lock: dict | None) -> dict[tuple[str, str], dict]:
    """``calibration_marks`` of one sweep from its lock, already read."""
    return {(sweep_id, role): {**m["calibration"], "locked_fingerprint": m.get("fingerprint"),
                               # what a node's draft may be without being a stranger to it
                               "lock_fingerprints": _fingerprints(lock or {})}
            for role, m in ((lock or {}).get("models") or {}).items()
            if isinstance(m, dict) and isinstance(m.get("calibration"), dict)}


def _fingerprints(lock: dict) -> list[str]:
    """Every model fingerprint a lock holds."""
    return sorted({m["fingerprint"] for m in (lock.get("models") or {}).values()
                   if isinstance(m, dict) and isinstance(m.get("fingerprint"), str)})


def record_summary(record: dict) -> dict:
    """What the review says of a calibration record."""
    return {"expected_acceptance": record.get("expected_acceptance"),
            "layers": (record.get("construction") or {}).get("layers"),
            "draft_fingerprint": record.get("draft_fingerprint")}


def calibration_words(cal: object, short: bool = False) -> str:
    """How a page names a calibration series ("" for a real pair's): always marked, marked
    stale when its record no longer holds for what it measured, and unverified when the
    record has nothing to compare some of it with (``record_holds``). ``short``: the mark
    alone, for a label whose row or hover says why."""
    if not cal:
        return ""
    why = cal.get("no_longer_holds") if isinstance(cal, dict) else None
    unknown = cal.get("unverified") if isinstance(cal, dict) else None
    if short:
        return "calibration pair" + (", stale" if why else ", unverified" if unknown else "")
    return "calibration pair" + (
        f" (stale: its record no longer holds: {'; '.join(why)})" if why
        else f" (unverified against its record: {'; '.join(unknown)})" if unknown else "")


def failed_speculation(store: Store, runs: list) -> dict[tuple, list[str]]:
    """Per series measured this week (``runs``: its RunRows), the errors of the speculative
    generations that failed in its sweeps, on its node, for its workload: a week whose every
    speculative generation failed (a draft that does not load) left a baseline alone, which
    read as a series measured plain on purpose, and `--fail-on no-data` passed (audit 27z)."""
    from agent.events import GenerationFailed

    from ..store import queries

    where: dict[tuple, set] = {}
    for r in runs:
        where.setdefault((r.sweep_id, r.node, r.series[2]), set()).add(r.series)
    if not where:
        return {}
    out: dict[tuple, list[str]] = {}
    for s in queries.typed(queries.events(store, sorted({k[0] for k in where}),
                                          ("generation_failed",), order=("node", "seq"))):
        e = s.event
        if isinstance(e, GenerationFailed) and e.mode == "speculative":
            for key in where.get((s.sweep_id, s.node, e.workload), ()):
                out.setdefault(key, []).append(e.error)
    return out
