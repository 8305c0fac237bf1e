"""The in-process engine: the pair (or a lineup of pairs) loaded once with mlx-lm, a trace
per generation.

A lineup (several targets and drafts) is measured as variants of one engine: a baseline per
target ("autoregressive@target-2") and a speculative variant per pair
("speculative@target-2+draft-3"), so the loop interleaves every pair with its own target's
baseline and each model is loaded once."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

from .engine_api import EngineUnavailable, Request, Slot, Variant
from .job import Job, Workload
from .roofline import bytes_per_token, chip_bandwidth_gbs, kv_bytes_per_position, model_bytes
from .roofline import utilisation as bw_utilisation
from .trace import Trace

BASELINE = Variant("autoregressive", speculative=False)
SPECULATIVE = Variant("speculative", speculative=True)  # draft width from each config


def _chip() -> str | None:
    if sys.platform != "darwin":
        return None
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def lineup_variants(lineup: tuple[tuple[str, str], ...]) -> tuple[Variant, ...]:
    """One pair: the two classic variants. A lineup: a baseline per target, then a
    speculative variant per pair naming its target's baseline."""
    if len(lineup) == 1:
        t, d = lineup[0]
        return (replace(BASELINE, models=(t, None)), replace(SPECULATIVE, models=(t, d)))
    targets = list(dict.fromkeys(t for t, _ in lineup))
    bases = [Variant(f"autoregressive@{t}", speculative=False, models=(t, None))
             for t in targets]
    specs = [Variant(f"speculative@{t}+{d}", speculative=True,
                     reference=f"autoregressive@{t}", models=(t, d)) for t, d in lineup]
    return (*bases, *specs)


