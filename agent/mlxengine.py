"""The in-process engine: the pair loaded once with mlx-lm, a trace per generation."""

from __future__ import annotations

import subprocess
import sys

from .job import Job, Workload
from .loop import Request, Slot, Variant
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


class MlxEngine:
    name = "mlx-lm"
    variants: tuple[Variant, ...] = (BASELINE, SPECULATIVE)
    holds_all_variants = True  # one pair in memory: speculation is a per-call argument
    field_knobs: dict = {}

    def __init__(self, job: Job, target, draft, tokenizer):
        self.job, self.target, self.draft, self.tokenizer = job, target, draft, tokenizer
        self.prompts = {w.name: tokenizer.encode(w.prompt) for w in job.workloads}
        self.warmed = False
        chip = _chip()
        self.bandwidth_gbs = job.memory_bandwidth_gbs or chip_bandwidth_gbs(chip)
        self.roof: dict = {"target_bytes": model_bytes(target), "draft_bytes": model_bytes(draft),
                           "target_kv_bytes_per_token": kv_bytes_per_position(target),
                           "draft_kv_bytes_per_token": kv_bytes_per_position(draft),
                           "chip": chip, "memory_bandwidth_gbs": self.bandwidth_gbs}

    def activate(self, variant: Variant) -> Variant | None:
        # one warm-up, speculative, runs both models' kernels once
        first, self.warmed = not self.warmed, True
        return SPECULATIVE if first else None

    def runtime_pid(self, variant: Variant) -> int | None:
        return None

    def cpu_accounted(self, variant: Variant) -> bool:
        return True  # the model runs in this process

    def prompt_tokens(self, w: Workload) -> int | None:
        return len(self.prompts[w.name])

    def generate(self, req: Request) -> Trace:
        from .generation import generate_trace

        ids = (self.prompts[req.prompt_key] if req.prompt_key in self.prompts
               else self.tokenizer.encode(req.prompt))
        return generate_trace(self.target, self.tokenizer, ids, req.config, req.max_tokens,
                              draft_model=self.draft if req.variant.speculative else None,
                              seed=req.seed)

    def extras(self, m: dict, req: Request) -> dict:
        r = self.roof
        rounds = m.get("verify_rounds") or 0
        ctx = (m["prompt_tokens"] or 0) + m["generated_tokens"] / 2
        if req.variant.speculative and rounds:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx,
                                r["draft_bytes"], r["draft_kv_bytes_per_token"],
                                m["drafted_tokens"] / rounds, m["generated_tokens"] / rounds)
        else:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx)
        u = bw_utilisation(b, m.get("decode_tok_s"), self.bandwidth_gbs)
        return {"bytes_per_token": round(b), "bandwidth_utilisation":
                None if u is None else round(u, 5)}

    def describe(self, slot: Slot) -> tuple[dict, dict]:
        return {}, slot.config

    def explain(self, e: Exception, variant: Variant) -> str:
        return f"{type(e).__name__}: {e}"

    def notices(self, job: Job) -> list[dict]:
        return []

    def close(self) -> None:
        pass
