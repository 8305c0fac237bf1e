"""One config's week in numbers (``ConfigStats``) and the gates it is judged by: each
speculative config against the baseline of its own sampling settings, that night, on that
node; a value exactly at its limit passes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from agent.stats import median, percentile

from .busy import contention_readings
from .configs import config_label, knob_suffix
from .week_runs import RunRow, vals


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
    spread_nights: int = 0              # nights with a run set aside for its spread alone
    spread_paired: int = 0              # of those, nights beside a speculative run
    paired_nights: int = 0              # a baseline's nights beside a speculative run
    contention: list = field(default_factory=list)  # its unreliable runs' readings (page)
    # set aside for its decode-rate spread alone, judged anyway (``through_noise``): the
    # spreads, runs and nights behind it and the outcome of its gates
    through_noise: dict | None = None


def tpots(runs: list[RunRow]) -> list[float]:
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
    dec = vals(runs, "decode_tok_s")
    speedups = []
    for r in runs:
        b = base_by_sweep.get((r.sweep_id, r.node, r.sampling))
        m = median((r.summary.get("values") or {}).get("decode_tok_s") or [])
        if b and m:
            speedups.append(m / b["decode"])
    ttft = vals(runs, "ttft_ms")
    base_ttft = [b["ttft"] for r in runs
                 if (b := base_by_sweep.get((r.sweep_id, r.node, r.sampling))) and b["ttft"]]
    swap = vals(runs, "swap_used_after_bytes")
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
        acceptance_p50=median(vals(runs, "acceptance_rate")),
        speedup=median(speedups) if first.mode == "speculative" else 1.0,
        ttft_p50=median(ttft),
        ttft_change=(statistics.median(ttft) / statistics.median(base_ttft) - 1)
        if ttft and base_ttft else None,
        itl_p95=median(vals(runs, "itl_p95_ms")), itl_p99=median(vals(runs, "itl_p99_ms")),
        peak_memory=median(vals(runs, "peak_mlx_memory_bytes")),
        kv_cache=median(vals(runs, "kv_cache_bytes")),
        swap_peak=max(swap) if swap else None, swap_in_nights=swap_in_nights,
        exact=None if any(e is None for e in exact_flags) else all(exact_flags),
        unreliable=sum(1 for r in runs if r.shaky), unreliable_reasons=reasons,
        task_pass_rate=median(rates) if rates else None, trials=len(dec),
        config_id=first.cid.key, label=config_label(first.mode, first.k, first.config),
        knobs=first.config, sampling=first.sampling, knob_text=knob_suffix(first.config),
        tpot_p50=median(tpots(runs)), contention=contention_readings(runs),
        reliable_nights=len({r.at.date() for r in runs if not r.shaky}))


# Gates compare measured medians with declared limits: a value exactly at its limit passes
# (54 ms against a 50 ms baseline is +8% and meets "≤ +8%", though 54/50 − 1 is
# 0.08000000000000007 in floating point).
_EPS = 1e-9


def at_most(value: float, limit: float) -> bool:
    return value <= limit + _EPS * max(1.0, abs(limit))


def at_least(value: float, floor: float) -> bool:
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
         at_least(c.speedup, gates["min_speedup"]))
    gate("itl_p95_ms", c.itl_p95, c.itl_p95 is not None and
         at_most(c.itl_p95, gates["itl_p95_ceiling_ms"]))
    gate("acceptance", c.acceptance_p50, c.acceptance_p50 is not None and
         at_least(c.acceptance_p50, gates["acceptance_floor"]))
    if bucket == "short":
        gate("ttft_change", c.ttft_change, c.ttft_change is not None and
             at_most(c.ttft_change, gates["ttft_regression_limit"]))
    gate("swap_peak_bytes", c.swap_peak if c.swap_peak is not None else 0,
         at_most(c.swap_peak or 0, gates["swap_ceiling_bytes"]))
    gate("exact", c.exact, c.exact is True)
    if c.parity_mismatches:
        gate("streaming_parity", c.parity_mismatches, False)
    if c.task_pass_rate is not None and base.task_pass_rate is not None:
        d = c.task_pass_rate - base.task_pass_rate
        gate("task_pass_rate", d, at_most(abs(d), gates["task_pass_tolerance"]))
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
