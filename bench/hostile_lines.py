"""Hostile and damaged journal lines, before and after: stored / set aside / node stopped /
lost, per kind of line issue 28 names, for two versions of the code side by side.

Each kind (``tests/hostile.KINDS``: a real journal the agent wrote, damaged one way) is
followed the way ``specfleet sweep`` follows a node: the node-side ``agent follow`` on a
real sshd node on loopback, streamed over SSH into the controller's ``NodeRun.follow_once``
(decode boundary, progress lines, ingest pipeline) and into the store (SQLite; the NUL
kinds into PostgreSQL, where they did harm). Then the node's outcome as the sweep reports
it, and every reader (weekly review, site, sweep page, compare) over the store.

The kinds are ``tests/hostile.KINDS`` (the lines issue 28 names) and ``MORE_KINDS`` (the
property test's mutations one at a time, and seq games: a seq far past the journal, a forged
end in the middle of it). Last, the outage holes: the real journal read into a SQLite store
another process holds locked (``--lock-s``), then read again as ``sweep --attach`` does.

Columns, per kind: ``bad stored``: events in the store that the agent never wrote (a
forged or damaged line taken as an event); ``set aside``: lines quarantined with a reason;
``stopped``: the node's ingestion raised (the sweep would stop following it); ``lost``:
events of the agent's own journal (the real lines the kind left whole, and the valid 3 MiB
event) that are not in the store as written; ``sweep says``: the node's outcome;
``readers``: whether every reader rendered.

    sudo .venv/bin/python bench/hostile_lines.py [--before REF] [--after WORKTREE] [--lock-s S]

``--before`` is a git ref of this repository (exported with ``git archive`` into a temp
folder; nothing is checked out), ``--after`` a folder (default: this checkout). Needs root
(sshd nodes) and the PostgreSQL the tests use on 127.0.0.1:5432. For the kinds the store
retry is cut to 5 s, so a line the store refuses for good (NUL) shows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def measure(code: Path) -> list[dict]:
    """Every kind, with the orchestrator and agent of ``code`` (run in a child process)."""
    sys.path.insert(0, str(HERE))
    from tests.fleet import start_fleet, stop_fleet
    from tests.hostile import KINDS, MORE_KINDS, follow_journal, journal, render_all

    sys.path.remove(str(HERE))
    sys.path.insert(0, str(code))  # orchestrator and agent from the code measured
    from sqlalchemy import create_engine, select, text
    from sqlalchemy.pool import NullPool

    from orchestrator.errors import SpecfleetError
    from orchestrator.fleet.transport import connect
    from orchestrator.store import open_store
    from orchestrator.store.models import Event
    from orchestrator.sweep.dispatch import SweepOptions

    assert str(code) in str(sys.modules["orchestrator"].__file__)
    real = journal()
    # a store that refuses a line for good is retried as if it were down: 5 s, not 120
    retry: dict[str, Any] = ({"store_retry_timeout_s": 5.0}
             if "store_retry_timeout_s" in SweepOptions.__dataclass_fields__ else {})
    fleet = start_fleet(1, sys.executable)
    work = Path(tempfile.mkdtemp(prefix="specfleet-hostile-"))
    work.chmod(0o755)
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    rows = []
    try:
        for kind in KINDS + MORE_KINDS:
            db = None
            if kind.store == "postgresql":
                db = f"specfleet_hostile_{uuid.uuid4().hex[:8]}"
                with admin.connect() as c:
                    c.execute(text(f'CREATE DATABASE "{db}"'))
                url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
            else:
                url = f"sqlite:///{work / (uuid.uuid4().hex[:8] + '.db')}"
            store = open_store(url)
            lines = kind.make(real)
            f = follow_journal(store, lines, work / "node", host=fleet.host(0), agent_dir=code,
                               transport=lambda h: connect(h, fleet.ssh_options()),
                               opts=SweepOptions(**retry))
            with store.engine.connect() as c:
                stored: dict[int, dict] = dict(c.execute(select(Event.seq, Event.payload).where(
                    Event.sweep_id == f.sweep_id)).all())
            own = own_events(real, lines, kind.valid)
            lost = len([e for e in own if stored.get(e["seq"]) != e])
            bad = len([p for p in stored.values() if p not in own])
            try:
                render_all(store, f.sweep_id, work / "readers")
                readers = "ok"
            except SpecfleetError:  # compare refuses a sweep with no runs: nothing to read
                readers = "no runs"
            except Exception as e:  # a reader broke on what was stored
                readers = f"{type(e).__name__}"
            rows.append({"kind": kind.name, "bad_stored": bad,
                         "set_aside": len(store.quarantined(f.sweep_id)),
                         "stopped": f.stopped, "lost": lost,
                         "says": f.outcome.split(":")[0] if f.outcome else "?",
                         "readers": readers})
            store.engine.dispose()
            if db:
                with admin.connect() as c:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
    finally:
        stop_fleet(fleet)
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _parsed(line: bytes) -> dict | None:
    try:
        e = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return e if isinstance(e, dict) else None


def own_events(real: list[bytes], lines: list[bytes], valid: bool) -> list[dict]:
    """The agent's own events among ``lines``: its real lines (renumbered after a forged
    line, or twice: once), and a changed line the kind calls valid (forged lines have ts
    1.0)."""
    def key(e: dict) -> str:
        return json.dumps({k: v for k, v in e.items() if k != "seq"}, sort_keys=True)

    keys, whole = {key(e) for e in map(_parsed, real) if e}, set(real)
    own: dict[int, dict] = {}
    for x in lines:
        e = _parsed(x)
        if e is not None and (x in whole or key(e) in keys or (valid and e.get("ts") != 1.0)):
            own.setdefault(e["seq"], e)
    return list(own.values())


def outage(code: Path, lock_s: float) -> dict:
    """The real journal followed over SSH into a SQLite store another process holds locked
    for ``lock_s`` seconds (longer than SQLite's own 10 s wait), then read again as
    `sweep --attach` does: the journal's seqs missing from the store after each read."""
    sys.path.insert(0, str(HERE))
    from tests.fleet import start_fleet, stop_fleet
    from tests.hostile import journal, new_sweep, placed

    sys.path.remove(str(HERE))
    sys.path.insert(0, str(code))
    import asyncio
    import io
    from dataclasses import replace

    from sqlalchemy import select

    from orchestrator.fleet.transport import connect
    from orchestrator.store import open_store
    from orchestrator.store.models import Event
    from orchestrator.sweep.dispatch import NodeRun, StderrProgress, SweepOptions

    fleet = start_fleet(1, sys.executable)
    work = Path(tempfile.mkdtemp(prefix="specfleet-outage-"))
    work.chmod(0o755)
    try:
        db = work / "s.db"
        store = open_store(f"sqlite:///{db}")
        sid = uuid.uuid4().hex[:12]
        path, folder = placed(work / "node", sid, code)
        lines = journal()
        path.write_bytes(b"".join(x + b"\n" for x in lines))
        path.chmod(0o644)
        host = replace(fleet.host(0), root=str(work / "node"))
        new_sweep(store, host.name, path, folder, host.python, sid, work / "node")
        run = NodeRun(host, store, sid, "outage", SweepOptions(), StderrProgress(io.StringIO()))

        def missing() -> int:
            with store.engine.connect() as c:
                have = set(c.execute(select(Event.seq).where(Event.sweep_id == sid)).scalars())
            return len({json.loads(x)["seq"] for x in lines} - have)

        async def read() -> str | None:
            try:
                async with connect(host, fleet.ssh_options()) as t:
                    await run.follow_once(t)
            except Exception as e:  # the read gave up: what the user would see
                return f"{type(e).__name__}"
            return None

        holder = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None)"
            "; c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); "
            "time.sleep(float(sys.argv[2])); c.execute('COMMIT')"), str(db), str(lock_s)],
            stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        first = asyncio.run(read())
        holder.wait()
        after_outage = missing()
        again = asyncio.run(read())
        return {"journaled": len(lines), "missing_after_outage": after_outage,
                "missing_after_attach": missing(), "gave_up": first or again or "-"}
    finally:
        stop_fleet(fleet)
        shutil.rmtree(work, ignore_errors=True)


