"""`specfleet sweeps verify`: is the store a faithful copy of every node's journal?

Each node hashes its journal line by line (a short standard-library script run with the
node's Python over SSH, so only seqs and hashes cross the link). Every journal line must be
in the store exactly once: stored as the event of its seq with the same content, or set
aside (quarantined) with its reason. A journal line that is neither is a *hole*; a stored
event whose content differs from the journal's line of that seq, a stored seq no journal
line has, or a second line for a stored seq that was not set aside is a *conflict*. A node
whose journal could not be read is *unverified*, never complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field

from agent import signing
from agent.protocol import MAX_EVENT_BYTES

from ..errors import RemoteError, SpecfleetError
from ..fleet.fanout import run_fan_out
from ..fleet.inventory import Host
from ..fleet.node_paths import check_placement, expand_root
from ..fleet.transport import SSHOptions, q
from ..store import Store
from ..store.coverage import (
    holes_below,
    ranges_text,
    repeated_seqs,
    seq_ranges,
    set_aside_lines,
    stored_line_hashes,
)
from ..store.derived import measurement_mismatches, nodes_without_row

# Runs on the node with the agent's Python (standard library only). One output line per
# journal line, "SEQ SHA256" ("-" for a line with no readable seq; " u" after it for a line
# of a keyed journal no part of which the key verifies), then "end LINES PARTIAL";
# a last line without its newline is being written (or was torn by a crash): not counted.
# With --key-stdin (a keyed sweep node: the key on stdin, never argv or a file) a line whose
# signed part starts past bytes glued in front is two lines, as the follower keeps it: the
# foreign bytes ("-") and the agent's line, split by the very rule the follower's decoder
# uses (agent/signing.py, sent along as its source). A line over the limit is never read
# whole: its head (what the follower sends and the store sets aside) is hashed, and the
# agent's line glued at its end, if any, found in its last LIMIT + 1 bytes.
_DIGEST_BODY = r"""
import hashlib, json, sys
check = None
if "--key-stdin" in sys.argv[2:]:
    check = Verifier(bytes.fromhex(sys.stdin.readline().strip()))
out, n, partial = [], 0, 0


def row(b, numbered=True, unsigned=False):
    try:
        text = b.decode("utf-8", "surrogateescape")
        seq = json.loads(text).get("seq") if numbered else None
    except Exception:
        seq = None
    seq = seq if type(seq) is int else "-"
    return "%s %s%s\n" % (seq, hashlib.sha256(b).hexdigest(), " u" if unsigned else "")


# each line without its newline, twice (of one over LIMIT bytes its head, LIMIT + 1 bytes,
# and its last LIMIT + 1 bytes: never read whole); (None, None) for a partial last line
def lines(f):
    while True:
        raw = f.readline(LIMIT + 2)
        if not raw:
            return
        if raw.endswith(b"\n"):
            yield raw[:-1], raw[:-1]
            continue
        if len(raw) < LIMIT + 2:
            yield None, None
            return
        tail = bytearray(raw)
        while not tail.endswith(b"\n"):
            more = f.readline(1 << 20)
            if not more:
                yield None, None
                return
            tail += more
            if len(tail) > 2 * (LIMIT + 2):
                del tail[:len(tail) - (LIMIT + 2)]
        yield raw[:LIMIT + 1], bytes(tail[:-1][-(LIMIT + 1):])


# a line over the limit: the follower sends its head, which the store keeps (set aside by
# its length, no seq) and hashes as it arrived (with bytes that are not UTF-8: stripped)
def long_row(head):
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        head = head.decode("utf-8", "surrogateescape").strip().encode("utf-8",
                                                                      "surrogateescape")
    return "- %s\n" % hashlib.sha256(head).hexdigest()


