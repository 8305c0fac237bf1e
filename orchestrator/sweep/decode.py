"""The one boundary where what a node sends becomes events the store may hold.

Every journal line a follower reads goes through ``Decoder.event``: JSON, the protocol's
major version, ``seq``, ``type``, ``ts``, the fields the protocol declares for the type, and
every value that lands in a store column checked against that column (type, range, length,
no NUL); the line then becomes its typed event (``agent.events``). A line that fails is
*quarantined* with its reason, never stored as an event and never allowed to stop the
other lines or the other nodes. An agent speaking another major version of the event
schema is refused as a whole, naming its version.

The checks themselves live in ``store.eventcheck``: the store's read path runs the same
ones on every stored event a reader asks for (``store.queries.events``). A line first
meets ``store.fastcheck``, which passes a valid event without wording anything; whatever
it does not pass goes through ``eventcheck``, which decides and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from agent.events import Event
from agent.protocol import EVENT_SCHEMA, EVENT_SCHEMA_MAJOR, MAX_EVENT_BYTES
from agent.signing import Verifier, signed_from

from ..errors import SpecfleetError
from ..store.coverage import GLUED, UNSIGNED  # noqa: F401  (UNSIGNED: re-exported)
from ..store.dupkeys import duplicate_key
from ..store.eventcheck import (  # noqa: F401  (re-exported: the rules' historical home)
    GENERATION_RULES,
    MAX_INT32,
    MAX_INT64,
    SAMPLE_RULES,
    SUMMARY_RULES,
    fields_problem,
    schema_problem,
    seq_of,
    seq_problem,
)
from ..store.fastcheck import FAST_CHECKS

MAX_LINE_BYTES = MAX_EVENT_BYTES  # a journal line longer than this is quarantined, not read


def glued_reason(seq: int | None) -> str:
    return (f"{GLUED} not written by this job's agent: appended with no newline before its "
            f"signed line (seq {seq}), which is read on its own")


class ProtocolMismatch(SpecfleetError):
    """A node's agent speaks an event schema this controller cannot read."""


@dataclass(frozen=True)
class Quarantined:
    """A line that was not stored, and why."""

    seq: int | None
    reason: str
    line: str
    occurrence: int = 1  # the how-manieth line of this content in the read (the follower's)


def line_bytes(text: str) -> int:
    """The line's length in bytes as the journal holds it (its escaped bytes that were not
    UTF-8 one each); below a quarter of the limit its characters stand in (within it
    either way), so a usual line is never encoded to be measured."""
    if len(text) * 4 <= MAX_LINE_BYTES:  # at most 4 bytes a character: within it
        return len(text)
    try:
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a surrogate no byte was escaped to: 3 bytes, as passed
        return len(text.encode("utf-8", "surrogatepass"))


