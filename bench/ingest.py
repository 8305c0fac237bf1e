"""Ingest throughput into SQLite and PostgreSQL, side by side (targets: generation events
≥ 50k/s into SQLite, ≥ 30k/s into PostgreSQL, validation included).

Events are copies of a real generation event from a sweep of the demo pair (token
times, telemetry window and all), renumbered. The lines take the controller's own path:
each goes through the decode boundary (``orchestrator.sweep.decode.Decoder.event``: JSON,
schema, seq, type and every value checked against its store column) and then the
follower's ``IngestPipeline``, which stores batches with ``Store.ingest`` in a thread
(events and measurements; telemetry is read through a view over the events). Then the
same lines again, to time the idempotent path (everything already stored). The lines are
signed as a keyed agent signs them (``agent.signing``); each is framed (``Decoder.framed``:
bytes glued before the signed line, none here) and the boundary checks its MAC, as for every
sweep launched since issue 28; ``unsigned`` is the boundary's rate without a key.

``floor`` is what the database itself takes on this machine in the same run: the same
rows, already built, written by the bare driver (sqlite3 executemany / psycopg COPY) in
the same batches, with no decoding, no checks and no SQLAlchemy. ``of floor`` is our path
as a share of it. Each store is run ``--repeat`` times, interleaved, and the median is
quoted (the machine is shared). ``decode boundary`` is the boundary's own rate.

``CPU`` is the same share counted in CPU seconds rather than wall time: this process's
(every thread) plus, on PostgreSQL, the server processes serving the bench's database. A
loaded machine gives each side whatever share of the cores it gets, which moves the wall
ratio by more than any change to the code; the CPU ratio stays put (it does not count the
overlap of decoding with the database's own work that a free core allows).

``--line long`` takes a speculative generation at draft width 3 instead (256 tokens, 30
telemetry samples, acceptance by position: ~7.7 kB, where the short baseline line is ~2.2 kB
and never walks the depth checks' nested lists); the short line stays the default, so the
numbers compare with earlier runs.

``--stages`` instead prints where a generation event's CPU goes on our path, stage by
stage (this thread's CPU time per event, median of ``--repeat`` batches of 1000 fresh
lines, each stored into a new sweep), beside the floor's: what each check costs.

    .venv/bin/python bench/ingest.py [--events 20000] [--repeat 3] [--stages]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from agent.signing import sign  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from orchestrator.sweep.decode import Decoder, Quarantined  # noqa: E402
from orchestrator.sweep.pipeline import IngestPipeline, ingest_gc  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
KEY = secrets.token_bytes(32)  # the sweep node's journal key (a keyed launch's)
_admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(url: str) -> float:
    """CPU used so far by this process and by the PostgreSQL backends of ``url``'s database
    (those connected now: read before the store is disposed of)."""
    total = time.process_time()
    if url.startswith("postgresql"):
        with _admin.connect() as c:
            pids = c.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :d"),
                             {"d": url.rsplit("/", 1)[1]}).scalars().all()
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile, or a server on another machine
                continue
            total += (int(stat[11]) + int(stat[12])) / _TICK  # utime + stime
    return total


def sample_events(n: int, line: str = "baseline") -> list[dict]:
    """A real generation event from the demo pair, renumbered n times. ``line``: "baseline"
    (64 tokens, 2 telemetry samples, no acceptance positions) or "long" (speculative at
    draft width 3, 256 tokens, 30 telemetry samples: what the boundary's depth walk and a
    long night's lines cost)."""
    from mlx_lm import load

    from agent.generation import generate_once
    from agent.protocol import SAMPLING_DEFAULTS

    pair = ROOT / "orchestrator/demo_models/pair"
    m, tok = load(str(pair / "target"))
    long = line == "long"
    cfg = {**SAMPLING_DEFAULTS, "num_draft_tokens": 3 if long else 0}
    draft = load(str(pair / "draft"))[0] if long else None
    g = generate_once(m, tok, tok.encode("def f(x):"), cfg, 256 if long else 64, draft)
    base = {"schema": 1, "type": "generation", "job_id": "bench", "workload": "code",
            "prompt_sha256": "0" * 64, "mode": "speculative" if long else "baseline",
            "knob": "num_draft_tokens", "knob_value": 3 if long else 2,
            "num_draft_tokens": cfg["num_draft_tokens"], "config": cfg, "repetition": 0,
            "telemetry": [{"ts": 1.0 + 0.5 * i, "swap_used_bytes": 0, "rss_bytes": 1 << 27,
                           "memory_pressure": "normal"} for i in range(30 if long else 2)],
            **g}
    return [{**base, "seq": i + 1, "ts": 1e9 + i, "run_index": i} for i in range(n)]


def light_events(n: int) -> list[dict]:
    """Events that write only the events table (progress-size payloads)."""
    return [{"schema": 1, "seq": i + 1, "type": "soak_sample", "ts": 1e9 + i, "job_id": "b",
             "index": i, "elapsed_s": i * 0.5, "decode_tok_s": 412.5, "rss_bytes": 1 << 27,
             "swap_used_bytes": 0, "memory_pressure": "normal"} for i in range(n)]


def floor(url: str, events: list[dict], lines: list[str],
          batch: int = 1000) -> tuple[float, float]:
    """The same rows into the same tables by the bare driver: the database's own rate."""
    from orchestrator.store.rows import EVENT_COLUMNS, MEASUREMENT_TABLE_COLUMNS, measurement_tuple

    store = open_store(url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, {"models": {"target": {}, "draft": {}}}, None)
    ev_rows = [(sid, "n", e["seq"], e["type"], e["ts"], line) for e, line in zip(events, lines)]
    m_rows = [measurement_tuple(sid, "n", e) for e in events if e["type"] == "generation"]
    tables = (("events", EVENT_COLUMNS, ev_rows),
              ("measurements", MEASUREMENT_TABLE_COLUMNS, m_rows))
    raw = store.engine.raw_connection().driver_connection
    cpu0, t0 = cpu_seconds(url), time.perf_counter()
    for i in range(0, len(ev_rows), batch):
        if url.startswith("sqlite"):
            raw.execute("BEGIN")
            for table, cols, rows in tables:
                if rows:
                    raw.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                                    f"({', '.join('?' * len(cols))})", rows[i:i + batch])
            raw.execute("COMMIT")
        else:
            with raw.cursor() as cur:
                for table, cols, rows in tables:
                    with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as cp:
                        for row in rows[i:i + batch]:
                            cp.write_row(row)
            raw.commit()
    rate = len(ev_rows) / (time.perf_counter() - t0)
    cpu = (cpu_seconds(url) - cpu0) / len(ev_rows)
    raw.close()
    store.engine.dispose()
    return rate, cpu


