"""Sweeps across the fleet: lease each node, launch the agent detached, follow its journal.

The agent runs in its own session on the node and journals every event to disk, so
neither a dropped SSH link nor a dead controller loses anything: the controller
follows the journal from the last sequence number it stored, reconnecting with
backoff, and ``--attach`` / ``--resume`` pick a sweep up again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import exc as sa_exc
from sqlalchemy.exc import SQLAlchemyError

from agent.cotenant import profile_name
from agent.protocol import FINAL_EVENTS, model_roles

from ..errors import RemoteError, SpecfleetError, StoreError, UnreachableError
from ..fleet.blobs import CONTROLLER_CACHE, push_model
from ..fleet.fanout import Outcome, run_fan_out
from ..fleet.inventory import Host
from ..fleet.node_paths import check_placement, expand_root
from ..fleet.transport import SSHOptions, connect, q
from ..store import Store
from ..store.coverage import coverage, ranges_text, seq_ranges
from ..store.db import result_pair
from ..store.derived import rederive_measurements
from .decode import Decoder, Quarantined
from .pipeline import IngestPipeline


@dataclass
class SweepResult:
    sweep_id: str
    status: str
    outcomes: list[Outcome] = field(default_factory=list)
    left_out: tuple[str, ...] = ()  # nodes an --attach/--resume left to finish later

    @property
    def ok(self) -> bool:
        """Ran to its end on every node, nothing failed (its runs may all have been set
        aside: ``status`` is then "unreliable")."""
        return self.status in ("ok", "unreliable")


@dataclass
class SweepOptions:
    ssh: SSHOptions = field(default_factory=SSHOptions)
    provision: bool = True
    reconnect_timeout_s: float = 120.0
    lease_ttl_s: float = 120.0
    trigger: str = "manual"
    # what a hint adds to `specfleet sweep --attach/--resume ID` so it runs as written:
    # the -i and --db this command was given (a password masked)
    hint_args: str = ""
    db_hint: str = ""  # its --db part alone


CALIBRATION_MARK = " (calibration)"


def model_name(doc: dict, role: str) -> str:
    """A model as people name it: its folder (with its parent when the folder is just
    "target" or "draft")."""
    p = Path(doc["models"][role]["path"])
    name = p.parent.name + "/" + p.name if p.name in ("target", "draft") else p.name
    # a calibration target is an instrument: its pair's series say so wherever they are named
    return name + CALIBRATION_MARK if doc["models"][role].get("calibration") else name


def model_pair_name(doc: dict) -> str:
    """The pair as people name it: the plan's models.source (and revision), else folders."""
    m = doc["models"]
    if m.get("source"):
        return m["source"] + (f"@{m['revision']}" if m.get("revision") else "") + (
            CALIBRATION_MARK if m["target"].get("calibration") else "")
    return " / ".join(model_name(doc, r) for r in ("target", "draft"))


def role_names(doc: dict) -> dict[str, str]:
    """Each model of a lineup by name (a lineup's pairs are named from these)."""
    roles = model_roles(doc["models"])
    return {r: model_name(doc, r) for r in roles} if len(roles) > 2 else {}


def _substitute(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, json.dumps(value)[1:-1])
    return text


def _dead_here(holder: str) -> bool:
    """Is a lease holder ("host:pid:nonce") a controller of this machine that has exited?"""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's controller: its lease expires on its own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


STORE_RETRY_MAX_S = 10.0   # a store that is down is asked again at least this often
STORE_DOWN_SAY_S = 60.0    # once the wait is that long, "still unreachable" once a minute


def store_down(e: SQLAlchemyError) -> bool:
    """The store cannot be reached or is busy (stopped, restarting, locked by another
    process), as opposed to refusing what it was sent: worth waiting for, however long."""
    if _out_of_space(e):
        return False  # someone must free space; waiting alone never ends it
    return bool(getattr(e, "connection_invalidated", False)) or isinstance(e, (
        sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
        sa_exc.DisconnectionError))


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _out_of_space(e: BaseException) -> bool:
    msg = _first_line(e)
    return "disk is full" in msg or "No space left" in msg


def controller_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class StopRefused(SpecfleetError):
    """--stop found another process under the stored PID and signalled nothing."""