class Decoder:
    """Decodes one node's journal lines; remembers the agent version it announced.

    With ``key`` (the sweep node's journal key, ``agent.signing``) a line without a valid
    MAC is set aside before anything in it is believed: it takes no seq, run, plan or end.
    Without one (a node launched before keys, a recorded journal) lines are read as before.
    """

    _key: bytes | None
    _signed: Verifier | None

    def __init__(self, node: str, key: bytes | None = None):
        self.node = node
        self.key = key
        self.agent_version: str | None = None
        self.started = False  # the agent's job_started (of this schema) was read
        self.duplicate: str | None = None  # the last line's key held twice (dupkeys)
        # the line ``framed`` just found signed: ``decode`` of that very text does not
        # take its MAC again (a follower frames each line, then decodes it: one MAC a line)
        self._verified: str | None = None
        self._verified_raw = b""  # its bytes, as the MAC took them (encoded once a line)

    @property
    def key(self) -> bytes | None:
        return self._key

    @key.setter
    def key(self, key: bytes | None) -> None:
        self._key = key
        self._signed = None if key is None else Verifier(key)
        self._verified = None

    def framed(self, line: str | bytes) -> tuple[str | None, str]:
        """(bytes another writer glued before the agent's signed line, or None; the line
        to decode). A keyed journal's line whose signed part starts past its first byte
        (``signing.signed_from``; surrounding whitespace is no line's content, as
        everywhere in the ledger) is the agent's line with foreign bytes in front: the two
        are judged apart, the agent's line whole. Any other line is returned as it is."""
        self._verified = None
        if isinstance(line, bytes):
            line = line.decode("utf-8", "surrogateescape")
        check = self._signed
        # a line over the limit is set aside by its length, as the digest leaves it whole
        if check is None or line_bytes(line.removesuffix("\n")) > MAX_LINE_BYTES:
            return None, line
        text = line.strip()
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte was escaped to: not the agent's
            return None, line
        at = signed_from(check, raw)
        if at is None:
            return None, line
        own = text if at == 0 else raw[at:].decode("utf-8", "surrogateescape")
        self._verified = own  # its MAC checked: decode takes this very text as signed
        self._verified_raw = raw if at == 0 else raw[at:]
        return (None if at == 0 else raw[:at].decode("utf-8", "surrogateescape").strip(),
                own)

    def event(self, line: str | bytes) -> Event | Quarantined:
        """The typed event, or why the line was set aside. Raises ``ProtocolMismatch``
        for an agent of another major schema version. ``event.raw`` is the checked JSON
        object, which the store keeps as the line it came from."""
        e = self.decode(line)
        return e if type(e) is Quarantined else Event.from_json(e)  # type: ignore[arg-type]

    def decode(self, line: str | bytes) -> dict | Quarantined:
        """The checked JSON object of the event (its wire form), or why the line was set
        aside. Raises ``ProtocolMismatch`` for an agent of another major schema version."""
        self.duplicate = None
        verified, self._verified = self._verified, None  # framed's, for this text only
        if isinstance(line, bytes):
            line = line.decode("utf-8", "surrogateescape")
        text = line[:-1] if line.endswith("\n") else line  # kept as the journal holds it
        size = line_bytes(text)
        if size > MAX_LINE_BYTES:
            # a line cut by the node's follower or the transport (MAX + 1 bytes) is never
            # parsed: its head may be a valid event the line never was
            return Quarantined(None, f"line of {size} bytes or more is longer than the "
                                     f"limit of {MAX_LINE_BYTES} bytes", text)
        signed, raw = self._signed, self._verified_raw if text is verified else None
        if signed is not None and raw is None and \
                not signed(text.encode("utf-8", "surrogateescape")):
            return Quarantined(_claimed_seq(text), UNSIGNED, text)
        try:
            e = orjson.loads(text)
        except orjson.JSONDecodeError as err:
            why = str(err).split(":")[0]
            if "surrogates not allowed" in str(err):
                why = "bytes that are not UTF-8"
            return Quarantined(None, f"not JSON ({why})", text)
        if type(e) is not dict:
            return Quarantined(None, f"an event must be a JSON object, got "
                                     f"{type(e).__name__}", text)
        # a key twice: readers of the line would disagree (SQLite's JSON reads the first,
        # orjson the last); the follower stores the object checked here, written again
        self.duplicate = duplicate_key(text, e, raw)
        typ = e.get("type")
        fast = FAST_CHECKS.get(typ) if type(typ) is str else None
        if fast is not None and fast(e, text):  # nearly every line: valid, nothing to word
            if typ == "job_started":
                self._started(e)
            return e
        seq = seq_of(e)
        problem = schema_problem(e)
        if problem:
            schema = e.get("schema")
            if type(schema) is not int or e.get("type") != "job_started":
                # an agent of another schema announces itself with job_started; any other
                # line is a damaged or forged one, set aside like the rest
                return Quarantined(seq, problem, text)
            if self.started or seq not in (1, None):
                # an agent announces itself in its journal's first line: one after the
                # agent's own announcement, or further down, is forged or damaged
                return Quarantined(seq, f"{problem} (a job_started "
                                   + ("after the agent's own" if self.started else
                                      f"at seq {seq}, not the journal's first line") + ")",
                                   text)
            if type(e.get("agent_version")) is str:
                self.agent_version = e["agent_version"]
            raise ProtocolMismatch(
                f"{self.node}: the agent (version {self.agent_version or 'unknown'}) writes "
                f"event schema {schema!r}; this controller reads {EVENT_SCHEMA_MAJOR}.x "
                f"(it speaks {EVENT_SCHEMA}): provision the agent that ships with this "
                "controller, or upgrade the controller")
        problem = seq_problem(e) or fields_problem(e, text)
        if problem:
            return Quarantined(seq, problem, text)
        if e["type"] == "job_started":
            self._started(e)
        return e

    def _started(self, e: dict) -> None:
        """The agent's own announcement (of this schema) read."""
        self.started = True
        if type(e.get("agent_version")) is str:
            self.agent_version = e["agent_version"]


def _claimed_seq(text: str) -> int | None:
    """The seq an unsigned line claims, for its quarantine row (it takes none)."""
    try:
        e = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return seq_of(e) if type(e) is dict else None
