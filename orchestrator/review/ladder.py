"""The graded fallback, walked with measured numbers.

The criteria's ladder: first shrink the draft width one step; if still failing, a lighter
draft tier; finally autoregressive only. With a lineup (one target, several drafts or
draft tiers) every rung is measured, so the review walks it instead of recommending it:
per target (chip × target weights and tier × workload × context × runtime) the rungs are

0. the heaviest draft at its widest measured width (the current config),
1. the same draft one measured width narrower (then narrower again, one step at a time),
2. each lighter draft, heaviest first, at its fastest config that passes every gate (or
   its fastest, when none passes), then speculation without a draft model (prompt lookup,
   multi-token prediction: an http runtime's draft-free variants), lightest of all,
3. autoregressive only,

each with speedup, acceptance, peak memory (and what it saves against rung 0), swap and
the task pass rate against the baseline; the walk stops at the first rung that passes
every gate. Only reliable configs are rungs, and the one config its series' verdict
switched on through the noise (set aside for its decode-rate spread alone, passing every
gate on intervals; marked on its rung and in the ladder's words): any other set-aside
config is never a step, so the walk never stops at a width the verdict passed over.
"""

from __future__ import annotations

import re
from typing import Any

from .gatewords import speedup_text
from .through_noise import baseline_at, noisy_pick
from .verdict import MIN_RUNS, gate_text

STEPS = ("current width", "one step narrower", "lighter draft tier", "autoregressive only")


def _bits(tier: str | None) -> int:
    """"4-bit g64" → 4; unquantised (or unknown) weights count as 16-bit."""
    m = re.match(r"(\d+)-bit", tier or "")
    return int(m.group(1)) if m else 16


def _noisy_pass(c: dict) -> bool:
    """Set aside for its spread alone, passed every gate decisively through the noise and
    picked by its series' verdict (``_noisy`` marks it): a rung where the verdict would
    not switch it on would stop the walk at a width the verdict passed over."""
    return bool(c.get("_picked_through_noise"))


def _usable(c: dict) -> bool:
    return c["mode"] == "speculative" and bool(c.get("gates")) and (_noisy_pass(c) or (
        not c["set_aside"] and c.get("speedup") is not None))


def _noisy(s: dict) -> list[dict]:
    """The series' configs, its verdict's through-the-noise pick marked for ``_noisy_pass``
    (copies: the section's configs stay as the review shows them)."""
    picked = noisy_pick(s)
    return [{**c, "_picked_through_noise": True} if picked is not None and c is picked else c
            for c in s["configs"]]


def _speedup(c: dict) -> float:
    """A rung's speedup: its own, or the through-the-noise reading that passed it."""
    return c["through_noise"]["speedup"] if _noisy_pass(c) else c["speedup"]


def _rung(step: int, section: dict, c: dict, base: dict, top_memory: float | None) -> dict:
    ident = section["identity"]
    failed = [name for name, g in (c.get("gates") or {}).items() if g["passed"] is False]
    mem = c.get("peak_memory")
    quality = (c["task_pass_rate"] - base["task_pass_rate"]
               if c.get("task_pass_rate") is not None
               and base.get("task_pass_rate") is not None else None)
    free = step == 2 and not ident.get("draft_fingerprint")
    return {"step": step, "action": "draft-free method" if free else STEPS[step],
            "model_pair": section["series"]["model_pair"],
            "draft_tier": ident.get("draft_quant") if c["mode"] == "speculative" else None,
            "k": c["k"] if c["mode"] == "speculative" else None,
            "speedup": _speedup(c) if c["mode"] == "speculative" else c.get("speedup"),
            "min_speedup": section["gates"]["min_speedup"],  # the gate its speedup is read at
            "through_noise": _noisy_pass(c),
            "acceptance": c.get("acceptance_p50"), "peak_memory": mem,
            "memory_saved": top_memory - mem if top_memory and mem else None,
            "swap_peak": c.get("swap_peak"), "task_pass_change": quality,
            # a rung passed through the noise counts the runs and nights that judged it
            **({"runs": c["through_noise"]["runs"], "nights": c["through_noise"]["nights"]}
               if _noisy_pass(c) else {
                "runs": c["runs"] - c["unreliable"],
                # the unit of evidence: several sweeps of one night are one night
                "nights": min(c["runs"] - c["unreliable"],
                              c.get("reliable_nights", c["runs"] - c["unreliable"]))}),
            "passes": c["mode"] == "baseline" or _noisy_pass(c) or c.get("classification")
            == "production candidate", "failed_gates": failed,
            # each missed gate as the comparison it made ("speedup 0.94 < 1.16")
            "failed_words": [gate_text(n, c["gates"][n]["value"], section["gates"])
                             for n in failed]}


def ladders(sections: list[dict]) -> list[dict]:
    """One ladder per target that more than one draft was measured with this week."""
    groups: dict[tuple, list[dict]] = {}
    for s in sections:
        ident, d = s.get("identity") or {}, s["series"]
        if not s.get("configs") or not _draft_id(ident):
            continue
        key = (d["chip"], d["workload"], d["context_bucket"], d["engine"],
               ident.get("target_fingerprint"), ident.get("target_quant"),
               bool(d.get("calibration")))  # an instrument's rungs are never a real ladder
        groups.setdefault(key, []).append(s)
    out = []
    for key, group in groups.items():
        if len({_draft_id(s["identity"]) for s in group}) < 2:
            continue
        ladder = _walk(group)
        if ladder:
            out.append({"chip": key[0], "workload": key[1], "context_bucket": key[2],
                        "engine": key[3], "target_tier": key[5], **ladder})
    return out


