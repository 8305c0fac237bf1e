"""Deciding through the noise: a config the agent set aside for its decode-rate spread
alone (a noisy host, nothing wrong with the machine's state) is still judged where the
answer does not hang on that noise.

- A gate whose reading does not depend on timing (acceptance, exact output, task pass
  rate, swap) is judged as for any config: failing it fails whatever the noise.
- A timing gate (speedup, TTFT change, ITL p95) is judged on a 95% interval, never the
  point: it passes when the whole interval clears the limit, fails when none of it does,
  and is otherwise undecided (``passed`` None, ``undecided`` True).

Both pages (the weekly review and the sweep page) judge through this module, and a
decision reached so is marked wherever it is shown (``through_noise``)."""

from __future__ import annotations

import math
import re
import statistics

from .compare import night_ratio

LEVEL = 0.95
TIMING_GATES = ("speedup", "ttft_change", "itl_p95_ms")
_SPREAD = "decode tok/s spread "  # agent.summary.config_summary's words for the spread
_SPREAD_WORDS = re.compile(r"^decode tok/s spread (\d+)% ≥ (\d+)%")


def spread_of_reason(reason: str) -> dict | None:
    """{value, limit} from the agent's words for a spread (None: another reason)."""
    m = _SPREAD_WORDS.match(reason)
    return {"value": int(m.group(1)) / 100, "limit": int(m.group(2)) / 100} if m else None


def spread_alone(summary: dict | None) -> dict | None:
    """The spread ({value, limit}) that set a config's run aside when it is the run's only
    reason (None: another reason too, or a run stored before events 1.9)."""
    s = summary or {}
    reasons = s.get("unreliable_reasons") or []
    if len(reasons) == 1 and reasons[0].startswith(_SPREAD) and s.get("spread"):
        return s["spread"]
    return None


def _positive(xs) -> list[float]:
    return [float(x) for x in xs if x is not None and 0 < x < math.inf]


def ratio_interval(base: list[float], spec: list[float], level: float = LEVEL
                   ) -> tuple[float, float, float] | None:
    """spec/base as (ratio of geometric means, low, high): Welch's t on the logs of the
    trials; a side with one trial borrows the other side's spread (``night_ratio``)."""
    r = night_ratio(_positive(base), _positive(spec), level, memory=False)
    if r["ci"] is None:
        return None
    return r["ratio"], r["ci"][0], r["ci"][1]


def level_interval(values: list[float], level: float = LEVEL
                   ) -> tuple[float, float, float] | None:
    """The geometric mean of ``values`` and its interval (Student's t on the logs)."""
    from scipy import stats

    logs = [math.log(x) for x in _positive(values)]
    if len(logs) < 2:
        return None
    m, se = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    q = float(stats.t.ppf(0.5 + level / 2, len(logs) - 1))
    return math.exp(m), math.exp(m - q * se), math.exp(m + q * se)


def decisive(low: float, high: float, limit: float, higher_is_better: bool) -> bool | None:
    """True when the whole interval clears the limit, False when none of it does, None
    (undecided) when the limit lies inside it."""
    good, bad = (low >= limit, high < limit) if higher_is_better else (high <= limit,
                                                                       low > limit)
    return True if good else False if bad else None


def interval_gate(iv: tuple[float, float, float] | None, limit: float,
                  higher_is_better: bool, offset: float = 0.0) -> dict:
    """A timing gate judged on an interval (``offset`` moves a ratio to a change: −1)."""
    if iv is None:
        return {"value": None, "passed": None, "undecided": True}
    point, lo, hi = (x + offset for x in iv)
    ok = decisive(lo, hi, limit, higher_is_better)
    return {"value": point, "passed": ok, "interval": [lo, hi],
            **({"undecided": True} if ok is None else {})}


def timing_gates(base: dict[str, list[float]], spec: dict[str, list[float]], bucket: str,
                 gates: dict) -> dict:
    """The speedup, TTFT and ITL gates on intervals, from each side's trials
    ({decode_tok_s, ttft_ms, itl_p95_ms: [per trial]})."""
    g = {"speedup": interval_gate(ratio_interval(base["decode_tok_s"], spec["decode_tok_s"]),
                                  gates["min_speedup"], True),
         "itl_p95_ms": interval_gate(level_interval(spec["itl_p95_ms"]),
                                     gates["itl_p95_ceiling_ms"], False)}
    if bucket == "short":
        g["ttft_change"] = interval_gate(ratio_interval(base["ttft_ms"], spec["ttft_ms"]),
                                         gates["ttft_regression_limit"], False, -1.0)
    return g


def outcome(gates: dict) -> str:
    """"fail" when any gate fails (decisively, for a timing gate), "pass" when every gate
    passes and none is undecided, else "undecided"."""
    if any(v.get("passed") is False for v in gates.values()):
        return "fail"
    return "undecided" if any(v.get("undecided") for v in gates.values()) else "pass"


def spread_text(spreads: list[dict]) -> str:
    """'decode tok/s varied 36% (the plan allows under 10%)' over a config's spreads."""
    vs = sorted(round(100 * s["value"]) for s in spreads)
    limits = sorted({round(100 * s["limit"]) for s in spreads})
    varied = f"{vs[0]}%" if vs[0] == vs[-1] else f"{vs[0]}–{vs[-1]}%"
    return (f"decode tok/s varied {varied} (the plan allows under "
            f"{'/'.join(f'{x}%' for x in limits)})")