with open(sys.argv[1], "rb") as f:
    for raw, tail in lines(f):
        if raw is None:
            partial = 1
            break
        if len(raw) > LIMIT:
            n += 1
            out.append(long_row(raw[:LIMIT + 1]))
            # the agent's line glued after bytes that made it longer than any event: the
            # follower kept only the head, so that line is missing, never accounted for
            t = tail.decode("utf-8", "surrogateescape").strip().encode("utf-8",
                                                                         "surrogateescape")
            at = signed_from(check, t) if check is not None else None
            if at is not None:
                n += 1
                out.append(row(t[at:]))
            continue
        # bytes that are not UTF-8 kept as they are (escaped, then restored): the store
        # hashes such a line as the journal holds it, never with U+FFFD in their place
        text = raw.decode("utf-8", "surrogateescape").strip()
        if not text:
            continue
        b = text.encode("utf-8", "surrogateescape")
        at = signed_from(check, b) if check is not None else None
        if at:
            n += 2
            glued = b[:at].decode("utf-8", "surrogateescape").strip()
            out.append(row(glued.encode("utf-8", "surrogateescape"), numbered=False))
            out.append(row(b[at:]))
        else:
            n += 1
            # not the agent's (forged, or its line damaged): the seq it claims is no seq
            # the agent's journal holds
            out.append(row(b, unsigned=check is not None and at is None))
sys.stdout.write("".join(out))
sys.stdout.write("end %d %d\n" % (n, partial))
"""
DIGEST_SCRIPT = (inspect.getsource(signing) + f"\nLIMIT = {MAX_EVENT_BYTES}\n"
                 + _DIGEST_BODY)

JournalLine = tuple[int | None, str]  # (seq, content hash)


@dataclass(frozen=True)
class Digest:
    """DIGEST_SCRIPT's output."""

    lines: list[JournalLine]
    partial: bool               # a partial last line was left out
    unsigned: frozenset[int]    # keyed journal: line numbers (from 1) the key verifies not


