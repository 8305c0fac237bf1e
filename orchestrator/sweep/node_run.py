"""One node's part of a sweep, from lease to final outcome: launch its agent detached,
follow its journal through the decode boundary into the store, reconnect when the link
drops, stop it on ``--stop``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from agent.protocol import FINAL_EVENTS, model_roles

from ..errors import RemoteError, SpecfleetError, UnreachableError
from ..fleet.blobs import CONTROLLER_CACHE, push_model
from ..fleet.fanout import Outcome
from ..fleet.inventory import Host
from ..fleet.node_paths import check_placement, expand_root
from ..fleet.transport import connect, q
from ..store import Store
from ..store.coverage import Coverage, coverage, ranges_text, seq_ranges
from ..store.derived import rederive_measurements
from ..store.dupkeys import rewritten_reason
from ..store.errors import StoreFailure, translated
from .decode import Decoder, Quarantined, glued_reason
from .lease import hold_lease
from .node_job import agent_command, node_identity, node_job
from .options import SweepOptions, again_command
from .outcome import node_outcome, node_row
from .pipeline import IngestPipeline
from .stopping import stop_said, stop_script
from .store_wait import with_store


def _content(line: str) -> bytes:
    """What identical set-aside lines of one read share (their occurrences are counted)."""
    return hashlib.sha256(line.encode("utf-8", "replace")).digest()


@dataclass
class _Read:
    """What one read of a node's journal has seen so far."""

    cov: Coverage  # the store's coverage when the read began
    pipeline: IngestPipeline
    ends: list[dict] = field(default_factory=list)  # final events read (said once kept)
    repeats: Counter[bytes] = field(default_factory=Counter)  # lines per content so far
    events: Counter[bytes] = field(default_factory=Counter)  # of them, lines read as events
    read: set[int] = field(default_factory=set)  # the seqs of the read's events


