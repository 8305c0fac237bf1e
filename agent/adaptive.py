"""Stop when the answer is known: the adaptive sweep's decisions, as pure functions.

A sweep's answer is which config is fastest, and by how much. Each candidate is measured in
repetition rounds, always right after its own baseline (the loop's A B A C order); its
sample per round is the paired speedup (its decode tok/s over the baseline's measured just
before it), so slow drift of the machine cancels out. After each round:

- a candidate whose median speedup is known to within the plan's ``tolerance`` (the
  half-width of a distribution-free confidence interval for the median, relative to it)
  stops repeating;
- draft widths past the knee stop once two successive widths are worse than the best with
  confidence (the upper end of their interval below the lower end of the best one's), and
  so does every wider one; any other candidate that is worse than the best with
  confidence stops too (its place in the answer is known);
- the baseline competes too: its paired speedup is 1 by definition, so a candidate whose
  whole interval lies below 1 is slower than not speculating at all and stops (when every
  candidate does, the answer is the baseline, as the full grid's would be);
- nothing stops before ``min_repetitions`` or goes on past the plan's ``repetitions``
  (what the full grid would run).

A trial flagged unreliable is no evidence for stopping: it is measured and reported, but
only reliable trials make an interval. The interval for the median is the order-statistic
one (no distribution assumed): [x(j), x(n+1-j)] with j the largest rank such that
P(Binomial(n, ½) < j) ≤ (1 − confidence)/2. Below a few samples no such j exists, and
nothing is known yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from .stats import median

KEYS = {"tolerance", "confidence", "min_repetitions"}  # the maximum: sweep.repetitions
DEFAULTS = {"tolerance": 0.03, "confidence": 0.9, "min_repetitions": 3}


def median_ci(xs: list[float], confidence: float) -> tuple[float, float] | None:
    """The distribution-free interval for the median, or None while n is too small for
    any interval at this confidence."""
    n = len(xs)
    tail = (1 - confidence) / 2
    j, cum = 0, 0.0
    for i in range(n + 1):  # j = how many order statistics to drop at each end
        cum += comb(n, i) / 2 ** n
        if cum > tail:
            break
        j = i + 1
    if j == 0 or j > n - j:
        return None
    s = sorted(xs)
    return s[j - 1], s[n - j]


@dataclass
class Decision:
    settled: bool
    reason: str = ""


def known(xs: list[float], spec: dict) -> Decision:
    """Whether one candidate's median speedup is pinned down to the tolerance."""
    n = len(xs)
    if n >= spec["max_repetitions"]:
        return Decision(True, f"{n} repetitions (the maximum)")
    if n < spec["min_repetitions"]:
        return Decision(False)
    ci = median_ci(xs, spec["confidence"])
    m = median(xs)
    if ci is None or not m:
        return Decision(False)
    half = (ci[1] - ci[0]) / 2 / abs(m)
    if half <= spec["tolerance"]:
        return Decision(True, f"median known to ±{half:.1%} ({spec['confidence']:.0%} "
                              f"interval) after {n} repetitions")
    return Decision(False)


def past_the_knee(widths: dict[int, list[float]], spec: dict) -> dict[int, str]:
    """Widths to stop because two successive widths past the best are worse than it with
    confidence: those two and every wider one, each with the reason."""
    cis = {k: ci for k, xs in widths.items() if len(xs) >= spec["min_repetitions"]
           and (ci := median_ci(xs, spec["confidence"])) is not None}
    if not cis:
        return {}
    best = max(cis, key=lambda k: median(widths[k]) or 0.0)
    lo_best = cis[best][0]
    wider = sorted(k for k in widths if k > best)
    worse = [k for k in wider if k in cis and cis[k][1] < lo_best]
    for a, b in zip(wider, wider[1:]):
        if a in worse and b in worse:
            why = (f"past the knee: widths {a} and {b} are both slower than width {best} "
                   f"with {spec['confidence']:.0%} confidence")
            return {k: why for k in wider if k >= a}
    return {}


def check_adaptive(spec, repetitions: int) -> str | None:
    """Why a job's ``adaptive`` section is refused (None: fine)."""
    if not isinstance(spec, dict):
        return "adaptive: a mapping of tolerance, confidence, min_repetitions"
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        return f"adaptive: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(KEYS))}"
    tol, conf = spec.get("tolerance", DEFAULTS["tolerance"]), spec.get("confidence", 0.9)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        return f"adaptive.tolerance: a share between 0 and 1 (0.03 is ±3%), got {tol!r}"
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0.5 <= conf < 1:
        return f"adaptive.confidence: a share from 0.5 to below 1, got {conf!r}"
    lo = spec.get("min_repetitions", DEFAULTS["min_repetitions"])
    if isinstance(lo, bool) or not isinstance(lo, int) or not 2 <= lo <= 1000:
        return f"adaptive.min_repetitions: an integer from 2 to 1000, got {lo!r}"
    if lo > repetitions:
        return (f"adaptive.min_repetitions {lo} is more than sweep.repetitions {repetitions} "
                "(the most an adaptive sweep runs)")
    return None


def resolved(spec: dict, repetitions: int) -> dict:
    return {**DEFAULTS, **spec, "max_repetitions": repetitions}


def settle(samples: dict, widths: dict, spec: dict) -> dict:
    """Candidates to stop now, each with its reason. ``samples``: key → reliable paired
    speedups so far; ``widths``: key → its draft width when the candidates differ only by
    width (the knee rule applies among those), else None."""
    out = {key: d.reason for key, xs in samples.items() if (d := known(xs, spec)).settled}
    # a candidate slower than the best with confidence: its place in the answer is known.
    # The baseline is one of the configs, at exactly 1 (each sample is over its own).
    cis = {k: ci for k, xs in samples.items() if len(xs) >= spec["min_repetitions"]
           and (ci := median_ci(xs, spec["confidence"])) is not None}
    conf = f"{spec['confidence']:.0%} confidence after"
    if cis:
        best = max(cis, key=lambda k: median(samples[k]) or 0.0)
        for k, ci in cis.items():
            if ci[1] < 1.0:
                out.setdefault(k, f"slower than its baseline with {conf} {len(samples[k])} "
                                  f"repetitions (median speedup {median(samples[k]):.2f}x)")
            elif k != best and ci[1] < cis[best][0]:
                out.setdefault(k, f"slower than the best with {conf} {len(samples[k])} "
                                  "repetitions")
    by_width = {widths[k]: samples[k] for k in samples if widths.get(k) is not None}
    for width, why in past_the_knee(by_width, spec).items():
        for key in samples:
            if widths.get(key) == width:
                out.setdefault(key, why)
    return out
