"""One decision per series, with its evidence in words, the rules that fired and why the
numbers may not transfer.

Precedence (the first that holds is the verdict):
1. **needs more data** — no reliable baseline this week or no reliable speculative config
   (a speculative config measured with no baseline at its own sampling settings is named,
   with the baseline to measure; with fewer than ``MIN_RUNS`` nights of reliable runs
   behind the config it is judged by, the decision below is given *provisional* with the
   count instead);
2. **production candidate at draft width K** — the fastest config that passes every gate
   (reliably; one set aside for its spread alone and passing on intervals is the pick
   where no reliable config passes, or where it is faster than the reliable pick with
   confidence: marked, the reliable one named beside it);
3. **keep autoregressive** — no width is faster than the baseline, or speculation changed
   the output at every width, or acceptance failed (the low-acceptance rule) at every width;
4. **graded fallback** — speculation helps somewhere but no config passes every gate. The
   ladder, from the criteria: shrink the draft width one step → a lighter draft tier →
   autoregressive only. Step 1 when a narrower width than the widest measured is the
   fastest; else step 2 (narrower widths do no better: a lighter draft). A fallback never
   enables a config that failed a gate: it names the next config that passes every gate
   (a lighter tier the lineup measured, see ``ladder``), else autoregressive.

The draft-width rules (``LADDER_RULES``) say parts of the same decision in their own
words and could contradict it ("disable speculation" next to "shrink the width"): the
verdict replaces them and lists their ids as the rules that fired. Other rules (memory,
swap, prefill) are further actions, shown as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .busy import busy_who
from .configs import NOT_SAMPLING, knob_suffix, sampling_key
from .gatewords import gate_text, interval_text, limit_text, speedup_text
from .through_noise import spread_text, undecided_text

MIN_RUNS = 3
FAILED_TEXT = "needs more data: the speculative generations failed this week"
DECISIONS = ("production candidate", "graded fallback", "keep autoregressive",
             "needs more data")  # the order the page counts them in
LADDER_RULES = frozenset({"draft-mismatch", "stop-widening", "net-loss", "bursty-rollbacks",
                          "fallback-order"})
_MACOS_BUILD = re.compile(r"^\d{2}[A-Z]\d{1,4}[a-z]?$")  # e.g. 24A335, 23F79, 22G120a


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _width(c: dict) -> str:
    return f"draft width {c['k']}{c.get('knob_text') or ''}"


def _describe(c: dict, gates: dict) -> str:
    """'speculation at draft width 3 is 0.94× the baseline on 12 reliable runs;
    acceptance 0.36 < 0.55': each missed gate as the comparison it made."""
    reliable = c["runs"] - c["unreliable"]
    speed = speedup_text(c["speedup"], gates["min_speedup"])
    parts = [f"speculation at {_width(c)} is {speed} the baseline on {reliable} reliable "
             f"run{'s' if reliable != 1 else ''}"]
    g = c.get("gates") or {}
    parts += [gate_text(name, v["value"], gates) for name, v in g.items()
              if v["passed"] is False]
    return "; ".join(parts)


def caveats(identity: dict, facts: dict | None) -> list[str]:
    """Why a series' numbers may not transfer to the Macs the decision is for."""
    facts = facts or {}
    out = []
    chip = identity.get("chip") or facts.get("chip")
    os_name = facts.get("os_name")
    build = facts.get("os_build") or identity.get("os_build")
    if chip and not str(chip).startswith("Apple"):
        out.append(f"measured on {chip}, not Apple Silicon: mlx ran on its CPU backend, so "
                   "speedups need not transfer to a Mac's GPU")
    elif not chip:
        out.append("the node's chip is unknown (`specfleet fleet facts` records it)")
    if os_name and "mac" not in str(os_name).lower():
        out.append(f"the OS is {os_name}" + (f" {build}" if build else "") + ", not macOS")
    elif not os_name and build and not _MACOS_BUILD.match(str(build)):
        out.append(f"OS build {build} is not a macOS build")
    if identity.get("power_source") == "battery" or facts.get("power_source") == "battery":
        out.append("the node ran on battery power")
    if facts.get("low_power_mode"):
        out.append("Low Power Mode was on")
    return out


