"""A series' nightly level per config, aggregated by the database: what change points,
the history site and its sparklines read.

The level of a night is the mean of that night's reliable runs' median decode tok/s (runs
of one series on one night: its nodes of one chip). The database does the grouping, so a
year of nightly sweeps for a hundred nodes (a million runs) comes back as tens of
thousands of rows. With each night, the identity it ran under (the highest value of each
identity field that night; the node is left out, since a series pools a chip's nodes),
so a change of version or weights shows at the night it happened.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime
from typing import Any

from sqlalchemy import Date, String, case, cast, func, select

from ..store import Store
from ..store.models import Run, Sweep

LEVEL_IDENTITY = ("env_id", "mlx_version", "mlx_lm_version", "os_build", "prompt_sha256",
                  "target_fingerprint", "draft_fingerprint")

Nights = list[tuple[date, float, dict]]


def series_columns() -> tuple:
    """A run's series key in SQL, as ``weekly.load_runs`` builds it in Python."""
    pair = func.coalesce(Run.model_pair,
                         func.substr(Run.target_fingerprint, 8, 12, type_=String) + "/"
                         + func.substr(Run.draft_fingerprint, 8, 12, type_=String))
    return (func.coalesce(Run.chip, Run.node), pair, Run.workload,
            func.coalesce(Run.context_bucket, "short"), func.coalesce(Run.engine, "mlx-lm"))


def nightly_levels(store: Store, start: datetime, end: datetime, totals: dict | None = None
                   ) -> dict[tuple, dict[tuple[str, int], Nights]]:
    """{series key: {(mode, k): [(night, level, identity), …] in date order}}.

    ``totals``, if given, is filled from the same scan with {series key: [runs, latest
    night]} counting every run (the level reads reliable ones only)."""
    night: Any
    if store.engine.dialect.name == "postgresql":
        night = cast(func.timezone("UTC", Sweep.created_at), Date)
    else:
        night = func.date(Sweep.created_at)
    keys = (*series_columns(), Run.mode, Run.num_draft_tokens, night)
    reliable = Run.unreliable.is_(False)
    q = (select(*keys, func.avg(case((reliable, Run.decode_tok_s_median))), func.count(),
                *(func.max(case((reliable, getattr(Run, k)))) for k in LEVEL_IDENTITY))
         .join(Sweep, Sweep.id == Run.sweep_id)
         .where(Sweep.created_at >= start, Sweep.created_at < end)
         .group_by(*keys))
    out: dict[tuple, dict[tuple[str, int], Nights]] = defaultdict(lambda: defaultdict(list))
    with store.engine.connect() as c:
        for row in c.execute(q):
            chip, p, workload, bucket, engine, mode, k, d, level, n, *ident = row
            d = d if isinstance(d, date) else date.fromisoformat(str(d)[:10])
            key = (chip, p, workload, bucket, engine)
            if totals is not None:
                t = totals.setdefault(key, [0, d])
                t[0] += n
                t[1] = max(t[1], d)
            if level is not None:  # a night with no reliable run has no level
                out[key][(mode, k)].append((d, float(level), dict(zip(LEVEL_IDENTITY, ident))))
    for configs in out.values():
        for nights in configs.values():
            nights.sort(key=lambda n: n[0])
    return out
