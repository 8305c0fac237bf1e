"""Which lines of a journal read again from its top go out to the controller (``follow
--from-seq N``): none of what the store already accounts for, all of what it may not.

The controller counts identical set-aside lines per read (the k-th line of one content is
the journal's k-th), so a line left out must leave no other line of its content counted
as an earlier one. The rule: a line whose seq is N or less and that is the first line to
claim that seq stays out (a read that took the seq to N read it: every line then holding
that seq went out, this first one among them); every other line goes out (a second line
claiming a stored seq, a copy appended later, a line with no readable seq). When a later
line holds the same content as a first line left out, that first line goes out again just
before it, as it is in the journal, so the copies are counted from one as the first read
counted them.

A line someone glued in front of the agent's next line (no newline between) claims seqs
through its parts: each ``{"schema":`` start the controller may split it at (the rule of
``signing.signed_from``) gives a prefix and a suffix, either of which may repeat a first
line. No key is needed here: which part the controller takes, by its MAC, is one of them.
"""

from __future__ import annotations

import hashlib
import json

from .signing import MAX_STARTS, START, SUFFIX_BYTES

_GONE = (-1, 0, b"")  # a first line already sent again


def seq_of(line: bytes) -> int | None:
    """The line's seq, when it is a readable event; None for anything else."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # a hostile line may nest 100,000 levels deep
        return None
    seq = event.get("seq") if isinstance(event, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def _stripped(line: bytes) -> bytes:
    """The line as the controller judges it: surrounding whitespace stripped as a string."""
    return line.decode("utf-8", "surrogateescape").strip().encode("utf-8", "surrogateescape")


def _parts(text: bytes) -> list[tuple[int, bytes]]:
    """The (seq, bytes) a stripped line with no readable seq may claim through its parts:
    the prefix and the suffix at each start ``signed_from`` tries, that are events."""
    out = []
    at = text.rfind(START, 0, max(len(text) - SUFFIX_BYTES, 0))
    for _ in range(MAX_STARTS):
        if at <= 0:
            break
        for part in (_stripped(text[:at]), text[at:]):
            if (seq := seq_of(part)) is not None:
                out.append((seq, part))
        at = text.rfind(START, 0, at)
    return out


class Reread:
    """Picks what goes out of a journal read from its top, for ``--from-seq from_seq``."""

    def __init__(self, from_seq: int, read_at):
        self.from_seq = from_seq
        self._read_at = read_at  # (offset, length) -> the journal's bytes there
        # seq <= from_seq -> (offset, length, sha256 of its stripped bytes) of its first line
        self._first: dict[int, tuple[int, int, bytes]] = {}
        self._claimed: set[int] = set()  # seqs <= from_seq a line that went out claimed

    def pick(self, line: bytes, offset: int) -> list[bytes]:
        """What goes out for ``line`` (no newline), found at ``offset`` in the journal."""
        n = self.from_seq
        if n <= 0:
            return [line]
        text = _stripped(line)  # a claim the controller reads, read alike here
        seq = seq_of(text)
        claims = [(seq, text)] if seq is not None else _parts(text)
        out = []
        for s, part in claims:
            first = self._first.get(s) if 1 <= s <= n else None
            if first is not None and first is not _GONE and \
                    first[2] == hashlib.sha256(part).digest():
                out.append(self._read_at(first[0], first[1]))  # as the journal holds it
                self._first[s] = _GONE
        # a seq below 1 is no seq the agent writes: no read took it as a stored seq's line
        if seq is not None and 1 <= seq <= n and seq not in self._first and \
                seq not in self._claimed:
            self._first[seq] = (offset, len(line), hashlib.sha256(text).digest())
            return out
        self._claimed.update(s for s, _ in claims if 1 <= s <= n)
        return [*out, line]