def _shaky(section: dict) -> list[str]:
    """Machine states that set runs aside this week: the node is not always in the state
    its numbers describe."""
    reasons = sorted({r for x in section.get("set_aside") or [] for r in x["reasons"]})
    kinds = [("throttl", "the node throttled during some runs this week (set aside)"),
             ("battery", "some runs this week were on battery (set aside)"),
             ("Low Power", "Low Power Mode was on during some runs this week (set aside)"),
             ("contended", f"{_who(section)} competed for the CPU in some runs (set aside)"),
             ("swap", "the node swapped during some runs this week (set aside)")]
    # a reading that could not be taken says which and how to get it (agent's READINGS)
    missing = sorted({r[:r.index(" (")].removeprefix("unverified: ") + " — "
                      + r[r.index(" (") + 2:].removesuffix(")")
                      for r in reasons if r.startswith("unverified: ") and " (" in r})
    measured = [r for r in reasons if not r.startswith("unverified: ")]
    return [text for key, text in kinds if any(key in r for r in measured)] + [
        f"some runs this week could not read {m} (set aside as unverified)" for m in missing]


def _who(section: dict) -> str:
    """Who took the CPU from the runs set aside as contended (their fields, else words)."""
    aside = [x for x in section.get("set_aside") or [] if any("contended" in r
                                                              for r in x["reasons"])]
    return busy_who([c for x in aside for c in x.get("contention") or ()],
                    [r for x in aside if not x.get("contention") for r in x["reasons"]
                     if r.startswith("contended")])


def _identity(section: dict) -> dict:
    ident = dict(section.get("identity") or {})
    chip = section["series"]["chip"]
    if chip != ident.get("node"):  # a series of a node whose chip is unknown is named by node
        ident["chip"] = chip
    return ident


def decide(section: dict, facts: dict | None = None) -> dict:
    """The series' one verdict (see the module docstring for the precedence); with fewer
    than ``MIN_RUNS`` reliable runs behind it, marked provisional with the count
    ("production candidate at draft width 4, provisional: 1 of 3 nights")."""
    out = _decide(section, facts)
    # the decision alone, before its marks: a page that says them its own way starts here
    out["words"] = out["text"]
    if p := out.get("provisional"):
        out["text"] += provisional_words(p)
    if tn := out.get("through_noise"):
        out["text"] += f"; decided through the noise: {tn['text']}"
    if cal := section.get("calibration"):
        why = cal.get("no_longer_holds") if isinstance(cal, dict) else None
        unknown = cal.get("unverified") if isinstance(cal, dict) else None
        out["text"] = ("calibration pair (an instrument, not a model" + (
            f"; stale: its record no longer holds: {'; '.join(why)}" if why else
            f"; unverified against its record: {'; '.join(unknown)}" if unknown else "")
            + "): " + out["text"])
    return out


def provisional_words(p: dict) -> str:
    """", provisional: 1 of 3 nights": a decision's mark when fewer nights are behind it
    than the review needs."""
    return f", provisional: {p['nights']} of {p['needed']} nights"


