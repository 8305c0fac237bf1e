"""Run a job: check the environment, ready the engine, then sweep or soak.

The measuring itself (order, warm-up, resume, exactness, quality, soak, summaries) is the
shared loop's (``agent/loop.py``); this module picks the engine and reports the job.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from . import AGENT_VERSION
from .checks import check_environment
from .engines import engine_for
from .job import Job
from .journal import Journal
from .loop import Engine, Loop, Variant
from .protocol import EVENT_SCHEMA, EXIT_CODES


def soak_variant(job: Job, engine: Engine) -> Variant:
    """The variant a soak runs: over http the one the job names (resolved when it was
    read); in process the baseline when the soak asks for draft width 0, else speculation."""
    vs = engine.variants
    if job.soak.get("variant"):
        return next(v for v in vs if v.name == job.soak["variant"])
    return next(v for v in vs if v.speculative != (job.soak.get("num_draft_tokens") == 0))


def _background(job: Job, journal: Journal):
    import contextlib

    if not job.background:
        return contextlib.nullcontext()
    from .cotenant import CoTenant

    return CoTenant(job.background, journal)


def run_job(job: Job, journal: Journal, *, cache_file: Path, resume: bool = False) -> int:
    from .telemetry import Sampler

    journal.job_id = job.job_id
    journal.emit("job_started", agent_version=AGENT_VERSION, event_schema=EVENT_SCHEMA,
                 host=socket.gethostname(),
                 pid=os.getpid(), platform=sys.platform, machine=platform.machine(),
                 python=platform.python_version(), seed=job.seed, mode=job.mode, resume=resume)
    journal.emit("environment_checked", **check_environment(job, cache_file))
    # the registry starts the job's engine: in process it loads the models (and says so),
    # over http a runtime serves them
    engine: Engine = engine_for(job.engine).start(job, journal)
    try:
        sampler = Sampler(job.telemetry_interval_s)
        # the controller's own CPU on this node (a local node) is said as the controller's
        sampler.watch_controller(job.controller_pid)
        with sampler, _background(job, journal) as cotenant:
            loop = Loop(job, journal, engine, sampler)
            loop.cotenant = cotenant
            if job.mode == "soak":
                return loop.soak(soak_variant(job, engine))
            return loop.sweep(resume)
    finally:
        engine.close()


def main_run(job_path: Path, journal_path: Path | None, *, echo: bool = True,
             resume: bool = False, lock_path: Path | None = None,
             cache_dir: Path | None = None, machine_lock: Path | None = None,
             key: bytes | None = None) -> int:
    from .errors import AgentError
    from .job import load_job
    from .lock import NodeLock, machine_lock_path

    home = Path(os.path.expanduser("~/.specfleet"))
    journal_path = journal_path or job_path.with_suffix(".events.jsonl")
    journal = Journal(journal_path, echo=sys.stdout if echo else None, key=key)
    try:
        job = load_job(job_path)
        journal.job_id = job.job_id
        root_lock = lock_path or home / "agent.lock"
        # the machine first: a second controller with another root must not measure here
        with NodeLock(machine_lock or machine_lock_path(), job.job_id, shared=True,
                      note=f"root lock {root_lock}"), NodeLock(root_lock, job.job_id):
            return run_job(job, journal, resume=resume,
                           cache_file=(cache_dir or home / "cache") / "fingerprints.json")
    except AgentError as e:
        journal.emit("job_failed", error=e.kind, message=str(e), exit_code=e.exit_code)
        print(f"agent: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # anything else is a bug, but it must still reach the journal
        import traceback

        journal.emit("job_failed", error="crash", message=f"{type(e).__name__}: {e}",
                     exit_code=EXIT_CODES["crash"])
        traceback.print_exc()  # for whoever reads the node's log; the exit code says crash
        return EXIT_CODES["crash"]
    finally:
        journal.close()
