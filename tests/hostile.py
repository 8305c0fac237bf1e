"""Hostile and damaged journal lines, and a node that sends them, for tests and bench/.

The journal they start from is real (``tests/journals.py``: one small sweep the agent
wrote). ``KINDS`` are the kinds of line issue 28 names, each a function that damages that
journal the way a broken disk, a bad actor or an oversized event would. ``follow_journal``
runs the controller's real follower (``NodeRun.follow_once``: decode boundary, progress
lines, ingest pipeline, store) against a node's journal through a transport: real SSH, the
local machine, or ``InProcess`` (the node-side follower and the transport's line splitter
run in this process, for thousands of cases a second).
"""

from __future__ import annotations

import asyncio
import io
import json
import shlex
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.journals import DATA
from tests.journals import lines as real_lines

ROOT = Path(__file__).resolve().parents[1]
JOB = json.loads((DATA / "small-sweep.job.json").read_text())


def journal() -> list[bytes]:
    """The real journal's lines, as bytes (a node sends bytes)."""
    return [x.encode() for x in real_lines()]


def event(line: bytes) -> dict:
    return json.loads(line)


def dump(e: dict) -> bytes:
    return json.dumps(e, separators=(",", ":")).encode()


def seq_of(lines: list[bytes], kind: str, n: int = 0) -> int:
    """The index in ``lines`` of the n-th event of type ``kind``."""
    return [i for i, x in enumerate(lines) if event(x)["type"] == kind][n]


# -- the hostile kinds the issue names: each returns the damaged journal ------------------

def _replace(i_of: Callable[[list[bytes]], int], change: Callable[[dict], dict | bytes]):
    def make(lines: list[bytes]) -> list[bytes]:
        lines = list(lines)
        i = i_of(lines)
        out = change(event(lines[i]))
        lines[i] = out if isinstance(out, bytes) else dump(out)
        return lines
    return make


def _insert_after(i_of: Callable[[list[bytes]], int], make_line: Callable[[list[bytes]], bytes]):
    def make(lines: list[bytes]) -> list[bytes]:
        lines = list(lines)
        i = i_of(lines)
        return lines[:i + 1] + [make_line(lines)] + lines[i + 1:]
    return make


def _without(name: str) -> Callable[[dict], dict]:
    return lambda e: {k: v for k, v in e.items() if k != name}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _next_seq(lines: list[bytes]) -> int:
    return max(event(x)["seq"] for x in lines) + 1


def _forged_finish(lines: list[bytes]) -> bytes:
    # after the 2nd generation: claims the whole plan, ends the job (6 of 28 events in)
    return dump({"schema": 1, "seq": 7, "type": "job_finished", "ts": 1.0, "job_id": "recorded",
                 "status": "ok", "generations": 16})


def _reused_seq(lines: list[bytes]) -> bytes:
    e = event(lines[seq_of(lines, "generation", 1)])
    return dump({**e, "decode_tok_s": 99999.0})  # same seq, other content


def _reused_run(lines: list[bytes]) -> bytes:
    e = event(lines[seq_of(lines, "generation", 1)])
    return dump({**e, "seq": _next_seq(lines), "decode_tok_s": 99999.0})


def _foreign_run(lines: list[bytes]) -> bytes:
    e = event(lines[seq_of(lines, "generation", 1)])
    return dump({**e, "seq": _next_seq(lines), "run_index": 500, "decode_tok_s": 99999.0})


def _big(lines: list[bytes]) -> bytes:
    # a real agent's 3 MiB generation: a long output with its token ids and timings
    e = event(lines[seq_of(lines, "generation", 0)])
    n = 150_000
    return dump({**e, "output_text": "x" * n, "token_ids": list(range(n)),
                 "token_times_us": list(range(0, 20 * n, 20)), "generated_tokens": n})


def _renumber(lines: list[bytes], at: int) -> list[bytes]:
    """Seqs 1..n again after inserting a line at ``at`` (a damaged line in the stream)."""
    return [dump({**event(x), "seq": i + 1}) if i >= at else x for i, x in enumerate(lines)]