def run(url: str, events: list[dict],
        lines: list[str]) -> tuple[float, float, float, float]:
    """New events/s, already-stored events/s, mean batch size, CPU s per new event."""
    store = open_store(url)
    sid = uuid.uuid4().hex[:12]
    store.create_sweep(sid, {"models": {"target": {}, "draft": {}}}, None)
    sizes: list[int] = []
    cpu: list[float] = []

    async def follow(expect_new: bool) -> float:
        decoder = Decoder("bench-node", key=KEY)

        async def store_batch(batch: list[dict], raw: list[str]) -> None:
            new = await asyncio.to_thread(store.ingest, sid, "bench-node", batch, raw)
            assert new == (len(batch) if expect_new else 0)
            sizes.append(len(batch))

        pipeline = IngestPipeline(store_batch)
        cpu0, t0 = cpu_seconds(url), time.perf_counter()
        for line in lines:
            glued, line = decoder.framed(line)  # as the follower frames each line first
            event = decoder.event(line)  # typed (agent.events), as a follower decodes
            assert glued is None and not isinstance(event, Quarantined), event
            await pipeline.add(event.raw, line)
        await pipeline.close()
        rate = len(lines) / (time.perf_counter() - t0)
        cpu.append((cpu_seconds(url) - cpu0) / len(lines))
        return rate

    first = asyncio.run(follow(True))
    batch = statistics.mean(sizes)
    again = asyncio.run(follow(False))
    store.engine.dispose()
    return first, again, batch, cpu[0]


def decode_rates(events: list[dict]) -> tuple[float, float, float, float]:
    """The boundary (MAC + parse + every check + the typed event) vs the same without
    building the typed event vs the same unsigned vs the bare json.loads the follower did
    before."""
    plain = [json.dumps(e, separators=(",", ":")) for e in events]
    keyed = [sign(KEY, x) for x in plain]
    decoder, unkeyed = Decoder("bench-node", key=KEY), Decoder("bench-node")
    rates = []
    for fn, lines in ((decoder.event, keyed), (decoder.decode, keyed),
                      (unkeyed.event, plain), (json.loads, plain)):
        best = 0.0
        for _ in range(3):  # best of 3: the machine is shared
            t0 = time.perf_counter()
            for line in lines:
                fn(line)
            best = max(best, len(lines) / (time.perf_counter() - t0))
        rates.append(best)
    return rates[0], rates[1], rates[2], rates[3]