# POSIX sh on the node (dash, bash, macOS sh; `ps -ww` is never cut): the agent's process
# group ends, but only once the PID is shown to be this sweep's agent: its command line
# runs JOB with JOURNAL, and it is at least as old as the agent's own job_started (a PID
# recycled since is younger). Anything else is named and never signalled.
STOP_SCRIPT = """pid=PID
started=STARTED
args=$(ps -ww -o args= -p $pid 2>/dev/null)
state=$(ps -o stat= -p $pid 2>/dev/null)
case "$state" in Z*) echo gone; exit 0 ;; esac
if [ -z "$args" ]; then echo gone; exit 0; fi
case "$args" in
  *" -m agent run "JOB" --journal "JOURNAL" "*) ;;
  *) echo "not-ours $args"; exit 0 ;;
esac
num() { v=$1; while [ ${#v} -gt 1 ] && [ "${v#0}" != "$v" ]; do v=${v#0}; done; echo "$v"; }
et=$(ps -o etime= -p $pid 2>/dev/null | tr -d ' ')
d=0
case "$et" in *-*) d=${et%%-*}; et=${et#*-} ;; esac
IFS=:; set -- $et; unset IFS
case $# in 3) h=$1 m=$2 s=$3 ;; 2) h=0 m=$1 s=$2 ;; *) h=0 m=0 s=${1:-0} ;; esac
age=$(( $(num $d) * 86400 + $(num $h) * 3600 + $(num $m) * 60 + $(num $s) ))
born=$(( $(date +%s) - age ))
if [ "$started" -gt 0 ] && [ "$born" -gt $(( started + 5 )) ]; then
  echo "too-young $born $args"; exit 0
fi
pg=$(ps -o pgid= -p $pid 2>/dev/null | tr -d ' ')
if [ -z "$pg" ]; then echo gone; exit 0; fi
kill -TERM -$pg 2>/dev/null || kill -TERM $pid 2>/dev/null
# a zombie has ended (nothing may reap it: a container's init, its parent)
alive() { st=$(ps -o stat= -p $pid 2>/dev/null); [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
i=0
while [ $i -lt 50 ] && alive; do sleep 0.2; i=$((i+1)); done
if alive; then kill -KILL -$pg 2>/dev/null || kill -KILL $pid; echo killed
else echo stopped; fi
"""


def stop_script(pid: int, job_path: str, journal_path: str, started: float | None) -> str:
    """STOP_SCRIPT for one agent: its PID, the job and journal its command line must name
    (quoted: a quoted word in a case pattern is literal, glob characters and all) and when
    it said it started (0: not known yet, only the command line is checked)."""
    values = {"PID": str(int(pid)), "STARTED": str(int(started or 0)),
              "JOURNAL": shlex.quote(journal_path), "JOB": shlex.quote(job_path)}
    # one pass: a path that happens to hold "JOB" is not substituted again
    return re.sub(r"\b(PID|STARTED|JOURNAL|JOB)\b", lambda m: values[m.group(1)], STOP_SCRIPT)


def _pair(event: dict) -> str:
    """ " target+draft-2" for a lineup's result (which pair), "" for a plan of one pair."""
    pair = result_pair(event)
    if pair and pair.endswith("+None"):  # a target's own baseline (its quality tasks)
        return f" {pair.removesuffix('+None')} alone"
    return f" {pair}" if pair else ""


