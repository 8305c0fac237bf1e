"""The week's sweeps as the review names them: those that did not finish ok, the gates
each one's plan declared, and which of them swept a calibration target (an instrument)."""

from __future__ import annotations

from datetime import datetime

from ..store import Store
from ..store.weekly_rows import failed_sweeps as failed_rows
from ..store.weekly_rows import sweep_plans


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


def calibration_targets(store: Store, sweep_ids: list[str]) -> dict[str, dict]:
    """Target fingerprints the week's locks mark as calibration targets (grown from a
    draft: `specfleet models calibrate`), with what their record says."""
    out: dict[str, dict] = {}
    for _, lock in sweep_plans(store, sweep_ids).values():
        for m in _calibrations(lock):
            cal = m["calibration"]
            out[m["fingerprint"]] = {
                "expected_acceptance": cal.get("expected_acceptance"),
                "layers": (cal.get("construction") or {}).get("layers"),
                "draft_fingerprint": cal.get("draft_fingerprint")}
    return out


def calibration_sweeps(store: Store, sweep_ids: list[str]) -> set[str]:
    """The week's sweeps whose lock swept a calibration target (their notices, e.g. the
    adaptive sweep's stops, are marked as the instrument's)."""
    return {sid for sid, (_, lock) in sweep_plans(store, sweep_ids).items()
            if _calibrations(lock)}
