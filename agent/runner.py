"""Run a job: check the environment, load the pair once, warm up, then the sweep.

Order per workload and repetition: for every candidate config, its baseline
(speculation off, same sampling) runs right before it — A B A C A D — so slow
drift of the machine hits both sides of every comparison.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path

from . import AGENT_VERSION
from .errors import EnvironmentMismatch, ModelLoadError
from .fingerprint import fingerprint
from .job import Job, Workload
from .journal import Journal


def installed_versions() -> dict[str, str | None]:
    out = {}
    for dist in ("mlx", "mlx-lm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def check_environment(job: Job) -> dict:
    """Refuse to measure on the wrong thing: version pins and model fingerprints."""
    versions = installed_versions()
    for dist, want in job.pins.items():
        if versions.get(dist) != want:
            raise EnvironmentMismatch(
                f"{dist} {versions.get(dist)} is installed but the job pins {want}")
    prints = {}
    for role, ref in (("target", job.target), ("draft", job.draft)):
        try:
            got = fingerprint(ref.path)
        except OSError as e:
            raise ModelLoadError(f"{role} model: {e}") from e
        if ref.fingerprint and got != ref.fingerprint:
            raise EnvironmentMismatch(
                f"{role} model at {ref.path} has fingerprint {got}, job expects {ref.fingerprint}")
        prints[role] = got
    return {"versions": versions, "fingerprints": prints}


def load_pair(job: Job):
    from mlx_lm import load

    models = {}
    for role, ref in (("target", job.target), ("draft", job.draft)):
        try:
            models[role] = load(ref.path)
        except Exception as e:  # mlx-lm raises many types for a bad folder
            raise ModelLoadError(f"{role} model at {ref.path} does not load: "
                                 f"{type(e).__name__}: {e}") from e
    (target, tokenizer), (draft, _) = models["target"], models["draft"]
    if target.args.vocab_size != draft.args.vocab_size:
        raise ModelLoadError("target and draft vocabularies differ "
                             f"({target.args.vocab_size} vs {draft.args.vocab_size})")
    return target, draft, tokenizer


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
                for mode in ("baseline", "speculative"):
                    plan.append({"workload": w, "mode": mode, "knob": knob, "knob_value": value,
                                 "config": cfg, "repetition": rep})
    return plan


def _sampling_key(w: Workload, cfg: dict) -> tuple:
    return (w.name, cfg["temperature"], cfg["top_k"], cfg["top_p"], cfg["min_p"])


def _exactness(tokens: list[int], reference: list[int] | None, cfg: dict) -> dict:
    if cfg["temperature"] != 0:
        return {"exact_match": None, "exactness": "sampled", "first_divergence": None}
    if reference is None:
        return {"exact_match": None, "exactness": "reference", "first_divergence": None}
    if tokens == reference:
        return {"exact_match": True, "exactness": "identical", "first_divergence": None}
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b),
                 min(len(tokens), len(reference)))
    return {"exact_match": False, "exactness": "diverged", "first_divergence": first}


def run_job(job: Job, journal: Journal) -> int:
    from .generation import generate_once

    journal.emit("job_started", job_id=job.job_id, agent_version=AGENT_VERSION,
                 host=socket.gethostname(), pid=os.getpid(), platform=sys.platform,
                 machine=platform.machine(), python=platform.python_version(), seed=job.seed)
    env = check_environment(job)
    journal.emit("environment_checked", **env)
    t = time.perf_counter()
    target, draft, tokenizer = load_pair(job)
    journal.emit("models_loaded", load_s=round(time.perf_counter() - t, 3))

    prompts = {w.name: tokenizer.encode(w.prompt) for w in job.workloads}
    first = job.workloads[0]
    generate_once(target, tokenizer, prompts[first.name], job.base, job.warmup_tokens,
                  draft_model=draft, seed=job.seed)  # warm-up, discarded
    plan = build_plan(job)
    journal.emit("plan", total_generations=len(plan), warmup_tokens=job.warmup_tokens,
                 workloads=[{"name": w.name, "prompt_sha256": w.prompt_sha256,
                             "prompt_tokens": len(prompts[w.name]), "max_tokens": w.max_tokens,
                             "kind": w.kind, "context_bucket": w.context_bucket}
                            for w in job.workloads])
    references: dict[tuple, list[int]] = {}
    for i, item in enumerate(plan):
        w, cfg, mode = item["workload"], item["config"], item["mode"]
        m = generate_once(target, tokenizer, prompts[w.name], cfg, w.max_tokens,
                          draft_model=draft if mode == "speculative" else None,
                          seed=job.seed + item["repetition"], decode_skip=job.decode_skip_tokens)
        key = _sampling_key(w, cfg)
        exact = _exactness(m["token_ids"], references.get(key), cfg)
        references.setdefault(key, m["token_ids"])
        journal.emit("generation", run_index=i, workload=w.name, workload_kind=w.kind,
                     context_bucket=w.context_bucket, prompt_sha256=w.prompt_sha256, mode=mode,
                     knob=item["knob"], knob_value=item["knob_value"],
                     num_draft_tokens=cfg["num_draft_tokens"] if mode == "speculative" else 0,
                     config=cfg, repetition=item["repetition"], max_tokens=w.max_tokens,
                     seed=job.seed + item["repetition"], **exact, **m)
    journal.emit("job_finished", status="ok", generations=len(plan))
    return 0


def main_run(job_path: Path, journal_path: Path | None, echo: bool = True) -> int:
    from .errors import AgentError
    from .job import load_job

    journal_path = journal_path or job_path.with_suffix(".events.jsonl")
    journal = Journal(journal_path, echo=sys.stdout if echo else None)
    try:
        job = load_job(job_path)
        return run_job(job, journal)
    except AgentError as e:
        journal.emit("job_failed", error=e.kind, message=str(e), exit_code=e.exit_code)
        print(f"agent: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # anything else is a bug, but it must still reach the journal
        journal.emit("job_failed", error="crash", message=f"{type(e).__name__}: {e}",
                     exit_code=70)
        raise
    finally:
        journal.close()