@dataclass(frozen=True)
class Kind:
    name: str
    make: Callable[[list[bytes]], list[bytes]]
    store: str = "sqlite"       # which store shows it (NUL: PostgreSQL)
    transport: str = "any"      # "ssh": only a real SSH channel shows it
    valid: bool = False         # a valid event: must be stored, whole
    note: str = ""


def _gen(n: int = 0):
    return lambda lines: seq_of(lines, "generation", n)


def _big_event(lines: list[bytes]) -> list[bytes]:
    i = seq_of(lines, "generation")
    return [*lines[:i], _big(lines), *lines[i + 1:]]


def _forged(lines: list[bytes]) -> list[bytes]:
    # the forged end takes seq 7; the agent's own events go on from 8
    return _renumber(_insert_after(_gen(1), _forged_finish)(lines), 6)


def _deep(e: dict) -> bytes:
    return dump(e)[:-1] + b',"extra":' + _nested(1000).encode() + b"}"


KINDS: list[Kind] = [
    Kind("generation without run_index", _replace(_gen(), _without("run_index")),
         note="KeyError in the progress line"),
    Kind("quality without passed", _insert_after(_gen(15), lambda ls: dump({
        "schema": 1, "seq": _next_seq(ls), "type": "quality", "ts": 1.0, "mode": "baseline",
        "num_draft_tokens": 0, "tasks": 3, "pass_rate": 1.0}))),
    Kind("soak_sample without index", _insert_after(_gen(15), lambda ls: dump({
        "schema": 1, "seq": _next_seq(ls), "type": "soak_sample", "ts": 1.0,
        "elapsed_s": 1.0}))),
    Kind("job_failed without message", _insert_after(_gen(15), lambda ls: dump({
        "schema": 1, "seq": _next_seq(ls), "type": "job_failed", "ts": 1.0,
        "error": "crash"}))),
    Kind("config_summary without metrics.decode_tok_s.p95", _replace(
        lambda ls: seq_of(ls, "config_summary"),
        lambda e: {**e, "metrics": {**e["metrics"], "decode_tok_s": {
            k: v for k, v in e["metrics"]["decode_tok_s"].items() if k != "p95"}}}),
         note="KeyError in store ingest"),
    Kind("line without schema", _replace(_gen(), _without("schema"))),
    Kind("1,000-deep nesting", _replace(_gen(), _deep)),
    Kind("NUL in versions", _replace(lambda ls: seq_of(ls, "environment_checked"),
                                     lambda e: {**e, "versions": {**e["versions"],
                                                                  "mlx": "0.3\x002"}}),
         store="postgresql"),
    Kind("NUL in fingerprints", _replace(lambda ls: seq_of(ls, "environment_checked"),
                                         lambda e: {**e, "fingerprints": {
                                             **e["fingerprints"], "draft": "sha256:\x00"}}),
         store="postgresql"),
    Kind("forged job_finished", _forged),
    Kind("line reusing a stored seq", _insert_after(_gen(1), _reused_seq)),
    Kind("line reusing a run index", _insert_after(_gen(1), _reused_run)),
    Kind("generation for a run the job never had", _insert_after(_gen(1), _foreign_run)),
    Kind("notice without message", _insert_after(_gen(15), lambda ls: dump({
        "schema": 1, "seq": _next_seq(ls), "type": "notice", "ts": 1.0, "workload": "code"})),
         note="breaks review, site and the sweep page"),
    Kind("real 3 MiB agent event", _big_event, transport="ssh", valid=True),
    Kind("invalid UTF-8", _replace(_gen(), lambda e: dump(e).replace(b'"code"', b'"c\xffde"'))),
    Kind("truncated line", _replace(_gen(), lambda e: dump(e)[:200])),
]


def _swap(i: int, j: int):
    def make(lines: list[bytes]) -> list[bytes]:
        lines = list(lines)
        lines[i], lines[j] = lines[j], lines[i]
        return lines
    return make


def _before_end(make_line: Callable[[list[bytes]], bytes]):
    return lambda lines: [*lines[:-1], make_line(lines), lines[-1]]


