"""The sweep page's "decided through the noise", taken from the weekly review's own judgement.

The sweep page once judged a section set aside for its decode-rate spread by itself, and
so disagreed with the weekly review on the same runs (it skipped swap, the task pass rate,
streaming parity and the failure window, decided against a baseline set aside for
throttling, read the spread from a pre-1.9 reason's words and said other figures). Here
each section's runs of this one sweep are judged by the weekly review's own code
(``weekly.judged_section``) with the sweep's gates, quality rates and failed windows: the
page decides through the noise only where that judgement does, and its sentence is built
from that verdict's fields, so the two pages say one thing."""

from __future__ import annotations

from collections import defaultdict
from datetime import timezone

from ..store import Store
from .series import Week
from .verdict import provisional_words
from .week_runs import RunRow, sweep_runs
from .weekly import judged_section
from .windows import failed_window_configs, quality_rates

SectionKey = tuple[str, tuple[str, str | None]]  # (node, (workload, pair)) as the page keys


def weekly_verdicts(store: Store, sweep, lock: dict | None, gates: dict
                    ) -> dict[SectionKey, dict]:
    """{(node, (workload, pair)): the weekly review's verdict on ``sweep``'s runs of that
    section}, judged with ``gates`` (the defaults and what the sweep's plan declared;
    ``lock``: the plan's lock, already read). A section whose runs fall in more than one
    series (two context buckets, two runtimes) is left out: no one verdict speaks for it."""
    return verdicts_of(weekly_sections(store, sweep, lock, gates))


def verdicts_of(judged: dict[SectionKey, list[dict]]) -> dict[SectionKey, dict]:
    """Each page section's verdict where one series (one judged section) speaks for it."""
    return {key: ss[0]["verdict"] for key, ss in judged.items() if len(ss) == 1}


def weekly_sections(store: Store, sweep, lock: dict | None, gates: dict
                    ) -> dict[SectionKey, list[dict]]:
    """{(node, (workload, pair)): the weekly review's judged section of each series
    ``sweep``'s runs of that page section fall in} (``weekly_verdicts``' arguments): the
    verdict, and the configs with the baseline each sampling's speedups are read against."""
    runs = sweep_runs(store, sweep.id, lock)
    if not runs:
        return {}
    at = sweep.created_at
    at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
    week = Week(start=at, quality=quality_rates(store, [sweep.id]),
                failed=failed_window_configs(store, [sweep.id], gates["failed_acceptance"],
                                             gates["failed_window_s"]),
                levels={}, ramps=[], rules=[], regressions_too=False)
    groups: dict[SectionKey, dict[tuple, list[RunRow]]] = defaultdict(dict)
    for r in runs:
        groups[(r.node, (r.series[2], r.pair))].setdefault(r.series, []).append(r)
    # no history before this sweep: nothing is stale or mixed, nothing regressed
    return {key: [judged_section(series, rs, at, at, gates, "plan", week)
                  for series, rs in by_series.items()]
            for key, by_series in groups.items()}


def noise_sentence(verdict: dict | None) -> str | None:
    """The section's verdict where the weekly review decided its runs through the noise
    (None otherwise: the page's own verdict stands), from that verdict's fields: the
    spread and the interval that decided, the decision and its count of nights, and its
    evidence."""
    tn = (verdict or {}).get("through_noise")
    if verdict is None or not tn:
        return None
    count = provisional_words(p) if (p := verdict.get("provisional")) else ""
    return (f"Decided through the noise ({tn['text']}): {verdict['words']}{count} "
            f"({verdict.get('evidence') or 'no evidence'}).")