class NodeRun:
    """One node's part of a sweep, from lease to final outcome."""

    def __init__(self, host: Host, store: Store, sweep_id: str, holder: str,
                 opts: SweepOptions, progress: Callable[[str, dict], None]):
        self.host, self.store, self.sweep_id, self.holder = host, store, sweep_id, holder
        self.opts, self.progress = opts, progress
        self.started = False  # once an agent runs, its lease outlives this controller
        self.stopped = False  # --stop ended its agent: the node is free again
        self.fresh = False  # a first start: until its agent runs, nothing was measured
        self._home: str | None = None  # the node's $HOME, asked once
        self.decoder = Decoder(host.name)
        self.twice: set[int] = set()  # seqs the current read holds more than one line of
        # id of an event read -> its line's occurrence of that content in the read (a line
        # the ledger refuses is kept once per occurrence), and whether it is the read's
        # first event line of it (ledger.admit); taken when its batch is stored
        self.nth: dict[int, tuple[int, bool]] = {}
        self.open_end = False  # whether the agent followed may still write (follow_once)

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
        return again_command(self.sweep_id, self.opts, verb)

    # -- leases ------------------------------------------------------------------------

    def lease(self) -> None:
        hold_lease(self.store, self.host.name, self.holder, self.sweep_id,
                   self.opts.lease_ttl_s, self.say)

    async def keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self.opts.lease_ttl_s / 3)
            try:
                with translated():
                    await asyncio.to_thread(self.lease)
            except SpecfleetError:
                pass  # the store may be restarting; the next renewal tries again

    # -- launch ------------------------------------------------------------------------

    async def launch(self, t, doc: dict, job: dict) -> None:
        from ..fleet.facts import collect

        h = self.host
        root = expand_root(h.root, await t.home())
        # The node's facts are part of every result's identity (chip, OS build, power).
        facts = await collect(h, t)
        await self.with_store(self.store.add_facts, h.name, facts)
        python, agent_dir, models, env_id = await self._place_agent(t, doc, root)
        this_job = node_job(job, doc, self.sweep_id, models, python, h)
        jobs = f"{root}/jobs"
        job_path, journal = f"{jobs}/{self.sweep_id}.json", f"{jobs}/{self.sweep_id}.events.jsonl"
        await t.run(f"mkdir -p {q(jobs)}")
        await t.write_text(job_path, json.dumps(this_job))
        await self.with_store(functools.partial(
            self.store.set_sweep_node, self.sweep_id, h.name, state="launching", root=root,
            job_path=job_path, journal_path=journal, agent_dir=agent_dir, python=python,
            journal_key=secrets.token_bytes(32).hex(),
            identity=node_identity(doc, job, env_id, facts)))
        await self.start_agent(t, resume=False)

    async def _place_agent(self, t, doc: dict, root: str) -> tuple[str, str, dict, str | None]:
        """The agent, its Python and the models on the node: (python, agent dir, the node's
        model paths, environment id or None)."""
        from ..fleet.provision import provision_host, push_agent

        h = self.host
        if self.opts.provision:
            d = await provision_host(h, t, doc)
            return d["env_python"], d["agent_dir"], d["models"], d["env_id"]
        # the node brings its own Python (specfleet_python); the agent checks pins
        await t.run(f"mkdir -p {q(root)}")
        agent_dir = (await push_agent(t, root))["agent_dir"]
        report = await push_model(t, h.name, h.python, root,
                                  {r: Path(doc["models"][r]["path"])
                                   for r in model_roles(doc["models"])},
                                  CONTROLLER_CACHE / "fingerprints.json",
                                  verify=doc["models"].get("verify", "daily"))
        if report.resent_corrupt:
            self.say(f"{report.resent_corrupt} weight blob(s) no longer matched their "
                     "sha256 and were sent again")
        return h.python, agent_dir, report.paths, None

    async def start_agent(self, t, resume: bool) -> None:
        sn = await self._placed(t)
        # the key goes over stdin: not in argv, the environment or a file on the node. One
        # key per sweep node, so a resumed agent signs with the key its predecessor used
        res = await t.run(agent_command(sn, self.host, resume),
                          input=f"{sn.journal_key}\n" if sn.journal_key else None)
        pid = json.loads(res.stdout.strip().splitlines()[-1])["pid"]
        await self.with_store(functools.partial(self.store.set_sweep_node, self.sweep_id,
                                                self.host.name, state="running", pid=pid))
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
        return stop_said(said, self.host.name, pid, sn.job_path, sn.journal_path, res.stdout)

    async def _placed(self, t):
        """The node's row, its placement checked against the inventory before anything
        named in it runs on the node (the store does not choose what runs)."""
        sn = await self.with_store(self._row)
        if self._home is None:
            self._home = await t.home()
        check_placement(self.host, expand_root(self.host.root, self._home), sn, self.sweep_id)
        return sn

    def _row(self):
        return node_row(self.store, self.sweep_id, self.host.name)

    # -- follow ------------------------------------------------------------------------

    async def with_store(self, fn, *args):
        """``fn(*args)`` in a thread, waiting out a store that is down for as long as it
        takes (``store_wait.with_store``)."""
        return await with_store(fn, *args, sweep_id=self.sweep_id, say=self.say,
                                launched=self.started or not self.fresh)

    async def ingest(self, batch: list[dict], raw: list[str]) -> None:
        """Store a batch, however long the store is down: never given up, never dropped.
        Lines the ledger sets aside (a conflict, a forgery) are said, once per attempt that
        stored them."""
        if not batch:
            return

        twice = frozenset(self.twice)  # seqs this read has more than one line of
        nth = [self.nth.get(id(e), (1, True)) for e in batch]

        def store_batch() -> list:
            refused: list = []  # fresh per attempt: a rolled-back attempt said nothing
            self.store.ingest(self.sweep_id, self.host.name, batch, raw, refused,
                              open_end=self.open_end, twice=twice, nth=nth)
            return refused

        said = await self.with_store(store_batch)
        for e in batch:
            self.nth.pop(id(e), None)
        for r in said:
            self.say(f"set aside a journal line (seq {r.seq}): {r.reason[:160]}")

    async def rewritten(self, event: dict, text: str, repeats: Counter[bytes]) -> str:
        """A line holding a key twice: its event is stored written again from the checked
        object, the line kept beside it (for `sweeps verify`). Returns what is stored."""
        key = self.decoder.duplicate or ""
        repeats[k := _content(text)] += 1
        q = Quarantined(event["seq"], rewritten_reason(key, event["seq"]), text, repeats[k])
        if await self.with_store(self.store.quarantine, self.sweep_id, self.host.name, [q]):
            self.say(f"seq {event['seq']} holds key {key[:60]!r} twice: stored with each key's "
                     "last value, as checked")
        return orjson.dumps(event).decode()

    async def stored_whole(self) -> bool:
        """The store holds the node's journal to its final event, with no hole below it."""
        cov = await self.with_store(coverage, self.store, self.sweep_id, self.host.name)
        last = await self.with_store(self.store.last_event, self.sweep_id, self.host.name)
        return not cov.holes and (last or {}).get("type") in FINAL_EVENTS

    async def follow_once(self, t) -> None:
        sn = await self._placed(t)
        # a node launched with a key: a line without its valid MAC is not the agent's
        self.decoder.key = bytes.fromhex(sn.journal_key) if sn.journal_key else None
        # from the last seq up to which everything is stored, not the highest stored one:
        # a hole below it (a batch lost, rows deleted) is read again from the journal
        cov = await self.with_store(coverage, self.store, self.sweep_id, self.host.name)
        # events stored: this schema's agent announced itself (a later announcement of
        # another schema, read first in this read, is a forged line, not the agent)
        self.decoder.started |= cov.last > 0
        if cov.holes:
            self.say(f"reading {cov.missing} journal line(s) the store lacks again from the "
                     f"node (seq {ranges_text(cov.holes)})")
        # a finished agent's pid may be another process's by now: read to the end and stop
        pid = 0 if sn.state == "finished" else sn.pid or 0
        # until the node's end is recorded its agent may still be writing: a job_finished
        # the journal goes on after is not its last word (after, lines past it are forged)
        self.open_end = sn.state in ("launching", "running")
        cmd = (f"cd {q(sn.agent_dir)} && {q(sn.python)} -m agent follow "
               f"{q(sn.journal_path)} --from-seq {cov.through} --pid {pid}")
        r = _Read(cov, IngestPipeline(self.ingest))
        self.twice.clear()
        self.nth.clear()
        try:
            # aclosing: a follower left early (an agent refused mid-stream) is closed now,
            # not whenever the garbage collector finds it after the event loop is gone
            async with contextlib.aclosing(t.stream_lines(cmd)) as lines:
                async for line in lines:
                    if line.strip():
                        await self._take(line, r)
        finally:
            await r.pipeline.close()
        last = await self.with_store(self.store.last_event, self.sweep_id, self.host.name)
        for e in r.ends:
            if e == last and e["seq"] not in cov.covered:
                self.progress(self.host.name, e)

    async def _aside(self, q: Quarantined, r: _Read) -> None:
        # each read starts at the journal's top (or sends every line the store may not
        # account for, agent.reread): the k-th identical set-aside line of this read is the
        # journal's k-th, so counting per read keeps one row per line and a re-read adds none
        r.repeats[key := _content(q.line)] += 1
        await self.set_aside(replace(q, occurrence=r.repeats[key]))

    async def _take(self, line: str, r: _Read) -> None:
        """One journal line through the decode boundary, into the store or set aside."""
        # bytes glued before the agent's signed line are set aside on their own; the
        # agent's line is judged whole, as if they were not there
        glued, line = self.decoder.framed(line)
        typed = self.decoder.event(line)  # the one boundary; may refuse the agent
        if glued is not None:
            seq = typed.seq if isinstance(typed, Quarantined) else typed.raw["seq"]
            await self._aside(Quarantined(None, glued_reason(seq), glued), r)
        if isinstance(typed, Quarantined):
            await self._aside(typed, r)
            return
        event = typed.raw  # the checked object: what the store keeps and reads
        text = line.strip()
        if self.decoder.duplicate is not None:  # stored as checked (dupkeys)
            text = await self.rewritten(event, text, r.repeats)
        if event["seq"] in r.read:  # the ledger judges it as a line repeated
            self.twice.add(event["seq"])
        r.read.add(event["seq"])
        if event["type"] in FINAL_EVENTS:
            r.ends.append(event)  # said once the ledger keeps it (it may be forged)
        elif event["seq"] not in r.cov.covered:  # shown once, when it first arrives
            self.progress(self.host.name, event)
        r.repeats[key := _content(text)] += 1
        r.events[key] += 1
        self.nth[id(event)] = (r.repeats[key], r.events[key] == 1)
        # stored as written (again for a seq stored already: the store keeps one); no
        # second serialisation
        await r.pipeline.add(event, text)

    async def follow(self, t) -> None:
        """Follow until the agent is done; on a dropped link reconnect and go on.

        A follower that died with the link (non-zero exit) or a store that blinked while
        we asked it where to resume are retried the same way; the journal keeps it all.
        """
        deadline = None
        delay = 0.5
        while True:
            try:
                with translated():
                    if t is None:
                        async with connect(self.host, self.opts.ssh) as t2:
                            await self.follow_once(t2)
                    else:
                        await self.follow_once(t)
                return
            except (UnreachableError, RemoteError, StoreFailure) as e:
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
        return node_outcome(self.store, self.sweep_id, self.host, self.opts)

    # -- the three ways in -------------------------------------------------------------

    async def run(self, t, mode: str, doc: dict | None = None, job: dict | None = None):
        # every write before the agent starts goes through with_store too: a store out of
        # space there was an "internal error" that named no next step
        self.fresh = mode == "start"
        await self.with_store(self.lease)
        keeper = asyncio.create_task(self.keep_lease())
        try:
            if mode == "start":
                assert doc is not None and job is not None
                await self.launch(t, doc, job)
            elif mode == "resume":
                done = await self._resume(t)
                if done is not None:
                    return done
            elif mode == "stop":
                return await self._stop(t)
            else:
                self.started = True
                # a finished node's journal is read again past what is stored, even when
                # the store holds its end: lines after it (appended later, forged) are set
                # aside with their reason, never left unread while the sweep says ok
            await self.follow(t)
            if mode == "attach":
                await self._rederive()
            return await self.with_store(self.outcome)
        finally:
            keeper.cancel()
            # a store that fails here must not replace the error that ended the run: a lease
            # left behind is reclaimed, its controller gone (lease.dead_here)
            with contextlib.suppress(StoreFailure), translated():
                final = self.store.last_event(self.sweep_id, self.host.name) or {}
                if not self.started or self.stopped or final.get("type") in ("job_finished",
                                                                              "job_failed"):
                    self.store.release_lease(self.host.name, self.holder)

    async def _resume(self, t) -> Outcome | None:
        """--resume: restart an agent that is gone; the outcome when all is stored already."""
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
        return None

    async def _stop(self, t) -> Outcome:
        """--stop: end the agent, store what it wrote, free the node."""
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

    async def _rederive(self) -> None:
        """--attach: measurements that differ from their stored events are derived again."""
        fixed = await self.with_store(rederive_measurements, self.store,
                                      self.sweep_id, self.host.name)
        if fixed:
            self.say(f"{len(fixed)} measurement(s) differed from their stored events "
                     f"and were derived again from them (seq "
                     f"{ranges_text(seq_ranges(fixed))})")