def _far(seq: int, kind: str = "notice"):
    return _before_end(lambda ls: dump({"schema": 1, "seq": seq, "type": kind, "ts": 1.0,
                                        "message": "forged", "error": "crash"}))


def _failed_in_seq(lines: list[bytes]) -> list[bytes]:
    # a job_failed at seq 7; the agent's own events go on from 8
    return _renumber(_insert_after(_gen(1), lambda ls: dump({
        "schema": 1, "seq": 7, "type": "job_failed", "ts": 1.0, "error": "crash",
        "message": "forged"}))(lines), 6)


# The property test's mutations (test_hostile_lines) one at a time, and seq games: for the
# table of bench/hostile_lines.py (each a journal; the examples test checks KINDS).
MORE_KINDS: list[Kind] = [
    Kind("generation with run_index renamed", _replace(_gen(), lambda e: {
        **_without("run_index")(e), "x_run_index": e["run_index"]})),
    Kind("generation with run_index a string", _replace(_gen(), lambda e: {
        **e, "run_index": "0"})),
    Kind("a line twice", lambda ls: [*ls[:6], ls[5], *ls[6:]], valid=True),
    Kind("two lines swapped", _swap(6, 12), valid=True),
    Kind("a line skipped", lambda ls: [*ls[:8], *ls[9:]], valid=True),
    Kind("forged job_finished past the end", _far(150, "job_finished")),
    Kind("forged job_failed past the end", _far(150, "job_failed")),
    Kind("forged job_failed in seq, journal goes on", _failed_in_seq),
    Kind("forged job_failed at the next seq", _insert_after(_gen(1), lambda ls: dump({
        "schema": 1, "seq": _next_seq(ls), "type": "job_failed", "ts": 1.0, "error": "crash",
        "message": "forged"}))),
    Kind("seq 2**31-1 before the end", _far(2**31 - 1)),
    Kind("seq just past the end, before it", _far(29)),
    Kind("line over 16 MiB", _replace(_gen(), lambda e: {**e, "x_big": "y" * (16 << 20)})),
    Kind("NUL in output_text", _replace(_gen(), lambda e: {
        **e, "output_text": e["output_text"] + "\x00"}), valid=True),
    Kind("NUL in workload", _replace(_gen(), lambda e: {**e, "workload": "co\x00de"})),
]


# -- a node that sends a journal, and the controller following it -------------------------

class InProcess:
    """A node whose follower runs in this process: ``agent.follow.follow`` over the journal
    the command names, its bytes split into lines by the transport's own splitter. What SSH
    adds (a channel, a remote process) is left out; every part of ours runs."""

    def __init__(self, host):
        self.host = host

    async def home(self) -> str:
        return str(Path.home())

    async def stream_lines(self, command: str):
        from agent.follow import follow
        from orchestrator.fleet.transport import split_lines

        args = shlex.split(command.split("&&", 1)[1])
        path = Path(args[args.index("follow") + 1])
        from_seq = int(args[args.index("--from-seq") + 1])
        out = io.BytesIO()
        follow(path, from_seq, None, out=out)
        data = io.BytesIO(out.getvalue())

        async def read(n: int) -> bytes:
            return data.read(n)

        async for line in split_lines(read):
            yield line


@dataclass
class Followed:
    sweep_id: str
    stopped: str | None                   # why the node's ingestion stopped, if it did
    said: list[str] = field(default_factory=list)  # what the controller printed
    outcome: str = ""


def new_sweep(store, node: str, journal_path: Path, agent_dir: Path = ROOT,
              python: str = sys.executable, sid: str | None = None,
              root: Path | None = None, key: bytes | None = None) -> str:
    """A sweep with ``node`` placed; with ``key`` the node's agent signs its lines."""
    sid = sid or uuid.uuid4().hex[:12]
    store.create_sweep(sid, JOB, None)
    store.set_sweep_node(sid, node, state="running", journal_path=str(journal_path),
                         agent_dir=str(agent_dir), python=python, pid=0,
                         root=None if root is None else str(root),
                         journal_key=None if key is None else key.hex())
    return sid


