"""The sweep page's "decided through the noise", taken from the weekly review's own judgement.

The sweep page once judged a section set aside for its decode-rate spread by itself
(acceptance, exact output and the timing gates on intervals), and so disagreed with the
weekly review on the same runs: it skipped swap, the task pass rate, streaming parity and
the failure window, decided against a baseline set aside for throttling, and read the
spread from a pre-1.9 reason's words. Here each section's runs of this one sweep are judged
by the weekly review's code (``series.judge``, ``verdict.decide``) with the week's gates,
quality rates and failed windows of this sweep: the sweep page decides through the noise
only where that judgement does, and says what it says."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta, timezone

from ..store import Store
from .series import Week, judge
from .verdict import decide
from .week_runs import RunRow, load_runs
from .week_sweeps import plan_gates, series_dict
from .windows import failed_window_configs, quality_rates

SectionKey = tuple[str, tuple[str, str | None]]  # (node, (workload, pair)) as the page keys


def weekly_verdicts(store: Store, sweep_id: str, defaults: dict) -> dict[SectionKey, dict]:
    """{(node, (workload, pair)): the weekly review's verdict on this sweep's runs of that
    section}; a section whose runs fall in more than one series (two context buckets, two
    runtimes) is left out: no one weekly verdict speaks for it."""
    sweep = store.sweep(sweep_id)
    if sweep is None:
        return {}
    at = sweep.created_at
    at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
    # a run's time is its sweep's creation: a second either side holds this sweep's runs
    runs = [r for r in load_runs(store, at - timedelta(seconds=1), at + timedelta(seconds=1))
            if r.sweep_id == sweep_id]
    if not runs:
        return {}
    gates = {**defaults, **plan_gates(store, [sweep_id]).get(sweep_id, (None, {}))[1]}
    week = Week(start=at, quality=quality_rates(store, [sweep_id]),
                failed=failed_window_configs(store, [sweep_id], gates["failed_acceptance"],
                                             gates["failed_window_s"]),
                levels={}, ramps=[], rules=[], regressions_too=False)
    groups: dict[SectionKey, list[RunRow]] = defaultdict(list)
    for r in runs:
        groups[(r.node, (r.series[2], r.pair))].append(r)
    out = {}
    for key, rs in groups.items():
        if len({r.series for r in rs}) == 1:
            out[key] = _decided(rs, gates, week)
    return out


def _decided(rs: list[RunRow], gates: dict, week: Week) -> dict:
    """The weekly review's verdict on these runs, their section built as
    ``weekly._sections`` builds one (no history before them: nothing is stale or mixed)."""
    latest = max(rs, key=lambda r: r.at)
    section: dict = {"series": series_dict(latest.series), "identity": latest.identity,
                     "stale": False, "mixed_identities": False,
                     "latest_run": latest.at.isoformat(), "configs": [], "signals": [],
                     "regressions": [], "change_points": [], "compared": 0,
                     "calibration": None, "gates": gates, "gates_from": "plan"}
    judge(section, latest.series, rs, rs, latest, gates, week)
    return decide(section)


def agreed(page: str | None, weekly: dict | None) -> str | None:
    """The section's through-noise verdict: None (the old verdict) unless the weekly
    review decided these runs through the noise; the page's own sentence (best width, its
    interval) when both reach the same decision, else the weekly review's words, marked."""
    tn = (weekly or {}).get("through_noise")
    if not tn or weekly is None:
        return None
    said = None if page is None else ("production candidate" if "a production candidate"
                                      in page else "keep autoregressive"
                                      if "Keep autoregressive" in page else None)
    if said == weekly["decision"]:
        return page
    head = weekly["text"].split("; decided through the noise", 1)[0]
    return (f"Decided through the noise ({tn['text']}): {head} "
            f"({weekly.get('evidence') or 'no evidence'}).")
