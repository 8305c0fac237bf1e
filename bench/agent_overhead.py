"""Instrument overhead: the agent's decode_tok_s vs a bare mlx-lm loop, side by side.

Both sides compute decode tok/s the same way (least-squares slope of token index over
arrival time after the same warm-up tokens); the agent additionally runs its telemetry
sampler, memory accounting and acceptance bookkeeping. Runs are interleaved (bare,
agent, bare, agent, …) so machine noise hits both. Target: agent/bare ≥ 0.98.

Part 1 measures in one process (the shared loop's measure with the mlx-lm engine vs
stream_generate). Part 2 runs
them as users do, each in its own process: ``python -m agent run JOB`` (telemetry on,
journal, lock) against a bare mlx-lm script that makes the same generations in the same
order (baseline, then draft width 3, per repetition), the processes interleaved.
``--agent-env`` reruns part 2 with variables set for the agent (to test a suspect).

    .venv/bin/python bench/agent_overhead.py [--reps 9] [--max-tokens 256] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.job import parse_job  # noqa: E402
from agent.stats import decode_rates  # noqa: E402
from agent.telemetry import Sampler  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.sweep.jobspec import build_job  # noqa: E402

SKIP = 64


def bare(model, tok, prompt_ids, max_tokens, draft=None, k=3) -> float:
    from mlx_lm import stream_generate

    kw = {"draft_model": draft, "num_draft_tokens": k} if draft is not None else {}
    times = []
    t0 = time.perf_counter()
    for _ in stream_generate(model, tok, prompt_ids, max_tokens=max_tokens, **kw):
        times.append(time.perf_counter() - t0)
    return decode_rates(times, SKIP)[0]


BARE_PROCESS = r"""
import json, sys, time
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
from agent.stats import decode_rates
d, prompt, max_tokens, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model, tok = load(d + "/target")
draft, _ = load(d + "/draft")
ids = tok.encode(prompt)
def one(spec, n):
    kw = {"draft_model": draft, "num_draft_tokens": 3} if spec else {}
    times, t0 = [], time.perf_counter()
    for _ in stream_generate(model, tok, ids, max_tokens=n, sampler=make_sampler(temp=0.0), **kw):
        times.append(time.perf_counter() - t0)
    return decode_rates(times, 64)[0]
one(False, 16)
out = {"baseline": [], "speculative": []}
for _ in range(reps):
    out["baseline"].append(one(False, max_tokens))
    out["speculative"].append(one(True, max_tokens))
