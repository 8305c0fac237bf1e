"""The weekly review's analysis: series, gates, signals → actions, regressions, staleness.

A series is node class (chip) × model pair (target, draft fingerprints) × workload ×
context bucket. Within a week, numbers come only from the series' current identity
(env id, mlx / mlx-lm versions, OS build, node, prompt hash): results with different
identities are never pooled, and when the identity changed since an earlier period the
review names the parts that changed.

The store side (what is read) is ``store.weekly_rows``; the judgement is here and in
``week_runs``, ``config_stats``, ``windows``, ``regression`` and ``series``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from ..store import Store
from .adaptive_stops import adaptive_stops, marked_stops
from .busy import busy_vs_idle
from .changepoints import MIN_HISTORY
from .configs import canonical
from .ladder import annotate, ladders
from .levels import nightly_levels
from .load import load_ramps
from .record_holds import series_holds
from .rules import Rule, fire
from .runtimes import agent_notices, side_by_side
from .series import Week, judge, positions, read_served
from .verdict import DECISIONS, FAILED_TEXT, decide
from .week_runs import RunRow, identity_key, iso_week_bounds, load_runs
from .week_sweeps import (
    calibration_roles,
    calibration_sweeps,
    failed_speculation,
    failed_sweeps,
    plan_gates,
    record_summary,
    series_dict,
)
from .windows import failed_window_configs, quality_rates, speculative_generations

DEFAULT_GATES = {"min_speedup": 1.16, "itl_p95_ceiling_ms": 50.0, "acceptance_floor": 0.55,
                 "ttft_regression_limit": 0.08, "swap_ceiling_bytes": 1.5e9,
                 "task_pass_tolerance": 0.005, "failed_acceptance": 0.40,
                 "failed_window_s": 300}
STALE_DAYS = 14


def analyse(store: Store, week: str | None, rules: list[Rule], gates: dict | None = None,
            now: datetime | None = None, change_points_too: bool = True,
            regressions_too: bool = True) -> dict:
    """The week's review. ``change_points_too=False`` and ``regressions_too=False`` leave
    those out (the history site shows verdicts and finds its own change points over the
    whole history; verdicts depend on neither)."""
    gates = {**DEFAULT_GATES, **(gates or {})}
    start, end, label = iso_week_bounds(week, now)
    # repetitions for this week and last; per-night medians for the three weeks before
    # (without regressions, last week's repetitions are not needed either)
    cut = start - timedelta(days=7) if regressions_too else start
    history = load_runs(store, start - timedelta(days=28), cut, values=False) \
        + load_runs(store, cut, end)
    this_week = [r for r in history if r.at >= start]
    sweep_ids = sorted({r.sweep_id for r in this_week})
    generations = speculative_generations(store, sweep_ids)
    ctx = Week(start=start, quality=quality_rates(store, sweep_ids),
               failed=failed_window_configs(store, sweep_ids, gates["failed_acceptance"],
                                            gates["failed_window_s"], generations),
               levels=nightly_levels(store, start - timedelta(days=28), end)
               if change_points_too else {},
               ramps=load_ramps(store, sweep_ids), rules=rules,
               regressions_too=regressions_too)
    out = _sections(store, history, start, end, gates, sweep_ids, ctx)
    busy = busy_vs_idle(out)
    for b in busy:  # a busy series' tails against its idle twin's: a rule's evidence too
        s = next((x for x in out if x["series"] is b["series"]), None)
        ratios = [r["itl_p99_ratio"] for r in b["rows"] if r.get("itl_p99_ratio")]
        if s is not None and ratios and s.get("metrics") is not None:
            s["metrics"]["busy_itl_p99_ratio"] = round(max(ratios), 3)
            s["signals"] = fire(rules, s["metrics"])
    found = ladders(out)  # lineups: the graded fallback walked with measured rungs
    annotate(out, found)
    # a generation event names its workload, bucket and config; its sweep and node the rest
    run_of = {(r.sweep_id, r.node, r.series[2], r.series[3], r.pair, canonical(r.config)): r
              for r in this_week}
    positions(out, generations, run_of)
    cal_sweeps = calibration_sweeps(store, sweep_ids)
    failures = failed_sweeps(store, start, end)
    return {"week": label, "start": start.isoformat(), "end": end.isoformat(), "gates": gates,
            "series": out, "side_by_side": side_by_side(out), "sweeps": sweep_ids,
            "ladders": found, "busy_vs_idle": busy,
            "loads": ctx.ramps,
            "notices": [{**n, "calibration": n["sweep_id"] in cal_sweeps}
                        for n in agent_notices(store, sweep_ids)],
            "adaptive_stops": marked_stops(adaptive_stops(store, sweep_ids),
                                           calibration_roles(store, sweep_ids)),
            "failures": failures, "counts": _counts(out, failures, this_week)}


def _counts(out: list[dict], failures: list[dict], this_week: list[RunRow]) -> dict:
    return {"failed_sweeps": len(failures), "series": len(out),
            "runs_this_week": len(this_week),
            "set_aside_runs": sum(x["runs"] for s in out for x in s.get("set_aside", [])),
            "stale": sum(1 for s in out if s["stale"]),
            # comparisons with reliable runs on both sides ("nothing regressed" is said
            # only when there was something to compare)
            "compared": sum(s["compared"] for s in out),
            # configs with nights enough for change points (and the nights that takes)
            "cp_examined": sum(s.get("cp_examined", 0) for s in out),
            "cp_min_nights": MIN_HISTORY,
            "verdicts": {d: sum(1 for s in out if s["verdict"]["decision"] == d)
                         for d in DECISIONS}}


def _sections(store: Store, history: list[RunRow], start: datetime, end: datetime,
              gates: dict, sweep_ids: list[str], ctx: Week) -> list[dict]:
    """One section per series with runs in the window, judged on its current identity."""
    declared = plan_gates(store, sweep_ids)
    facts = store.latest_facts()  # what each node is: why its numbers may not transfer
    by_series: dict[tuple, list[RunRow]] = defaultdict(list)
    for r in history:
        by_series[r.series].append(r)
    failed = failed_speculation(store, [r for r in history if r.at >= start])
    out = []
    for key, runs in sorted(by_series.items(), key=lambda kv: kv[0]):
        latest = max(runs, key=lambda r: r.at)
        # the gates the plan behind this series' latest run declared, over the defaults
        plan_name, own = declared.get(latest.sweep_id, (None, {}))
        out.append(judged_section(key, runs, start, end, {**gates, **own},
                                  f"plan {plan_name}" if own else "defaults", ctx,
                                  facts.get(latest.node), failed.get(key)))
    return out


def judged_section(key: tuple, runs: list[RunRow], start: datetime, end: datetime,
                   gates: dict, gates_from: str, ctx: Week, facts: dict | None = None,
                   failed: list[str] | None = None) -> dict:
    """A series' section: its runs from ``start`` on, judged on the latest run's identity
    with ``gates``, and its verdict (the sweep page judges one sweep's runs with it too).
    ``failed``: the errors of its speculative generations that failed this week."""
    current = [r for r in runs if r.at >= start]
    latest = max(runs, key=lambda r: r.at)
    ident = latest.identity
    cur = [r for r in current if identity_key(r.identity) == identity_key(ident)]
    section: dict = {"series": series_dict(key),
                     "identity": ident,
                     "stale": (end - latest.at).days > STALE_DAYS or not current,
                     "mixed_identities": len({identity_key(r.identity) for r in current}) > 1,
                     "latest_run": latest.at.isoformat(), "configs": [], "signals": [],
                     "regressions": [], "change_points": [], "compared": 0,
                     # an instrument's series: marked, never in a policy unless asked
                     "calibration": _calibration(latest, current),
                     "gates": gates, "gates_from": gates_from,
                     **({"speculation_failed": failed} if failed else {})}
    if cur:
        judge(section, key, runs, cur, latest, gates, ctx)
    section["verdict"] = decide(section, facts)
    if cur and read_served(section, ctx.rules):  # the rules read the width switched on
        section["verdict"] = decide(section, facts)
    _say_failed(section)
    return section


def _say_failed(section: dict) -> None:
    """A verdict reached on the widths that ran says that others failed (audit 43: a
    candidate at width 4 said nothing of widths 2 and 3 failing every night)."""
    errors, v = section.get("speculation_failed"), section["verdict"]
    if errors and not v["text"].startswith(FAILED_TEXT):
        v["evidence"] += (f"; {len(errors)} speculative generation"
                          f"{'s' if len(errors) != 1 else ''} failed this week, e.g. "
                          f"{errors[0][:200]} (see the sweep page)")


def _calibration(latest: RunRow, current: list[RunRow]) -> dict | None:
    """A calibration series' record as its latest sweep's lock stored it, and, judged on
    each of this week's runs against its own record (``record_holds``), why it no longer
    holds (``no_longer_holds``) or what it has nothing to compare with (``unverified``)."""
    if latest.calibration is None:
        return None
    return {**record_summary(latest.calibration), **series_holds(current)}
