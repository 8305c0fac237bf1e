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

from sqlalchemy import Date, String, cast, func, select

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


def series_totals(store: Store, end: datetime) -> dict[tuple, tuple[int, datetime]]:
    """{series key: (runs, latest run)} over the whole store."""
    keys = series_columns()
    q = (select(*keys, func.count(), func.max(Sweep.created_at))
         .join(Sweep, Sweep.id == Run.sweep_id).where(Sweep.created_at < end).group_by(*keys))
    with store.engine.connect() as c:
        return {tuple(r[:5]): (r[5], r[6]) for r in c.execute(q)}


def nightly_levels(store: Store, start: datetime, end: datetime
                   ) -> dict[tuple, dict[tuple[str, int], Nights]]:
    """{series key: {(mode, k): [(night, level, identity), …] in date order}}."""
    night: Any
    if store.engine.dialect.name == "postgresql":
        night = cast(func.timezone("UTC", Sweep.created_at), Date)
    else:
        night = func.date(Sweep.created_at)
    keys = (*series_columns(), Run.mode, Run.num_draft_tokens, night)
    q = (select(*keys, func.avg(Run.decode_tok_s_median),
                *(func.max(getattr(Run, k)) for k in LEVEL_IDENTITY))
         .join(Sweep, Sweep.id == Run.sweep_id)
         .where(Sweep.created_at >= start, Sweep.created_at < end, Run.unreliable.is_(False),
                Run.decode_tok_s_median.is_not(None))
         .group_by(*keys))
    out: dict[tuple, dict[tuple[str, int], Nights]] = defaultdict(lambda: defaultdict(list))
    with store.engine.connect() as c:
        for row in c.execute(q):
            chip, p, workload, bucket, engine, mode, k, d, level, *ident = row
            d = d if isinstance(d, date) else date.fromisoformat(str(d)[:10])
            out[(chip, p, workload, bucket, engine)][(mode, k)].append(
                (d, float(level), dict(zip(LEVEL_IDENTITY, ident))))
    for configs in out.values():
        for nights in configs.values():
            nights.sort(key=lambda n: n[0])
    return out
