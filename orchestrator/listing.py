"""Read the store for people and scripts: sweeps and runs as rows (table, JSON, CSV)."""

from __future__ import annotations

import csv
import io
import json

from .errors import SpecfleetError
from .store import Store, queries
from .store import runs as stored
from .store.coverage import missing_by_node

RUN_FIELDS = ("id", "sweep_id", "node", "engine", "model_pair", "workload", "context_bucket",
              "mode",
              "num_draft_tokens", "trials", "decode_tok_s_median", "decode_tok_s_p95",
              "decode_tok_s_cv", "acceptance_median", "unreliable", "chip", "os_build",
              "env_id", "mlx_version", "mlx_lm_version", "target_fingerprint",
              "draft_fingerprint", "prompt_sha256")


def sweeps(store: Store, limit: int = 20) -> list[dict]:
    """The newest sweeps. One whose store lacks part of a node's journal (seqs missing below
    the last stored event) is never shown ``ok``: its status says ``incomplete``, and
    ``missing`` counts the seqs per node (`specfleet sweeps verify` names them)."""
    rows = stored.newest_sweeps(store, limit)
    missing = missing_by_node(store, [r.sweep_id for r in rows])
    out = []
    for r in rows:
        lacks = missing.get(r.sweep_id, {})
        out.append({"sweep_id": r.sweep_id, "created_at": r.created_at.isoformat(),
                    "status": "incomplete" if lacks and r.status in ("ok", "unreliable")
                    else r.status,
                    "trigger": r.trigger, "plan_id": r.plan_id,
                    "nodes": dict(r.nodes), "missing": lacks})
    return out


def runs(store: Store, sweep_id: str | None = None, node: str | None = None,
         workload: str | None = None, engine: str | None = None) -> list[dict]:
    return [{f: getattr(r, f) for f in RUN_FIELDS}
            for r in stored.runs(store, sweep_id, node, workload, engine)]


def run_detail(store: Store, run_id: int) -> dict:
    r = stored.run(store, run_id)
    if r is None:
        raise SpecfleetError(f"no run {run_id}; `specfleet runs list` shows the ids")
    gens = stored.run_measurements(store, r)
    return {**{f: getattr(r, f) for f in RUN_FIELDS}, "config": r.config,
            "summary": r.summary,
            # stored events of this node's sweep that do not read as their type
            "unreadable_events": [u.message() for u in queries.unreadable(
                store, [r.sweep_id], node=r.node)],
            "measurements": [{"run_index": g.run_index, "repetition": g.repetition,
                              "decode_tok_s": g.decode_tok_s, "ttft_ms": g.ttft_ms,
                              "itl_p95_ms": g.itl_p95_ms, "acceptance_rate":
                              g.acceptance_rate, "exact_match": g.exact_match,
                              "unreliable": g.unreliable} for g in gens]}


def _digits(v):
    """Floats to six significant digits: 158.36999999999995 is 158.37 (the measurement
    carries no more than that)."""
    return float(f"{v:.6g}") if isinstance(v, float) else v


def to_csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else _digits(v)
                    for k, v in r.items()})
    return buf.getvalue()
