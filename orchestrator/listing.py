"""Read the store for people and scripts: sweeps and runs as rows (table, JSON, CSV)."""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from .errors import SpecfleetError
from .store import Store, queries
from .store.coverage import missing_by_node
from .store.models import Measurement, NodeOutcome, Run, Sweep

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
    with Session(store.engine) as s:
        rows = s.scalars(select(Sweep).order_by(Sweep.created_at.desc()).limit(limit)).all()
        missing = missing_by_node(store, [r.id for r in rows])
        out = []
        for r in rows:
            nodes = s.execute(select(NodeOutcome.node, NodeOutcome.status).where(
                NodeOutcome.sweep_id == r.id)).all()
            lacks = missing.get(r.id, {})
            out.append({"sweep_id": r.id, "created_at": r.created_at.isoformat(),
                        "status": "incomplete" if lacks and r.status in ("ok", "unreliable")
                        else r.status,
                        "trigger": r.trigger, "plan_id": r.plan_id,
                        "nodes": {n: st for n, st in nodes}, "missing": lacks})
        return out


def runs(store: Store, sweep_id: str | None = None, node: str | None = None,
         workload: str | None = None, engine: str | None = None) -> list[dict]:
    q = select(Run).order_by(Run.sweep_id, Run.node, Run.workload, Run.mode,
                             Run.num_draft_tokens)
    if sweep_id:
        q = q.where(Run.sweep_id == sweep_id)
    if node:
        q = q.where(Run.node == node)
    if workload:
        q = q.where(Run.workload == workload)
    if engine:
        q = q.where(Run.engine == engine)
    with Session(store.engine) as s:
        return [{f: getattr(r, f) for f in RUN_FIELDS} for r in s.scalars(q)]


def run_detail(store: Store, run_id: int) -> dict:
    with Session(store.engine) as s:
        r = s.get(Run, run_id)
        if r is None:
            raise SpecfleetError(f"no run {run_id}; `specfleet runs list` shows the ids")
        gens = s.scalars(select(Measurement).where(
            Measurement.sweep_id == r.sweep_id, Measurement.node == r.node,
            Measurement.workload == r.workload, Measurement.mode == r.mode,
            Measurement.num_draft_tokens == r.num_draft_tokens,
            Measurement.pair.is_(None) if r.pair is None else Measurement.pair == r.pair
        ).order_by(
            Measurement.run_index)).all()
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
