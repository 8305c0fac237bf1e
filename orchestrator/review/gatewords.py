"""A number beside the line it was judged against, as text that reads the way it was
judged: a speedup of 1.156 that missed the 1.16 gate reads "1.156×", never "1.16×" (the
gate's own number, which passes); a gate missed reads as the comparison it made
("speedup 1.1599 < 1.16"). Every page that prints a speedup (the verdict's evidence, the
review's Markdown and HTML, the ladder, the runtimes table, the sweep page) prints it
through ``ratio_text``, so a value within rounding of its gate shows the digits that tell
the two apart, and only there."""

from __future__ import annotations

from typing import Any

from .config_stats import at_least


def limit_text(x: float) -> str:
    """A declared limit as written ("1.16", "8", "1500"), exactly when that rounds."""
    short = f"{x:g}"
    return short if float(short) == x else f"{x:.12g}"


def shown(value: float, limit: float, op: str, digits: int = 2,
          scale: float = 1.0) -> tuple[str, str]:
    """``value`` and ``limit`` (times ``scale``) as text that reads the way the gate
    compared them (``op``: "<" or ">"): a speedup that missed 1.16 by 0.0001 reads
    "1.1599 < 1.16", never "1.16 < 1.16"."""
    v, lim = value * scale, limit_text(limit * scale)
    for d in range(digits, 16):
        text = f"{v:.{d}f}"
        if (float(text) < float(lim)) if op == "<" else (float(text) > float(lim)):
            return text, lim
    return repr(v), lim


def ratio_text(value: float, *floors: float | None, digits: int = 2) -> str:
    """``value`` to ``digits`` places, or to as many more as it takes to stay on its own
    side of each floor it is read against (at or above passes, as ``at_least`` judges):
    1.156 against 1.16 reads "1.156", 0.9996 against 1 (no gain) "0.9996", 1.5 "1.50"."""
    lines = [f for f in floors if f is not None]
    for d in range(digits, 16):
        text = f"{value:.{d}f}"
        if all(at_least(float(text), f) == at_least(value, f) for f in lines):
            return text
    return repr(value)


def speedup_text(value: float | None, min_speedup: float | None = None) -> str:
    """A speedup with its sign of multiplication, on its own side of no gain (1×) and of
    the speedup gate (``min_speedup``); nothing measured is "–"."""
    return "–" if value is None else ratio_text(value, 1.0, min_speedup) + "×"


def interval_text(iv: list[float] | tuple[float, float], *floors: float | None) -> str:
    """'1.10–1.25': a 95% interval whose ends each stay on their side of the floors."""
    return f"{ratio_text(iv[0], *floors)}–{ratio_text(iv[1], *floors)}"


def gate_text(name: str, val: Any, gates: dict) -> str:
    """A missed gate as the comparison it made, never reading as its own limit:
    "speedup 1.1599 < 1.16", "TTFT +8.02% > +8%", "peak swap 1600.0 MB > 1500 MB"."""
    if name == "ttft_change":
        v, lim = shown(val, gates["ttft_regression_limit"], ">", 1, 100)
        return f"TTFT +{v}% > +{lim}%"
    if name == "swap_peak_bytes":
        v, lim = shown(val, gates["swap_ceiling_bytes"], ">", 1, 1e-6)
        return f"peak swap {v} MB > {lim} MB"
    cmp = {"speedup": ("speedup", "<", gates["min_speedup"], ""),
           "acceptance": ("acceptance", "<", gates["acceptance_floor"], ""),
           "itl_p95_ms": ("ITL p95", ">", gates["itl_p95_ceiling_ms"], " ms")}
    if name in cmp:
        what, op, limit, unit = cmp[name]
        v, lim = shown(val, limit, op, 1 if unit else 2)
        return f"{what} {v}{unit} {op} {lim}{unit}"
    if name == "task_pass_rate" and isinstance(val, (int, float)):
        # the size of the change as the gate compared it (|change| > tolerance)
        v, lim = shown(abs(val), gates["task_pass_tolerance"], ">", 1, 100)
        return f"task pass rate {'-' if val < 0 else '+'}{v}% vs the baseline, beyond ±{lim}%"
    return {
        "exact": "output differs from the baseline",
        "streaming_parity": f"{val} streaming parity mismatches",
        "task_pass_rate": f"task pass rate {val:+.1%} vs the baseline, beyond "
                          f"±{gates['task_pass_tolerance']:.1%}",
        "not_failed": "acceptance under the failure floor for more than ten minutes",
    }.get(name, f"{name} {val}")
