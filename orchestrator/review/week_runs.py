"""The weekly review's runs: a window's config summaries as ``RunRow`` (its series, its
config as the ingest keyed it, its identity), the ISO week they fall in, and how two
identities differ. Read through ``store.weekly_rows``; judged in ``weekly`` and ``series``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

from agent.engines import DEFAULT_ENGINE

from ..errors import ConfigError
from ..store import Store
from ..store.db import result_pair
from ..store.weekly_rows import IDENTITY, WeekRun, week_runs
from .configs import ConfigId, canonical, knobs_of_key, sampling_key
from .week_sweeps import calibration_marks, lock_marks, series_key, target_role

__all__ = ["IDENTITY", "LABELS", "RunRow", "identity_changes", "identity_key",
           "iso_week_bounds", "load_runs", "sweep_runs", "vals"]


def iso_week_bounds(week: str | None, now: datetime | None = None) -> tuple[datetime, datetime,
                                                                             str]:
    """``2026-W48`` → [Monday 00:00, next Monday) in UTC, and the label."""
    now = now or datetime.now(timezone.utc)
    if week in (None, "this", "last"):
        # "this" / "last": README commands and schedules keep working as the weeks go by
        y, w, _ = (now - timedelta(days=7 if week == "last" else 0)).isocalendar()
        week = f"{y}-W{w:02d}"
    m = re.fullmatch(r"(\d{4})-W(\d{2})", week)
    try:
        if not m:
            raise ValueError
        first = date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1)
    except ValueError:
        raise ConfigError(f"--week: {week!r} is not an ISO week of a real year, like "
                          f"{now.isocalendar()[0]}-W{now.isocalendar()[1]:02d} (or this, "
                          "last)") from None
    start = datetime.combine(first, datetime.min.time(), tzinfo=timezone.utc)
    return start, start + timedelta(days=7), week


@dataclass
class RunRow:
    run_id: int
    sweep_id: str
    at: datetime
    node: str
    series: tuple
    mode: str
    k: int
    summary: dict
    identity: dict
    trigger: str | None
    unreliable: bool
    config: dict = field(default_factory=dict)   # every knob, as the agent ran it
    config_key: str = ""                          # the ingest's key (pair + every knob)
    calibration: dict | None = None  # its target's calibration record, as its lock stored it

    @property
    def cid(self) -> ConfigId:
        """The run's config: the ingest's key, the unit every reader groups by."""
        return ConfigId(self.mode, self.k, self.config_key or canonical(self.config))

    @property
    def whole(self) -> tuple:
        """What every run of one config shares (``configs.group_configs`` checks it)."""
        return (self.cid, (canonical(self.config), self.pair, self.series))

    @property
    def sampling(self) -> str:
        return sampling_key(self.config)

    @property
    def pair(self) -> str | None:
        """The lineup pair the run belongs to ("target+draft-2"); None for a one-pair plan."""
        return result_pair(self.summary)

    @property
    def quality_key(self) -> tuple:
        s = self.summary
        if self.mode == "baseline":  # a target's baseline answers once, whatever its partner
            s = {"models": {"target": s["models"].get("target")}} if s.get("models") else {}
        return (self.sweep_id, self.node, result_pair(s), self.k)

    @property
    def shaky(self) -> bool:
        """The store flagged this run unreliable (a throttled, battery-powered, low-power,
        swapping or contended machine, or repetitions that spread too far): it is shown and
        counted, never averaged into a number the review draws a conclusion from."""
        return self.unreliable


def load_runs(store: Store, start: datetime, end: datetime,
              values: bool = True) -> list[RunRow]:
    """Runs of sweeps in [start, end). ``values=False`` skips the per-repetition JSON and
    keeps each run's medians: enough for trends and per-night comparisons, and far cheaper
    over weeks of history."""
    marks = calibration_marks(store, start, end)
    return [_run_row(r, marks.get((r.sweep_id, target_role(r.pair))))
            for r in week_runs(store, start, end, values)]


def sweep_runs(store: Store, sweep_id: str, lock: dict | None) -> list[RunRow]:
    """The runs of one sweep, read by its id; ``lock``: its plan's lock, already read (its
    calibration targets' runs are series of their own)."""
    marks = lock_marks(sweep_id, lock)
    return [_run_row(r, marks.get((r.sweep_id, target_role(r.pair))))
            for r in week_runs(store, None, None, sweep_id=sweep_id)]


def _run_row(r: WeekRun, calibration: dict | None = None) -> RunRow:
    pair = r.model_pair or f"{(r.identity['target_fingerprint'] or '?')[7:19]}/" \
                           f"{(r.identity['draft_fingerprint'] or '?')[7:19]}"
    # a runtime is part of the series: MLX and llama.cpp side by side, never pooled
    # a busy node (a background profile) is a series of its own, beside the idle one
    # a calibration target's runs are a series of their own, whatever the pair is named
    series = series_key((r.chip or r.node, pair, r.workload, r.context_bucket or "short",
                         (r.engine or DEFAULT_ENGINE) + (f" · {r.background}" if r.background
                                                         else "")), calibration)
    summary = r.summary if r.summary is not None else {"values": {
        "decode_tok_s": [r.decode_tok_s_median], "acceptance_rate": [r.acceptance_median]}}
    return RunRow(r.run_id, r.sweep_id, r.at, r.node, series, r.mode, r.num_draft_tokens,
                  summary, dict(r.identity), r.trigger, r.unreliable,
                  knobs_of_key(r.config_key) or {}, r.config_key, calibration)


def vals(runs: list[RunRow], metric: str) -> list[float]:
    return [v for r in runs for v in (r.summary.get("values") or {}).get(metric) or []
            if v is not None]


def identity_key(ident: dict) -> tuple:
    return tuple(ident.get(k) for k in IDENTITY)


LABELS = {"env_id": "env id", "mlx_version": "mlx", "mlx_lm_version": "mlx-lm",
          "os_build": "OS build", "node": "node", "prompt_sha256": "prompts",
          "target_fingerprint": "target weights", "draft_fingerprint": "draft weights",
          "target_quant": "target tier", "draft_quant": "draft tier",
          "chip": "chip", "power_source": "power source"}


def identity_changes(a: dict, b: dict, keys: tuple[str, ...] = IDENTITY) -> list[str]:
    return [f"{LABELS[k]} {a.get(k) or '?'} → {b.get(k) or '?'}" for k in keys
            if a.get(k) != b.get(k)]