def _decide(section: dict, facts: dict | None = None) -> dict:
    gates = section["gates"]
    configs = section.get("configs") or []
    fired = [s["rule"] for s in section.get("signals") or []]
    # "enable": the config a gateway may switch on (one that passed every gate), or None
    out: dict[str, Any] = {"decision": "needs more data", "step": None, "k": None,
                           "enable": None, "text": "",
           "evidence": "", "rules": [r for r in fired if r in LADDER_RULES],
           "further": [s for s in section.get("signals") or [] if s["rule"] not in LADDER_RULES],
           "caveats": caveats(_identity(section), facts) + _shaky(section)}
    base = next((c for c in configs if c["mode"] == "baseline" and not c["set_aside"]), None)
    spec = [c for c in configs if c["mode"] == "speculative" and not c["set_aside"]
            and c.get("speedup") is not None and c.get("gates")]
    if section.get("stale") and not configs:
        out["text"] = "needs more data: no run this week"
        out["evidence"] = f"latest run {section['latest_run'][:10]}"
        return out
    if _noisy_pick(section, out, judged_too=base is not None and bool(spec), spec=spec):
        return out
    if base is not None and (errors := section.get("speculation_failed")) \
            and not any(c["mode"] == "speculative" for c in configs):
        out["text"] = FAILED_TEXT
        out["evidence"] = f"{len(errors)} failed, e.g. {errors[0][:200]}; see the sweep page"
        return out
    if base is None or not spec:
        out.update(_no_evidence(section, base is None))
        return out
    fastest = max(spec, key=lambda c: c["speedup"])
    passing = [c for c in spec if c["classification"] == "production candidate"]
    judged = max(passing, key=lambda c: c["speedup"]) if passing else fastest
    have = judged["runs"] - judged["unreliable"]
    if have <= 0:
        out.update(text=f"needs more data: no reliable run at {_width(judged)}, {MIN_RUNS} "
                        "needed", evidence=_describe(judged, gates), k=judged["k"])
        return out
    # the night is the unit of evidence: three sweeps of one night are one night
    nights = min(have, judged.get("reliable_nights", have))
    if nights < MIN_RUNS:
        # the decision the nights so far point to, marked with its count, rather than
        # "needs more data" until the third night
        out["provisional"] = {"nights": nights, "needed": MIN_RUNS}
    if passing:
        out.update(decision="production candidate", k=judged["k"],
                   enable={"num_draft_tokens": judged["k"], "config": judged.get("knobs") or {}},
                   text=f"production candidate at {_width(judged)}",
                   evidence=_describe(judged, gates) + "; passes every gate")
        return out
    no_gain = fastest["speedup"] <= 1.0  # exactly the baseline's rate is no gain either
    changed = all(c["exact"] is False for c in spec)
    failed = all(c["gates"].get("not_failed", {}).get("passed") is False for c in spec)
    if no_gain or changed or failed:
        why = ("no draft width is faster than the baseline" if no_gain else
               "speculation changed the output at every width" if changed else
               "acceptance failed at every width")
        out.update(decision="keep autoregressive", step=3,
                   text=f"keep autoregressive: {why}", evidence=_describe(fastest, gates))
        return out
    # widths of the fastest config's own sampling settings: another temperature is no step
    widest = max(c["k"] for c in spec if c.get("sampling") == fastest.get("sampling"))
    # nothing here passes every gate: serve autoregressive until a lighter rung does
    # (``ladder.annotate`` names a measured one); never switch on what just failed
    if fastest["k"] < widest:
        out.update(decision="graded fallback", step=1, k=fastest["k"],
                   text=f"graded fallback step 1: serve autoregressive; no config passes "
                        f"every gate (the narrower {_width(fastest)} is the fastest and "
                        "still misses); next to measure: a lighter draft tier",
                   evidence=_describe(fastest, gates)
                   + f"; width {widest} does worse")
    else:
        out.update(decision="graded fallback", step=2, k=fastest["k"],
                   text="graded fallback step 2: serve autoregressive; no config passes every "
                        "gate (narrower widths do no better); next to measure: a lighter "
                        "draft tier",
                   evidence=_describe(fastest, gates))
    return out


def _no_evidence(section: dict, no_base: bool) -> dict:
    """Why nothing could be judged: a speculative config measured reliably with no
    reliable baseline at its own sampling settings is named, with the baseline it lacks
    and what to measure ("no reliable baseline at temperature 0.7"), never "nothing
    measured"; then the configs set aside and why."""
    configs = section.get("configs") or []
    bases = {c.get("sampling") for c in configs if c["mode"] == "baseline"
             and not c["set_aside"]}
    unpaired = [c for c in configs if c["mode"] == "speculative" and not c["set_aside"]
                and c.get("speedup") is None and c.get("sampling") not in bases]

    def at(c: dict) -> str:  # the sampling settings its baseline is missing at, in words
        knobs = {n: v for n, v in (c.get("knobs") or {}).items() if n != "variant"}
        return knob_suffix(knobs).removeprefix(" · ")

    words = []
    for c in unpaired:
        n, where = c["runs"] - c["unreliable"], f" at {at(c)}" if at(c) else ""
        words.append(f"{c.get('label') or 'speculative k=' + str(c['k'])} measured on {n} "
                     f"reliable run{'s' if n != 1 else ''} with no baseline{where} to compare "
                     f"it with: measure the baseline{where} (speculation off) beside it")
    words += [f"{x['config']}: {x['runs']} of {x['of']} runs set aside "
              f"({', '.join(x['reasons'])})" for x in section.get("set_aside") or []]
    if no_base:
        missing = "no reliable baseline this week"
    elif unpaired:
        where = " or ".join(dict.fromkeys(at(c) or "the default settings" for c in unpaired))
        missing = f"no reliable baseline at {where} this week"
    elif not words and not any(c["mode"] == "speculative" for c in configs):
        # measured plain (a runtime's baseline beside mlx-lm's): not "nothing measured"
        runs = sum(c["runs"] for c in configs)
        return {"text": "needs more data: measured without speculation this week",
                "evidence": f"the baseline alone, {runs} run{'s' if runs != 1 else ''}"
                if runs else "nothing measured"}
    else:
        missing = "no reliable speculative config this week"
    return {"text": f"needs more data: {missing}",
            "evidence": "; ".join(words) or "nothing measured"}


