"""Harness efficiency: share of wall time spent inside measured generations.

Runs the agent on a sweep of 4 draft widths × 3 workloads × N repetitions (baselines
interleaved) and compares the share with the naive way: one `mlx_lm.generate` process
per config, which reloads the pair every time. Target for the agent: ≥ 90%.

    .venv/bin/python bench/harness_efficiency.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.sweep.jobspec import build_job  # noqa: E402


def agent_share(job_path: Path, d: Path) -> tuple[float, float, int]:
    journal = d / "events.jsonl"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agent", "run", str(job_path), "--journal",
                    str(journal), "--quiet", "--lock", str(d / "lock"), "--cache-dir",
                    str(d / "cache")], check=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    gens = [e for e in map(json.loads, journal.read_text().splitlines())
            if e["type"] == "generation"]
    inside = sum(g["token_times_us"][-1] for g in gens) / 1e6
    return inside / wall, wall, len(gens)


def naive_share(job: dict, reps: int) -> tuple[float, float, int]:
    """One `python -m mlx_lm generate` per config; generation time from its own report."""
    inside = wall = 0.0
    runs = 0
    for w in job["workloads"]:
        for _ in range(reps):
            for k in [0] + job["knobs"]["num_draft_tokens"]:
                cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model",
                       job["models"]["target"]["path"], "--prompt", w["prompt"],
                       "--max-tokens", str(w["max_tokens"]), "--ignore-chat-template",
                       "--temp", "0"]
                if k:
                    cmd += ["--draft-model", job["models"]["draft"]["path"],
                            "--num-draft-tokens", str(k)]
                t0 = time.perf_counter()
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                wall += time.perf_counter() - t0
                m = re.search(r"Generation: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
                p = re.search(r"Prompt: (\d+) tokens, ([\d.]+) tokens-per-sec", out)
                inside += int(m.group(1)) / float(m.group(2)) + int(p.group(1)) / float(p.group(2))
                runs += 1
    return inside / wall, wall, runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--naive-reps", type=int, default=1,
                    help="repetitions for the naive side (it is slow; the share is per run)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        build_demo_models(d / "models", log=lambda m: None)
        job = build_job(d / "models", repetitions=args.reps)
        (d / "job.json").write_text(json.dumps(job))
        a_share, a_wall, a_n = agent_share(d / "job.json", d)
        n_share, n_wall, n_n = naive_share(job, args.naive_reps)
    print(f"{'harness':<28}{'runs':>6}{'wall s':>9}{'in generation':>15}")
    print(f"{'specfleet agent (one load)':<28}{a_n:>6}{a_wall:>9.1f}{a_share:>14.1%}")
    print(f"{'mlx_lm.generate per config':<28}{n_n:>6}{n_wall:>9.1f}{n_share:>14.1%}")
    print(f"agent share / naive share: {a_share / n_share:.2f}x")


if __name__ == "__main__":
    main()