def _draft_id(ident: dict) -> str | None:
    """What a series speculated with: its draft's weights, or a draft-free method."""
    return ident.get("draft_fingerprint") or ident.get("draft_quant")


def _weight(s: dict) -> tuple:
    if not s["identity"].get("draft_fingerprint"):
        return (-1, 0)  # no draft weights at all: below every tier
    mem = max((c.get("peak_memory") or 0 for c in s["configs"] if c["mode"] == "speculative"),
              default=0)
    return (_bits(s["identity"].get("draft_quant")), mem)


def _walk(group: list[dict]) -> dict | None:
    group = sorted(group, key=_weight, reverse=True)  # heaviest draft first
    top = {**group[0], "configs": _noisy(group[0])}
    # one sampling setting throughout (the top draft's fastest config's): a rung at another
    # temperature is another ladder, never a step of this one
    usable = [c for c in top["configs"] if _usable(c)]
    if not usable:
        return None
    sampling = max(usable, key=_speedup).get("sampling")
    base = baseline_at(top, sampling)
    spec = sorted((c for c in usable if c.get("sampling") == sampling), key=lambda c: -c["k"])
    if base is None or not spec:
        return None
    top_memory = spec[0].get("peak_memory")
    rungs = [_rung(0, top, spec[0], base, top_memory)]
    rungs += [_rung(1, top, c, base, top_memory) for c in spec[1:]]
    for s in group[1:]:
        own = [c for c in _noisy(s) if _usable(c) and c.get("sampling") == sampling]
        if not own:
            continue
        passing = [c for c in own if c.get("classification") == "production candidate"
                   or _noisy_pass(c)]
        c = max(passing or own, key=_speedup)
        own_base = baseline_at(s, sampling) or base
        rungs.append(_rung(2, s, c, own_base, top_memory))
    rungs.append(_rung(3, top, base, base, None))
    stop = next(i for i, r in enumerate(rungs) if r["passes"])
    # a walk over rungs with too few reliable runs is an indication, not the answer
    thin = sorted({r["nights"] for r in rungs[:stop + 1] if r["nights"] < MIN_RUNS})
    text = describe_stop(rungs[stop])
    if thin:
        text = (f"provisional ({min(thin)} night(s) behind a rung, "
                f"{MIN_RUNS} needed): {text}")
    return {"target": top["series"]["model_pair"].split(" / ")[0], "rungs": rungs,
            "stop": stop, "text": text, "provisional": bool(thin),
            "nights": min(thin) if thin else None,
            "members": [s["series"]["model_pair"] for s in group]}


def describe_stop(r: dict) -> str:
    """The ladder's answer in words, e.g. "ladder step 2 (lighter draft tier): 4-bit g64
    draft at width 2 passes every gate, 1.6 MB less peak memory"."""
    head = f"ladder step {r['step']} ({r['action']})"
    if r["step"] == 3:
        return head + ": no measured draft config passes every gate; serve autoregressive"
    saved = (f", {r['memory_saved'] / 1e6:.1f} MB less peak memory"
             if r.get("memory_saved") and r["memory_saved"] > 0 else "")
    what = (r["model_pair"].split(" / ")[-1] + " (no draft model)"
            if r["action"] == "draft-free method" else
            f"{r['draft_tier']} draft" if r.get("draft_tier") else r["model_pair"])
    how = " through the noise" if r.get("through_noise") else ""
    return (f"{head}: {what} at width {r['k']} passes every gate{how} "
            f"({speedup_text(r['speedup'], r.get('min_speedup'))}){saved}")


def annotate(sections: list[dict], found: list[dict]) -> None:
    """Each member series' verdict names its ladder's step; the heaviest draft's graded
    fallback becomes the measured step instead of a recommendation."""
    by_pair: dict[tuple, dict[str, Any]] = {}
    for one in found:
        for pair in one["members"]:
            by_pair[(one["chip"], one["workload"], one["context_bucket"], one["engine"],
                     pair)] = one
    for s in sections:
        d = s["series"]
        lad = by_pair.get((d["chip"], d["workload"], d["context_bucket"], d["engine"],
                           d["model_pair"]))
        if lad is None:
            continue
        v = s["verdict"]
        stop = lad["rungs"][lad["stop"]]
        v["ladder"] = {"step": stop["step"], "action": stop["action"], "text": lad["text"],
                       "provisional": lad["provisional"], "nights": lad["nights"],
                       "to": {"model_pair": stop["model_pair"], "draft_tier": stop["draft_tier"],
                              "num_draft_tokens": stop["k"]}}
        if d["model_pair"] == lad["members"][0] and v["decision"] == "graded fallback":
            v["step"] = stop["step"]
            v["text"] = "graded fallback, measured: " + lad["text"]
        else:
            v["text"] += (f" · ladder: step {stop['step']} ({stop['action']})"
                          # said once: a provisional verdict already says its nights
                          + (", provisional" if lad["provisional"]
                             and not v.get("provisional") else ""))
