"""What the week's events say beside its runs: speculative generations read once, the
configs whose acceptance stayed under the floor too long (the failed-window gate), and the
quality tasks' pass rates."""

from __future__ import annotations

import statistics
from collections import defaultdict

from agent.events import Generation, Quality

from ..store import Store, queries
from ..store.db import result_pair
from .configs import canonical

GenRow = tuple[str, str, float, Generation]  # sweep, node, ts, the event


def speculative_generations(store: Store, sweep_ids: list[str]) -> list[GenRow]:
    """(sweep, node, ts, event) of this week's speculative generation events, read once
    for both the failed-window gate and the by-position chart (the week's biggest read)."""
    return [(s.sweep_id, s.node, e.ts, e)
            for s in queries.typed(queries.events(store, sweep_ids, ("generation",)))
            if isinstance(e := s.event, Generation) and e.mode == "speculative"]


def failed_window_configs(store: Store, sweep_ids: list[str], floor: float,
                          window_s: float, rows: list[GenRow] | None = None) -> set[tuple]:
    """(sweep, node, workload, pair, config) whose acceptance stayed under ``floor`` for more
    than two windows of ``window_s`` seconds of generation time (see ``low_for_too_long``);
    the config is ``configs.canonical`` of every knob, as the run's own."""
    if rows is None:
        rows = speculative_generations(store, sweep_ids)
    points: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for sid, node, ts, p in rows:
        if p.get("acceptance_rate") is not None:
            key = (sid, node, p.workload, result_pair(p), canonical(p.config))
            points[key].append((ts, p.get("acceptance_rate")))
    return {key for key, pts in points.items() if low_for_too_long(sorted(pts), floor, window_s)}


def low_for_too_long(points: list[tuple[float, float]], floor: float, window_s: float) -> bool:
    """Sliding windows over generation time, not clock-aligned buckets.

    At each generation, its window is the ``window_s`` seconds of generations ending with
    it; the window is low when their median acceptance is under ``floor``. The run fails
    when windows stay low, generation after generation, over more than two windows of
    time: from the start of the first low window to the last low generation. So two low
    generations seconds apart never fail (one window of time, wherever the clock's
    five-minute marks fall), and low acceptance that lasts past ten minutes always does.
    """
    start = None  # when the current low stretch's first window began
    lo = 0
    for i, (ts, _) in enumerate(points):
        while points[lo][0] <= ts - window_s:
            lo += 1
        if statistics.median(a for _, a in points[lo:i + 1]) < floor:
            start = ts - window_s if start is None else start
            if ts - start > 2 * window_s:
                return True
        else:
            start = None
    return False


def quality_rates(store: Store, sweep_ids: list[str]) -> dict:
    if not sweep_ids:
        return {}
    return {(s.sweep_id, s.node, result_pair(s.event), s.event.num_draft_tokens):
            s.event.pass_rate
            for s in queries.typed(queries.events(store, sweep_ids, ("quality",)))
            if isinstance(s.event, Quality)}