@dataclass
class NodeLedger:
    """One node's journal against the store."""

    node: str
    status: str  # complete | incomplete | unverified
    journal_lines: int = 0
    stored: int = 0
    set_aside: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)
    journal_sha256: str | None = None  # over the journal's events (lines not set aside)
    store_sha256: str | None = None    # over the stored events; equal when complete
    partial_line: bool = False
    repeats: list[int] = field(default_factory=list)  # stored seqs the journal repeats
    # seqs below the journal's last that no line of it has (nor the store): lost on the node,
    # damaged or never written; no read can bring them, and the store lacks them: incomplete
    journal_gaps: list[tuple[int, int]] = field(default_factory=list)
    detail: str | None = None
    journal_path: str | None = None

    @property
    def missing(self) -> int:
        return sum(b - a + 1 for a, b in self.holes)

    def line(self) -> str:
        """One line for people."""
        if self.status == "unverified":
            return f"{self.node:<20} unverified  {self.detail}"
        text = (f"{self.node:<20} {self.status:<11} {self.journal_lines} journal line(s): "
                f"{self.stored} stored, {self.set_aside} set aside")
        if self.repeats:  # accounted for (among those set aside): listed, never a conflict
            text += (f"; {len(self.repeats)} repeated line(s) of stored events (seq "
                     f"{ranges_text(seq_ranges(self.repeats))}), each stored once")
        if self.journal_gaps:
            text += (f"; no journal line is numbered seq {ranges_text(self.journal_gaps)} "
                     "(lost on the node, damaged, unreadable or never written; the node's outcome "
                     "names them too)")
        if self.holes:
            text += f"; {self.missing} missing: seq {ranges_text(self.holes)}"
        for c in self.conflicts[:10]:
            text += f"; conflict: {c['problem']}"
        if len(self.conflicts) > 10:
            text += f"; … {len(self.conflicts) - 10} more conflict(s)"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class VerifyReport:
    sweep_id: str
    nodes: list[NodeLedger]

    @property
    def complete(self) -> bool:
        return bool(self.nodes) and all(n.status == "complete" for n in self.nodes)

    def as_dict(self) -> dict:
        return {"sweep_id": self.sweep_id, "complete": self.complete,
                "nodes": [{**asdict(n), "holes": [list(h) for h in n.holes],
                           "journal_gaps": [list(h) for h in n.journal_gaps],
                           "missing": n.missing} for n in self.nodes]}

    def summary(self) -> str:
        if self.complete:
            return f"sweep {self.sweep_id}: complete"
        bad = [n for n in self.nodes if n.status != "complete"]
        said = ", ".join(f"{n.node} ({n.status}: {n.missing} missing, "
                         f"{len(n.conflicts)} conflict(s)" + (
                             f", {sum(b - a + 1 for a, b in n.journal_gaps)} in no journal "
                             "line" if n.journal_gaps else "") + ")"
                         if n.status == "incomplete"
                         else f"{n.node} (unverified)" for n in bad)
        attach = f"`specfleet sweep --attach {self.sweep_id}`"
        # each fix said only where it works: --attach reads holes again and derives the
        # measurements again, but keeps a stored event that differs from its journal line
        hints = []
        if any(n.holes or n.status == "unverified" for n in bad):
            hints.append(f"{attach} reads what is missing again from the journals")
        if any(c.get("kind") == "derived" and not c.get("orphan")
               for n in bad for c in n.conflicts):
            hints.append(f"{attach} derives the differing measurements again from their "
                         "stored events")
        for n in bad:
            if n.journal_gaps:
                hints.append(f"on {n.node} seq {ranges_text(n.journal_gaps)} is in neither "
                             "the journal nor the store (a line lost or damaged on the node, "
                             "or never written): no read brings it back")
            # stored events no journal line holds (the journal truncated or replaced on
            # the node): the store holds the only copy, never to be deleted for a re-read
            mine = [c for c in n.conflicts if "kind" not in c]  # against its journal
            gone = sorted({c["seq"] for c in mine if c["line"] is None})
            if gone:
                hints.append(f"on {n.node} no journal line holds seq "
                             f"{ranges_text(seq_ranges(gone))}, which the store holds (was "
                             "the journal truncated or replaced on the node?): the store "
                             "holds the only copy, keep it")
            # a journal line not known to be the agent's (a node launched before keys, a
            # line the key does not verify): the stored event may be the only copy of it
            kept = sorted({c["seq"] for c in mine if c["line"] is not None
                           and c["seq"] is not None and not c.get("mendable")})
            if kept:
                hints.append(f"on {n.node} the journal's line of seq "
                             f"{ranges_text(seq_ranges(kept))} differs from the stored event "
                             "and is not known to be its agent's (a forged or damaged line, "
                             "or the journal replaced): the store holds the only copy of "
                             "the event, keep it")
            seqs = sorted({c["seq"] for c in mine if c.get("mendable")})
            if seqs:
                at = f" at seq {ranges_text(seq_ranges(seqs))}"
                hints.append(
                    f"on {n.node} the store differs from the node's journal{at}; the journal "
                    f"({n.journal_path or 'on the node'}) is the record, and --attach keeps "
                    "what is stored, so it cannot mend this: restore the store from a "
                    "backup, or delete those events of the node from the store and "
                    f"{attach} reads them again from the journal")
        return f"sweep {self.sweep_id}: incomplete on {said}" + "".join(
            f"; {h}" for h in hints)


def _digest(journal: list[tuple[int, str]], seqs: list[int]) -> str:
    """A content hash over events in seq order (each seq's first line)."""
    h = hashlib.sha256()
    first: dict[int, str] = {}
    for seq, sha in journal:
        first.setdefault(seq, sha)
    for seq in sorted(seqs):
        h.update(f"{seq} {first[seq]}\n".encode())
    return h.hexdigest()


