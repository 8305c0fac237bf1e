"""A series' nightly level per config, aggregated by the database: what change points,
the history site and its sparklines read.

The level of a night is the mean of that night's reliable runs' median decode tok/s (runs
of one series on one night: its nodes of one chip). The database does the grouping, so a
year of nightly sweeps for a hundred nodes (a million runs) comes back as tens of
thousands of rows. With each night, the identity it ran under (each identity field's value
in that night's latest sweep; the node is left out, since a series pools a chip's nodes),
so a change of version or weights shows at the night it happened.

A night is dated by the sweeps' own clock, not UTC's midnight: the day starts in the middle
of the longest quiet stretch of the day between sweeps (``night_dates``). A node that
sweeps at 01:30 local time in Berlin sweeps at 00:30 UTC in winter and 23:30 UTC in summer;
by UTC date the DST change put two sweeps on one night and dated every later night (and
its weekday) a day early. Cut in the quiet afternoon, each sweep keeps its own night.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timedelta

from ..store import Store
from ..store.weekly_rows import LEVEL_IDENTITY, level_rows, sweep_times
from .configs import ConfigId
from .week_sweeps import calibration_marks, series_key, target_role

Nights = list[tuple[date, float, dict]]
DAY = 86400.0
MIN_QUIET = 6 * 3600.0  # a day with no quieter stretch than this keeps UTC's midnight


def day_shift(times: list[datetime]) -> timedelta:
    """What to add to a sweep's UTC time so its date is its night's: the middle of the
    longest stretch of the day (UTC clock) with no sweep moves to midnight, within ±12 h
    (sweeps in the small hours keep their own date). None quieter than ``MIN_QUIET``, or
    no sweeps: no shift."""
    clock = sorted({(t.hour * 3600 + t.minute * 60 + t.second) for t in times})
    if not clock:
        return timedelta(0)
    gaps = [((clock[(i + 1) % len(clock)] - c) % DAY or DAY, c) for i, c in enumerate(clock)]
    gap, after = max(gaps)
    if gap < MIN_QUIET:
        return timedelta(0)
    middle = (after + gap / 2) % DAY
    return timedelta(seconds=-middle if middle < DAY / 2 else DAY - middle)


def night_dates(sweeps: dict[str, datetime]) -> dict[str, date]:
    """Each sweep's night (``day_shift``): consistent across a DST change and the same for
    every window read of one store."""
    shift = day_shift(list(sweeps.values()))
    return {sid: (at + shift).date() for sid, at in sweeps.items()}


def nightly_levels(store: Store, start: datetime, end: datetime, totals: dict | None = None
                   ) -> dict[tuple, dict[ConfigId, Nights]]:
    """{series key: {config (the ingest's key): [(night, level, identity), …] by date}}.

    ``totals``, if given, is filled from the same scan with {series key: [runs, latest
    night]} counting every run (the level reads reliable ones only)."""
    all_sweeps = sweep_times(store)
    dated = night_dates(all_sweeps)
    nights = {sid: dated[sid] for sid, at in all_sweeps.items() if start <= at < end}
    if not nights:
        return {}
    acc: dict[tuple, dict[date, list]] = defaultdict(dict)
    marks = calibration_marks(store, start, end)  # a calibration target's: its own series
    # a window (fewer sweeps than all): only its sweeps' runs are read (by index)
    for row in level_rows(store, start, end, window=len(nights) < len(all_sweeps)):
        d = nights.get(row.sweep_id)
        if d is None:
            continue
        key = series_key(row.series, marks.get((row.sweep_id, target_role(row.lineup_pair))))
        if totals is not None:
            t = totals.setdefault(key, [0, d])
            t[0] += row.runs
            t[1] = max(t[1], d)
        if not row.reliable:
            continue  # no reliable run that night: no level
        slot = acc[(key, ConfigId(row.mode, row.num_draft_tokens, row.config_key))
                   ].setdefault(d, [0.0, 0, {}])
        slot[0] += row.decode_sum
        slot[1] += row.reliable
        # the night's identity is its latest sweep's: the highest value as text would
        # read mlx-lm 0.9.0 above 0.10.0 on a night with a sweep either side of a bump
        at = all_sweeps[row.sweep_id]
        for name, v in zip(LEVEL_IDENTITY, row.identity):
            if v is not None and (slot[2].get(name) is None or at >= slot[2][name][0]):
                slot[2][name] = (at, v)
    out: dict[tuple, dict[ConfigId, Nights]] = defaultdict(dict)
    for (key, cid), per_night in acc.items():
        out[key][cid] = [(d, total / n, {name: ident[name][1] if name in ident else None
                                         for name in LEVEL_IDENTITY})
                               for d, (total, n, ident) in sorted(per_night.items())]
    return out