class StderrProgress:
    """One line per event worth showing: runs done / total, config, tok/s, acceptance."""

    def __init__(self, stream=None):
        # resolved now, not at import: the CLI (or a test runner) may have replaced stderr
        self.stream, self.total, self.soak_shown = stream or sys.stderr, {}, {}

    def __call__(self, node: str, event: dict) -> None:
        kind = event["type"]
        if kind == "plan":
            self.total[node] = event["total_generations"]
            line = f"{event['total_generations']} generations planned"
        elif kind == "generation":
            acc = event.get("acceptance_rate")
            where = (f"{event.get('runtime')}/{event['variant']}" if event.get("variant")
                     else f"k={event['num_draft_tokens']}") + _pair(event)
            line = (f"{event['run_index'] + 1:>3}/{self.total.get(node, '?')} "
                    f"{event['workload']:<8} {event['mode']:<11} {where} "
                    f"{event.get('decode_tok_s') or 0:7.1f} tok/s"
                    + (f"  acceptance {acc:.2f}" if acc is not None else "")
                    + ("  streaming parity MISMATCH" if event.get("parity") == "mismatch"
                       else ""))
        elif kind == "generation_failed":
            what = event.get("variant") or event.get("workload") or "?"
            line = f"generation FAILED ({what}): {str(event.get('error'))[:200]}"
        elif kind == "quality":
            line = (f"quality {event['mode']} k={event['num_draft_tokens']}{_pair(event)}: "
                    f"{event['passed']}/{event['tasks']} tasks passed")
        elif kind == "soak_sample":
            # one line per ~10 s: a long soak makes a sample every generation
            if event["index"] and event["elapsed_s"] - self.soak_shown.get(node, 0) < 10:
                return
            self.soak_shown[node] = event["elapsed_s"]
            line = (f"soak {event['elapsed_s']:6.0f}s #{event['index'] + 1:<5} "
                    f"{event.get('decode_tok_s') or 0:7.1f} tok/s  rss "
                    f"{(event.get('rss_bytes') or 0) / 2**20:.0f} MiB  swap "
                    f"{(event.get('swap_used_bytes') or 0) / 2**20:.0f} MiB")
        elif kind == "soak_result":
            line = (f"soak {event['status']}: {event['generations']} generations in "
                    f"{event.get('duration_s') or 0:.0f}s, peak rss "
                    f"{(event.get('peak_rss_bytes') or 0) / 2**20:.0f} MiB"
                    + "".join(f"; {r}" for r in event.get("reasons") or []))
        elif kind == "notice" and event.get("adaptive"):
            line = str(event.get("message"))[:300]
        elif kind == "load_level":
            line = (f"load {event['load']}={event['level']:g} {event['variant']}: "
                    + (f"FAILED: {str(event.get('error'))[:200]}" if event["status"] == "failed"
                       else f"{event.get('output_tok_s_total') or 0:.1f} tok/s, e2e p95 "
                            f"{event.get('e2e_ms_p95') or 0:.0f} ms, {event.get('completed')}/"
                            f"{event.get('requests')} ok"
                            + (f", goodput {event['goodput_rps']:.2f}/s"
                               if event.get("goodput_rps") is not None else "")
                            + (f"; SATURATED: {event.get('stop_reason')}"
                               if event["status"] == "saturated" else "")))
        elif kind == "job_failed":
            line = f"agent failed: {event['message']}"
        elif kind == "follow":
            line = event["message"]
        else:
            return
        print(f"[{node}] {line}", file=self.stream, flush=True)


