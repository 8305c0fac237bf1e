"""Whether a calibration series' record still holds for what the series measured (issue 34):
judged night by night, like with like.

A record (``specfleet-calibration.json``, as the sweep's lock stored it) says what a node
must measure:

- an exact pair (expected acceptance 1.0: identity layers) accepts every drafted token, at
  every width and on every workload, at the record's settings (greedy): a run whose
  acceptance is more than ``ACCEPTANCE_TOLERANCE`` below 1.0 misses it;
- a perturbed pair's record holds the acceptance the builder measured per workload (its
  prompt) and width (``measured.cells``): a run is compared only with the cell of its own
  workload, prompt and width, within a two-proportion binomial bound on accepted / drafted
  (the record's drafted tokens and the run's, ``acceptance_tolerance``), never tighter than
  ``ACCEPTANCE_TOLERANCE``. An older record (one number, pooled over the prompts it names at
  one width) is compared only with a run of exactly those prompts at that width.

A run the record has no matching entry for (another width, workload or prompt, other
sampling settings, a draft of the sweep's lock the record was not grown from) leaves the
series "unverified against its record": said, never silently clean and never stale. Any
one night that misses makes the series stale (a median of nights would hide it), as does a
node whose target weights are not the record's, or whose draft is neither the record's nor
any the sweep's lock holds ("measured another draft")."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .configs import knob_suffix
from .week_runs import RunRow
from .week_sweeps import ACCEPTANCE_TOLERANCE  # the manifest's: the least a bound is

Z = 3.29  # two-sided 99.9%: a night misses only when chance cannot explain it


def short(fp: object) -> str:
    return str(fp).removeprefix("sha256:")[:12]


def exact(record: dict) -> bool:
    """An exact pair's record: acceptance 1.0 by construction, at every width."""
    return record.get("expected_acceptance") == 1.0


MAX_COUNT = 10 ** 15  # more tokens than any record drafts: no count (and past a float's range)


def _count(x: object) -> int | None:
    if isinstance(x, int) and not isinstance(x, bool) and 0 < x < MAX_COUNT:
        return x
    return None


def _rate(x: object) -> float | None:
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return None
    return float(x) if 0.0 <= x <= 1.0 else None


def record_cells(record: dict) -> dict[tuple[str, int], dict[str, Any]]:
    """{(workload, width): {acceptance, drafted_tokens, prompt_sha256}} the record measured
    (malformed cells left out: unverified, never a bound)."""
    out = {}
    for c in ((record.get("measured") or {}).get("cells") or []):
        if not isinstance(c, dict):
            continue
        k, a, n = _count(c.get("num_draft_tokens")), _rate(c.get("acceptance")), \
            _count(c.get("drafted_tokens"))
        if isinstance(c.get("workload"), str) and k and a is not None and n:
            out[(c["workload"], k)] = {"acceptance": a, "drafted_tokens": n,
                                       "prompt_sha256": c.get("prompt_sha256")}
    return out


def _pooled(record: dict) -> tuple[dict, int | None, dict[str, Any] | None]:
    """An older record's one number: {prompt name: sha} it pooled, its width, its cell."""
    m = record.get("measured") or {}
    prompts: dict = m["prompts"] if isinstance(m.get("prompts"), dict) else {}
    a, n = _rate(record.get("expected_acceptance")), _count(m.get("drafted_tokens"))
    cell = {"acceptance": a, "drafted_tokens": n} if a is not None and n else None
    return prompts, _count(m.get("num_draft_tokens")), cell


def acceptance_tolerance(expected: float, drafted_record: int, measured: float,
                         drafted: int) -> float:
    """How far a run's acceptance may be from the record's before chance cannot explain it:
    ``Z`` standard errors of the difference of two binomial proportions (accepted / drafted,
    the two pooled for the variance), at least ``ACCEPTANCE_TOLERANCE``."""
    drafted = min(drafted, MAX_COUNT)  # a run's huge count: the record's alone bounds it
    p = (expected * drafted_record + measured * drafted) / (drafted_record + drafted)
    se = math.sqrt(max(p * (1.0 - p), 0.0) * (1.0 / drafted_record + 1.0 / drafted))
    return max(ACCEPTANCE_TOLERANCE, Z * se)


def drafted_estimate(generated: float, width: int, acceptance: float) -> int:
    """Tokens one generation drafted: each verify round drafts ``width`` and yields its
    accepted ones and one of the target's (``acceptance × width + 1``). An acceptance
    outside [0, 1] (no rate: judged, it misses) is estimated at its nearest bound."""
    a = min(max(acceptance, 0.0), 1.0)
    return max(1, round(generated * width / (a * width + 1.0)))