def compare(node: str, journal: list[JournalLine], stored: dict[int, str],
            aside_seqs: set[int], aside_hashes: Iterable[str] | Counter[str],
            unsigned: Collection[int] = frozenset(), keyed: bool = False) -> NodeLedger:
    """The journal's lines (in journal order) against the stored events (seq -> content
    hash) and the set-aside lines (their seqs, and their content hashes with how many
    rows hold each: a set counts each once). ``unsigned``: the numbers (from 1) of a keyed
    journal's lines its agent did not sign, whose seqs are claimed, not held; ``keyed``:
    the journal's key verified its lines. A conflict is ``mendable`` when the journal holds
    the agent's own line of its seq (a second copy of the stored event, or a line the key
    verifies): only then may the stored event go for a re-read, never the only copy."""
    holes: list[int] = []
    conflicts: list[dict] = []
    matched: set[int] = set()
    aside = 0
    # a line with no readable seq is accounted for only by a set-aside row of its own: five
    # identical unreadable lines need five rows (one row is not all five)
    left = Counter(aside_hashes)
    events: list[tuple[int, str]] = []  # the journal's lines the store should hold as events
    repeats: list[int] = []
    unreadable = 0  # lines set aside with no readable seq
    for i, (seq, sha) in enumerate(journal, 1):
        have = stored.get(seq) if seq is not None else None
        if seq is not None and have == sha and seq not in matched:
            matched.add(seq)  # the stored event (a repeat of it, next, has a row of its own)
            events.append((seq, sha))
            continue
        if left[sha] > 0:  # one row per line: a copy no row holds is not accounted for
            left[sha] -= 1
            aside += 1  # set aside, with its reason
            unreadable += seq is None
            continue
        if seq is None:
            conflicts.append({"line": i, "seq": None, "problem": f"journal line {i} has no "
                              "readable seq and was neither stored nor set aside"})
            continue
        if have == sha:  # the stored event's very bytes again, kept before repeats were:
            repeats.append(seq)  # nothing lost, nothing differs
        elif have is None and seq in aside_seqs:
            aside += 1  # set aside under its seq (the boundary kept part of a long line)
        elif have is None:
            holes.append(seq)
            events.append((seq, sha))
        elif seq in matched:
            conflicts.append({"line": i, "seq": seq, "mendable": True,
                              "problem": f"journal line {i} repeats "
                              f"seq {seq}, which is stored, and was not set aside"})
        else:
            # both hashes said: which line is whose, without either crossing the link whole
            conflicts.append({"line": i, "seq": seq, "stored_sha256": have,
                              "journal_sha256": sha, "mendable": keyed and i not in unsigned,
                              "problem": f"seq {seq}: the store holds other content than "
                                         f"journal line {i} (stored sha256 {have[:16]}, "
                                         f"journal sha256 {sha[:16]})"})
            events.append((seq, sha))
    # a seq only an unsigned line claims is one the agent's journal lacks (a gap: its line
    # lost or damaged on the node), however that line is accounted for
    journaled = {seq for i, (seq, _) in enumerate(journal, 1)
                 if seq is not None and i not in unsigned}
    for seq in sorted(set(stored) - journaled):
        conflicts.append({"line": None, "seq": seq,
                          "problem": f"seq {seq} is stored but no journal line has it"})
    j_hash = _digest(events, [s for s, _ in events])
    s_hash = _digest(list(stored.items()), list(stored))
    # the journal's last event (a line set aside past it, a forged jump, is no event)
    top = max((s for s, _ in events if s in journaled), default=0)
    # as ranges between the seqs there are: a forged seq near 2**31 must not become a list.
    # A seq below the journal's last that no line of the agent's holds and nothing in the
    # store covers (a line lost or damaged on the node, one never written) is a hole too:
    # the store lacks that event, and no read brings it back. On a node launched before
    # keys a line set aside unreadable may be one of them (as the node's outcome counts);
    # on a keyed one no unreadable line is the agent's
    gaps = holes_below(journaled | set(stored) | aside_seqs, top - 1)
    lacking = sum(b - a + 1 for a, b in gaps) - (0 if keyed else unreadable)
    complete = not holes and lacking <= 0 and not conflicts and j_hash == s_hash
    return NodeLedger(node, "complete" if complete else "incomplete", len(journal),
                      len(stored), aside, seq_ranges(holes), conflicts, j_hash, s_hash,
                      repeats=repeats, journal_gaps=gaps)


def read_digest(text: str) -> Digest:
    """DIGEST_SCRIPT's output: the lines, whether a partial last line was left out, and
    which lines a keyed journal's key does not verify."""
    lines = text.splitlines()
    if not lines or not lines[-1].startswith("end "):
        raise ValueError("the journal digest ended early")
    _, count, partial = lines[-1].split()
    out: list[JournalLine] = []
    unsigned: set[int] = set()
    for i, row in enumerate(lines[:-1], 1):
        seq, sha, *mark = row.split(" ")
        if mark == ["u"]:
            unsigned.add(i)
        elif mark:
            raise ValueError(f"the journal digest's line {i} is not SEQ SHA256 [u]")
        out.append((None if seq == "-" else int(seq), sha))
    if len(out) != int(count):
        raise ValueError(f"the journal digest has {len(out)} of {count} lines")
    return Digest(out, partial == "1", frozenset(unsigned))