print(json.dumps(out))
"""


def processes(d: Path, raw: dict, reps: int, rounds: int, env_extra: dict,
              telemetry_interval_s: float = 0.5) -> None:
    """Part 2: the agent as its own process vs a bare mlx-lm process, interleaved, the
    order flipped every round (whoever goes second may find a warmer machine)."""
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    job = {**raw, "job_id": "overhead", "knobs": {"num_draft_tokens": [3]},
           "repetitions": reps, "warmup_tokens": 16,
           "telemetry_interval_s": telemetry_interval_s}
    (d / "job.json").write_text(json.dumps(job))
    prompt = raw["workloads"][0]["prompt"]
    max_tokens = raw["workloads"][0]["max_tokens"]
    bare_r: dict[str, list[float]] = {"baseline": [], "speculative": []}
    agent_r: dict[str, list[float]] = {"baseline": [], "speculative": []}
    def run_bare() -> None:
        out = subprocess.run([sys.executable, "-c", BARE_PROCESS, str(d), prompt,
                              str(max_tokens), str(reps)], capture_output=True, text=True,
                             cwd=root, check=True).stdout
        for k, v in json.loads(out.splitlines()[-1]).items():
            bare_r[k] += v

    def run_agent(i: int) -> None:
        journal = d / f"agent{i}-{telemetry_interval_s}.jsonl"
        subprocess.run([sys.executable, "-m", "agent", "run", str(d / "job.json"), "--journal",
                        str(journal), "--lock", str(d / "agent.lock"), "--cache-dir",
                        str(d / "cache"), "--quiet"], cwd=root, check=True,
                       env={**os.environ, **env_extra})
        for line in journal.read_text().splitlines():
            e = json.loads(line)
            if e["type"] == "generation":
                agent_r[e["mode"]].append(e["decode_tok_s"])

    for i in range(rounds):
        if i % 2 == 0:
            run_bare()
            run_agent(i)
        else:
            run_agent(i)
            run_bare()
    what = " ".join(f"{k}={v}" for k, v in env_extra.items()) or "as shipped"
    what += f", telemetry every {telemetry_interval_s} s"
    print(f"\nseparate processes ({what}): {rounds} rounds × {reps} repetitions, "
          f"{max_tokens} tokens, agent vs bare interleaved")
    for mode in ("baseline", "speculative"):
        mb, ma = statistics.median(bare_r[mode]), statistics.median(agent_r[mode])
        print(f"{mode:<16}{mb:>12.1f}{ma:>13.1f}{ma / mb:>12.3f}   (n = {len(bare_r[mode])} "
              f"and {len(agent_r[mode])})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="process pairs in part 2")
    ap.add_argument("--agent-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set for the agent process in an extra part 2 run")
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--telemetry-off", action="store_true",
                    help="also run part 2 with the agent's sampler idle (one reading an hour)")
    args = ap.parse_args()
    from mlx_lm import load

    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        raw = build_job(Path(d), ["code"], max_tokens=args.max_tokens)
        raw["workloads"] = raw["workloads"][:1]
        model, tok = load(f"{d}/target")
        draft, _ = load(f"{d}/draft")
        if not args.skip_in_process:
            in_process(raw, model, tok, draft, args)
        processes(Path(d), raw, args.reps, args.rounds, {})
        if args.telemetry_off:  # the suspect: the sampler thread competing for the GIL
            processes(Path(d), raw, args.reps, args.rounds, {}, telemetry_interval_s=3600.0)
        if args.agent_env:
            processes(Path(d), raw, args.reps, args.rounds,
                      dict(kv.split("=", 1) for kv in args.agent_env))


def in_process(raw: dict, model, tok, draft, args) -> None:
    from agent.journal import Journal
    from agent.loop import Loop, Request
    from agent.mlxengine import BASELINE, SPECULATIVE, MlxEngine

    job = parse_job(raw)
    w = job.workloads[0]
    prompt = tok.encode(w.prompt)
    print(f"{'mode':<16}{'bare tok/s':>12}{'agent tok/s':>13}{'agent/bare':>12}   median of "
          f"{args.reps}, {args.max_tokens} tokens, code prompt, decode slope after {SKIP}")
    with Sampler(job.telemetry_interval_s) as sampler, \
            tempfile.TemporaryDirectory() as scratch:
        engine = MlxEngine(job, {"target": (model, tok), "draft": (draft, tok)})
        loop = Loop(job, Journal(Path(scratch) / "j.jsonl"), engine, sampler)
        for label, spec in (("autoregressive", False), ("speculative k=3", True)):
            cfg = {**job.base, "num_draft_tokens": 3}
            v = SPECULATIVE if spec else BASELINE
            bare(model, tok, prompt, 32, draft if spec else None)  # warm both paths
            loop.measure(Request(v, w.prompt, 32, cfg, 0, prompt_key=w.name))
            b, a = [], []
            for _ in range(args.reps):
                b.append(bare(model, tok, prompt, args.max_tokens, draft if spec else None))
                a.append(loop.measure(Request(v, w.prompt, w.max_tokens, cfg, 0,
                                              prompt_key=w.name))["decode_tok_s"])
            mb, ma = statistics.median(b), statistics.median(a)
            paired = sorted(x / y for x, y in zip(a, b))
            print(f"{label:<16}{mb:>12.1f}{ma:>13.1f}{ma / mb:>12.3f}   paired ratio median "
                  f"{statistics.median(paired):.3f} (min {paired[0]:.3f}, max {paired[-1]:.3f})")


if __name__ == "__main__":
    main()