def _noisy_pick(section: dict, out: dict, judged_too: bool, spec: list[dict]) -> bool:
    """Beside reliable widths that all miss, a width that passes through the noise is the
    verdict (marked), never "no config passes every gate"; there a noisy fail decides
    nothing (``judged_too``). Beside reliable widths that pass, one that passes through the
    noise is the verdict only where it beats the reliable pick (``_beats``): marked, the
    reliable one named beside it, at its own settings."""
    reliable = [c for c in spec if c["classification"] == "production candidate"]
    top = max(reliable, key=lambda c: c["speedup"]) if reliable else None
    if not _through_noise(section, out, passes_only=judged_too,
                          beats=_beats(top) if top else None):
        return False
    if top is not None:
        speed = speedup_text(top["speedup"], section["gates"]["min_speedup"])
        out["evidence"] += (f"; the fastest reliable config, {_width(top)}, passes every "
                            f"gate too ({speed})")
    return True


def _beats(top: dict) -> Callable[[dict], bool]:
    """Whether a width passed through the noise displaces the reliable pick ``top``: at
    top's sampling settings, on at least as many nights (up to ``MIN_RUNS``: one noisy
    night never unsettles a pick its nights are in), and faster with confidence (the low
    end of its 95% speedup interval above top's speedup). On its point estimate a width
    truly 7% slower displaced the pick in 13-29% of weeks (audit 34q, 1-6 noisy widths),
    its speedup read 1.46x against a true 1.30x."""
    have = top["runs"] - top["unreliable"]
    nights = min(have, top.get("reliable_nights", have), MIN_RUNS)

    def beats(c: dict) -> bool:
        iv = c["gates"]["speedup"].get("interval")
        return (c.get("sampling") == top.get("sampling") and iv is not None
                and iv[0] > top["speedup"] and c["through_noise"]["nights"] >= nights)
    return beats


def _through_noise(section: dict, out: dict, passes_only: bool = False,
                   beats: Callable[[dict], bool] | None = None) -> bool:
    """The decision from configs set aside for their decode-rate spread alone and judged
    through the noise (``through_noise``), only where it is decisive: keep autoregressive
    when every one fails a gate (decisively, for a timing gate), a production candidate
    at the fastest that passes every gate decisively; a graded fallback when all fail but
    one is decisively faster than the baseline. Marked in the text and as a field.
    ``passes_only``: reliable widths were judged too, so only a pass decides here;
    ``beats``: a reliable width passes, so only a pass that beats it (``_beats``) does."""
    gates = section["gates"]
    noisy = [c for c in section.get("configs") or [] if c["mode"] == "speculative"
             and c.get("through_noise") and c.get("gates")]

    def speed(c: dict) -> float:
        return c["gates"]["speedup"]["value"] or 0.0

    passing = [c for c in noisy if c["through_noise"]["outcome"] == "pass"
               and (beats is None or beats(c))]
    failing = [c for c in noisy if c["through_noise"]["outcome"] == "fail"]
    if not noisy or (not passing and (passes_only or len(failing) < len(noisy))):
        return False

    judged = max(passing or failing, key=speed)
    tn = judged["through_noise"]
    spreads = [s for c in noisy for s in c["through_noise"]["spreads"]]
    if passing:
        sp, family = judged["gates"]["speedup"], tn.get("family", 1)
        gate = gates["min_speedup"]
        why = (f"speedup {speedup_text(sp['value'], gate)} ({_iv_words(sp)} "
               f"{interval_text(sp['interval'], 1.0, gate)}{_pass_level(sp, family, gate)}) "
               f"≥ {limit_text(gate)}")
    else:  # a gate every width fails, as its comparison ("acceptance 0.38 < 0.55 at ...")
        common = sorted(n for n, v in failing[0]["gates"].items() if v["passed"] is False
                        and all(c["gates"][n]["passed"] is False for c in failing))
        where = " at every width" if len(failing) > 1 else f" at {_width(failing[0])}"
        why = "; ".join(_noisy_gate(n, [c["gates"][n] for c in failing], gates) + where
                        for n in common[:2])
    out["through_noise"] = {"text": spread_text(spreads) + (f", {why}" if why else ""),
                            "configs": len(noisy), "outcome": tn["outcome"]}
    if tn["nights"] < MIN_RUNS:
        out["provisional"] = {"nights": tn["nights"], "needed": MIN_RUNS}
    evidence = _noisy_describe(judged, gates)
    if passing:
        out.update(decision="production candidate", k=judged["k"],
                   enable={"num_draft_tokens": judged["k"], "config": judged.get("knobs") or {}},
                   text=f"production candidate at {_width(judged)}",
                   evidence=evidence + "; passes every gate through the noise")
        return True
    helps = [c for c in failing if c["gates"]["speedup"].get("interval")
             and c["gates"]["speedup"]["interval"][0] > 1.0]
    if helps and not all(c.get("exact") is False for c in failing):
        best = max(helps, key=speed)
        out.update(decision="graded fallback", step=2, k=best["k"],
                   text="graded fallback step 2: serve autoregressive; no config passes every "
                        "gate; next to measure: a lighter draft tier",
                   evidence=_noisy_describe(best, gates))
        return True
    out.update(decision="keep autoregressive", step=3,
               text="keep autoregressive: every draft width fails a gate", evidence=evidence)
    return True