def parse_digest(text: str) -> tuple[list[JournalLine], bool]:
    """DIGEST_SCRIPT's output: the lines, and whether a partial last line was left out."""
    d = read_digest(text)
    return d.lines, d.partial


def verify_sweep(store: Store, sweep_id: str, hosts: list[Host],
                 ssh: SSHOptions | None = None) -> VerifyReport:
    """Compare the store with the journal of every node the sweep ran on."""
    if store.sweep(sweep_id) is None:
        raise SpecfleetError(f"no sweep {sweep_id!r} in the store; `specfleet sweeps list` "
                             "shows the ids")
    rows = {r.node: r for r in store.sweep_nodes(sweep_id)}
    by_name = {h.name: h for h in hosts}
    results: dict[str, NodeLedger] = {
        n: NodeLedger(n, "unverified", detail="not in the inventory: pass the one the sweep "
                      "ran on with -i") for n in rows if n not in by_name}

    async def one(h: Host, t) -> NodeLedger:
        sn = rows[h.name]
        stored, (aside_seqs, aside_hashes) = await asyncio.gather(
            asyncio.to_thread(stored_line_hashes, store, sweep_id, h.name),
            asyncio.to_thread(set_aside_lines, store, sweep_id, h.name))
        if not sn.journal_path or not sn.python:  # the agent never started: no journal
            digest = Digest([], False, frozenset())
        else:
            # what runs on the node is the inventory's choice, never the store's
            check_placement(h, expand_root(h.root, await t.home()), sn, sweep_id)
            keyed = " --key-stdin" if sn.journal_key else ""
            r = await t.run(f"{q(sn.python)} -c {q(DIGEST_SCRIPT)} {q(sn.journal_path)}"
                            f"{keyed}", check=False,
                            input=f"{sn.journal_key}\n" if sn.journal_key else None)
            if r.exit_status != 0:
                why = (r.stderr.strip().splitlines() or [f"exit {r.exit_status}"])[-1]
                return NodeLedger(h.name, "unverified", detail=f"cannot read its journal "
                                  f"{sn.journal_path}: {why[:200]}")
            try:
                digest = read_digest(r.stdout)
            except ValueError as e:
                raise RemoteError(h.name, "journal digest", r.exit_status, str(e)) from None
        out = compare(h.name, digest.lines, stored, aside_seqs, aside_hashes,
                      digest.unsigned, keyed=bool(sn.journal_key))
        out.partial_line = digest.partial
        out.repeats = sorted({*out.repeats, *await asyncio.to_thread(
            repeated_seqs, store, sweep_id, h.name)})
        out.journal_path = sn.journal_path
        # the derived rows too: a measurement must be what its stored event says
        derived = await asyncio.to_thread(measurement_mismatches, store, sweep_id, h.name)
        # a measurement of a journal line the store lacks (its event lost, the measurement
        # kept) is that hole's, which --attach fills; any other no stored event holds is not
        lacked = {seq for a, b in out.holes for seq in range(a, b + 1)}
        derived = [m for m in derived if not (m.get("orphan") and m["seq"] in lacked)]
        if derived:
            out.conflicts += [{**m, "kind": "derived"} for m in derived]
            out.status = "incomplete"
        if sn.state not in ("finished", "failed", "stopped", "died") and \
                out.status != "complete":
            out.detail = f"the node's agent is {sn.state}: lines may still be on their way"
        return out

    for o in run_fan_out([by_name[n] for n in rows if n in by_name], one, ssh):
        results[o.host] = o.value if o.status == "ok" else NodeLedger(
            o.host, "unverified", detail=f"{o.status}: {o.detail}")
    for n, (events, measured) in nodes_without_row(store, sweep_id, set(rows)).items():
        results[n] = NodeLedger(n, "incomplete", stored=events, conflicts=[{
            "line": None, "seq": None, "kind": "unplaced",
            "problem": f"{events} event(s) and {measured} measurement(s) are stored under "
                       f"{n}, which the sweep ran no job on (no node row): no journal of "
                       "the sweep vouches for them"}])
    return VerifyReport(sweep_id, [results[n] for n in sorted(results)])
