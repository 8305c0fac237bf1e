"""The one measuring loop, for every engine.

Plan, warm-up, interleaving with the baseline, seeds, ``--resume``, exactness, quality
tasks, soak and summaries live here. An engine (in-process mlx-lm, a runtime behind an
HTTP API) only makes its variants ready and turns a request into a ``Trace``; the metrics
come from ``trace.metrics`` for both.

Order per workload and repetition: every candidate (a speculative variant at one knob
setting) runs right after its baseline at the same setting — A B A C A D — so slow drift
of the machine hits both sides of every comparison. An engine that cannot hold every
variant at once (runtimes the agent starts and stops itself) runs the same generations in
blocks: per repetition, each variant's generations together, baseline first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .adaptive import resolved
from .adaptive_loop import Adaptive
from .engine_api import Engine, EngineUnavailable, Request, Slot, Variant
from .job import Job
from .journal import Journal
from .protocol import EXIT_CODES, KNOBS, baseline_key, normal_config
from .summary import emit_summaries, exactness
from .telemetry.sampler import SAMPLE_KEYS
from .trace import metrics, not_applied

SAMPLE_FIELDS = ("ts", *SAMPLE_KEYS)  # one telemetry sample inside a generation event
# what a background profile causes on purpose (contention, swap, pressure) does not set its
# runs aside; throttling, battery and Low Power Mode still do
BUSY_BY_DESIGN = ("contended", "swapped", "memory pressure")


# -- the plan ---------------------------------------------------------------------------

def candidates(job: Job, engine: Engine) -> list[tuple[str | None, Any, dict, dict]]:
    """(knob, value, config, request fields): one knob at a time around the base config,
    without repeating a setting. No knob at all: the base config alone."""
    seen, out = set(), []
    for knob, values in {**job.knobs, **engine.field_knobs}.items():
        for v in values:
            if knob in engine.field_knobs:
                cfg, fields = dict(job.base), {knob: v}
            else:
                cfg, fields = normal_config({**job.base, knob: v}), {}
            key = json.dumps([cfg, fields], sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                out.append((knob, v, cfg, fields))
    return out or [(None, None, dict(job.base), {})]


def config_for(job: Job, v: Variant, cfg: dict) -> dict:
    """A knob setting as a variant runs it: a baseline with speculation off (and the job's
    baseline overrides), a variant that fixes its draft width with that width."""
    if not v.speculative:
        return normal_config({**cfg, **job.baseline, "num_draft_tokens": 0})
    if v.num_draft_tokens is not None:
        return {**cfg, "num_draft_tokens": v.num_draft_tokens}
    return dict(cfg)


def build_plan(job: Job, engine: Engine) -> list[Slot]:
    variants = list(engine.variants)
    by_name = {v.name: v for v in variants}
    first = variants[0] if variants and not variants[0].speculative else None
    # a lineup has one baseline per target: each candidate names its own
    named = {v.reference for v in variants if v.reference}
    others: list[Variant | None] = [v for v in variants
                                    if v is not first and v.name not in named]
    plan: list[Slot] = []
    for w in job.workloads:
        for rep in range(job.repetitions):
            for knob, value, cfg, fields in candidates(job, engine):
                # each candidate after its reference; only a reference: it alone
                for v in others or [None]:
                    reference = by_name[v.reference] if v is not None and v.reference \
                        else first
                    pair = [x for x in (reference, v) if x is not None]
                    for var in pair:
                        c = config_for(job, var, cfg)
                        k, kv = (knob, value) if knob else (
                            ("variant", var.name) if engine.variants_are_configs
                            else ("num_draft_tokens", cfg["num_draft_tokens"]))
                        plan.append(Slot(w, var, k, kv, c, fields, rep,
                                         reference.name if reference else None, v or var))
    if engine.holds_all_variants:
        return plan
    order = {v.name: i for i, v in enumerate(variants)}  # stable: plan order within a block
    return sorted(plan, key=lambda s: (s.repetition, order[s.variant.name]))


def previous_events(journal_path: Path, job_id: str, typ: str = "generation",
                    mine: Callable[[bytes], bool] | None = None) -> list[dict]:
    """Events of one type this job already journaled (for ``--resume``); with ``mine`` (a
    keyed journal's check) only the lines its agents signed: a forged line skips no run."""
    out: list[dict] = []
    if not journal_path.exists():
        return out
    for line in journal_path.read_bytes().splitlines():
        if mine is not None and not mine(line):
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("job_id") == job_id and e.get("type") == typ:
            out.append(e)
    return out


def compared(g: dict) -> list:
    """What exactness compares for a generation: its token ids where they are known, else
    its characters; tool calls after either (a speculative runtime must reproduce them)."""
    units: list = (g["token_ids"] if g.get("first_divergence_unit") != "character"
                   else list(g.get("output_text") or ""))
    return units + [json.dumps([c["name"], c["arguments"]]) for c in g.get("tool_calls") or []]


# -- measuring ----------------------------------------------------------------------------

class Loop:
    def __init__(self, job: Job, journal: Journal, engine: Engine, sampler):
        self.job, self.journal, self.engine, self.sampler = job, journal, engine, sampler
        self.cotenant = None  # the job's background load (agent.cotenant.CoTenant), if any
        self.active: str | None = None
        self.down: dict[str, str] = {}   # variant → why it cannot be made ready
        self.warmups = 0

    def ready(self, v: Variant) -> str | None:
        """Make ``v`` the active variant (warming it up if the engine asks); the reason
        when it cannot be."""
        if v.name in self.down:
            return self.down[v.name]
        if self.active == v.name:
            return None
        self.active = None  # activating one variant may stop another (blocks)
        try:
            warm = self.engine.activate(v)
        except EngineUnavailable as e:
            self.down[v.name] = str(e)
            return str(e)
        if warm:
            w = self.job.workloads[0]
            try:
                self.engine.generate(Request(warm, w.prompt, self.job.warmup_tokens,
                                             config_for(self.job, warm, self.job.base),
                                             self.job.seed,
                                             tools=w.tools, prompt_key=w.name))
                self.warmups += 1
            except Exception as e:  # said, not fatal: each generation then fails or not
                self.journal.emit("notice", variant=warm.name, message="warm-up failed: "
                                  + self.engine.explain(e, warm))
        self.active = v.name
        self.sampler.watch(self.engine.runtime_pid(v), self.engine.cpu_accounted(v))
        return None

    def cotenant_shortfall(self) -> list[str]:
        """A busy run is measured beside the declared load, or set aside saying why not."""
        return self.cotenant.shortfall() if self.cotenant is not None else []

    def measure(self, req: Request) -> dict:
        from .telemetry import summarise_window, unreliable_reasons
        from .telemetry.sampler import contention_reading

        start = self.sampler.mark()
        t = self.engine.generate(req)
        window = self.sampler.window(start, self.sampler.mark())
        m = metrics(t, speculative=req.variant.speculative,
                    num_draft_tokens=req.config.get("num_draft_tokens") or 0,
                    max_tokens=req.max_tokens, decode_skip=self.job.decode_skip_tokens)
        tele = summarise_window(window)
        reasons = unreliable_reasons(tele, self.job.contention_threshold)
        if self.job.background:  # the load is the experiment: what it causes is the result
            reasons = [r for r in reasons if not r.startswith(BUSY_BY_DESIGN)]
        reasons += self.cotenant_shortfall() + not_applied(m, req.config)
        hit = contention_reading(tele, self.job.contention_threshold)
        if hit and not self.job.background:
            m["contention"] = hit  # set aside for it, as fields: all taken, and each cause
        m.update(tele, unreliable=bool(reasons), unreliable_reasons=reasons,
                 telemetry=[{k: s.get(k) for k in SAMPLE_FIELDS} for s in window])
        m.update(self.engine.extras(m, req))
        m["first_divergence_unit"] = "token" if t.token_ids is not None else "character"
        return m

    def request(self, slot: Slot, seed: int) -> Request:
        w = slot.workload
        return Request(slot.variant, w.prompt, w.max_tokens, slot.config, seed, slot.fields,
                       w.tools, prompt_key=w.name)

    # -- a sweep ----------------------------------------------------------------------

    def sweep(self, resume: bool) -> int:
        job, journal, engine = self.job, self.journal, self.engine
        plan = build_plan(job, engine)
        done = {g["run_index"]: g for g in (previous_events(journal.path, job.job_id,
                                                            mine=journal.mine)
                                            if resume else [])}
        for notice in engine.notices(job):
            journal.emit("notice", **notice)
        journal.emit("plan", total_generations=len(plan), already_done=len(done),
                     engine=engine.name, variants=[v.name for v in engine.variants],
                     order="interleaved" if engine.holds_all_variants else "blocks",
                     **({"adaptive": resolved(job.adaptive, job.repetitions)}
                        if job.adaptive else {}),
                     warmup_tokens=job.warmup_tokens, repetitions=job.repetitions,
                     workloads=[{"name": w.name, "prompt_sha256": w.prompt_sha256,
                                 "prompt_tokens": engine.prompt_tokens(w),
                                 "max_tokens": w.max_tokens, "kind": w.kind,
                                 "context_bucket": w.context_bucket} for w in job.workloads])
        refs: dict[tuple, list] = {}
        outputs: dict[tuple, dict] = {}
        gens: list[dict] = []
        adapt = Adaptive(job, engine, journal) if job.adaptive else None
        for i, slot in enumerate(plan):
            w, cfg = slot.workload, slot.config
            if adapt is not None and adapt.skip(slot):
                continue
            # outputs are compared with the same target's baseline (a lineup has several)
            key = (slot.reference, w.name, baseline_key(cfg))
            reference = slot.reference
            if i in done:  # resumed: its numbers are in the journal already
                g = done[i]
                if slot.variant.name == reference:
                    refs.setdefault(key, compared(g))
                gens.append(g)
                if adapt is not None:
                    adapt.measured(slot, g)
                continue
            names, event_cfg = engine.describe(slot)
            seed = job.seed + slot.repetition
            desc = {"run_index": i, "workload": w.name, "workload_kind": w.kind,
                    "context_bucket": w.context_bucket, "prompt_sha256": w.prompt_sha256,
                    "mode": slot.mode, **names, "knob": slot.knob, "knob_value": slot.knob_value,
                    "num_draft_tokens": cfg["num_draft_tokens"] if slot.variant.speculative
                    else 0, "config": event_cfg, "repetition": slot.repetition,
                    "max_tokens": w.max_tokens, "seed": seed}
            why = self.ready(slot.variant)
            if why:
                journal.emit("generation_failed", **desc, error=why)
                continue
            try:
                m = self.measure(self.request(slot, seed))
            except Exception as e:  # one bad config or reply must not sink the others
                journal.emit("generation_failed", **desc,
                             error=self.engine.explain(e, slot.variant))
                continue
            out = compared(m)
            exact = exactness(out, refs.get(key), cfg)
            if slot.variant.name == reference:
                refs.setdefault(key, out)
            outputs.setdefault((slot.variant.name, w.name, slot.knob), {}).setdefault(
                json.dumps(slot.knob_value, default=str), []).append(
                (cfg, m["output_text"] + json.dumps(m.get("tool_calls") or [])))
            gens.append(journal.emit("generation", **desc, **exact, **m))
            if adapt is not None:
                adapt.measured(slot, gens[-1])
        self.knob_effects(outputs)
        emit_summaries(job, journal, gens)
        if job.quality_tasks:
            self.quality(plan)
        levels = self.load_levels(resume) if job.load else 0
        skipped = adapt.skipped if adapt is not None else 0
        journal.emit("job_finished", status="ok", generations=len(gens), engine=engine.name,
                     failed=len(plan) - len(gens) - skipped, warmups=self.warmups,
                     **({"load_levels": levels} if job.load else {}),
                     **({"adaptive": {"planned_at_most": len(plan), "skipped": skipped}}
                        if adapt is not None else {}))
        return EXIT_CODES["ok"]

    def knob_effects(self, outputs: dict) -> None:
        """A sampling knob swept over sampled output must change it; identical output at
        every setting means the engine ignored it (e.g. a runtime dropping temperature)."""
        for (variant, workload, knob), by_value in outputs.items():
            if knob not in KNOBS or KNOBS[knob].kind not in ("sampler", "logits") \
                    or len(by_value) < 2:
                continue
            runs = [r for rs in by_value.values() for r in rs]
            if not any(cfg.get("temperature", 0) > 0 for cfg, _ in runs):
                continue  # greedy at every setting: a sampling knob rightly changes nothing
            if len({text for _, text in runs}) == 1:
                values = sorted((json.loads(v) for v in by_value), key=str)
                self.journal.emit("knob_effect", variant=variant, workload=workload, knob=knob,
                                  values=values, effect=False,
                                  message=f"knob had no effect: {knob} in {values} gave "
                                          "identical output")

    # -- load levels ------------------------------------------------------------------

    def load_levels(self, resume: bool) -> int:
        """After the sweep: each variant under rising load, closed loop (concurrency) then
        open loop (request_rate), one ``load_level`` event per level; a variant's ramp stops
        at the first level that saturates, with the reason. Baseline and speculative
        variants meet the same levels (per level when the engine holds every variant, else
        per variant, so that one runtime runs at a time)."""
        from .load import no_gain, open_loop, saturation, summarize
        from .telemetry import summarise_window, unreliable_reasons

        job, journal, engine = self.job, self.journal, self.engine
        spec = job.load
        names = {w.name: w for w in job.workloads}
        w = names.get(str(spec.get("workload")), job.workloads[0])
        n = int(spec.get("requests", 16))
        done = {(e["variant"], e["load"], e["level"]) for e in (
            previous_events(journal.path, job.job_id, "load_level", journal.mine)
            if resume else [])}
        ramps = [(load, level) for load in ("concurrency", "request_rate")
                 for level in spec.get(load, [])]
        # in process only autoregressive variants ramp (the parser saw to it): a batch
        # cannot speculate in the pinned mlx-lm
        ramped = [v for v in engine.variants
                  if v.name in spec.get("variants", [v.name for v in engine.variants])]
        order = ([(v, r) for r in ramps for v in ramped] if engine.holds_all_variants
                 else [(v, r) for v in ramped for r in ramps])
        history: dict[tuple[str, str], list[dict]] = {}
        stopped: dict[tuple[str, str], str] = {}
        count = 0
        for v, (load, level) in order:
            if (v.name, load) in stopped or (v.name, load, level) in done:
                continue
            desc = {"workload": w.name, "variant": v.name,
                    "mode": "speculative" if v.speculative else "baseline",
                    "load": load, "level": level, "max_tokens": w.max_tokens}
            why = self.ready(v)
            if why:
                journal.emit("load_level", **desc, status="failed", error=why)
                stopped[(v.name, load)] = why
                continue
            cfg = config_for(job, v, job.base)
            start = self.sampler.mark()
            if load == "concurrency":
                outcomes, wall = engine.closed_loop(v, w, cfg, int(level), n)
            else:
                outcomes, wall = open_loop(engine.load_sender(v, w, cfg), float(level), n,
                                           spec.get("arrivals", "poisson"),
                                           int(spec.get("max_concurrency", 64)), job.seed)
            window = self.sampler.window(start, self.sampler.mark())
            m = summarize(outcomes, wall, spec.get("slo"), closed=load == "concurrency")
            tele = summarise_window(window)
            swaps = [x.get("swap_used_bytes") for x in window
                     if x.get("swap_used_bytes") is not None]
            m.update({k: tele.get(k) for k in ("rss_peak_bytes", "swap_in_bytes",
                                               "memory_pressure", "cpu_other_share",
                                               "cpu_controller_share", "cpu_steal_share")})
            # every number carries its reliability: a throttled or contended level is shown,
            # never a knee, a cap or a rule's evidence (what a background profile causes is
            # the experiment, as in the sweep)
            reasons = unreliable_reasons(tele, job.contention_threshold)
            if job.background:
                reasons = [r for r in reasons if not r.startswith(BUSY_BY_DESIGN)]
            reasons += self.cotenant_shortfall()
            m.update(unreliable=bool(reasons), unreliable_reasons=reasons)
            ramp = history.setdefault((v.name, load), [])
            ramp.append(m)
            why = saturation(ramp, load, float(level) if load == "request_rate" else None)
            if not why and len(swaps) >= 3 and all(b > a for a, b in zip(swaps, swaps[1:])):
                why = f"swap grew at every sample ({swaps[0]} → {swaps[-1]} bytes)"
            journal.emit("load_level", **desc, status="saturated" if why else "ok",
                         arrivals=spec.get("arrivals", "poisson") if load == "request_rate"
                         else None, stop_reason=why, **m)
            count += 1
            if why:
                stopped[(v.name, load)] = why
        for (name, load), ramp in history.items():
            gain = no_gain(ramp, spec.get(load, []))
            if load == "concurrency" and gain:  # saturated or not: it says why
                journal.emit("notice", variant=name, workload=w.name, message=gain)
        return count

    # -- quality tasks ----------------------------------------------------------------

    def quality(self, plan: list[Slot]) -> None:
        """Each distinct config answers the frozen task set once, greedily."""
        from .quality import check

        configs: dict[str, Slot] = {}
        for s in plan:
            key = json.dumps([s.variant.name, {**s.config, "temperature": 0.0}, s.fields],
                             sort_keys=True, default=str)
            configs.setdefault(key, s)
        for s in configs.values():
            cfg = {**s.config, "temperature": 0.0}
            names, event_cfg = self.engine.describe(s)
            if "models" in names and not s.variant.speculative:  # a target's baseline
                names = {**names, "models": {"target": names["models"]["target"]}}
            if not s.variant.speculative:  # the baseline answers once, whatever its partner
                names.pop("method", None)
            results = []
            why = self.ready(s.variant)
            for task in self.job.quality_tasks:
                if why:
                    results.append({"task": task["id"], "passed": False, "reason": why})
                    continue
                try:
                    t = self.engine.generate(Request(s.variant, task["prompt"],
                                                     task["max_tokens"], cfg, self.job.seed,
                                                     s.fields))
                    results.append(check(task, t.output_text))
                except Exception as e:  # that task fails; the others still answer
                    results.append({"task": task["id"], "passed": False,
                                    "reason": self.engine.explain(e, s.variant)})
            passed = sum(r["passed"] for r in results)
            self.journal.emit("quality", mode=s.mode, **names,
                              num_draft_tokens=cfg["num_draft_tokens"]
                              if s.variant.speculative else 0,
                              config={**event_cfg, "temperature": 0.0}, tasks=len(results),
                              passed=passed,
                              pass_rate=round(passed / len(results), 4) if results else None,
                              results=results)

    # -- soak -------------------------------------------------------------------------

    def soak(self, variant: Variant) -> int:
        from .soak import run_soak

        job, journal = self.job, self.journal
        names = {w.name: w for w in job.workloads}
        w = names.get(str(job.soak.get("workload")), job.workloads[0])
        k = (variant.num_draft_tokens if variant.num_draft_tokens is not None
             else job.soak.get("num_draft_tokens", job.base["num_draft_tokens"])
             if variant.speculative else 0)
        cfg = {**job.base, "num_draft_tokens": k or 1}
        max_tokens = int(job.soak.get("max_tokens", w.max_tokens))
        why = self.ready(variant)
        if why:
            journal.emit("soak_result", workload=w.name, num_draft_tokens=k, status="fail",
                         reasons=[why], generations=0)
            journal.emit("job_finished", status="soak_failed", generations=0, reasons=[why])
            return EXIT_CODES["soak_failed"]
        req = Request(variant, w.prompt, max_tokens, cfg, job.seed, prompt_key=w.name)
        result = run_soak(job, journal, self.sampler, lambda: self.measure(req))
        names_, _ = self.engine.describe(Slot(w, variant, "", None, cfg, {}, 0))
        # whose memory the verdict judged: the runtime the agent started, or the agent
        journal.emit("soak_result", workload=w.name, num_draft_tokens=k, **names_, **result,
                     memory_of="runtime" if self.engine.runtime_pid(variant) else "agent")
        journal.emit("job_finished", status="ok" if result["status"] == "pass" else "soak_failed",
                     generations=result["generations"], reasons=result["reasons"])
        return EXIT_CODES["ok"] if result["status"] == "pass" else EXIT_CODES["soak_failed"]