def _pass_level(gate: dict, n: int, floor: float) -> str:
    """'; 98.3% interval 1.52–2.63 for 3 configs': the interval a pass was read at when
    several configs were judged through the noise (Bonferroni), beside the 95% one."""
    if not (iv := gate.get("pass_interval")):
        return ""
    return f"; {gate['pass_level']:.1%} interval {interval_text(iv, 1.0, floor)} for {n} configs"


def _iv_words(gate: dict) -> str:
    return gate.get("interval_words", "95% interval")


def _noisy_gate(name: str, judged: list[dict], gates: dict) -> str:
    """A gate every width missed, by its worst reading (a timing gate by its interval)."""
    worst = max(judged, key=lambda v: -(v["value"] or 0) if name in (
        "speedup", "acceptance") else (v["value"] or 0))
    text = gate_text(name, worst["value"], gates)
    if iv := worst.get("interval"):
        floor = {"speedup": gates["min_speedup"], "acceptance": gates["acceptance_floor"]}
        text += f" ({_iv_words(worst)} {interval_text(iv, floor.get(name))})"
    return text


def _noisy_describe(c: dict, gates: dict) -> str:
    """'speculation at draft width 3 is 0.52× the baseline (95% interval 0.41–0.66) on 1
    run set aside for its spread; acceptance 0.38 < 0.55'."""
    sp = c["gates"]["speedup"]
    gate = gates["min_speedup"]
    iv = f" ({_iv_words(sp)} {interval_text(sp['interval'], 1.0, gate)})" \
        if sp.get("interval") else ""
    n = c["through_noise"]["runs"]
    speed = speedup_text(sp["value"] or 0, gate)
    parts = [f"speculation at {_width(c)} is {speed} the baseline{iv} on {n} "
             f"run{'s' if n != 1 else ''} set aside for the spread (judged through the noise)"]
    parts += [gate_text(name, v["value"], gates) for name, v in c["gates"].items()
              if v["passed"] is False]
    parts += [undecided_text(name) for name, v in c["gates"].items() if v.get("undecided")]
    return "; ".join(parts)


POLICY_SCHEMA = "specfleet-policy/1"


