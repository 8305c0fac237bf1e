"""Review at scale: a year of nightly sweeps for 100 nodes (~1M runs), on SQLite and
PostgreSQL; prints how long `specfleet review` takes for the last week and `specfleet
site` for the whole history (target ≤ 5 s each), and the rank test's time per series pair.

    .venv/bin/python bench/review_scale.py [--nodes 100] [--days 365]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from orchestrator.review import ranktest  # noqa: E402
from orchestrator.review.report import write_review  # noqa: E402
from orchestrator.review.site import write_site  # noqa: E402
from orchestrator.store import open_store  # noqa: E402
from orchestrator.store.models import Run, Sweep  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
CHIPS = ["Apple M2 Max", "Apple M3 Pro", "Apple M4 Max", "Apple M1 Ultra"]
WORKLOADS = ["code", "memo", "translation"]
BUCKETS = ["short", "long"]
CONFIGS = [("baseline", 0), ("speculative", 2), ("speculative", 3), ("speculative", 4),
           ("speculative", 6)]


def fill(url: str, nodes: int, days: int, end: datetime) -> int:
    store = open_store(url)
    rng = random.Random(1)
    total = 0
    start = end - timedelta(days=days)
    for d in range(days):
        at = start + timedelta(days=d, hours=2)
        sid = uuid.uuid4().hex[:12]
        rows = []
        for n in range(nodes):
            chip = CHIPS[n % len(CHIPS)]
            mlx_lm = "0.32.2" if d < days - 10 else "0.33.0"
            for w in WORKLOADS:
                for b in BUCKETS:
                    for mode, k in CONFIGS:
                        base = 400 if mode == "baseline" else 400 * (1.3 - 0.05 * k)
                        vals = [base * (1 + rng.uniform(-0.03, 0.03)) for _ in range(3)]
                        acc = None if mode == "baseline" else 0.8 - 0.05 * k
                        rows.append({
                            "sweep_id": sid, "node": f"mac-{n:03d}", "workload": w,
                            "context_bucket": b, "mode": mode, "knob": None,
                            "knob_value": None, "num_draft_tokens": k,
                            "config_key": f"{mode}{k}{b}", "config": {},
                            "trials": 3, "decode_tok_s_median": sorted(vals)[1],
                            "decode_tok_s_p95": None, "decode_tok_s_cv": None,
                            "acceptance_median": acc, "unreliable": False,
                            "summary": {"values": {"decode_tok_s": vals,
                                                   "acceptance_rate": [acc] * 3,
                                                   "ttft_ms": [40.0] * 3,
                                                   "itl_p95_ms": [3.0] * 3}, "exact": True},
                            "env_id": "e1", "mlx_version": "0.32.4", "mlx_lm_version": mlx_lm,
                            "target_fingerprint": "sha256:t", "draft_fingerprint": "sha256:d",
                            "prompt_sha256": "p", "os_build": "24A335", "chip": chip,
                            "power_source": "ac", "model_pair": "llama-8b/llama-1b"})
        with store.engine.begin() as c:
            c.execute(Sweep.__table__.insert().values(id=sid, created_at=at, status="ok",
                                                      job={}, trigger="nightly"))
            c.execute(Run.__table__.insert(), rows)
        total += len(rows)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--days", type=int, default=365)
    args = ap.parse_args()
    end = datetime(2026, 11, 23, tzinfo=timezone.utc)  # Monday: review week 2026-W47
    name = f"specfleet_scale_{uuid.uuid4().hex[:8]}"
    from sqlalchemy.pool import NullPool

    # NullPool: a fresh admin connection for the final DROP, even if PostgreSQL restarted
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        with tempfile.TemporaryDirectory() as d:
            for label, url in (("SQLite", f"sqlite:///{d}/scale.db"),
                               ("PostgreSQL",
                                f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}")):
                t0 = time.perf_counter()
                runs = fill(url, args.nodes, args.days, end)
                fill_s = time.perf_counter() - t0
                store = open_store(url)
                times, site_times, rank = [], [], []
                real = ranktest.mann_whitney

                def timed(a, b, real=real, rank=rank):  # the rank test alone, per pair
                    t = time.perf_counter()
                    out = real(a, b)
                    rank.append(time.perf_counter() - t)
                    return out

                for _ in range(3):
                    t0 = time.perf_counter()
                    import orchestrator.review.regression as regression
                    regression.mann_whitney = timed
                    write_review(store, Path(d) / label, week="2026-W47",
                                 formats=("html", "md", "json"))
                    regression.mann_whitney = real
                    times.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    write_site(store, Path(d) / f"{label}-site", week="2026-W47", now=end)
                    site_times.append(time.perf_counter() - t0)
                times.sort()
                site_times.sort()
                rank.sort()
                per_pair = rank[len(rank) // 2] * 1000 if rank else 0.0
                print(f"{label:<11} {runs:>9,} runs (filled in {fill_s:5.0f} s)  review "
                      f"median {times[1]:5.2f} s ({times[1] / 5:.2f}× the 5 s budget; rank "
                      f"test {sum(rank) / 3:.2f} s of it, {len(rank) // 3} pairs, median "
                      f"{per_pair:.1f} ms a pair)  site median {site_times[1]:5.2f} s "
                      f"({site_times[1] / 5:.2f}× the budget)")
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