def export(ref: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="specfleet-before-"))
    d.chmod(0o755)
    archive = subprocess.run(["git", "-C", str(HERE), "archive", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive, check=True)
    for p in d.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return d


def run_child(code: Path, lock_s: float, outage_only: bool = False) -> dict:
    out = subprocess.run([sys.executable, __file__, "--measure", str(code), "--lock-s",
                          str(lock_s)] + ["--outage-only"] * outage_only, check=True,
                         stdout=subprocess.PIPE, text=True, env={**os.environ}).stdout
    return json.loads(out.strip().splitlines()[-1])


def cell(r: dict) -> str:
    stopped = "STOPPED" if r["stopped"] else "-"
    return (f"{r['bad_stored']:>3} {r['set_aside']:>3} {stopped:>7} {r['lost']:>3} "
            f"{r['says']:>6} {r['readers']:>8}")


def main() -> None:
    ap = argparse.ArgumentParser()
    # 15d2900: main before issue 28's boundary work (main has since merged it)
    ap.add_argument("--before", default="15d2900", help="a git ref (default: 15d2900)")
    ap.add_argument("--after", type=Path, default=HERE, help="a folder (default: this one)")
    ap.add_argument("--lock-s", type=float, default=15.0,
                    help="how long the outage holds the SQLite store locked (default: 15)")
    ap.add_argument("--outage-only", action="store_true", help="only the outage holes")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps({"kinds": [] if args.outage_only else measure(args.measure),
                          "outage": outage(args.measure, args.lock_s)}))
        return
    before_dir = export(args.before)
    try:
        b, a = (run_child(d, args.lock_s, args.outage_only)
                for d in (before_dir, args.after.resolve()))
    finally:
        shutil.rmtree(before_dir, ignore_errors=True)
    before, after = b["kinds"], a["kinds"]
    head = "bad set stopped lost  says  readers"
    print(f"{'kind of line':<48} | {'before (' + args.before + ')':<36} | after")
    print(f"{'':<48} | {head:<36} | {head}")
    for rb, ra in zip(before, after, strict=True):
        print(f"{rb['kind']:<48} | {cell(rb):<36} | {cell(ra)}")
    print()
    for label, rows in (("before", before), ("after", after)):
        for r in rows:
            if r["stopped"]:
                print(f"{label}: {r['kind']}: stopped by {r['stopped']}")
    print(f"\nSQLite locked {args.lock_s:g} s mid-read (journal seqs missing from the store):")
    for label, o in (("before", b["outage"]), ("after", a["outage"])):
        print(f"  {label:<6} {o['journaled']} journaled; after the outage read "
              f"{o['missing_after_outage']} missing, after --attach {o['missing_after_attach']}"
              f" missing; a read gave up: {o['gave_up']}")


if __name__ == "__main__":
    main()
