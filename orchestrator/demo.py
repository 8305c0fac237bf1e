"""The embedded default: local node, SQLite, the project's own model pair."""

from __future__ import annotations

from dataclasses import replace
from importlib import metadata
from pathlib import Path

from .demo_models import build_demo_models
from .dispatch import StderrProgress, run_sweep
from .errors import SpecfleetError
from .inventory import load_inventory
from .jobspec import build_job
from .review import render_review
from .store import open_store

LOCAL_INVENTORY = Path(__file__).resolve().parents[1] / "inventory" / "local.yml"


def run_demo(workdir: Path, *, max_tokens: int | None = None, log=print) -> Path:
    """Build models, sweep the local node, render the review; returns the review path."""
    workdir = workdir.resolve()
    models = workdir / "models"
    build_demo_models(models, log=log)
    store = open_store(f"sqlite:///{workdir / 'specfleet.db'}")
    # Keep the demo self-contained: the local node's files live in the workdir.
    hosts = [replace(h, root=str(workdir / "node")) for h in load_inventory(LOCAL_INVENTORY).hosts]
    # Pin what this machine runs, so the agent's environment check is exercised too.
    job = build_job(models, max_tokens=max_tokens, quality=True,
                    pins={d: metadata.version(d) for d in ("mlx", "mlx-lm")})
    result = run_sweep(hosts, job, store, inventory=str(LOCAL_INVENTORY),
                       progress=StderrProgress())
    events = workdir / "events.jsonl"
    if result.status != "ok":
        details = "; ".join(f"{o.host}: {o.detail}" for o in result.outcomes if o.detail)
        raise SpecfleetError(f"demo sweep {result.sweep_id} did not finish: {details}")
    log(f"sweep {result.sweep_id}: {sum(o.value['events'] for o in result.outcomes)} "
        "events stored")
    _export_events(store, result.sweep_id, events)
    log(f"events written to {events}")
    return render_review(store, workdir / "review.html", result.sweep_id)


def _export_events(store, sweep_id: str, path: Path) -> None:
    import json

    from sqlalchemy import select

    from .store.models import Event

    with store.engine.connect() as c:
        rows = c.execute(select(Event.payload).where(Event.sweep_id == sweep_id)
                         .order_by(Event.node, Event.seq)).scalars()
        path.write_text("".join(json.dumps(p, separators=(",", ":")) + "\n" for p in rows))