def stages(url: str, events: list[dict], lines: list[str], repeat: int) -> dict[str, float]:
    """CPU µs per event of each stage of our path for one batch of generation lines, and of
    the floor's write of the same rows (this thread only: not PostgreSQL's server)."""
    n = min(1000, len(lines))
    times: dict[str, list[float]] = {}
    store = open_store(url)
    for r in range(repeat):  # a batch of fresh lines each time, as a follower reads them
        _stage_batch(store, url, lines[r * n % len(lines):][:n], times)
    store.engine.dispose()
    return {k: statistics.median(v) for k, v in times.items()}


def _stage_batch(store, url: str, batch: list[str], times: dict[str, list[float]]) -> None:
    import orjson

    from agent.events import Event
    from agent.signing import Verifier
    from orchestrator.store.bulk import bulk
    from orchestrator.store.dupkeys import duplicate_key
    from orchestrator.store.fastcheck import FAST_CHECKS
    from orchestrator.store.ledger import admit
    from orchestrator.store.rows import (
        EVENT_COLUMNS,
        MEASUREMENT_TABLE_COLUMNS,
        measurement_tuple,
    )

    n, clock, check, verify = len(batch), time.thread_time, FAST_CHECKS["generation"], \
        Verifier(KEY)

    def sweep() -> str:
        sid = uuid.uuid4().hex[:12]
        store.create_sweep(sid, {"models": {"target": {}, "draft": {}}}, None)
        return sid

    def timed(stage: str, fn, *args):
        t0 = clock()
        out = fn(*args)
        times.setdefault(stage, []).append((clock() - t0) / n * 1e6)
        return out

    raw = [x.encode() for x in batch]
    timed("MAC (HMAC-SHA256 of the line)", lambda: [verify(x) for x in raw])
    objs = timed("parse (orjson)", lambda: [orjson.loads(x) for x in batch])
    timed("duplicate keys", lambda: [duplicate_key(x, e) for x, e in zip(batch, objs)])
    timed("typed check (msgspec shape, depth, NUL)",
          lambda: [check(e, x) for x, e in zip(batch, objs)])
    timed("typed event (Event.from_json)", lambda: [Event.from_json(e) for e in objs])
    decoder = Decoder("bench-node", key=KEY)

    def boundary() -> list[dict]:
        out = []
        for x in batch:
            _, own = decoder.framed(x)
            out.append(decoder.event(own).raw)  # type: ignore[union-attr]
        return out

    evs = timed("= framing + decode boundary (Decoder)", boundary)
    sid = sweep()
    with store.engine.begin() as c:
        kept, kept_lines, _ = timed("ledger (admit: one context read + rules)", admit, c,
                                    sid, "bench-node", evs, batch)
        rows = timed("event rows", lambda: [(sid, "bench-node", e["seq"], e["type"], e["ts"],
                                             x) for e, x in zip(kept, kept_lines)])
        m = timed("measurement rows", lambda: [measurement_tuple(sid, "bench-node", e)
                                               for e in kept])
        timed("write events", bulk, c, "events", EVENT_COLUMNS, rows, True)
        timed("write measurements", bulk, c, "measurements", MEASUREMENT_TABLE_COLUMNS, m, True)
        t0 = clock()
    times.setdefault("commit", []).append((clock() - t0) / n * 1e6)
    timed("= store.ingest", store.ingest, sweep(), "bench-node", evs, batch)
    sid = sweep()
    ev_rows = [(sid, "n", e["seq"], e["type"], e["ts"], x) for e, x in zip(evs, batch)]
    m_rows = [measurement_tuple(sid, "n", e) for e in evs]
    conn = store.engine.raw_connection().driver_connection
    t0 = clock()
    if url.startswith("sqlite"):
        conn.execute("BEGIN")  # the driver autocommits under SQLAlchemy: as floor() does
    for table, cols, rws in (("events", EVENT_COLUMNS, ev_rows),
                             ("measurements", MEASUREMENT_TABLE_COLUMNS, m_rows)):
        if url.startswith("sqlite"):
            conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES "
                             f"({', '.join('?' * len(cols))})", rws)
        else:
            with conn.cursor() as cur, cur.copy(
                    f"COPY {table} ({', '.join(cols)}) FROM STDIN") as cp:
                for row in rws:
                    cp.write_row(row)
    conn.execute("COMMIT") if url.startswith("sqlite") else conn.commit()
    times.setdefault("floor: the driver's write + commit", []).append(
        (clock() - t0) / n * 1e6)
    conn.close()


