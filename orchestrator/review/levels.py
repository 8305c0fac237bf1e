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
from datetime import date, datetime, timezone

from sqlalchemy import String, case, func, select

from agent.engines import DEFAULT_ENGINE

from ..store import Store
from ..store.models import Run, Sweep
from .configs import ConfigId

LEVEL_IDENTITY = ("env_id", "mlx_version", "mlx_lm_version", "os_build", "prompt_sha256",
                  "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant")

Nights = list[tuple[date, float, dict]]


def series_columns() -> tuple:
    """A run's series key in SQL, as ``weekly.load_runs`` builds it in Python."""
    pair = func.coalesce(Run.model_pair,
                         func.substr(Run.target_fingerprint, 8, 12, type_=String) + "/"
                         + func.substr(Run.draft_fingerprint, 8, 12, type_=String))
    # a busy node's runs (a background profile) are a series of their own
    engine = func.coalesce(Run.engine, DEFAULT_ENGINE) + func.coalesce(" · " + Run.background, "")
    return (func.coalesce(Run.chip, Run.node), pair, Run.workload,
            func.coalesce(Run.context_bucket, "short"), engine)


def nightly_levels(store: Store, start: datetime, end: datetime, totals: dict | None = None
                   ) -> dict[tuple, dict[ConfigId, Nights]]:
    """{series key: {config (the ingest's key): [(night, level, identity), …] by date}}.

    ``totals``, if given, is filled from the same scan with {series key: [runs, latest
    night]} counting every run (the level reads reliable ones only)."""
    with store.engine.connect() as c:
        all_sweeps = c.execute(select(Sweep.id, Sweep.created_at)).all()
    nights = {sid: _night(at) for sid, at in all_sweeps
              if start <= _aware(at) < end}
    if not nights:
        return {}
    reliable = Run.unreliable.is_(False) & Run.decode_tok_s_median.is_not(None)
    keys = (Run.sweep_id, *series_columns(), Run.mode, Run.num_draft_tokens, Run.config_key)
    # grouped per sweep, not per night: no join and no date arithmetic in the scan (the
    # database reads the table once, in order); the nights are merged below
    q = (select(*keys, func.sum(case((reliable, Run.decode_tok_s_median))),
                func.count(case((reliable, 1))), func.count(),
                *(func.max(case((reliable, getattr(Run, k)))) for k in LEVEL_IDENTITY))
         .group_by(*keys))
    if len(nights) < len(all_sweeps):  # a window: only its sweeps' runs (by index)
        q = q.where(Run.sweep_id.in_(select(Sweep.id).where(Sweep.created_at >= start,
                                                            Sweep.created_at < end)))
    acc: dict[tuple, dict[date, list]] = defaultdict(dict)
    with store.engine.connect() as c:
        for row in c.execute(q):
            sid, chip, p, workload, bucket, engine, mode, k, ck, total, n_ok, n, *ident = row
            d = nights.get(sid)
            if d is None:
                continue
            key = (chip, p, workload, bucket, engine)
            if totals is not None:
                t = totals.setdefault(key, [0, d])
                t[0] += n
                t[1] = max(t[1], d)
            if not n_ok:
                continue  # no reliable run that night: no level
            slot = acc[(key, ConfigId(mode, k, ck))].setdefault(d, [0.0, 0, {}])
            slot[0] += total
            slot[1] += n_ok
            for name, v in zip(LEVEL_IDENTITY, ident):  # the highest, as the night's identity
                if v is not None and (slot[2].get(name) is None or v > slot[2][name]):
                    slot[2][name] = v
    out: dict[tuple, dict[ConfigId, Nights]] = defaultdict(dict)
    for (key, cid), per_night in acc.items():
        out[key][cid] = [(d, total / n, {name: ident.get(name) for name in LEVEL_IDENTITY})
                               for d, (total, n, ident) in sorted(per_night.items())]
    return out


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def _night(at: datetime) -> date:
    return _aware(at).astimezone(timezone.utc).date()
