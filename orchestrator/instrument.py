"""The instrument check: sweep a calibration pair on each node and judge the instrument there.

A calibration pair has a known answer (``orchestrator/calibration.py``): acceptance exactly
1.0 and output identical to autoregressive decoding, and a speedup that follows from the
node's own step costs (``agent/calibrate.py``). Per node:

- exactness: every speculative generation accepted every drafted token and produced the
  token ids of the baseline of its own prompt (none recorded: unverified);
- speed: the measured speedup at each width within ``TOLERANCE`` of the speedup predicted
  from that node's draft step, target step and target verification of k+1 tokens. On a
  noisy machine costs timed at one moment and speeds measured at another disagree by the
  noise, so the node measures both in alternating rounds (step costs, then the agent's
  loop autoregressive and speculative back to back at each width) and the check judges
  a distribution-free 90% interval for the median of the per-round ratio
  measured/predicted: ok only when it lies within the tolerance, off only when it lies
  wholly outside, otherwise unverified (too noisy to judge), never ok or off on the median
  alone (its quartiles are shown as the spread); the sweep's
  own stored speedup outside that spread (widened by the tolerance) is two readings that
  disagree: unverified, never ok;
- overhead: the agent's measuring loop against a bare mlx-lm loop in the same process.

One line per node: "instrument ok" or what is off and by how much. A reading that could not
be taken (generations set aside as unreliable, a node that failed) is *unverified*, never ok.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from agent.calibrate import predicted_speedup
from agent.protocol import DEFAULT_SWEEP
from agent.stats import median_interval

from .calibration import ensure_calibration
from .errors import SpecfleetError
from .fleet.fanout import run_fan_out
from .fleet.node_paths import check_placement, expand_root
from .fleet.transport import SSHOptions, q
from .store import Store, queries
from .sweep.dispatch import SweepOptions, start_sweep
from .sweep.lock import load_lock, write_lock
from .sweep.plan import load_plan

TOLERANCE = 0.10       # measured vs predicted speedup, per width
# "within 10%" includes 10%: 1.1 - 1 is 0.10000000000000009 in binary, and 0.9 - 1 is
# -0.09999999999999998, so a bare float compare judged +10% off and -10% ok
EDGE = 1e-9
CONFIDENCE = 0.90      # the interval for a width's median ratio: a line wrong <= 5%
MIN_ROUNDS = 5         # the fewest rounds whose range covers the median with CONFIDENCE
OVERHEAD_FLOOR = 0.95  # the agent's loop at least this share of a bare loop's decode rate


@dataclass
class NodeCheck:
    node: str
    status: str                  # ok | off | unverified | failed
    line: str
    widths: list[dict] = field(default_factory=list)
    acceptance: float | None = None
    identical: bool | None = None
    overhead: dict | None = None
    costs: dict | None = None


def instrument_plan(target: Path, draft: Path, repetitions: int, max_tokens: int) -> str:
    pins = [f"{d}=={metadata.version(d)}" for d in ("mlx", "mlx-lm")]
    return "\n".join([
        "# specfleet calibrate: the instrument check's calibration pair", "name: calibrate",
        "environment:", f'  python: "{sys.version_info.major}.{sys.version_info.minor}"',
        f"  packages: {json.dumps(pins)}", "  platforms: []",
        "models:", f"  target: {target}", f"  draft: {draft}",
        "workloads:", "  use: [code]", "  context: [short]", "  quality: false",
        f"  max_tokens: {max_tokens}",
        "sweep:", f"  knobs: {{num_draft_tokens: {DEFAULT_SWEEP['num_draft_tokens']}}}",
        f"  repetitions: {repetitions}"]) + "\n"


def judge(node: str, generations: list[dict], costs: dict | None,
          overhead: dict | None, speed: dict | None = None) -> NodeCheck:
    """The node's verdict from its stored generations and its own measured costs; with
    ``speed`` (the node's alternating rounds, ``agent.calibrate.speed_rounds``) the speed
    verdict is that robust reading's, else the sweep's medians against ``costs``."""
    base = [g for g in generations if g["mode"] == "baseline"]
    spec = [g for g in generations if g["mode"] == "speculative"]
    if not base or not spec:
        return NodeCheck(node, "failed", f"{node}: instrument unverified: no "
                         f"{'baseline' if not base else 'speculative'} generation stored")
    problems: list[str] = []
    unverified: list[str] = []
    acceptance, differ = _exactness(base, spec, problems, unverified)
    shaky = [g for g in generations if g.get("unreliable")]
    # the node's load, said once with its next step: every reading beside it is suspect
    kinds = sorted({r.split(":")[0] for g in shaky for r in g.get("unreliable_reasons")
                    or ["unknown"]})
    aside = (f"{len(shaky)} of {len(generations)} generations set aside "
             f"({', '.join(kinds)}): run the check again when the node is quiet")
    widths: list[dict] = []
    if speed is not None:
        widths = _robust_widths(speed, acceptance, problems, unverified)
        unverified += [f"speed unverified at width {k}: no rounds reported" for k in
                       sorted({g["num_draft_tokens"] for g in spec} - set(speed))]
        if not shaky:
            _sweep_agrees(base, spec, widths, unverified)
        if shaky:  # the loop's overhead was read once, beside the same load
            overhead = None
            unverified.insert(0, aside)
    elif shaky:
        unverified.insert(0, f"speed unverified: {aside}")
        overhead = None  # measured on the same busy node: no more trustworthy
    elif costs is None:
        unverified.append("speed unverified: the node's step costs could not be measured")
    else:
        widths = _median_widths(base, spec, costs, acceptance, problems, unverified)
    if overhead is None:
        unverified.append("loop overhead unverified" + (
            " (read beside the same load)" if shaky else ""))
    elif overhead["ratio"] < OVERHEAD_FLOOR:
        problems.append(f"the agent's loop decodes at {overhead['ratio']:.2f}× a bare mlx-lm "
                        f"loop (floor {OVERHEAD_FLOOR})")
    status, detail = _verdict(node, problems, unverified, acceptance, differ, widths, overhead)
    return NodeCheck(node, status, detail, widths, acceptance,
                     None if differ is None else not differ, overhead, costs)


def _exactness(base: list[dict], spec: list[dict], problems: list[str],
               unverified: list[str]) -> tuple[float | None, list[dict] | None]:
    """Pooled acceptance, and the speculative generations whose output differs from their
    prompt's baseline (None: no token ids to compare); what is wrong is added to the lists."""
    drafted = sum(g.get("drafted_tokens") or 0 for g in spec)
    accepted = sum(g.get("accepted_tokens") or 0 for g in spec)
    acceptance = accepted / drafted if drafted else None
    # each generation against the baseline of its own prompt (a workload may hold several)
    ids = {_prompt(g): g.get("token_ids") for g in base}
    unread = [g for g in base + spec if not g.get("token_ids")]
    if unread:  # nothing to compare is no evidence of identical output
        differ: list[dict] | None = None
        unverified.append(f"output identity unverified: no token ids recorded in "
                          f"{len(unread)} of {len(base) + len(spec)} generations")
    else:
        differ = [g for g in spec if g.get("token_ids") != ids.get(_prompt(g))]
    if acceptance != 1.0:
        problems.append(f"acceptance {acceptance if acceptance is None else round(acceptance, 4)}"
                        f" ≠ 1.0 ({drafted - accepted} of {drafted} drafted tokens rejected)")
    if differ:
        problems.append(f"output differs from autoregressive in {len(differ)} of {len(spec)} "
                        f"generations (first at width {differ[0]['num_draft_tokens']})")
    return acceptance, differ


def _median_widths(base: list[dict], spec: list[dict], costs: dict,
                   acceptance: float | None, problems: list[str],
                   unverified: list[str]) -> list[dict]:
    """Per width: the sweep's median speedup against the one ``costs`` predict."""
    widths: list[dict] = []
    b = statistics.median(g["decode_tok_s"] for g in base)
    for k in sorted({g["num_draft_tokens"] for g in spec}):
        if k + 1 not in costs["verify_ms"]:  # an older (or odd) node's reply
            unverified.append(f"speed unverified at width {k}: the node did not time "
                              f"verifying {k + 1} tokens")
            continue
        at = [g["decode_tok_s"] for g in spec if g["num_draft_tokens"] == k]
        m = statistics.median(at) / b
        p = predicted_speedup(costs, k, acceptance or 0.0)
        # repetitions that spread wider than the tolerance either side: a median the 10%
        # check cannot resolve (as the rounds' quartiles are judged)
        spread = _rel_spread([g["decode_tok_s"] for g in base]) + _rel_spread(at)
        noisy = spread > 2 * TOLERANCE + EDGE
        if noisy:
            unverified.append(f"speed unverified at width {k}: the sweep's repetitions "
                              f"spread {spread:.0%} of their medians (too noisy)")
        widths.append({"k": k, "measured": m, "predicted": p, "off": m / p - 1,
                       "noisy": noisy})
    for w in widths:
        if not w.pop("noisy") and abs(w["off"]) > TOLERANCE + EDGE:
            problems.append(f"width {w['k']} measured {w['measured']:.2f}× vs predicted "
                            f"{w['predicted']:.2f}× ({w['off']:+.0%})")
    return widths


def _rel_spread(xs: list[float]) -> float:
    """(max - min) / median of one side's repetitions (0 for one reading)."""
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / med if med > 0 else math.inf


def _verdict(node: str, problems: list[str], unverified: list[str],
             acceptance: float | None, differ: list[dict] | None, widths: list[dict],
             overhead: dict | None) -> tuple[str, str]:
    """ok / unverified / off, and the line that says it with the measured facts."""
    speeds = ", ".join(f"k={w['k']} {w['measured']:.2f}×/{w['predicted']:.2f}× "
                       f"({w['off']:+.0%}" + (f", spread {w['spread'][0] - 1:+.0%} to "
                                              f"{w['spread'][1] - 1:+.0%}" if "spread" in w
                                              else "") + ")" for w in widths)
    loop = f"loop {overhead['ratio']:.2f}× bare" if overhead else ""
    facts = "; ".join(x for x in (f"measured/predicted {speeds}" if speeds else "", loop) if x)
    if problems:
        status, head = "off", "instrument OFF: " + "; ".join(problems + unverified)
    elif unverified:
        status, head = "unverified", "instrument unverified: " + "; ".join(unverified) + (
            " (acceptance 1.0, output identical)" if acceptance == 1.0 and differ == [] else
            " (acceptance 1.0)" if acceptance == 1.0 else "")
    else:
        status, head = "ok", "instrument ok (acceptance 1.0, output identical)"
    return status, f"{node}: {head}" + (f" — {facts}" if facts else "")


def _prompt(g: dict) -> tuple:
    return g.get("workload"), g.get("context_bucket"), g.get("prompt_sha256")


def _sweep_agrees(base: list[dict], spec: list[dict], widths: list[dict],
                  unverified: list[str]) -> None:
    """The rounds judge the speed, but the sweep's stored runs are what the product
    reports: where the sweep's median speedup lies outside the rounds' spread widened by
    the tolerance, the two readings of one instrument disagree and neither is ok."""
    b = statistics.median(g["decode_tok_s"] for g in base)
    for w in widths:
        at = [g["decode_tok_s"] for g in spec if g["num_draft_tokens"] == w["k"]]
        if not at or not b:
            continue
        m = statistics.median(at) / b
        lo, hi = w["spread"]
        if not lo - TOLERANCE - EDGE <= m / w["predicted"] <= hi + TOLERANCE + EDGE:
            unverified.append(f"the sweep measured width {w['k']} at {m:.2f}× vs predicted "
                              f"{w['predicted']:.2f}× ({m / w['predicted'] - 1:+.0%}), outside "
                              "the rounds' spread")


def _robust_widths(speed: dict, acceptance: float | None, problems: list[str],
                   unverified: list[str]) -> list[dict]:
    """Judge each width on a distribution-free interval for the median of its per-round
    ratio measured/predicted (``agent.stats.median_interval``, ``CONFIDENCE``): ok only
    when the interval lies within ``TOLERANCE``, off only when it lies wholly outside, and
    otherwise unverified, too noisy to judge; never ok or off on the median alone, which
    noise moves past the tolerance. Unverified too where no round was timed, where too
    few were for an interval, or where the pair did not accept every token (the rounds
    predict at acceptance 1.0)."""
    widths = []
    for k in sorted(speed):
        r = speed[k]
        if not r.get("rounds"):
            unverified.append(f"speed unverified at width {k}: no round could be timed")
            continue
        # the line shows the two medians and their ratio (one reading); the per-round
        # ratios' own median, which the verdict's interval is about, is kept beside it
        w = {"k": k, "measured": r["measured"], "predicted": r["predicted"],
             "off": r["measured"] / r["predicted"] - 1 if r["predicted"] else r["ratio"] - 1,
             "ratio_median": r["ratio"], "spread": r["spread"], "rounds": r["rounds"]}
        widths.append(w)
        if why := judge_width(k, r, w):
            (problems if w.get("status") == "off" else unverified).append(why)
    if acceptance != 1.0 and widths:
        unverified.append("speed unverified: predicted at acceptance 1.0, which the sweep "
                          "did not measure")
    return widths


def judge_width(k: int, r: dict, w: dict) -> str | None:
    """What is wrong with one width's reading (None: ok), its status set in ``w``."""
    n = r["rounds"]
    if not r.get("ratios"):
        w["status"] = "unverified"
        return (f"speed unverified at width {k}: the node reported no per-round ratios "
                "(no interval for their median)")
    got = median_interval(r["ratios"], CONFIDENCE)
    if got is None:
        w["status"] = "unverified"
        return (f"speed unverified at width {k}: {n} round(s) timed, fewer than the "
                f"{MIN_ROUNDS} whose range covers the median with {CONFIDENCE:.0%} "
                "confidence")
    lo, hi, cover = got
    w["interval"], w["confidence"] = [lo, hi], cover
    said = (f"{cover:.0%} interval of the median {lo - 1:+.0%} to {hi - 1:+.0%} over {n} "
            "rounds")
    if 1 - TOLERANCE - EDGE <= lo and hi <= 1 + TOLERANCE + EDGE:
        w["status"] = "ok"
        return None
    if hi < 1 - TOLERANCE - EDGE or lo > 1 + TOLERANCE + EDGE:
        w["status"] = "off"
        return (f"width {k} measured {w['measured']:.2f}× vs predicted "
                f"{w['predicted']:.2f}× ({w['off']:+.0%}, median of {n} rounds; {said}, "
                f"wholly outside ±{TOLERANCE:.0%})")
    w["status"] = "unverified"
    return (f"speed unverified at width {k}: too noisy to judge (measured/predicted "
            f"{w['off']:+.0%}, {said}, crosses ±{TOLERANCE:.0%}; per-round spread "
            f"{r['spread'][0]:.2f}–{r['spread'][1]:.2f})")


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e9


def node_reading(raw) -> tuple[dict | None, str | None]:
    """What ``python -m agent costs`` printed, checked (a node's output is input, not
    truth): positive step costs, verify costs keyed by token count, a loop ratio."""
    try:
        c, o = raw["costs"], raw["overhead"]
        costs = {"target_ms": c["target_ms"], "draft_ms": c["draft_ms"],
                 "verify_ms": {int(n): v for n, v in c["verify_ms"].items()}}
        if not all(map(_positive, [costs["target_ms"], costs["draft_ms"],
                                   *costs["verify_ms"].values(), o["ratio"]])):
            raise ValueError("a cost or ratio that is not a positive number")
        speed = {int(k): _rounds(r) for k, r in raw.get("speed", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return None, f"unreadable reply from the node ({type(e).__name__}: {e})"
    return {"costs": {**c, **costs}, "overhead": o, "speed": speed or None}, None


def _rounds(r: dict) -> dict:
    """One width's rounds from a node's reply, checked: a count, and if any were timed,
    positive medians and a spread of two positive ratios, lower first."""
    n = r["rounds"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"a round count that is not a count: {n!r}")
    if n == 0:
        return {"rounds": 0}
    lo, hi = r["spread"]
    if not all(map(_positive, [r["predicted"], r["measured"], r["ratio"], lo, hi])) or lo > hi:
        raise ValueError("a speed reading that is not positive numbers, lower quartile first")
    if not lo * (1 - EDGE) <= r["ratio"] <= hi * (1 + EDGE):
        # a median lies between its quartiles: a reading whose does not judged no rounds
        raise ValueError(f"a median ratio {r['ratio']} outside its own quartiles {lo}–{hi}")
    out = {k: r[k] for k in ("rounds", "predicted", "measured", "ratio", "spread")}
    if "ratios" in r:  # the per-round ratios the interval is taken from: n positive numbers
        x = r["ratios"]
        if not isinstance(x, list) or len(x) != n or not all(map(_positive, x)) or \
                abs(statistics.median(x) - r["ratio"]) > EDGE * r["ratio"]:
            raise ValueError("per-round ratios that are not the rounds' (n positive numbers "
                             "whose median is the ratio)")
        out["ratios"] = x
    return out


def check_instrument(hosts, store: Store, workdir: Path, draft: Path, *, layers: int = 16,
                     repetitions: int = 3, max_tokens: int = 64, cost_reps: int = 25,
                     rounds: int = 5,
                     ssh: SSHOptions | None = None, inventory: str | None = None, progress=None,
                     log=print) -> list[NodeCheck]:
    """Sweep the calibration pair of ``draft`` on ``hosts``, measure each node's step costs
    and loop overhead there, and judge each node."""
    workdir = workdir.resolve()
    target = ensure_calibration(draft, workdir / f"calibration-{layers}", layers, log)
    plan = workdir / "calibrate-plan.yml"
    plan.write_text(instrument_plan(target, draft.resolve(), repetitions, max_tokens))
    doc = load_lock(write_lock(load_plan(plan), log))
    result = start_sweep(doc, hosts, store, inventory=inventory, progress=progress,
                         opts=SweepOptions(ssh=ssh or SSHOptions(), provision=False))
    placed = {n.node: n for n in store.sweep_nodes(result.sweep_id)}
    gens: dict[str, list[dict]] = {}  # typed (store.queries); an unreadable one left out
    for s in queries.typed(queries.events(store, [result.sweep_id], ("generation",))):
        gens.setdefault(s.node, []).append(s.event.to_json())
    # a node whose runs were all set aside (contended) still ran: the judge says unverified
    ran = {o.host for o in result.outcomes if o.status in ("ok", "unreliable")}

    async def costs(h, t):
        sn = placed[h.name]
        check_placement(h, expand_root(h.root, await t.home()), sn, result.sweep_id)
        r = await t.run(f"cd {q(sn.agent_dir)} && {q(sn.python)} -m agent costs "
                        f"{q(sn.job_path)} --reps {cost_reps} --rounds {rounds}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    measured = {o.host: o for o in run_fan_out([h for h in hosts if h.name in ran], costs, ssh)}
    out = []
    for h in hosts:
        o = measured.get(h.name)
        if h.name not in ran:
            got = next((x for x in result.outcomes if x.host == h.name), None)
            why = got.detail if got is not None else None
            if got is not None and got.status == "busy":  # nothing measured: no verdict
                out.append(NodeCheck(h.name, "unverified", f"{h.name}: instrument "
                                     f"unverified: the node is busy, nothing measured ({why})"))
                continue
            out.append(NodeCheck(h.name, "failed", f"{h.name}: instrument failed: the "
                                 f"calibration sweep failed here ({why})"))
            continue
        value, problem = node_reading(o.value) if o is not None and o.status == "ok" else \
            (None, o.detail if o is not None else "not measured")
        check = judge(h.name, gens.get(h.name, []), value and value["costs"],
                      value and value["overhead"], value and value["speed"])
        if problem:
            check.line += f" (step costs: {problem})"
        out.append(check)
    if not out:
        raise SpecfleetError("no node to check: the inventory and --limit select no host")
    return out