class NodeRun:
    """One node's part of a sweep, from lease to final outcome."""

    def __init__(self, host: Host, store: Store, sweep_id: str, holder: str,
                 opts: SweepOptions, progress: Callable[[str, dict], None]):
        self.host, self.store, self.sweep_id, self.holder = host, store, sweep_id, holder
        self.opts, self.progress = opts, progress
        self.started = False  # once an agent runs, its lease outlives this controller
        self.stopped = False  # --stop ended its agent: the node is free again
        self._home: str | None = None  # the node's $HOME, asked once
        self.decoder = Decoder(host.name)

    async def set_aside(self, q: Quarantined) -> None:
        """A line that failed the decode boundary: kept with its reason, said once, and the
        follower goes on with the next line."""
        new = await self.with_store(self.store.quarantine, self.sweep_id, self.host.name, [q])
        if new:
            self.say(f"set aside a journal line{'' if q.seq is None else f' (seq {q.seq})'}: "
                     f"{q.reason[:160]}")

    def say(self, message: str) -> None:
        self.progress(self.host.name, {"type": "follow", "message": message})

    def again(self, verb: str) -> str:
        """The command that picks this sweep up again, as the user can paste it."""
        return f"specfleet sweep --{verb} {self.sweep_id}{self.opts.hint_args}"

    # -- leases ------------------------------------------------------------------------

    def lease(self) -> None:
        lease = self.store.acquire_lease(self.host.name, self.holder, self.sweep_id,
                                         self.opts.lease_ttl_s)
        if not lease["ours"] and _dead_here(lease["holder"]):
            # a controller of this machine that is gone (killed, crashed): its lease would
            # hold the node until it expires for no one
            if self.store.take_lease(self.host.name, lease["holder"], self.holder,
                                     self.sweep_id, self.opts.lease_ttl_s):
                self.say(f"reclaimed the node's lease from controller {lease['holder']} "
                         f"(sweep {lease['sweep_id']}), which is no longer running")
                return
            lease = self.store.acquire_lease(self.host.name, self.holder, self.sweep_id,
                                             self.opts.lease_ttl_s)
        if not lease["ours"]:
            raise SpecfleetError(
                f"node busy: leased by {lease['holder']} for sweep {lease['sweep_id']} until "
                f"{lease['expires_at']:%Y-%m-%d %H:%M:%S}")

    async def keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.opts.lease_ttl_s / 3)
            try:
                await asyncio.to_thread(self.lease)
            except (SQLAlchemyError, SpecfleetError):
                pass  # the store may be restarting; the next renewal tries again

    # -- launch ------------------------------------------------------------------------

    async def launch(self, t, doc: dict, job: dict) -> None:
        from ..fleet.facts import collect
        from ..fleet.provision import provision_host, push_agent

        h = self.host
        root = expand_root(h.root, await t.home())
        # The node's facts are part of every result's identity (chip, OS build, power).
        facts = await collect(h, t)
        await asyncio.to_thread(self.store.add_facts, h.name, facts)
        env_id = None
        if self.opts.provision:
            d = await provision_host(h, t, doc)
            python, agent_dir, models = d["env_python"], d["agent_dir"], d["models"]
            env_id = d["env_id"]
        else:  # the node brings its own Python (specfleet_python); the agent checks pins
            await t.run(f"mkdir -p {q(root)}")
            agent_dir = (await push_agent(t, root))["agent_dir"]
            python = h.python
            report = await push_model(t, h.name, python, root,
                                      {r: Path(doc["models"][r]["path"])
                                       for r in model_roles(doc["models"])},
                                      CONTROLLER_CACHE / "fingerprints.json",
                                      verify=doc["models"].get("verify", "daily"))
            if report.resent_corrupt:
                self.say(f"{report.resent_corrupt} weight blob(s) no longer matched their "
                         "sha256 and were sent again")
            models = report.paths
        node_job = json.loads(json.dumps(job))
        node_job["job_id"] = self.sweep_id
        node_job["models"] = {r: {"path": models[r]["path"],
                                  "fingerprint": doc["models"][r]["fingerprint"]}
                              for r in model_roles(doc["models"])}
        if node_job.get("engine"):  # runtime command lines name the node's copies of the pair
            paths = {"{target}": models["target"]["path"], "{draft}": models["draft"]["path"],
                     "{python}": python}
            node_job["engine"] = json.loads(_substitute(json.dumps(node_job["engine"]), paths))
        if h.vars.get("specfleet_memory_bandwidth_gbs"):  # per-node roofline override
            node_job["memory_bandwidth_gbs"] = float(h.vars["specfleet_memory_bandwidth_gbs"])
        jobs = f"{root}/jobs"
        job_path, journal = f"{jobs}/{self.sweep_id}.json", f"{jobs}/{self.sweep_id}.events.jsonl"
        await t.run(f"mkdir -p {q(jobs)}")
        await t.write_text(job_path, json.dumps(node_job))
        self.store.set_sweep_node(self.sweep_id, h.name, state="launching", root=root,
                                  job_path=job_path, journal_path=journal, agent_dir=agent_dir,
                                  python=python, identity={
                                      "env_id": env_id, "power_source": facts["power_source"],
                                      "model_pair": model_pair_name(doc),
                                      "background": profile_name(job["background"])
                                      if job.get("background") else None,
                                      **({"role_names": names} if (names := role_names(doc))
                                         else {})})
        await self.start_agent(t, resume=False)

    async def start_agent(self, t, resume: bool) -> None:
        sn = await self._placed(t)
        cmd = (f"cd {q(sn.agent_dir)} && {q(sn.python)} -m agent run {q(sn.job_path)} "
               f"--journal {q(sn.journal_path)} --lock {q(sn.root + '/agent.lock')} "
               f"--cache-dir {q(sn.root + '/cache')} --detach" + (" --resume" if resume else "")
               + (f" --machine-lock {q(str(self.host.vars['specfleet_machine_lock']))}"
                  if self.host.vars.get("specfleet_machine_lock") else ""))
        res = await t.run(cmd)
        pid = json.loads(res.stdout.strip().splitlines()[-1])["pid"]
        self.store.set_sweep_node(self.sweep_id, self.host.name, state="running", pid=pid)
        self.started = True
        self.say(f"agent {'resumed' if resume else 'started'} (pid {pid}), detached")

    async def stop_agent(self, t) -> str:
        """End the agent: SIGTERM to its process group (a runtime it started is in it),
        SIGKILL after 10 s. The locks it held are flocks: they go with the process."""
        sn = await self._placed(t)
        pid = int(sn.pid or 0)
        if not pid:
            return "no agent was started"
        started = self.store.agent_started_at(self.sweep_id, self.host.name)
        res = await t.run(stop_script(pid, sn.job_path, sn.journal_path, started), check=False)
        said = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if said.startswith("not-ours"):
            raise StopRefused(
                f"{self.host.name}: refused to signal pid {pid}: it is not this sweep's agent "
                f"(its command line is {said.removeprefix('not-ours ')[:200]!r}, expected "
                f"`-m agent run {sn.job_path} --journal {sn.journal_path}`). The PID was "
                "reused, or the stored lease was edited; the agent, if any, has ended "
                "already. Nothing was signalled")
        if said.startswith("too-young"):
            raise StopRefused(
                f"{self.host.name}: refused to signal pid {pid}: that process started after "
                "this sweep's agent did (the PID was reused by another run of the same job "
                "file); nothing was signalled")
        return {"gone": f"agent (pid {pid}) had already ended",
                "stopped": f"agent (pid {pid}) stopped",
                "killed": f"agent (pid {pid}) killed after 10 s"}.get(said, res.stdout)

    async def _placed(self, t):
        """The node's row, its placement checked against the inventory before anything
        named in it runs on the node (the store does not choose what runs)."""
        sn = await self.with_store(self._row)
        if self._home is None:
            self._home = await t.home()
        check_placement(self.host, expand_root(self.host.root, self._home), sn, self.sweep_id)
        return sn

    def _row(self):
        rows = [r for r in self.store.sweep_nodes(self.sweep_id) if r.node == self.host.name]
        if not rows:
            raise SpecfleetError(f"{self.host.name}: not part of sweep {self.sweep_id}")
        return rows[0]

    # -- follow ------------------------------------------------------------------------

    async def with_store(self, fn, *args):
        """``fn(*args)`` in a thread, waiting out a store that is down for as long as it
        takes (bounded backoff): the node's journal keeps every event meanwhile, so the
        wait costs nothing but time. A store that refuses what it was sent, or is out of
        space, is an error at once."""
        down_since, delay, said = None, 0.5, -math.inf
        while True:
            try:
                result = await asyncio.to_thread(fn, *args)
            except SQLAlchemyError as e:
                msg = _first_line(e)
                if _out_of_space(e):
                    raise StoreError(f"the controller's store is out of disk space ({msg}); "
                                     "free space, then `specfleet sweep --attach "
                                     f"{self.sweep_id}` (the node's journal keeps every "
                                     "event)") from None
                if not store_down(e):
                    raise StoreError(f"the store refused a write ({msg[:300]}); the node's "
                                     "journal keeps every event: `specfleet sweep --attach "
                                     f"{self.sweep_id}` stores them once this is fixed"
                                     ) from None
                now = time.monotonic()
                down_since = down_since or now
                # each longer wait is said, then once a minute: 22 nodes, not 22 lines a second
                if delay < STORE_RETRY_MAX_S or now - said >= STORE_DOWN_SAY_S:
                    said = now
                    self.say(f"store unreachable for {now - down_since:.0f}s ({msg[:100]}); "
                             f"retrying in {delay:g}s. Nothing is lost: the node's journal "
                             "keeps every event, stored once the store answers")
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_MAX_S)
                continue
            if down_since is not None:
                self.say(f"store reachable again after {time.monotonic() - down_since:.0f}s; "
                         "going on, nothing lost")
            return result

    async def ingest(self, batch: list[dict], raw: list[str]) -> None:
        """Store a batch, however long the store is down: never given up, never dropped.
        Lines the ledger sets aside (a conflict, a forgery) are said, once per attempt that
        stored them."""
        if not batch:
            return

        def store_batch() -> list:
            refused: list = []  # fresh per attempt: a rolled-back attempt said nothing
            self.store.ingest(self.sweep_id, self.host.name, batch, raw, refused)
            return refused

        for r in await self.with_store(store_batch):
            self.say(f"set aside a journal line (seq {r.seq}): {r.reason[:160]}")

    async def stored_whole(self) -> bool:
        """The store holds the node's journal to its final event, with no hole below it."""
        cov = await self.with_store(coverage, self.store, self.sweep_id, self.host.name)
        last = await self.with_store(self.store.last_event, self.sweep_id, self.host.name)
        return not cov.holes and (last or {}).get("type") in FINAL_EVENTS

    async def follow_once(self, t) -> None:
        sn = await self._placed(t)
        # from the last seq up to which everything is stored, not the highest stored one:
        # a hole below it (a batch lost, rows deleted) is read again from the journal
        cov = await self.with_store(coverage, self.store, self.sweep_id, self.host.name)
        if cov.holes:
            self.say(f"reading {cov.missing} journal line(s) the store lacks again from the "
                     f"node (seq {ranges_text(cov.holes)})")
        # a finished agent's pid may be another process's by now: read to the end and stop
        pid = 0 if sn.state == "finished" else sn.pid or 0
        cmd = (f"cd {q(sn.agent_dir)} && {q(sn.python)} -m agent follow "
               f"{q(sn.journal_path)} --from-seq {cov.through} --pid {pid}")
        pipeline = IngestPipeline(self.ingest)
        ends: list[dict] = []
        try:
            # aclosing: a follower left early (an agent refused mid-stream) is closed now,
            # not whenever the garbage collector finds it after the event loop is gone
            async with contextlib.aclosing(t.stream_lines(cmd)) as lines:
                async for line in lines:
                    if not line.strip():
                        continue
                    typed = self.decoder.event(line)  # the one boundary; may refuse the agent
                    if isinstance(typed, Quarantined):
                        await self.set_aside(typed)
                        continue
                    event = typed.raw  # the checked object: what the store keeps and reads
                    if event["type"] in FINAL_EVENTS:
                        ends.append(event)  # said once the ledger keeps it (it may be forged)
                    elif event["seq"] not in cov.covered:  # shown once, when it first arrives
                        self.progress(self.host.name, event)
                    # stored as written (again for a seq stored already: the store keeps
                    # one); no second serialisation
                    await pipeline.add(event, line.strip())
        finally:
            await pipeline.close()
        last = await self.with_store(self.store.last_event, self.sweep_id, self.host.name)
        for e in ends:
            if e == last and e["seq"] not in cov.covered:
                self.progress(self.host.name, e)

    async def follow(self, t) -> None:
        """Follow until the agent is done; on a dropped link reconnect and go on.

        A follower that died with the link (non-zero exit) or a store that blinked while
        we asked it where to resume are retried the same way; the journal keeps it all.
        """
        deadline = None
        delay = 0.5
        while True:
            try:
                if t is None:
                    async with connect(self.host, self.opts.ssh) as t2:
                        await self.follow_once(t2)
                else:
                    await self.follow_once(t)
                return
            except (UnreachableError, RemoteError, SQLAlchemyError) as e:
                why = getattr(e, "reason", None) or str(e).splitlines()[0]
                t = None
                deadline = deadline or time.monotonic() + self.opts.reconnect_timeout_s
                if time.monotonic() > deadline:
                    raise UnreachableError(
                        self.host.name, f"lost the node ({why}); its agent may still be "
                        f"running: `{self.again('attach')}`") from None
                self.say(f"link lost ({why[:80]}); reconnecting in {delay:.1f}s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    def outcome(self) -> Outcome:
        last = self.store.last_event(self.sweep_id, self.host.name) or {}
        kind = last.get("type")
        if kind == "job_finished" and last.get("status", "ok") != "ok":  # e.g. soak_failed
            self.store.set_sweep_node(self.sweep_id, self.host.name, state="finished")
            why = "; ".join(last.get("reasons") or []) or "see the journal"
            return Outcome(self.host.name, "failed", f"{last['status']}: {why}",
                           exit_status=7 if last["status"] == "soak_failed" else None)
        if kind == "job_finished" and last.get("failed"):
            # a job that measured only part of its plan is not ok, whatever else it did
            self.store.set_sweep_node(self.sweep_id, self.host.name, state="finished")
            return Outcome(self.host.name, "failed",
                           f"{last['failed']} planned generation(s) failed "
                           f"({last.get('generations', 0)} measured); the errors are on the "
                           f"sweep page: `specfleet review --sweep {self.sweep_id}`")
        cov = coverage(self.store, self.sweep_id, self.host.name)
        lost = cov.missing - cov.unnumbered  # set-aside lines fill some
        if kind == "job_finished" and lost > 0:  # never silent: say which never arrived
            self.store.set_sweep_node(self.sweep_id, self.host.name, state="finished")
            return Outcome(self.host.name, "failed",
                           f"{lost} journal line(s) never reached the store: seq "
                           f"{ranges_text(cov.holes)}"
                           + (f" ({cov.unnumbered} set-aside line(s) had no readable seq)"
                              if cov.unnumbered else "")
                           + f"; the node's journal {self._row().journal_path} holds what "
                             "it wrote")
        if kind == "job_finished":
            self.store.set_sweep_node(self.sweep_id, self.host.name, state="finished")
            measured, aside, reasons = self.store.set_aside_generations(self.sweep_id,
                                                                       self.host.name)
            if measured and aside == measured:  # nothing to judge by: not an ok result
                return Outcome(self.host.name, "unreliable", value={
                    "events": self.store.last_seq(self.sweep_id, self.host.name),
                    "generations": last.get("generations"), "set_aside": aside}, detail=(
                    f"no reliable result: all {measured} generation(s) were set aside as "
                    f"unreliable ({'; '.join(reasons[:3]) or 'see the sweep page'}); the sweep "
                    f"page says why, run by run: `specfleet review --sweep {self.sweep_id}"
                    f"{self.opts.db_hint}`. Run it again when the node is quiet"))
            kept = self.store.quarantined_count(self.sweep_id, self.host.name)
            return Outcome(self.host.name, "ok", value={
                "events": self.store.last_seq(self.sweep_id, self.host.name),
                "generations": last.get("generations"), "set_aside": kept},
                detail=f"{kept} journal line(s) set aside (`specfleet review --sweep "
                       f"{self.sweep_id}` lists why)" if kept else None)
        if kind == "job_failed":
            self.store.set_sweep_node(self.sweep_id, self.host.name, state="failed")
            if last.get("error") == "node_busy":  # nothing measured: not started, not failed
                return Outcome(self.host.name, "busy", self._busy(last["message"]),
                               exit_status=last.get("exit_code"))
            return Outcome(self.host.name, "failed", f"agent: {last['message']}",
                           exit_status=last.get("exit_code"))
        self.store.set_sweep_node(self.sweep_id, self.host.name, state="died")
        return Outcome(self.host.name, "failed",
                       f"the agent stopped before finishing (last event: {kind or 'none'}); "
                       f"run `{self.again('resume')}` to measure only what "
                       "is missing")

    def _busy(self, message: str) -> str:
        """The agent found the machine lock taken: who holds it, and the three ways on."""
        ways = ["wait until it ends and run this again"]
        other = re.search(r"node is busy: job ([0-9a-f]{6,64}) ", message)
        if other and other.group(1) != self.sweep_id:  # e.g. a sweep left after Ctrl-C
            held = self.store.sweep(other.group(1))
            if held is not None:  # in this store: the hint names the inventory it ran with
                args = "".join(f" -i {shlex.quote(p)}" for p in (held.inventory or "").split(",")
                               if p) + self.opts.db_hint
                ways.append(f"if nobody follows that sweep any more, end it: "
                            f"`specfleet sweep --stop {other.group(1)}{args}`")
            else:
                ways.append(f"if it is a sweep of yours in another store that nobody follows "
                            f"any more, end it: `specfleet sweep --stop {other.group(1)}` with "
                            "that store's -i and --db")
        ways.append("if this node is a simulated one (tests, a demo beside another benchmark "
                    "on this machine), give it a machine lock of its own: "
                    + ("run the command with `SPECFLEET_MACHINE_LOCK=/tmp/specfleet-lock-NAME` "
                       "in front" if self.host.is_local else
                       "`specfleet_machine_lock: /tmp/specfleet-lock-NAME` in the inventory"))
        return (f"not started: {message.removeprefix('node is busy: ')}; the node is busy "
                f"with that job. Either " + "; or ".join(ways))

    # -- the three ways in -------------------------------------------------------------

    async def run(self, t, mode: str, doc: dict | None = None, job: dict | None = None):
        await asyncio.to_thread(self.lease)
        keeper = asyncio.create_task(self.keep_lease())
        try:
            if mode == "start":
                assert doc is not None and job is not None
                await self.launch(t, doc, job)
            elif mode == "resume":
                self.started = True
                sn = await self._placed(t)
                if sn.state == "finished" and await self.stored_whole():
                    return self.outcome()
                # the agent's own test: a killed agent can linger as a zombie that
                # `kill -0` calls alive when nothing reaps it (a container's init)
                alive = await t.run(
                    f"cd {q(sn.agent_dir)} && {q(sn.python)} -c 'import sys; from agent.follow "
                    f"import alive; sys.exit(0 if alive({int(sn.pid or 0)}) else 1)'",
                    check=False)
                if alive.exit_status != 0 and sn.state != "finished":
                    await self.start_agent(t, resume=True)
            elif mode == "stop":
                self.started = True
                if self._row().state == "stopped":
                    return Outcome(self.host.name, "stopped", "already stopped")
                if self._row().state in ("finished", "failed"):
                    return self.outcome()
                said = await self.stop_agent(t)
                await self.follow_once(t)  # what it wrote before it ended, stored
                last = self.store.last_event(self.sweep_id, self.host.name) or {}
                if last.get("type") in FINAL_EVENTS:
                    return await asyncio.to_thread(self.outcome)  # it had finished anyway
                self.store.set_sweep_node(self.sweep_id, self.host.name, state="stopped")
                self.stopped = True
                return Outcome(self.host.name, "stopped",
                               f"stopped: {said}; "
                               f"{self.store.last_seq(self.sweep_id, self.host.name)} events "
                               f"stored; `{self.again('resume')}` measures "
                               "what is missing")
            else:
                self.started = True
                # a finished node's journal is read again past what is stored, even when
                # the store holds its end: lines after it (appended later, forged) are set
                # aside with their reason, never left unread while the sweep says ok
            await self.follow(t)
            if mode == "attach":
                fixed = await self.with_store(rederive_measurements, self.store,
                                              self.sweep_id, self.host.name)
                if fixed:
                    self.say(f"{len(fixed)} measurement(s) differed from their stored events "
                             f"and were derived again from them (seq "
                             f"{ranges_text(seq_ranges(fixed))})")
            return await self.with_store(self.outcome)
        finally:
            keeper.cancel()
            final = self.store.last_event(self.sweep_id, self.host.name) or {}
            if not self.started or self.stopped or final.get("type") in ("job_finished",
                                                                          "job_failed"):
                self.store.release_lease(self.host.name, self.holder)


def _run(hosts: list[Host], store: Store, sweep_id: str, opts: SweepOptions, progress,
         mode: str, doc: dict | None = None, job: dict | None = None) -> list[Outcome]:
    holder = controller_id()

    async def one(h: Host, t) -> Outcome:
        return await NodeRun(h, store, sweep_id, holder, opts, progress).run(t, mode, doc, job)

    return run_fan_out(hosts, one, opts.ssh)


def _finish(store: Store, sweep_id: str, outcomes: list[Outcome],
            pending: tuple[str, ...] = ()) -> str:
    try:
        return store.finish_sweep(sweep_id, {o.host: (o.status, o.detail) for o in outcomes},
                                  pending)
    except SQLAlchemyError as e:
        # the outcomes are not stored: say them here, or their reasons are lost
        said = "; ".join(f"{o.host} {o.status}" + (f": {o.detail}" if o.detail else "")
                         for o in outcomes)
        raise StoreError(f"could not record the outcome of sweep {sweep_id} "
                         f"({str(e).splitlines()[0]}); the nodes' journals keep every event: "
                         f"`specfleet sweep --attach {sweep_id}` once the store is back"
                         + (f". Outcomes: {said}" if said else "")) from None


def start_sweep(doc: dict, hosts: list[Host], store: Store, *, inventory: str | None = None,
                opts: SweepOptions | None = None, progress=None,
                announce=lambda sweep_id: None) -> SweepResult:
    """Create the sweep record and run the lock's job on every host."""
    opts = opts or SweepOptions()
    sweep_id = uuid.uuid4().hex[:12]
    job = doc["job"]
    store.record_lock(doc)
    store.create_sweep(sweep_id, {**job, "models": {r: {"fingerprint": doc["models"][r][
        "fingerprint"]} for r in model_roles(doc["models"])}}, inventory, plan_id=doc["lock_id"],
        trigger=opts.trigger, controller=controller_id())
    announce(sweep_id)
    try:
        outcomes = _run(hosts, store, sweep_id, opts, progress or (lambda n, e: None), "start",
                        doc, job)
    except Exception as e:  # never leave the record `running` for a sweep that stopped
        _finish(store, sweep_id, [Outcome(h.name, "failed", f"the controller stopped: "
                                          f"{type(e).__name__}: {e}") for h in hosts])
        raise
    return SweepResult(sweep_id, _finish(store, sweep_id, outcomes), outcomes)


def continue_sweep(sweep_id: str, hosts: list[Host], store: Store, *, resume: bool,
                   opts: SweepOptions | None = None, progress=None,
                   leave_out: bool = False, stop: bool = False) -> SweepResult:
    """``--attach``: follow running agents; ``--resume``: restart dead ones with --resume;
    ``stop``: end the agents (what they wrote is stored) and release the nodes.
    ``leave_out``: the user chose the nodes (--limit); the others are left as they are, and
    the sweep stays running until they finish too."""
    opts = opts or SweepOptions()
    if store.sweep(sweep_id) is None:
        raise SpecfleetError(f"no sweep {sweep_id!r} in the store")
    rows = {r.node: r for r in store.sweep_nodes(sweep_id)}
    chosen = [h for h in hosts if h.name in rows]
    missing = set(rows) - {h.name for h in chosen}
    if missing and not leave_out:
        raise SpecfleetError(f"sweep {sweep_id} ran on {', '.join(sorted(missing))}, which the "
                             "inventory does not include (name the nodes to pick up with "
                             "--limit to leave the others out)")
    if not chosen:
        raise SpecfleetError(f"--limit selects none of the nodes sweep {sweep_id} ran on "
                             f"({', '.join(sorted(rows))})")
    # nodes left out whose agents have not finished: the sweep is not over
    pending = tuple(sorted(n for n in missing if rows[n].state not in ("finished", "failed")))
    outcomes = _run(chosen, store, sweep_id, opts, progress or (lambda n, e: None),
                    "stop" if stop else "resume" if resume else "attach")
    return SweepResult(sweep_id, _finish(store, sweep_id, outcomes, pending), outcomes,
                       left_out=pending)

