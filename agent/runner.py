"""Run a job: check the environment, load the pair once, warm up, then sweep or soak.

Order per workload and repetition: for every candidate config, its baseline
(speculation off, same sampling) runs right before it — A B A C A D — so slow
drift of the machine hits both sides of every comparison.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import AGENT_VERSION
from .checks import check_environment, load_pair
from .job import Job, Workload
from .journal import Journal
from .protocol import EVENT_SCHEMA, EXIT_CODES, SAMPLING_DEFAULTS
from .roofline import bytes_per_token, chip_bandwidth_gbs, kv_bytes_per_position, model_bytes
from .roofline import utilisation as bw_utilisation
from .summary import emit_summaries, exactness
from .telemetry.sampler import SAMPLE_KEYS

SAMPLE_FIELDS = ("ts", *SAMPLE_KEYS)  # one telemetry sample inside a generation event


def candidate_configs(job: Job) -> list[tuple[str, object, dict]]:
    """One knob at a time around the base config, without repeating a config."""
    seen, out = set(), []
    for knob, values in job.knobs.items():
        for v in values:
            cfg = {**job.base, knob: v}
            key = tuple(sorted(cfg.items()))
            if key not in seen:
                seen.add(key)
                out.append((knob, v, cfg))
    return out


def build_plan(job: Job) -> list[dict]:
    plan = []
    for w in job.workloads:
        for rep in range(job.repetitions):
            for knob, value, cfg in candidate_configs(job):
                # speculation off: the baseline's config differs from its candidate's only
                # in num_draft_tokens (and what the job's "baseline" overrides)
                base_cfg = {**cfg, **job.baseline, "num_draft_tokens": 0}
                plan.append({"workload": w, "mode": "baseline", "knob": knob,
                             "knob_value": value, "config": base_cfg, "repetition": rep})
                plan.append({"workload": w, "mode": "speculative", "knob": knob,
                             "knob_value": value, "config": cfg, "repetition": rep})
    return plan


def _sampling_key(w: Workload, cfg: dict) -> tuple:
    return (w.name, *(cfg.get(k) for k in SAMPLING_DEFAULTS))


def _chip() -> str | None:
    if sys.platform != "darwin":
        return None
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                              text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def previous_generations(journal_path: Path, job_id: str) -> list[dict]:
    """Generation events this job already journaled (for ``--resume``)."""
    out: list[dict] = []
    if not journal_path.exists():
        return out
    for line in journal_path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("job_id") == job_id and e.get("type") == "generation":
            out.append(e)
    return out


class Sweep:
    """The loaded pair plus what every generation needs to be measured and described."""

    def __init__(self, job: Job, journal: Journal, target, draft, tokenizer, sampler):
        self.job, self.journal, self.sampler = job, journal, sampler
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.prompts = {w.name: tokenizer.encode(w.prompt) for w in job.workloads}
        chip = _chip()
        self.bandwidth_gbs = job.memory_bandwidth_gbs or chip_bandwidth_gbs(chip)
        self.roof: dict = {"target_bytes": model_bytes(target), "draft_bytes": model_bytes(draft),
                     "target_kv_bytes_per_token": kv_bytes_per_position(target),
                     "draft_kv_bytes_per_token": kv_bytes_per_position(draft),
                     "chip": chip, "memory_bandwidth_gbs": self.bandwidth_gbs}

    def measure(self, w: Workload, cfg: dict, speculative: bool, seed: int,
                max_tokens: int | None = None, prompt_ids=None) -> dict:
        from .generation import generate_once
        from .telemetry import summarise_window, unreliable_reasons

        start = self.sampler.mark()
        m = generate_once(self.target, self.tokenizer, prompt_ids or self.prompts[w.name], cfg,
                          max_tokens or w.max_tokens, draft_model=self.draft if speculative
                          else None, seed=seed, decode_skip=self.job.decode_skip_tokens)
        window = self.sampler.window(start, self.sampler.mark())
        t = summarise_window(window)
        reasons = unreliable_reasons(t)
        m.update(t, unreliable=bool(reasons), unreliable_reasons=reasons,
                 telemetry=[{k: s.get(k) for k in SAMPLE_FIELDS} for s in window])
        m.update(self._roofline(m, speculative))
        return m

    def _roofline(self, m: dict, speculative: bool) -> dict:
        r = self.roof
        rounds = m.get("verify_rounds") or 0
        ctx = m["prompt_tokens"] + m["generated_tokens"] / 2
        if speculative and rounds:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx,
                                r["draft_bytes"], r["draft_kv_bytes_per_token"],
                                m["drafted_tokens"] / rounds, m["generated_tokens"] / rounds)
        else:
            b = bytes_per_token(r["target_bytes"], r["target_kv_bytes_per_token"], ctx)
        u = bw_utilisation(b, m.get("decode_tok_s"), self.bandwidth_gbs)
        return {"bytes_per_token": round(b), "bandwidth_utilisation":
                None if u is None else round(u, 5)}


def run_job(job: Job, journal: Journal, *, cache_file: Path, resume: bool = False) -> int:
    from .telemetry import Sampler

    journal.job_id = job.job_id
    journal.emit("job_started", agent_version=AGENT_VERSION, event_schema=EVENT_SCHEMA,
                 host=socket.gethostname(),
                 pid=os.getpid(), platform=sys.platform, machine=platform.machine(),
                 python=platform.python_version(), seed=job.seed, mode=job.mode, resume=resume)
    journal.emit("environment_checked", **check_environment(job, cache_file))
    if job.engine:  # a runtime behind an HTTP API serves the pair; nothing to load here
        from .httpsweep import run_http_job

        return run_http_job(job, journal)
    t = time.perf_counter()
    target, draft, tokenizer = load_pair(job)
    load_s = time.perf_counter() - t
    with Sampler(job.telemetry_interval_s) as sampler:
        sweep = Sweep(job, journal, target, draft, tokenizer, sampler)
        journal.emit("models_loaded", load_s=round(load_s, 3), **sweep.roof)
        first = job.workloads[0]
        sweep.measure(first, job.base, True, job.seed, max_tokens=job.warmup_tokens)  # warm-up
        if job.mode == "soak":
            return _soak(job, journal, sweep)
        return _sweep(job, journal, sweep, resume)


def _soak(job: Job, journal: Journal, sweep: Sweep) -> int:
    from .soak import run_soak

    names = {w.name: w for w in job.workloads}
    w = names.get(str(job.soak.get("workload")), job.workloads[0])
    k = job.soak.get("num_draft_tokens", job.base["num_draft_tokens"])
    cfg = {**job.base, "num_draft_tokens": k or 1}
    max_tokens = int(job.soak.get("max_tokens", w.max_tokens))
    result = run_soak(job, journal, sweep.sampler,
                      lambda: sweep.measure(w, cfg, bool(k), job.seed, max_tokens=max_tokens))
    journal.emit("soak_result", workload=w.name, num_draft_tokens=k, **result)
    journal.emit("job_finished", status="ok" if result["status"] == "pass" else "soak_failed",
                 generations=result["generations"], reasons=result["reasons"])
    return EXIT_CODES["ok"] if result["status"] == "pass" else EXIT_CODES["soak_failed"]


def _sweep(job: Job, journal: Journal, sweep: Sweep, resume: bool) -> int:
    plan = build_plan(job)
    done = {g["run_index"]: g for g in (previous_generations(journal.path, job.job_id)
                                        if resume else [])}
    journal.emit("plan", total_generations=len(plan), already_done=len(done),
                 warmup_tokens=job.warmup_tokens, repetitions=job.repetitions,
                 workloads=[{"name": w.name, "prompt_sha256": w.prompt_sha256,
                             "prompt_tokens": len(sweep.prompts[w.name]),
                             "max_tokens": w.max_tokens, "kind": w.kind,
                             "context_bucket": w.context_bucket} for w in job.workloads])
    references: dict[tuple, list[int]] = {}
    gens: list[dict] = []
    for i, item in enumerate(plan):
        w, cfg, mode = item["workload"], item["config"], item["mode"]
        key = _sampling_key(w, cfg)
        if i in done:  # resumed: its numbers are in the journal already
            g = done[i]
            if mode == "baseline":
                references.setdefault(key, g["token_ids"])
            gens.append(g)
            continue
        seed = job.seed + item["repetition"]
        desc = {"run_index": i, "workload": w.name, "workload_kind": w.kind,
                "context_bucket": w.context_bucket, "prompt_sha256": w.prompt_sha256,
                "mode": mode, "knob": item["knob"], "knob_value": item["knob_value"],
                "num_draft_tokens": cfg["num_draft_tokens"] if mode == "speculative" else 0,
                "config": cfg, "repetition": item["repetition"], "max_tokens": w.max_tokens,
                "seed": seed}
        try:
            m = sweep.measure(w, cfg, mode == "speculative", seed)
        except Exception as e:  # a config mlx-lm rejects must not sink the other configs
            journal.emit("generation_failed", **desc, error=f"{type(e).__name__}: {e}")
            continue
        exact = {**exactness(m["token_ids"], references.get(key), cfg),
                 "first_divergence_unit": "token"}
        if mode == "baseline":
            references.setdefault(key, m["token_ids"])
        gens.append(journal.emit("generation", **desc, **exact, **m))
    emit_summaries(job, journal, gens)
    if job.quality_tasks:
        _quality(job, journal, sweep)
    journal.emit("job_finished", status="ok", generations=len(gens),
                 failed=len(plan) - len(gens))
    return 0


def _quality(job: Job, journal: Journal, sweep: Sweep) -> None:
    """Each distinct config answers the frozen task set once, greedily."""
    from .quality import check

    configs: dict[tuple, dict] = {("baseline", 0): {**job.base, **job.baseline,
                                                    "num_draft_tokens": 0}}
    for knob, value, cfg in candidate_configs(job):
        configs[("speculative", cfg["num_draft_tokens"], knob, json.dumps(value))] = cfg
    tasks = job.quality_tasks
    for key, cfg in configs.items():
        results = []
        for task in tasks:
            ids = sweep.tokenizer.encode(task["prompt"])
            w = Workload(name=task["id"], prompt=task["prompt"], max_tokens=task["max_tokens"],
                         prompt_sha256="")
            m = sweep.measure(w, {**cfg, "temperature": 0.0}, key[0] == "speculative", job.seed,
                              prompt_ids=ids)
            results.append(check(task, m["output_text"]))
        passed = sum(r["passed"] for r in results)
        journal.emit("quality", mode=key[0], num_draft_tokens=key[1] if key[0] != "baseline"
                     else 0, config=cfg, tasks=len(results), passed=passed,
                     pass_rate=round(passed / len(results), 4) if results else None,
                     results=results)


def main_run(job_path: Path, journal_path: Path | None, *, echo: bool = True,
             resume: bool = False, lock_path: Path | None = None,
             cache_dir: Path | None = None) -> int:
    from .errors import AgentError
    from .job import load_job
    from .lock import NodeLock

    home = Path(os.path.expanduser("~/.specfleet"))
    journal_path = journal_path or job_path.with_suffix(".events.jsonl")
    journal = Journal(journal_path, echo=sys.stdout if echo else None)
    try:
        job = load_job(job_path)
        journal.job_id = job.job_id
        with NodeLock(lock_path or home / "agent.lock", job.job_id):
            return run_job(job, journal, resume=resume,
                           cache_file=(cache_dir or home / "cache") / "fingerprints.json")
    except AgentError as e:
        journal.emit("job_failed", error=e.kind, message=str(e), exit_code=e.exit_code)
        print(f"agent: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # anything else is a bug, but it must still reach the journal
        import traceback

        journal.emit("job_failed", error="crash", message=f"{type(e).__name__}: {e}",
                     exit_code=EXIT_CODES["crash"])
        traceback.print_exc()  # for whoever reads the node's log; the exit code says crash
        return EXIT_CODES["crash"]
    finally:
        journal.close()