def signed_by_agent(lines: list[bytes], key: bytes, forged: set[int]) -> list[bytes]:
    """A recorded journal as an agent holding ``key`` writes it: each line signed with the
    agent's own signing function (what ``Journal.emit`` ends a line with), except the lines
    at the indices ``forged``, planted by someone without the key."""
    from agent.signing import sign

    return [x if i in forged else sign(key, x.decode()).encode()
            for i, x in enumerate(lines)]


def placed(root: Path, sid: str, agent_dir: Path) -> tuple[Path, Path]:
    """A node root laid out as a sweep's launch lays it out (ROOT/jobs/<sweep>.events.jsonl,
    ROOT/agents/<agent id>, here a link to ``agent_dir``): the controller runs nothing the
    inventory would not choose. Returns (journal path, agent folder)."""
    from orchestrator.fleet.provision import agent_artefact

    (root / "jobs").mkdir(parents=True, exist_ok=True)
    (root / "agents").mkdir(exist_ok=True)
    folder = root / "agents" / agent_artefact()[0]
    if not folder.exists():
        folder.symlink_to(agent_dir)
    return root / "jobs" / f"{sid}.events.jsonl", folder


def follow_journal(store, lines: list[bytes], where: Path, *, transport=None, host=None,
                   node: str = "n1", agent_dir: Path = ROOT,
                   loop: asyncio.AbstractEventLoop | None = None, opts=None,
                   key: bytes | None = None) -> Followed:
    """Write ``lines`` as a node's journal under ``where`` and follow it once, as
    ``specfleet sweep`` does; then the node's outcome, as the sweep would report it.
    ``loop``: one event loop for many cases (a new one per case costs its threads).
    ``key``: the sweep node's journal key (the lines signed with it, ``signed_by_agent``)."""
    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.dispatch import NodeRun, StderrProgress, SweepOptions

    node = host.name if host is not None else node
    where.mkdir(parents=True, exist_ok=True)
    sid = uuid.uuid4().hex[:12]
    path, folder = placed(where, sid, agent_dir)
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    path.chmod(0o644)
    host = replace(host, root=str(where)) if host is not None else Host(
        name=node, address="localhost", connection="local", python=sys.executable,
        root=str(where))
    new_sweep(store, node, path, folder, host.python, sid, where, key)
    text = io.StringIO()
    shown = StderrProgress(text)  # the lines a user sees, as the CLI prints them
    run = NodeRun(host, store, sid, "hostile-test", opts or SweepOptions(), shown)
    stopped = None

    async def once():
        if transport is not None:
            async with transport(host) as t:
                await run.follow_once(t)
        else:
            await run.follow_once(InProcess(host))

    try:
        if loop is None:
            asyncio.run(once())
        else:
            loop.run_until_complete(once())
    except Exception as e:  # the node's ingestion stopped: what the user would see
        stopped = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    out = Followed(sid, stopped, text.getvalue().splitlines())
    try:  # what the sweep reports for the node (it must not fail on what was stored)
        o = run.outcome()
        out.outcome = f"{o.status}" + (f": {o.detail}" if o.detail else "")
    except Exception as e:
        out.stopped = out.stopped or f"outcome: {type(e).__name__}: {e}"
    return out


def render_all(store, sweep_id: str, out: Path) -> dict[str, str]:
    """Every reader over the store: the weekly review (HTML, Markdown), the site, the sweep
    page and compare. Returns what each wrote (or raises: a reader broke)."""
    from orchestrator.review.compare import as_text, compare
    from orchestrator.review.report import environment, write_review
    from orchestrator.review.site import write_site
    from orchestrator.review.sweep_page import render_review

    out.mkdir(parents=True, exist_ok=True)
    written = write_review(store, out / "weekly.html", formats=("html", "md"))
    page = render_review(store, out / "sweep.html", sweep_id)
    site = write_site(store, out / "site")
    c = compare(store, sweep_id, sweep_id)
    (out / "compare.html").write_text(environment(True).get_template("compare.html.j2")
                                      .render(c=c))
    return {"review": written["html"].read_text(), "md": written["md"].read_text(),
            "sweep page": page.read_text(), "site": (site / "index.html").read_text()
            if site.is_dir() else site.read_text(), "compare": as_text(c)}
