"""The weekly review's analysis: series, gates, signals → actions, regressions, staleness.

A series is node class (chip) × model pair (target, draft fingerprints) × workload ×
context bucket. Within a week, numbers come only from the series' current identity
(env id, mlx / mlx-lm versions, OS build, node, prompt hash): results with different
identities are never pooled, and when the identity changed since an earlier period the
review names the parts that changed.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone

from sqlalchemy import select

from agent.engines import DEFAULT_ENGINE
from agent.events import Generation, Quality
from agent.stats import cv, median, percentile

from ..errors import ConfigError
from ..store import Store, queries
from ..store.db import result_pair
from ..store.models import NodeOutcome, Plan, Run, Sweep
from .busy import busy_vs_idle, contention_readings
from .changepoints import change_points
from .configs import (
    ConfigId,
    canonical,
    config_label,
    group_configs,
    knob_suffix,
    knobs_of_key,
    sampling_key,
)
from .ladder import annotate, ladders
from .levels import nightly_levels
from .load import load_ramps, load_signals
from .ranktest import mann_whitney
from .rules import Rule, fire
from .runtimes import agent_notices, side_by_side
from .verdict import DECISIONS, decide

IDENTITY = ("env_id", "mlx_version", "mlx_lm_version", "os_build", "node", "prompt_sha256",
            "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant")
DEFAULT_GATES = {"min_speedup": 1.16, "itl_p95_ceiling_ms": 50.0, "acceptance_floor": 0.55,
                 "ttft_regression_limit": 0.08, "swap_ceiling_bytes": 1.5e9,
                 "task_pass_tolerance": 0.005, "failed_acceptance": 0.40,
                 "failed_window_s": 300}
REGRESSION_FACTOR = 1.1   # asv's default
REGRESSION_P = 0.002
MIN_REPS = 7               # below this, p < 0.002 is out of reach: "unconfirmed"
STALE_DAYS = 14


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
    cols = [Run.id, Run.sweep_id, Run.node, Run.chip, Run.model_pair, Run.target_fingerprint,
            Run.draft_fingerprint, Run.workload, Run.context_bucket, Run.mode,
            Run.num_draft_tokens, Run.engine, Run.background, Run.config_key,
            Run.summary if values else Run.decode_tok_s_median,
            Run.acceptance_median, Run.unreliable,
            *(getattr(Run, k) for k in IDENTITY if k not in ("node", "target_fingerprint",
                                                             "draft_fingerprint"))]
    with store.engine.connect() as c:  # only the columns the review reads (not config)
        rows = c.execute(
            select(*cols, Sweep.created_at, Sweep.trigger).join(Sweep, Sweep.id == Run.sweep_id)
            .where(Sweep.created_at >= start, Sweep.created_at < end)).all()
    out = []
    for r in rows:
        created = r.created_at if r.created_at.tzinfo else r.created_at.replace(
            tzinfo=timezone.utc)
        pair = r.model_pair or f"{(r.target_fingerprint or '?')[7:19]}/" \
                               f"{(r.draft_fingerprint or '?')[7:19]}"
        # a runtime is part of the series: MLX and llama.cpp side by side, never pooled
        # a busy node (a background profile) is a series of its own, beside the idle one
        series = (r.chip or r.node, pair, r.workload, r.context_bucket or "short",
                  (r.engine or DEFAULT_ENGINE) + (f" · {r.background}" if r.background else ""))
        ident = {k: getattr(r, k) for k in IDENTITY}
        summary = (r.summary or {}) if values else {"values": {
            "decode_tok_s": [r.decode_tok_s_median], "acceptance_rate": [r.acceptance_median]}}
        out.append(RunRow(r.id, r.sweep_id, created, r.node, series, r.mode,
                          r.num_draft_tokens, summary, ident, r.trigger, r.unreliable,
                          knobs_of_key(r.config_key) or {}, r.config_key))
    return out


def _vals(runs: list[RunRow], metric: str) -> list[float]:
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


@dataclass
class ConfigStats:
    mode: str
    k: int
    runs: int
    nights: int
    decode_p50: float | None
    decode_p95: float | None
    acceptance_p50: float | None
    speedup: float | None
    ttft_p50: float | None
    ttft_change: float | None
    itl_p95: float | None
    itl_p99: float | None
    peak_memory: float | None
    swap_peak: float | None
    kv_cache: float | None  # bytes the KV caches held (kv_bits, max_kv_size …)
    swap_in_nights: int
    exact: bool | None
    unreliable: int
    unreliable_reasons: list[str]
    task_pass_rate: float | None = None
    parity_mismatches: int = 0          # http runtimes: streamed text ≠ non-streamed text
    parity_first_difference: int | None = None
    parity_tool_mismatches: int = 0     # of those, tool calls that differ
    gates: dict = field(default_factory=dict)
    classification: str = ""
    set_aside: bool = False             # every run unreliable: shown, never concluded from
    trials: int = 0                     # generations behind the runs (the sweep page's unit)
    config_id: str = ""                 # the ingest's config key (every knob)
    label: str = ""                     # configs.config_label: how every page names it
    knobs: dict = field(default_factory=dict)
    sampling: str = ""                  # the sampling settings it shares with its baseline
    knob_text: str = ""                 # " · temperature 0.7": settings away from defaults
    tpot_p50: float | None = None       # ms: median over requests of (E2E − TTFT)/(tokens − 1)
    reliable_nights: int = 0            # nights with a reliable run: the unit of evidence
    contention: list = field(default_factory=list)  # its unreliable runs' readings (page)


def _tpots(runs: list[RunRow]) -> list[float]:
    """Each request's time per output token in ms, (E2E − TTFT) / (tokens − 1), where its
    run kept E2E (journals from before the agent reported it have none: left out)."""
    out = []
    for r in runs:
        v = r.summary.get("values") or {}
        for e2e, ttft, n in zip(v.get("e2e_ms") or [], v.get("ttft_ms") or [],
                                v.get("generated_tokens") or []):
            if e2e is not None and ttft is not None and n is not None and n >= 2:
                out.append((e2e - ttft) / (n - 1))
    return out


def config_stats(runs: list[RunRow], base_by_sweep: dict, quality: dict) -> ConfigStats:
    """``base_by_sweep``: {(sweep, node, sampling key): the baseline's medians}: each run is
    compared with the baseline of its own sampling settings, that night, on that node."""
    first = runs[0]
    dec = _vals(runs, "decode_tok_s")
    speedups = []
    for r in runs:
        b = base_by_sweep.get((r.sweep_id, r.node, r.sampling))
        m = median((r.summary.get("values") or {}).get("decode_tok_s") or [])
        if b and m:
            speedups.append(m / b["decode"])
    ttft = _vals(runs, "ttft_ms")
    base_ttft = [b["ttft"] for r in runs
                 if (b := base_by_sweep.get((r.sweep_id, r.node, r.sampling))) and b["ttft"]]
    swap = _vals(runs, "swap_used_after_bytes")
    swap_in_nights = len({r.at.date() for r in runs
                          if any((r.summary.get("values") or {}).get("swap_in_bytes") or [])})
    exact_flags = [r.summary.get("exact") for r in runs]
    reasons = sorted({x for r in runs for x in r.summary.get("unreliable_reasons") or []})
    rates = [quality[r.quality_key] for r in runs if r.quality_key in quality]
    parity = [r.summary["parity"] for r in runs if r.summary.get("parity")]
    offsets = [p["first_difference"] for p in parity if p.get("first_difference") is not None]
    return ConfigStats(
        parity_mismatches=sum(p["mismatches"] for p in parity),
        parity_first_difference=min(offsets) if offsets else None,
        parity_tool_mismatches=sum(p.get("tool_mismatches", 0) for p in parity),
        mode=first.mode, k=first.k, runs=len(runs), nights=len({r.at.date() for r in runs}),
        decode_p50=median(dec), decode_p95=percentile(dec, 95),
        acceptance_p50=median(_vals(runs, "acceptance_rate")),
        speedup=median(speedups) if first.mode == "speculative" else 1.0,
        ttft_p50=median(ttft),
        ttft_change=(statistics.median(ttft) / statistics.median(base_ttft) - 1)
        if ttft and base_ttft else None,
        itl_p95=median(_vals(runs, "itl_p95_ms")), itl_p99=median(_vals(runs, "itl_p99_ms")),
        peak_memory=median(_vals(runs, "peak_mlx_memory_bytes")),
        kv_cache=median(_vals(runs, "kv_cache_bytes")),
        swap_peak=max(swap) if swap else None, swap_in_nights=swap_in_nights,
        exact=None if any(e is None for e in exact_flags) else all(exact_flags),
        unreliable=sum(1 for r in runs if r.shaky), unreliable_reasons=reasons,
        task_pass_rate=median(rates) if rates else None, trials=len(dec),
        config_id=first.cid.key, label=config_label(first.mode, first.k, first.config),
        knobs=first.config, sampling=first.sampling, knob_text=knob_suffix(first.config),
        tpot_p50=median(_tpots(runs)), contention=contention_readings(runs),
        reliable_nights=len({r.at.date() for r in runs if not r.shaky}))


# Gates compare measured medians with declared limits: a value exactly at its limit passes
# (54 ms against a 50 ms baseline is +8% and meets "≤ +8%", though 54/50 − 1 is
# 0.08000000000000007 in floating point).
_EPS = 1e-9


def _at_most(value: float, limit: float) -> bool:
    return value <= limit + _EPS * max(1.0, abs(limit))


def _at_least(value: float, floor: float) -> bool:
    return value >= floor - _EPS * max(1.0, abs(floor))


def evaluate_gates(c: ConfigStats, base: ConfigStats, bucket: str, gates: dict,
                   failed_windows: bool) -> dict:
    """Each gate: passed / failed / n/a, with the number it was judged on.

    The acceptance floor (stated "at draft width 4") is applied to each speculative
    config's own median acceptance: the width-4 config is judged as written, and a series
    without width 4 is not judged by another width's number (acceptance per drafted token
    falls as the draft widens, so narrower widths clear it more easily, wider ones less).
    """
    g = {}

    def gate(name, value, ok):
        g[name] = {"value": value, "passed": None if value is None else bool(ok)}

    gate("speedup", c.speedup, c.speedup is not None and
         _at_least(c.speedup, gates["min_speedup"]))
    gate("itl_p95_ms", c.itl_p95, c.itl_p95 is not None and
         _at_most(c.itl_p95, gates["itl_p95_ceiling_ms"]))
    gate("acceptance", c.acceptance_p50, c.acceptance_p50 is not None and
         _at_least(c.acceptance_p50, gates["acceptance_floor"]))
    if bucket == "short":
        gate("ttft_change", c.ttft_change, c.ttft_change is not None and
             _at_most(c.ttft_change, gates["ttft_regression_limit"]))
    gate("swap_peak_bytes", c.swap_peak if c.swap_peak is not None else 0,
         _at_most(c.swap_peak or 0, gates["swap_ceiling_bytes"]))
    gate("exact", c.exact, c.exact is True)
    if c.parity_mismatches:
        gate("streaming_parity", c.parity_mismatches, False)
    if c.task_pass_rate is not None and base.task_pass_rate is not None:
        d = c.task_pass_rate - base.task_pass_rate
        gate("task_pass_rate", d, _at_most(abs(d), gates["task_pass_tolerance"]))
    else:
        g["task_pass_rate"] = {"value": None, "passed": None}
    g["not_failed"] = {"value": not failed_windows, "passed": not failed_windows}
    return g


def classify(c: ConfigStats) -> str:
    if c.gates.get("not_failed", {}).get("passed") is False:
        return ("failed (acceptance below the floor for more than two five-minute windows "
                "of generation time)")
    missed = [n for n, v in c.gates.items() if v["passed"] is False]
    if not missed:
        return "production candidate"
    if len(missed) == 1:
        return f"just misses: {missed[0]}"
    return "not a candidate: misses " + ", ".join(missed)


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


def _per_run(runs: list[RunRow], metric: str) -> list[float]:
    """One value a night on a node: the median of that night's run medians (several sweeps
    of one night share its state: one sample, not several)."""
    nights: dict[tuple, list[float]] = defaultdict(list)
    for r in runs:
        m = median([v for v in (r.summary.get("values") or {}).get(metric) or []
                    if v is not None])
        if m is not None:
            nights[(r.node, r.at.date())].append(m)
    return [m for ms in nights.values() if (m := median(ms)) is not None]


def regression(now: list[RunRow], then: list[RunRow], metric: str = "decode_tok_s",
               per_night: bool = False) -> dict:
    """``per_night``: compare one value a night (the median of its runs' medians) instead
    of repetitions."""
    pick = _per_run if per_night else _vals
    a, b = pick(then, metric), pick(now, metric)
    if not a or not b:
        return {"verdict": "no data", "ratio": None, "p": None, "n": [len(a), len(b)]}
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else None
    mw = mann_whitney(a, b)
    enough = len(a) >= MIN_REPS and len(b) >= MIN_REPS
    big = ratio is not None and (ratio < 1 / REGRESSION_FACTOR or ratio > REGRESSION_FACTOR)
    significant = mw["p"] is not None and mw["p"] < REGRESSION_P
    if big and significant and enough:
        verdict = "regression" if ratio is not None and ratio < 1 else "improvement"
    elif big or significant:
        verdict = "unconfirmed"
    else:
        verdict = "stable"
    return {"verdict": verdict, "ratio": ratio, "p": mw["p"], "n": [len(a), len(b)],
            "then": median(a), "now": median(b)}


def failed_sweeps(store: Store, start: datetime, end: datetime) -> list[dict]:
    """Sweeps of the week that did not finish ok (a nightly that did not start included),
    each with the nodes that were not ok and why."""
    with store.engine.connect() as c:
        rows = c.execute(
            select(Sweep.id, Sweep.created_at, Sweep.status, Sweep.trigger, Plan.name,
                   NodeOutcome.node, NodeOutcome.status, NodeOutcome.detail)
            .outerjoin(Plan, Plan.id == Sweep.plan_id)
            .outerjoin(NodeOutcome, (NodeOutcome.sweep_id == Sweep.id)
                       & (NodeOutcome.status != "ok"))
            .where(Sweep.created_at >= start, Sweep.created_at < end,
                   Sweep.status.in_(("failed", "partial")))
            .order_by(Sweep.created_at, NodeOutcome.node)).all()
    out: dict[str, dict] = {}
    for sid, at, status, trigger, plan, node, nstatus, detail in rows:
        f = out.setdefault(sid, {"sweep_id": sid, "at": at.isoformat(timespec="minutes"),
                                 "status": status, "trigger": trigger or "manual",
                                 "plan": plan, "nodes": []})
        if node is not None:
            f["nodes"].append({"node": node, "status": nstatus,
                               "reason": (detail or "")[:400]})
    return list(out.values())


def plan_gates(store: Store, sweep_ids: list[str]) -> dict[str, tuple[str | None, dict]]:
    """Each sweep's plan name and the gates its plan declared (``gates`` in the lock)."""
    out: dict[str, tuple[str | None, dict]] = {}
    with store.engine.connect() as c:
        for sid, name, lock in c.execute(
                select(Sweep.id, Plan.name, Plan.lock).join(Plan, Plan.id == Sweep.plan_id)
                .where(Sweep.id.in_(sweep_ids))):
            out[sid] = (name, dict((lock or {}).get("gates") or {}))
    return out


def calibration_targets(store: Store, sweep_ids: list[str]) -> dict[str, dict]:
    """Target fingerprints the week's locks mark as calibration targets (grown from a
    draft: `specfleet models calibrate`), with what their record says."""
    out: dict[str, dict] = {}
    with store.engine.connect() as c:
        for (lock,) in c.execute(select(Plan.lock).join(Sweep, Sweep.plan_id == Plan.id)
                                 .where(Sweep.id.in_(sweep_ids))):
            for m in ((lock or {}).get("models") or {}).values():
                if isinstance(m, dict) and isinstance(m.get("calibration"), dict):
                    cal = m["calibration"]
                    out[m["fingerprint"]] = {
                        "expected_acceptance": cal.get("expected_acceptance"),
                        "layers": (cal.get("construction") or {}).get("layers"),
                        "draft_fingerprint": cal.get("draft_fingerprint")}
    return out


def calibration_sweeps(store: Store, sweep_ids: list[str]) -> set[str]:
    """The week's sweeps whose lock swept a calibration target (their notices, e.g. the
    adaptive sweep's stops, are marked as the instrument's)."""
    with store.engine.connect() as c:
        return {sid for sid, lock in c.execute(
            select(Sweep.id, Plan.lock).join(Plan, Sweep.plan_id == Plan.id)
            .where(Sweep.id.in_(sweep_ids)))
            if any(isinstance(m, dict) and isinstance(m.get("calibration"), dict)
                   for m in ((lock or {}).get("models") or {}).values())}


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
    quality = quality_rates(store, sweep_ids)
    generations = speculative_generations(store, sweep_ids)
    failed = failed_window_configs(store, sweep_ids, gates["failed_acceptance"],
                                   gates["failed_window_s"], generations)
    declared = plan_gates(store, sweep_ids)
    calibrations = calibration_targets(store, sweep_ids)
    ramps = load_ramps(store, sweep_ids)
    facts = store.latest_facts()  # what each node is: why its numbers may not transfer
    levels = nightly_levels(store, start - timedelta(days=28), end) if change_points_too \
        else {}
    by_series: dict[tuple, list[RunRow]] = defaultdict(list)
    for r in history:
        by_series[r.series].append(r)
    out = []
    set_aside_runs = 0
    for key, runs in sorted(by_series.items(), key=lambda kv: kv[0]):
        current = [r for r in runs if r.at >= start]
        latest = max(runs, key=lambda r: r.at)
        stale = (end - latest.at).days > STALE_DAYS or not current
        ident = latest.identity
        cur = [r for r in current if identity_key(r.identity) == identity_key(ident)]
        mixed = len({identity_key(r.identity) for r in current}) > 1
        section: dict = {"series": {"chip": key[0], "model_pair": key[1], "workload": key[2],
                              "context_bucket": key[3], "engine": key[4]},
                   "identity": ident, "stale": stale, "mixed_identities": mixed,
                   "latest_run": latest.at.isoformat(), "configs": [], "signals": [],
                   "regressions": [], "change_points": [], "compared": 0,
                   # an instrument's series: marked, never in a policy unless asked
                   "calibration": calibrations.get(ident.get("target_fingerprint") or "")}
        # the gates the plan behind this series' latest run declared, over the defaults
        plan_name, own = declared.get(latest.sweep_id, (None, {}))
        series_gates = {**gates, **own}
        section["gates"] = series_gates
        section["gates_from"] = f"plan {plan_name}" if own else "defaults"
        if cur:
            _judge(section, key, runs, cur, start, ident, series_gates, quality, failed,
                   levels, ramps, latest, rules, regressions_too)
            set_aside_runs += sum(x["runs"] for x in section["set_aside"])
        section["verdict"] = decide(section, facts.get(latest.node))
        out.append(section)
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
    _positions(out, generations, run_of)
    cal_sweeps = calibration_sweeps(store, sweep_ids)
    return {"week": label, "start": start.isoformat(), "end": end.isoformat(), "gates": gates,
            "series": out, "side_by_side": side_by_side(out), "sweeps": sweep_ids,
            "ladders": found, "busy_vs_idle": busy,
            "loads": ramps,
            "notices": [{**n, "calibration": n["sweep_id"] in cal_sweeps}
                        for n in agent_notices(store, sweep_ids)],
            "failures": (failures := failed_sweeps(store, start, end)),
            "counts": {"failed_sweeps": len(failures), "series": len(out),
                       "runs_this_week": len(this_week), "set_aside_runs": set_aside_runs,
                       "stale": sum(1 for s in out if s["stale"]),
                       # comparisons with reliable runs on both sides ("nothing regressed"
                       # is said only when there was something to compare)
                       "compared": sum(s["compared"] for s in out),
                       "verdicts": {d: sum(1 for s in out if s["verdict"]["decision"] == d)
                                    for d in DECISIONS}}}


def _judge(section: dict, key: tuple, runs: list[RunRow], cur: list[RunRow], start: datetime,
           ident: dict, series_gates: dict, quality: dict, failed: set, levels: dict,
           ramps: list, latest: RunRow, rules: list[Rule], regressions_too: bool) -> None:
    """A series' configs this week (one per ingest config key), gates, metrics, signals,
    regressions and change points, into ``section``."""
    base_by_sweep = {}
    for r in cur:
        if r.mode == "baseline" and not r.shaky:
            v = r.summary.get("values") or {}
            d, t = median(v.get("decode_tok_s") or []), median(v.get("ttft_ms") or [])
            if d:
                base_by_sweep[(r.sweep_id, r.node, r.sampling)] = {"decode": d, "ttft": t}
    # an unreliable trial is reported, never averaged in
    configs = group_configs((r for r in cur if not r.shaky), RunRow.whole.fget)  # type: ignore
    shaky = group_configs((r for r in cur if r.shaky), RunRow.whole.fget)  # type: ignore
    for ck in shaky:
        configs.setdefault(ck, [])
    stats: dict[ConfigId, ConfigStats] = {}
    for ck, rs in configs.items():
        st = config_stats(rs or shaky[ck], base_by_sweep, quality)
        aside = shaky.get(ck, [])
        if rs:
            st.unreliable = len(aside)
            st.unreliable_reasons = sorted({x for r in aside for x in
                                            r.summary.get("unreliable_reasons") or []})
            st.contention = contention_readings(aside)
            st.runs = len(rs) + len(aside)
            st.trials += len(_vals(aside, "decode_tok_s"))
        else:  # nothing reliable to conclude from: its numbers are shown only
            st.set_aside, st.speedup = True, None
            st.classification = "set aside: every run unreliable"
        stats[ck] = st
    section["set_aside"] = [
        {"config": stats[ck].label, "runs": len(rs), "of": len(rs) + len(configs[ck]),
         "reasons": sorted({x for r in rs for x in
                            r.summary.get("unreliable_reasons") or ["unknown"]}),
         **({"contention": cr} if (cr := contention_readings(rs)) else {})}
        for ck, rs in sorted(shaky.items(), key=lambda kv: kv[0].order()) if rs]
    # each speculative config against the baseline of its own sampling settings
    bases = {c.sampling: c for c in stats.values() if c.mode == "baseline" and not c.set_aside}
    for ck, c in sorted(stats.items(), key=lambda kv: kv[0].order()):
        base = bases.get(c.sampling)
        if c.mode == "speculative" and base is not None and not c.set_aside:
            fw = any((r.sweep_id, r.node, key[2], r.pair, canonical(r.config)) in failed
                     for r in configs[ck])
            c.gates = evaluate_gates(c, base, key[3], series_gates, fw)
            c.classification = classify(c)
        section["configs"].append(c.__dict__)
    spec = [c for c in stats.values() if c.mode == "speculative" and c.speedup
            and not c.set_aside]
    best = max(spec, key=lambda c: c.speedup or 0.0) if spec else None
    best_id = next((ck for ck, c in stats.items() if c is best), None)
    base = bases.get(best.sampling) if best else next(iter(bases.values()), None)
    family = [c for c in spec if best and c.sampling == best.sampling]  # best's settings
    acc4 = next((c for c in family if c.k == 4), None)
    base_id = next((ck for ck, c in stats.items() if c is base), None)
    metrics = {
        "best_k": best.k if best else None,
        "best_config": best.config_id if best else None,
        "best_label": best.label if best else None,
        "best_speedup": best.speedup if best else None,
        "best_acceptance": best.acceptance_p50 if best else None,
        "acceptance_at_4": acc4.acceptance_p50 if acc4 else None,
        "widest_k": max((c.k for c in family), default=None),
        # the swap rule reads reliable configs only: a set-aside config's swap is shown
        # beside it, never a rule's evidence
        "swap_peak_bytes": max((c.swap_peak or 0 for c in stats.values() if not c.set_aside),
                               default=0),
        "swap_in_nights": max((c.swap_in_nights for c in stats.values() if not c.set_aside),
                              default=0),
        "mem_increase": (best.peak_memory / base.peak_memory - 1)
        if best and base and best.peak_memory and base.peak_memory else None,
        "mem_added_bytes": (best.peak_memory - base.peak_memory)
        if best and base and best.peak_memory and base.peak_memory else None,
        "decode_share": _decode_share(configs[base_id] if base_id else []),
        "itl_spike": (best.itl_p99 / max(base.itl_p95 or 1e-9, 1e-9))
        if best and base and best.itl_p99 else None,
        "acceptance_cv": cv(_vals(configs[best_id], "acceptance_rate")) if best_id else None,
        "candidates": sum(1 for c in stats.values()
                          if c.classification == "production candidate"),
    }
    metrics.update(load_signals(ramps, {r.sweep_id for r in cur}, latest.node, key[2]))
    section["metrics"] = metrics
    section["signals"] = fire(rules, metrics)
    for ck in sorted(configs, key=ConfigId.order) if regressions_too else ():
        earlier = [r for r in runs if r.cid == ck and r.at < start and not r.shaky]
        recent = [r for r in earlier if r.at >= start - timedelta(days=7)]
        for period, then in (("week over week", recent), ("vs last 4 weeks", earlier)):
            reg = regression(configs[ck], then, per_night=True)  # the night is the unit
            section["compared"] += reg["verdict"] != "no data"
            if reg["verdict"] in ("regression", "improvement", "unconfirmed"):
                prev = max(then, key=lambda r: r.at).identity if then else {}
                reg.update(config=stats[ck].label, period=period,
                           cause=identity_changes(prev, ident) if then else [])
                section["regressions"].append(reg)
    section["change_points"] = [
        {"config": stats[ck].label, "metric": "decode_tok_s", **cp}
        for ck in sorted(configs, key=ConfigId.order)
        for cp in change_points(levels.get(key, {}).get(ck, []), identity_changes)]
    section["trend"] = _trend(runs, best_id)
    section["speedup_by_k"] = {c.k: c.speedup for c in family}
    section["itl_p95_values"] = {
        "baseline": _vals(configs[base_id], "itl_p95_ms") if base_id else [],
        "best": _vals(configs[best_id], "itl_p95_ms") if best_id else []}


def _decode_share(base_runs: list[RunRow]) -> float | None:
    """Share of a request's time spent decoding (the rest is TTFT), from the baseline."""
    shares = []
    for r in base_runs:
        v = r.summary.get("values") or {}
        for ttft, rate, n in zip(v.get("ttft_ms") or [], v.get("decode_tok_s") or [],
                                 v.get("generated_tokens") or []):
            if ttft is not None and rate and n:
                decode_s = n / rate
                shares.append(decode_s / (decode_s + ttft / 1000))
    return median(shares)


def _trend(runs: list[RunRow], best: ConfigId | None) -> list[dict]:
    """Per night over the whole window: acceptance and decode tok/s of the series' best
    config (reliable runs only: a set-aside night is no point on the chart)."""
    nights: dict[date, list[RunRow]] = defaultdict(list)
    for r in runs:
        if r.cid == best and not r.shaky:
            nights[r.at.date()].append(r)
    return [{"date": d.isoformat(), "acceptance": median(_vals(rs, "acceptance_rate")),
             "decode_tok_s": median(_vals(rs, "decode_tok_s"))} for d, rs in sorted(nights.items())]


def _positions(sections: list[dict], rows: list[GenRow], run_of: dict[tuple, RunRow],
               top: int = 6) -> None:
    """Acceptance by draft position for the best config of each series (the busiest
    ``top`` series this week): drafted and accepted tokens are summed per series and
    config, so chips, model pairs, runtimes, context buckets and sampling settings never
    share one curve, and a set-aside run's generations are no part of it."""
    want = [s for s in sections if s.get("metrics", {}).get("best_k")][:top]

    def key(s: dict) -> tuple:
        d = s["series"]
        return (d["chip"], d["model_pair"], d["workload"], d["context_bucket"], d["engine"]), \
            s["metrics"]["best_config"]

    totals = {key(s): ([0] * s["metrics"]["best_k"], [0] * s["metrics"]["best_k"])
              for s in want}
    for sid, node, _, p in rows:  # one pass over the events, not one per section
        r = run_of.get((sid, node, p.workload, p.get("context_bucket") or "short",
                        result_pair(p), canonical(p.config)))
        t = totals.get((r.series, r.cid.key)) if r is not None and not r.shaky else None
        if t is None:
            continue
        for pos in p.acceptance_by_position or []:
            i = pos["position"] - 1
            if i < len(t[0]):
                t[0][i] += pos["drafted"]
                t[1][i] += pos["accepted"]
    for s in want:
        drafted, accepted = totals[key(s)]
        s["acceptance_by_position"] = [a / d if d else None for a, d in zip(accepted, drafted)]