def print_stages(admin, events: list[dict], lines: list[str], repeat: int) -> None:
    name = f"specfleet_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        with tempfile.TemporaryDirectory() as d:
            got = {"SQLite": stages(f"sqlite:///{d}/stages.db", events, lines, repeat),
                   "PostgreSQL": stages(f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
                                        events, lines, repeat)}
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    print(f"\nCPU µs per generation event ({len(lines[0])} bytes), median of {repeat} "
          "batches of 1000; this thread only")
    print(f"{'stage':<44}{'SQLite':>9}{'PostgreSQL':>12}")
    for k in got["SQLite"]:
        print(f"{k:<44}{got['SQLite'][k]:>9.1f}{got['PostgreSQL'][k]:>12.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stages", action="store_true",
                    help="where a generation event's CPU goes, stage by stage")
    ap.add_argument("--line", choices=("baseline", "long"), default="baseline",
                    help="the generation line: a short baseline one, or a long speculative "
                    "one (30 telemetry samples, acceptance by position)")
    args = ap.parse_args()
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    if args.stages:
        events = sample_events(max(args.events, 1000), args.line)
        lines = [sign(KEY, json.dumps(e, separators=(",", ":"))) for e in events]
        gc.collect()
        gc.freeze()
        ingest_gc()  # the controller's collector thresholds, as IngestPipeline sets them
        print_stages(admin, events, lines, args.repeat)
        return
    targets = {"SQLite": 50000, "PostgreSQL": 30000}
    for label, events in (("generation", sample_events(args.events, args.line)),
                          ("light", light_events(args.events * 2))):
        # as in a keyed journal
        lines = [sign(KEY, json.dumps(e, separators=(",", ":"))) for e in events]
        # the bench's own sample heap is long-lived: keep it out of the collector's way,
        # or every full collection walks 20k events the controller would never hold
        gc.collect()
        gc.freeze()
        size = len(lines[0])
        print(f"\n{len(events)} {label} events of {size} bytes each, x{args.repeat} per store"
              + (" (each also writes a measurement row)" if label == "generation" else ""))
        results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in targets}
        floors: dict[str, list[tuple[float, float]]] = {k: [] for k in targets}
        for _ in range(args.repeat):
            name = f"specfleet_bench_{uuid.uuid4().hex[:8]}"
            with admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                pg = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
                with tempfile.TemporaryDirectory() as d:
                    results["SQLite"].append(run(f"sqlite:///{d}/bench.db", events, lines))
                    floors["SQLite"].append(floor(f"sqlite:///{d}/floor.db", events, lines))
                    results["PostgreSQL"].append(run(pg, events, lines))
                    floors["PostgreSQL"].append(floor(pg, events, lines))
            finally:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        boundary, untyped, unsigned, bare = decode_rates(events)
        print(f"decode boundary {boundary:,.0f} events/s (checks only, no typed event: "
              f"{untyped:,.0f}; {boundary / untyped:.2f}x; unsigned {unsigned:,.0f}: "
              f"{boundary / unsigned:.2f}x) vs bare json.loads {bare:,.0f} "
              f"events/s ({boundary / bare:.2f}x)")
        print(f"{'store':<12}{'new events/s (median; runs)':>40}{'vs target':>10}"
              f"{'floor':>9}{'of floor':>9}{'again/s':>9}{'batch':>7}{'CPU':>6}")
        for k, runs in results.items():
            new = [r[0] for r in runs]
            med, low = statistics.median(new), statistics.median(f[0] for f in floors[k])
            # CPU per event: the floor's over ours (medians), as "of floor" is the rates'
            by_cpu = (statistics.median(f[1] for f in floors[k])
                      / statistics.median(r[3] for r in runs))
            spread = ", ".join(f"{x / 1000:.1f}k" for x in new)
            print(f"{k:<12}{med:>10,.0f} ({spread:>26}){med / targets[k]:>9.2f}x"
                  f"{low:>9,.0f}{med / low:>8.2f}x"
                  f"{statistics.median(r[1] for r in runs):>9,.0f}"
                  f"{statistics.median(r[2] for r in runs):>7,.0f}{by_cpu:>5.2f}x")
        gc.unfreeze()


if __name__ == "__main__":
    main()