def policy(a: dict, calibration: bool = False) -> dict:
    """The week's verdicts as a runtime policy a gateway can read: per series, speculation
    on or off, the draft width, and the graded-fallback ladder with the thresholds that
    trigger each step. Deterministic (sorted, no timestamps), so week to week it reviews
    as a diff. Calibration series (an instrument, not a model) only when asked; asked, a
    calibration series' provisional config is switched on with its marker (``provisional``:
    nights of needed), as a real pair's never is."""
    gates = a["gates"]
    out = []
    for s in sorted(a["series"], key=lambda s: tuple(s["series"].values())):
        if s.get("calibration") and not calibration:
            continue
        v = s["verdict"]
        measured = v.get("ladder")  # a lineup measured the lighter tiers: name the one
        # only a config that passed every gate is switched on: this series' candidate, or
        # the measured rung a graded fallback stopped at (a lighter tier, a narrower width)
        # one night is not enough to switch on a model, for a candidate as for a ladder
        # rung: a provisional one is named (``candidate``) and left off until its nights are
        # in. A calibration pair asked into the policy is an instrument whose answer is known
        # by construction: it is switched on, and the entry says on how few nights. Once
        # its record no longer holds its answer is not known: never switched on; while the
        # record cannot be checked against some of it (unverified), not before its nights
        cal = s.get("calibration")
        stale = (cal.get("no_longer_holds") if isinstance(cal, dict) else None) or []
        unverified = (cal.get("unverified") if isinstance(cal, dict) else None) or []
        early = bool(s.get("calibration")) and not stale and not unverified
        use = None if stale or (v.get("provisional") and not early) else v.get("enable")
        if use is None and not stale and v["decision"] == "graded fallback" and measured \
                and measured["step"] in (1, 2) and measured["to"].get("num_draft_tokens") \
                and (early or not measured.get("provisional")):
            use = {"num_draft_tokens": measured["to"]["num_draft_tokens"], "config": {},
                   "ladder_step": measured["step"], **measured["to"]}
        on = use is not None
        k = use["num_draft_tokens"] if use else None
        # step 1 may only shrink to a width that passed every gate at the settings served
        served = sampling_key(use["config"]) if use and use.get("config") else None
        widths = sorted({c["k"] for c in s.get("configs") or [] if c["mode"] == "speculative"
                         and not c["set_aside"] and c.get("classification")
                         == "production candidate"
                         and (served is None or c.get("sampling") == served)})
        narrower = [w for w in widths if on and w < k]
        ladder = []
        if on:
            if narrower:
                ladder.append({"step": 1, "action": "shrink_draft_width", "to": narrower[-1]})
            ladder.append({"step": 2, "action": "lighter_draft_tier", **(
                {"to": measured["to"]} if measured and measured["step"] == 2 else {})})
        ladder.append({"step": 3, "action": "autoregressive"})
        d = s["series"]
        out.append({
            "series": " / ".join(str(d[f]) for f in ("chip", "model_pair", "workload",
                                                      "context_bucket", "engine"))
            + (" / calibration" if s.get("calibration") else ""),
            **d, "decision": v["decision"], "step": v["step"], "speculation": on,
            "num_draft_tokens": k,
            **({"sampling": {n: x for n, x in use["config"].items()
                             if n not in NOT_SAMPLING}} if use and use["config"] else {}),
            # an http runtime's variant is the server setup to switch on (audit 27z)
            **({"variant": use["config"]["variant"]}
               if use and (use.get("config") or {}).get("variant") else {}),
            **({"use": {n: use[n] for n in ("model_pair", "draft_tier", "ladder_step")}}
               if use and "ladder_step" in use else {}),
            "fallback": {"ladder": ladder, "when": {
                "acceptance_below": gates["acceptance_floor"],
                "swap_peak_bytes_above": gates["swap_ceiling_bytes"],
                "ttft_change_above": gates["ttft_regression_limit"]}},
            "because": v["text"], "evidence": v["evidence"],
            **_provisional(v, measured if use and "ladder_step" in use else None),
            **({"candidate": {"num_draft_tokens": v["enable"]["num_draft_tokens"],
                              "off_until": "its nights are in (provisional)"}}
               if v.get("provisional") and v.get("enable") and not on else {}),
            **({"calibration": True} if s.get("calibration") else {}),
            # decided through the noise: never on (or named) without its marker
            **({"through_noise": v["through_noise"]} if v.get("through_noise") else {}),
            **({"calibration_stale": stale} if stale else {}),
            **({"calibration_unverified": unverified} if unverified else {}),
            **({"measured_ladder": measured} if measured else {})})
    return {"schema": POLICY_SCHEMA, "week": a["week"], "series": out}


def _provisional(v: dict, rung: dict | None) -> dict:
    """The entry's marker: the verdict's count of nights, or, for a ladder rung switched on
    with fewer nights than needed behind it (a calibration series asked in), that rung's."""
    if v.get("provisional"):
        return {"provisional": v["provisional"]}
    if rung and rung.get("provisional"):
        return {"provisional": {"nights": rung.get("nights"), "needed": MIN_RUNS}}
    return {}
