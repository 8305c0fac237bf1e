"""The http engine's instrument overhead: the agent's decode tok/s vs a bare SSE client,
side by side against the same runtime (``mlx_lm.server`` with the demo pair).

Both read the same stream the same way in the end (least-squares slope of token index over
arrival time after the same skip); the agent additionally goes through the shared loop
(telemetry window, the non-streamed parity request). Without ``--tokenizer`` the agent
counts tokens as the bare client does (one per chunk, or the runtime's usage spread over
them), so the ratio is the instrument's overhead alone; with it, the agent re-tokenises the
text, which can count differently from the tokens generated. Requests alternate
(bare, agent, bare, agent, …) so the runtime's and the machine's drift hit both. Target:
agent/bare ≥ 0.98. One server per variant: autoregressive, and speculative with k=3.

    .venv/bin/python bench/http_overhead.py [--reps 9] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.httpruntime import HttpEngine  # noqa: E402
from agent.job import parse_job  # noqa: E402
from agent.journal import Journal  # noqa: E402
from agent.loop import Loop, Request  # noqa: E402
from agent.stats import decode_rates  # noqa: E402
from agent.telemetry import Sampler  # noqa: E402
from orchestrator.demo_models import build_demo_models  # noqa: E402
from orchestrator.sweep.jobspec import build_job  # noqa: E402

SKIP = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare(port: int, prompt: str, max_tokens: int) -> float:
    """A plain SSE client: one time per content chunk (one token each from this server)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    times = []
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            if json.loads(line[5:])["choices"][0].get("text"):
                times.append(time.perf_counter() - t0)
    conn.close()
    return decode_rates(times, SKIP)[0] or 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--tokenizer", action="store_true",
                    help="let the agent count tokens with the pair's tokenizer")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        build_demo_models(Path(d), log=lambda m: None)
        raw = build_job(Path(d), ["code"], max_tokens=args.max_tokens)
        w = raw["workloads"][0]
        print(f"{'variant':<16}{'bare tok/s':>12}{'agent tok/s':>13}{'agent/bare':>12}   median "
              f"of {args.reps}, {args.max_tokens} tokens, mlx_lm.server, decode slope after "
              f"{SKIP}")
        for label, extra in (("autoregressive", []),
                             ("speculative k=3", ["--draft-model", f"{d}/draft",
                                                  "--num-draft-tokens", "3"])):
            port = free_port()
            server = subprocess.Popen([sys.executable, "-m", "mlx_lm", "server", "--model",
                                       f"{d}/target", "--port", str(port), *extra],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                for _ in range(600):
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read()
                        break
                    except OSError:
                        time.sleep(0.1)
                raw["engine"] = {"type": "http", "runtime": "mlx_lm.server",
                                 **({"tokenizer": f"{d}/target"} if args.tokenizer else {}),
                                 "variants": [
                                     {"name": label, "base_url": f"http://127.0.0.1:{port}",
                                      "speculative": bool(extra)}]}
                raw["knobs"] = {"temperature": [0.0]}
                job = parse_job(raw)
                journal = Journal(Path(d) / f"{port}.jsonl", echo=None)
                engine = HttpEngine(job, journal)
                with Sampler(job.telemetry_interval_s) as sampler:
                    loop = Loop(job, journal, engine, sampler)
                    v = engine.variants[0]
                    loop.ready(v)  # the agent's own warm-up
                    bare(port, w["prompt"], 32)  # and the bare client's
                    cfg = {**job.base, "num_draft_tokens": 3 if extra else 0}
                    b, a = [], []
                    for _ in range(args.reps):
                        b.append(bare(port, w["prompt"], args.max_tokens))
                        m = loop.measure(Request(v, w["prompt"], args.max_tokens, cfg, 0,
                                                 prompt_key=w["name"]))
                        a.append(m["decode_tok_s"] or 0.0)
                    engine.close()
                mb, ma = statistics.median(b), statistics.median(a)
                paired = sorted(x / y for x, y in zip(a, b) if y)
                print(f"{label:<16}{mb:>12.1f}{ma:>13.1f}{ma / mb:>12.3f}   paired ratio "
                      f"median {statistics.median(paired):.3f} (min {paired[0]:.3f}, max "
                      f"{paired[-1]:.3f})")
            finally:
                server.terminate()
                server.wait(10)


if __name__ == "__main__":
    main()