class MlxEngine:
    name = "mlx-lm"
    variants_are_configs = False
    holds_all_variants = True  # every model in memory: speculation is a per-call argument
    field_knobs: dict = {}

    def __init__(self, job: Job, loaded: dict):
        """``loaded``: role → (model, tokenizer), every model of the job's lineup."""
        self.job, self.loaded = job, loaded
        self.lineup = job.lineup
        self.variants = lineup_variants(job.lineup)
        self.target, self.tokenizer = loaded[job.lineup[0][0]]
        self.draft = loaded[job.lineup[0][1]][0]
        # prompts as each target's tokenizer encodes them
        self.prompts = {t: {w.name: loaded[t][1].encode(w.prompt) for w in job.workloads}
                        for t in dict.fromkeys(t for t, _ in job.lineup)}
        self.warmed: set[str] = set()
        chip = _chip()
        self.bandwidth_gbs = job.memory_bandwidth_gbs or chip_bandwidth_gbs(chip)
        self.roofs = {(t, d): {"target_bytes": model_bytes(loaded[t][0]),
                               "draft_bytes": model_bytes(loaded[d][0]),
                               "target_kv_bytes_per_token": kv_bytes_per_position(loaded[t][0]),
                               "draft_kv_bytes_per_token": kv_bytes_per_position(loaded[d][0])}
                      for t, d in job.lineup}
        self.roof: dict = {**self.roofs[job.lineup[0]], "chip": chip,
                           "memory_bandwidth_gbs": self.bandwidth_gbs}
        if len(job.lineup) > 1:  # what each model weighs: the lineup's memory story
            self.roof["model_bytes"] = {role: model_bytes(m) for role, (m, _) in loaded.items()}

    @classmethod
    def start(cls, job: Job, journal) -> MlxEngine:
        """Load every model of the job once and say how long it took."""
        import time

        from .checks import load_models

        t = time.perf_counter()
        loaded = load_models(job)
        load_s = time.perf_counter() - t
        engine = cls(job, loaded)
        journal.emit("models_loaded", load_s=round(load_s, 3), **engine.roof)
        return engine

    def _pair(self, variant: Variant) -> tuple[str, str | None]:
        return variant.models or (self.lineup[0][0], self.lineup[0][1]
                                  if variant.speculative else None)

    def activate(self, variant: Variant) -> Variant | None:
        # each model's kernels run once before measuring: the first use of a target warms
        # it up with one of its pairs (a speculative warm-up runs both models)
        t, d = self._pair(variant)
        if {t, d} - {None} <= self.warmed:
            return None
        warm = variant if variant.speculative else next(
            v for v in self.variants if v.speculative and self._pair(v)[0] == t)
        self.warmed |= {r for r in self._pair(warm) if r}
        return warm

    def runtime_pid(self, variant: Variant) -> int | None:
        return None

    def cpu_accounted(self, variant: Variant) -> bool:
        return True  # the model runs in this process

    def prompt_tokens(self, w: Workload) -> int | None:
        return len(self.prompts[self.lineup[0][0]][w.name])  # one target family per job

    def generate(self, req: Request) -> Trace:
        from .generation import generate_trace

        t, d = self._pair(req.variant)
        target, tokenizer = self.loaded[t]
        prompts = self.prompts[t]
        ids = (prompts[req.prompt_key] if req.prompt_key in prompts
               else tokenizer.encode(req.prompt))
        return generate_trace(target, tokenizer, ids, req.config, req.max_tokens,
                              draft_model=self.loaded[d][0] if d else None, seed=req.seed)

    def load_sender(self, variant: Variant, w: Workload, config: dict):
        # an open loop needs a server to queue at; the job parser refuses request_rate here
        raise EngineUnavailable("an open loop (request_rate) needs an http engine")

    def closed_loop(self, variant: Variant, w: Workload, config: dict, concurrency: int,
                    requests: int):
        """Batched autoregressive generation at one batch width, continuously batched as
        mlx_lm.server does: ``concurrency`` sequences in flight, the next request joining
        as one finishes. Speculation cannot be batched by the pinned mlx-lm (its
        BatchGenerator takes no draft model): the job parser lets only autoregressive
        variants ramp."""
        import time

        from mlx_lm.generate import BatchGenerator
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        from .generation import mlx_arguments
        from .load import Outcome

        if variant.speculative:
            raise EngineUnavailable("mlx-lm cannot speculate in a batch")
        t, _ = self._pair(variant)
        model, tokenizer = self.loaded[t]
        ids = self.prompts[t].get(w.name) or tokenizer.encode(w.prompt)
        # every knob a batch can take reaches it; a quantised KV cache cannot be batched
        # by mlx-lm 0.32.2, so such a level fails saying so instead of ignoring it
        sampler_args, logits_args, gen_args, max_kv = mlx_arguments(config, speculative=False)
        if gen_args.get("kv_bits") is not None:
            raise EngineUnavailable("mlx-lm's BatchGenerator cannot quantise the KV cache "
                                    "(kv_bits)")
        gen = BatchGenerator(model, max_tokens=w.max_tokens,
                             stop_tokens=[[e] for e in tokenizer.eos_token_ids],
                             sampler=make_sampler(**sampler_args),
                             logits_processors=make_logits_processors(**logits_args)
                             if logits_args else None,
                             completion_batch_size=concurrency,
                             prefill_batch_size=min(concurrency, 8), max_kv_size=max_kv,
                             **({"prefill_step_size": gen_args["prefill_step_size"]}
                                if "prefill_step_size" in gen_args else {}))
        t0 = time.perf_counter()
        live: dict[int, Outcome] = {}
        out: list[Outcome] = []
        sent = 0

        def add() -> None:
            nonlocal sent
            now = time.perf_counter() - t0
            (uid,) = gen.insert([list(ids)], [w.max_tokens])
            live[uid] = Outcome(now, now)
            sent += 1

        try:
            for _ in range(min(concurrency, requests)):
                add()
            while live:
                responses = gen.next_generated()
                now = time.perf_counter() - t0
                if not responses:
                    break
                for r in responses:
                    o = live.get(r.uid)
                    if o is None:
                        continue
                    if r.finish_reason != "stop":
                        o.chunk_times.append(now - o.sent)
                    if r.finish_reason is not None:
                        o.end = now
                        out.append(live.pop(r.uid))
                        if sent < requests:
                            add()
        finally:
            gen.close()
        for o in live.values():  # the generator stopped with these unfinished
            o.error, o.end = "unfinished when the batch generator stopped", o.end or 0.0
            out.append(o)
        return sorted(out, key=lambda o: o.sent), time.perf_counter() - t0

    def extras(self, m: dict, req: Request) -> dict:
        t, d = self._pair(req.variant)
        r = self.roofs[(t, d)] if d else next(v for (pt, _), v in self.roofs.items()
                                             if pt == t)
        rounds = m.get("verify_rounds") or 0
        ctx = (m["prompt_tokens"] or 0) + m["generated_tokens"] / 2
        if req.variant.speculative and rounds:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx,
                                r["draft_bytes"], r["draft_kv_bytes_per_token"],
                                m["drafted_tokens"] / rounds, m["generated_tokens"] / rounds)
        else:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx)
        u = bw_utilisation(b, m.get("decode_tok_s"), self.bandwidth_gbs)
        out = {"bytes_per_token": round(b), "bandwidth_utilisation":
               None if u is None else round(u, 5)}
        if len(self.lineup) > 1 and m.get("peak_mlx_memory_bytes") is not None:
            # every model of the lineup stays loaded: the process peak holds the others'
            # weights too. A pair's memory is the peak without them (resident, untouched
            # by this generation), so a lighter draft tier shows what it saves.
            others = sum(v for role, v in self.roof["model_bytes"].items()
                         if role not in (t, d))
            out.update(peak_mlx_memory_bytes=m["peak_mlx_memory_bytes"] - others,
                       other_models_resident_bytes=others)
        return out

    def describe(self, slot: Slot) -> tuple[dict, dict]:
        if len(self.lineup) == 1:
            return {}, slot.config
        # a baseline generation belongs to the pair it was measured beside: each pair's
        # results carry their own baseline, and the store files them under that pair
        t, d = self._pair(slot.partner or slot.variant)
        return {"models": {"target": t, "draft": d}}, slot.config

    def explain(self, e: Exception, variant: Variant) -> str:
        return f"{type(e).__name__}: {e}"

    def notices(self, job: Job) -> list[dict]:
        return []

    def close(self) -> None:
        pass
