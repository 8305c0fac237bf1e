"""Issue 31 item 1's speed target, as bench/ingest.py measures it: generation events stored
through the controller's path (decode boundary, ingest pipeline, ledger, store) at >= 0.8
of the bare driver's floor, counted in CPU seconds. The bench's own ``run`` and ``floor``
take the measurement; the events are a real journal's generation, as the bench's sample
is (the bench generates its own with mlx-lm; this reuses a recorded one, with no model)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from agent.protocol import SAMPLING_DEFAULTS
from tests.journals import lines as journal_lines

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _events(n: int) -> list[dict]:
    """The bench's sample event (bench/ingest.py ``sample_events``) around a recorded
    generation's measured fields, renumbered ``n`` times."""
    g = next(e for e in map(json.loads, journal_lines()) if e["type"] == "generation")
    cfg = {**SAMPLING_DEFAULTS, "num_draft_tokens": 0}
    base = {**g, "schema": 1, "type": "generation", "job_id": "bench", "workload": "code",
            "prompt_sha256": "0" * 64, "mode": "baseline", "knob": "num_draft_tokens",
            "knob_value": 2, "num_draft_tokens": 0, "config": cfg, "repetition": 0,
            "telemetry": [{"ts": 1.0, "swap_used_bytes": 0, "rss_bytes": 1 << 27,
                           "memory_pressure": "normal"}] * 2}
    base.pop("models", None), base.pop("method", None)
    return [{**base, "seq": i + 1, "ts": 1e9 + i, "run_index": i} for i in range(n)]


@pytest.mark.xfail(strict=True, reason=(
    "issue 31 item 1: measured CPU share of the floor on SQLite 0.23-0.39 (bench/ingest.py, "
    "2026-11-27, a machine at load 9-13); the checks' C work alone (HMAC-SHA256 ~4.5 us, "
    "orjson parse ~5.5, msgspec typed check ~3.5, duplicate-key dump ~2.3, depth count "
    "~2.3 per 2.2 kB line) is ~18 us against the floor's ~22 us, so 0.8 needs checks "
    "costing at most 5.5 us a line"))
def test_generation_ingest_costs_at_most_1_25x_the_bare_driver_on_sqlite(tmp_path):
    bench = _bench()
    events = _events(2000)
    lines = [bench.sign(bench.KEY, json.dumps(e, separators=(",", ":"))) for e in events]
    ours, floors = [], []
    for i in range(3):  # interleaved, medians: the machine is shared
        ours.append(bench.run(f"sqlite:///{tmp_path}/ours{i}.db", events, lines)[3])
        floors.append(bench.floor(f"sqlite:///{tmp_path}/floor{i}.db", events, lines)[1])
    assert statistics.median(floors) / statistics.median(ours) >= 0.8