def identity_holds(record: dict, identity: dict) -> tuple[list[str], list[str]]:
    """(why the record no longer holds, why it cannot be checked) for a node's identity:
    target weights not the record's; a draft neither the record's nor the lock's (stale),
    or another draft of the lock's, or none reported (unverified)."""
    stale, unverified = [], []
    want = record.get("fingerprint") or record.get("locked_fingerprint")
    got = identity.get("target_fingerprint")
    if want and got and got != want:
        stale.append(f"the target's fingerprint changed ({short(want)} in the record, "
                     f"{short(got)} measured)")
    elif want and not got:
        unverified.append("its node reported no target fingerprint")
    own, draft = record.get("draft_fingerprint"), identity.get("draft_fingerprint")
    if own and draft != own:
        if not draft:
            unverified.append("its node reported no draft fingerprint")
        elif draft in (record.get("lock_fingerprints") or ()):
            unverified.append(f"measured with the draft {short(draft)} of its lock, which "
                              f"its record (grown from {short(own)}) has no acceptance for")
        else:
            stale.append(f"measured another draft: {short(draft)}, neither the record's "
                         f"({short(own)}) nor any its sweep's lock holds")
    return stale, unverified


def judge_acceptance(record: dict, workload: str, width: int, acceptance: float,
                     drafted: int, prompt: str | None = None,
                     settings: str = "") -> tuple[str | None, str | None]:
    """One run (a workload's prompt, a width, at ``settings`` away from the defaults)
    against its record: (how it misses, None), (None, why it cannot be compared) or
    (None, None) when it holds."""
    if settings:
        return None, f"measured at other settings than its record's ({settings.strip(' ·')})"
    cell: dict[str, Any] | None = {"acceptance": 1.0, "drafted_tokens": None} if exact(record) \
        else record_cells(record).get((workload, width))
    if cell is None:
        cell, why = _old_cell(record, workload, width, prompt)
        if cell is None:
            return None, why
    elif prompt and cell.get("prompt_sha256") not in (None, prompt):
        return None, f"its record measured {workload} on another prompt"
    e, n_r = cell["acceptance"], cell["drafted_tokens"]
    tol = acceptance_tolerance(e, n_r, acceptance, drafted) if n_r else ACCEPTANCE_TOLERANCE
    if abs(acceptance - e) > tol + 1e-9:
        return (f"measured acceptance {acceptance:.2f} on {workload} at width {width}, off "
                f"the record's {e:.2f} by more than {tol:.2f}"), None
    return None, None


def _old_cell(record: dict, workload: str, width: int,
              prompt: str | None) -> tuple[dict[str, Any] | None, str]:
    """An older record's one number, when the run is exactly what it pooled."""
    prompts, at, cell = _pooled(record)
    if record_cells(record) or cell is None or not prompts or not at:
        return None, f"its record has no acceptance for {workload} at width {width}"
    if at != width or list(prompts) != [workload] \
            or (prompt and prompts[workload] not in (None, prompt)):
        return None, (f"its record holds one acceptance, over {', '.join(sorted(prompts))} "
                      f"at width {at}, none for {workload} at width {width}")
    return cell, ""


def _acceptance(r: RunRow) -> tuple[float, int] | None:
    """A run's measured acceptance (median of its repetitions) and the tokens one of them
    drafted (repetitions of a greedy prompt repeat its tokens: one is what was drawn)."""
    v = r.summary.get("values") or {}
    acc = [x for x in v.get("acceptance_rate") or [] if x is not None]
    if not acc:
        return None
    a = statistics.median(acc)
    gen = [x for x in v.get("generated_tokens") or [] if x]
    return a, drafted_estimate(statistics.median(gen) if gen else 64.0, r.k, a)


def series_holds(runs: list[RunRow]) -> dict[str, list[str]]:
    """A calibration series' week judged run by run against each run's own record:
    ``no_longer_holds`` (each night that missed, named) and ``unverified`` (what the
    record has no entry for), each present only when not empty."""
    stale: list[str] = []
    unverified: list[str] = []
    for r in sorted(runs, key=lambda r: (r.at, r.node, r.k)):
        if not r.calibration:
            continue
        why, cannot = identity_holds(r.calibration, r.identity)
        stale += why
        unverified += cannot
        own = r.calibration.get("draft_fingerprint")
        if r.mode != "speculative" or not r.k \
                or (own and r.identity.get("draft_fingerprint") != own):
            continue  # another draft's acceptance: the record says nothing of it
        if (m := _acceptance(r)) is None:
            unverified.append(f"its node reported no acceptance at width {r.k}")
            continue
        miss, no_entry = judge_acceptance(r.calibration, str(r.series[2]), r.k, *m,
                                          prompt=r.identity.get("prompt_sha256"),
                                          settings=knob_suffix(r.config))
        if miss:
            stale.append(f"the night of {r.at.date().isoformat()} ({r.node}) {miss}")
        elif no_entry:
            unverified.append(no_entry)
    out = {"no_longer_holds": list(dict.fromkeys(stale)),
           "unverified": list(dict.fromkeys(unverified))}
    return {k: v for k, v in out.items() if v}
