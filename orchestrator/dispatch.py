"""Sweeps: push agent, weights and job to each node, run, stream events into the store.

Every node gets an outcome — ok, failed or unreachable — and one bad node never
stops the others (gather with ``return_exceptions``).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import agent

from .blobs import CONTROLLER_CACHE, push_model
from .errors import RemoteError
from .fanout import Outcome, run_fan_out
from .inventory import Host
from .store import Store
from .transport import SSHOptions, q

AGENT_DIR = Path(agent.__file__).resolve().parent
INGEST_BATCH = 64


@dataclass
class SweepResult:
    sweep_id: str
    status: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def expand_root(root: str, home: str) -> str:
    return home + root[1:] if root == "~" or root.startswith("~/") else root


async def run_on_host(host: Host, t, job: dict, store: Store, sweep_id: str,
                      progress: Callable[[str, dict], None]) -> Outcome:
    """Push agent, weights and job; run the agent; ingest its events as they arrive."""
    stored = 0
    root = expand_root(host.root, await t.home())
    await t.run(f"mkdir -p {q(root + '/agent_pkg')} {q(root + '/jobs')}")
    await t.put_dir(AGENT_DIR, f"{root}/agent_pkg/agent")
    report = await push_model(
        t, host.name, host.python, root,
        {role: Path(m["path"]) for role, m in job["models"].items()},
        CONTROLLER_CACHE / "fingerprints.json")
    node_job = json.loads(json.dumps(job))
    for role, m in node_job["models"].items():
        m["path"] = report.paths[role]["path"]
    if host.vars.get("specfleet_memory_bandwidth_gbs"):  # per-node roofline override
        node_job["memory_bandwidth_gbs"] = float(host.vars["specfleet_memory_bandwidth_gbs"])
    job_path = f"{root}/jobs/{sweep_id}.json"
    journal = f"{root}/jobs/{sweep_id}.events.jsonl"
    await t.write_text(job_path, json.dumps(node_job))
    cmd = (f"cd {q(root + '/agent_pkg')} && exec {q(host.python)} -m agent run "
           f"{q(job_path)} --journal {q(journal)} --lock {q(root + '/agent.lock')} "
           f"--cache-dir {q(root + '/cache')}")
    batch: list[dict] = []
    failure: dict | None = None
    try:
        async for line in t.stream_lines(cmd):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # not an event (a library printing to stdout)
            if not isinstance(event, dict) or "seq" not in event:
                continue
            batch.append(event)
            progress(host.name, event)
            if event["type"] == "job_failed":
                failure = event
            if len(batch) >= INGEST_BATCH or event["type"] != "generation":
                stored += store.ingest(sweep_id, host.name, batch)
                batch = []
    except RemoteError as e:
        stored += store.ingest(sweep_id, host.name, batch)
        batch = []
        msg = failure["message"] if failure else (e.stderr.strip().splitlines() or [""])[-1]
        return Outcome(host.name, "failed", f"agent exited {e.exit_status}: {msg}",
                       value={"events": stored}, command=e.command, exit_status=e.exit_status,
                       stderr_tail="\n".join(e.stderr.strip().splitlines()[-5:]))
    finally:
        stored += store.ingest(sweep_id, host.name, batch)
    return Outcome(host.name, "ok", value={"events": stored})


class StderrProgress:
    """One line per event worth showing: runs done / total, config, tok/s, acceptance."""

    def __init__(self, stream=sys.stderr):
        self.stream, self.total = stream, {}

    def __call__(self, node: str, event: dict) -> None:
        kind = event["type"]
        if kind == "plan":
            self.total[node] = event["total_generations"]
            line = f"{event['total_generations']} generations planned"
        elif kind == "generation":
            acc = event.get("acceptance_rate")
            line = (f"{event['run_index'] + 1:>3}/{self.total.get(node, '?')} "
                    f"{event['workload']:<8} {event['mode']:<11} k={event['num_draft_tokens']} "
                    f"{event.get('decode_tok_s') or 0:7.1f} tok/s"
                    + (f"  acceptance {acc:.2f}" if acc is not None else ""))
        elif kind == "quality":
            line = (f"quality {event['mode']} k={event['num_draft_tokens']}: "
                    f"{event['passed']}/{event['tasks']} tasks passed")
        elif kind == "job_failed":
            line = f"agent failed: {event['message']}"
        else:
            return
        print(f"[{node}] {line}", file=self.stream, flush=True)


def run_sweep(hosts: list[Host], job: dict, store: Store, *, inventory: str | None = None,
              ssh: SSHOptions | None = None, progress=None) -> SweepResult:
    """Run ``job`` on every host; record the sweep and each node's outcome."""
    sweep_id = uuid.uuid4().hex[:12]
    job = {**job, "job_id": sweep_id}
    store.create_sweep(sweep_id, job, inventory)
    progress = progress or (lambda n, e: None)
    outcomes = run_fan_out(
        hosts, lambda h, t: run_on_host(h, t, job, store, sweep_id, progress), ssh)
    status = store.finish_sweep(sweep_id, {o.host: (o.status, o.detail) for o in outcomes})
    return SweepResult(sweep_id, status, outcomes)
