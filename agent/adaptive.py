"""Stop when the answer is known: the adaptive sweep's decisions, as pure functions.

A sweep's answer is which config is fastest, and by how much. Each candidate is measured in
repetition rounds, always right after its own baseline (the loop's A B A C order); its
sample per round is the paired speedup (its decode tok/s over the baseline's measured just
before it), so slow drift of the machine cancels out. After each round a candidate stops
only when its rank is settled:

- its paired difference against the current best excludes the plan's ``tolerance``: the
  interval for the median of its round-by-round ratio to the best lies wholly below
  1 − tolerance. That ratio is of the two candidates' own decode rates in the round
  (``rates``) where the loop gives them: both are speedups over the same baseline config,
  so their ratio is that of their rates, and each baseline trial's noise is no part of it
  (on a quiet 2-core VM the grown target's baselines ran 63–141 tok/s while its widths held
  far steadier, and widths 2 and 4 of the calibration pair stayed within reach of each
  other for all 12 rounds). The baseline competes too, at exactly 1 (each speedup is over
  its own baseline), so a candidate whose speedup interval lies below 1 − tolerance stops,
  and when all do, the answer is the baseline, as the full grid's would be;
- or it is settled as the best: the last one left, faster than the baseline beyond the
  tolerance with confidence.

A candidate within the tolerance of the best never stops early: it is measured as often as
the grid would measure it, so the two pick alike (a candidate whose own median is known to
±5% is no answer: one 8% from the best can be pinned and still swap places with it). Nothing
stops before ``min_repetitions`` or goes on past the plan's ``repetitions``.

A trial flagged unreliable is no evidence for stopping: it is measured and reported, but
only reliable trials make an interval. The interval for the median is the order-statistic
one (no distribution assumed): [x(j), x(n+1-j)] with j the largest rank such that
P(Binomial(n, ½) < j) ≤ (1 − confidence)/2. Below a few samples no such j exists, and
nothing is known yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stats import median, median_interval

KEYS = {"tolerance", "confidence", "min_repetitions"}  # the maximum: sweep.repetitions
DEFAULTS = {"tolerance": 0.03, "confidence": 0.9, "min_repetitions": 3}


def median_ci(xs: list[float], confidence: float) -> tuple[float, float] | None:
    """The distribution-free interval for the median, or None while n is too small for
    any interval at this confidence (``stats.median_interval``, without its coverage)."""
    got = median_interval(xs, confidence)
    return None if got is None else (got[0], got[1])


@dataclass
class Decision:
    settled: bool
    reason: str = ""


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


def paired(xs: list, ys: list) -> list[float]:
    """Round by round, one candidate's paired speedup over another's: both were measured in
    the same repetition round, so what drifted between rounds cancels once more. A round
    with no reliable sample on either side (None) pairs nothing: the lists stay aligned by
    round, never shifted."""
    return [x / y for x, y in zip(xs, ys) if x is not None and y]


def settle(samples: dict, widths: dict, spec: dict, rates: dict | None = None) -> dict:
    """Candidates to stop now, each with its reason. ``samples``: key → paired speedups so
    far, one per round in round order (None for a round whose pair was unreliable: kept so
    that two candidates' lists pair the same rounds), of the candidates still running.
    ``rates``: key → the candidate's own decode rate a round (None: unreliable), aligned
    with ``samples``: candidates are compared on these where given, on their speedups
    where not. ``widths`` (key → draft width) is accepted for the loop's call and unused:
    no rule assumes a knee, every stop rests on the candidate's own paired evidence."""
    del widths
    lo, conf = spec["min_repetitions"], spec["confidence"]
    rounds = samples  # one entry a round (None: no reliable pair that round)
    samples = {k: [x for x in xs if x is not None] for k, xs in rounds.items()}
    out = {k: f"{len(xs)} repetitions (the maximum)" for k, xs in rounds.items()
           if len(xs) >= spec["max_repetitions"]}
    ready = {k: xs for k, xs in samples.items() if len(xs) >= lo}
    if not ready:
        return out
    # the current best: the baseline (speedup 1 by definition) or a candidate above it
    best = max(ready, key=lambda k: median(ready[k]) or 0.0)
    base_best = (median(ready[best]) or 0.0) <= 1.0
    after = f"with {conf:.0%} confidence after"
    # beyond the tolerance: a candidate within it of the best is one answer by the plan's
    # terms, so it is measured as often as the grid would (its median the grid's)
    edge = 1.0 - spec["tolerance"]
    for k, xs in ready.items():
        if k in out:
            continue
        own = median_ci(xs, conf)
        if own is not None and own[1] < edge:  # the paired difference against the baseline
            out[k] = (f"slower than its baseline {after} {len(xs)} repetitions "
                      f"(median speedup {median(xs):.2f}x)")
            continue
        if k == best or base_best:
            continue
        ratios = paired(*((rates[k], rates[best]) if rates and k in rates and best in rates
                          else (rounds[k], rounds[best])))
        ci = median_ci(ratios, conf) if len(ratios) >= lo else None
        if ci is not None and ci[1] < edge:
            out[k] = (f"slower than the best {after} {len(ratios)} paired repetitions "
                      f"(median {median(ratios):.3f}x the best's)")
    left = [k for k in samples if k not in out]
    best_ci = median_ci(ready[best], conf)
    if left == [best] and not base_best and best_ci is not None and best_ci[0] * edge > 1.0:
        out[best] = (f"settled as the best: faster than its baseline beyond the tolerance "
                     f"{after} {len(ready[best])} repetitions, every other candidate slower")
    return out
