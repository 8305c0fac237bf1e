"""Ingest throughput into SQLite and PostgreSQL, side by side (target ≥ 50k events/s).

Events are copies of a real generation event from a sweep of the demo pair (token
times, telemetry window and all), renumbered. Each journal line goes through the decode
boundary (``orchestrator.decode.Decoder``: JSON, schema, seq, type and every value checked
against its store column) and each batch through Store.ingest, as the controller does, so
measurements and telemetry rows are written too. Then the same lines again, to time the
idempotent path (everything already stored). ``decode only`` is the boundary's own rate.

    .venv/bin/python bench/ingest.py [--events 20000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from orchestrator.store import open_store  # noqa: E402
from orchestrator.sweep.decode import Decoder, Quarantined  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def sample_events(n: int) -> list[dict]:
    """A real generation event from the demo pair, renumbered n times."""
    from mlx_lm import load

    from agent.generation import generate_once
    from agent.protocol import SAMPLING_DEFAULTS

    m, tok = load(str(ROOT / "tests/data/demo-models/target"))
    cfg = {**SAMPLING_DEFAULTS, "num_draft_tokens": 0}
    g = generate_once(m, tok, tok.encode("def f(x):"), cfg, 64)
    base = {"schema": 1, "type": "generation", "job_id": "bench", "workload": "code",
            "prompt_sha256": "0" * 64, "mode": "baseline", "knob": "num_draft_tokens",
            "knob_value": 2, "num_draft_tokens": 0, "config": cfg, "repetition": 0,
            "telemetry": [{"ts": 1.0, "swap_used_bytes": 0, "rss_bytes": 1 << 27,
                           "memory_pressure": "normal"}] * 2, **g}
    return [{**base, "seq": i + 1, "ts": 1e9 + i, "run_index": i} for i in range(n)]


def light_events(n: int) -> list[dict]:
    """Events that write only the events table (progress-size payloads)."""
    return [{"schema": 1, "seq": i + 1, "type": "soak_sample", "ts": 1e9 + i, "job_id": "b",
             "index": i, "elapsed_s": i * 0.5, "decode_tok_s": 412.5, "rss_bytes": 1 << 27,
             "swap_used_bytes": 0, "memory_pressure": "normal"} for i in range(n)]


def run(url: str, events: list[dict], batch: int) -> tuple[float, float]:
    store = open_store(url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, {"models": {"target": {}, "draft": {}}}, None)
    lines = [json.dumps(e, separators=(",", ":")) for e in events]  # as read from a journal
    decoder = Decoder("bench-node")

    def decoded(chunk: list[str]) -> list[dict]:
        out = [decoder.decode(line) for line in chunk]
        assert not any(isinstance(e, Quarantined) for e in out), out[0]
        return out

    t0 = time.perf_counter()
    for i in range(0, len(lines), batch):
        chunk = lines[i:i + batch]
        assert store.ingest(sid, "bench-node", decoded(chunk), chunk) == len(chunk)
    first = len(events) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, len(lines), batch):
        chunk = lines[i:i + batch]
        assert store.ingest(sid, "bench-node", decoded(chunk), chunk) == 0
    again = len(events) / (time.perf_counter() - t0)
    store.engine.dispose()
    return first, again


def decode_rates(events: list[dict]) -> tuple[float, float]:
    """The boundary (parse + every check) vs the bare json.loads the follower did before."""
    lines = [json.dumps(e, separators=(",", ":")) for e in events]
    decoder = Decoder("bench-node")
    rates = []
    for fn in (decoder.decode, json.loads):
        best = 0.0
        for _ in range(3):  # best of 3: the machine is shared
            t0 = time.perf_counter()
            for line in lines:
                fn(line)
            best = max(best, len(lines) / (time.perf_counter() - t0))
        rates.append(best)
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    for label, events in (("generation", sample_events(args.events)),
                          ("light", light_events(args.events * 2))):
        size = len(json.dumps(events[0]))
        print(f"\n{len(events)} {label} events of {size} bytes each, batches of {args.batch}"
              + (" (each also writes a measurement and telemetry rows)"
                 if label == "generation" else ""))
        name = f"specfleet_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            with tempfile.TemporaryDirectory() as d:
                results = {"SQLite": run(f"sqlite:///{d}/bench.db", events, args.batch),
                           "PostgreSQL": run(
                               f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
                               events, args.batch)}
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        boundary, bare = decode_rates(events)
        print(f"decode boundary {boundary:,.0f} events/s vs bare json.loads {bare:,.0f} "
              f"events/s ({boundary / bare:.2f}x)")
        print(f"{'store':<12}{'new events/s':>14}{'vs 50k':>8}{'again events/s':>17}")
        for k, (first, again) in results.items():
            print(f"{k:<12}{first:>14,.0f}{first / 50000:>7.2f}x{again:>17,.0f}")


if __name__ == "__main__":
    main()
