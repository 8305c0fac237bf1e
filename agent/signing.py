"""The journal's signature: an HMAC-SHA256 at the end of each line the agent writes.

Anyone who can append to a node's journal can write a line that looks like the agent's; a
line that comes first takes its seq, run index, plan or end (issue 28). The controller
makes a secret key per sweep node at launch and gives it to the agent over the SSH
session's stdin (never a file on the node, never argv, never the environment); the agent
ends each line ``,"mac":"<64 hex>"}``, the MAC taken over the exact bytes before
``,"mac"`` (the event's ``seq`` among them, so a MAC binds its line's seq). The controller
checks those bytes as they came, with no second serialisation. Stdlib only: the agent
imports nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

TAG = b',"mac":"'
MAC_HEX = 64  # SHA-256, hex
SUFFIX_BYTES = len(TAG) + MAC_HEX + 2  # what signing adds to a line (the tag, mac, '"}')
START = b'{"schema":'  # how every line the agent writes begins (journal.Journal.emit)
# where in a line a signed line glued after other bytes may begin: tried from the right, so
# bytes glued in front cannot push the agent's own start out; a few more than the one start
# the agent's line has (a nested object whose first key is "schema" adds one)
MAX_STARTS = 8


def mac(key: bytes, body: bytes) -> str:
    return hmac.digest(key, body, hashlib.sha256).hex()


def sign(key: bytes, line: str) -> str:
    """The JSON object ``line`` (no newline) with its MAC as its last member."""
    body = line[:-1].encode("utf-8")  # up to, not including, the closing brace
    return line[:-1] + TAG.decode() + mac(key, body) + '"}'


def signed(key: bytes, line: bytes) -> bool:
    """Whether ``line`` (no newline) ends with a valid MAC of the bytes before it."""
    return Verifier(key)(line)


def signed_from(check: Callable[[bytes], bool], line: bytes) -> int | None:
    """Where the agent's signed line begins in ``line`` (a journal line, surrounding
    whitespace stripped): 0 when all of it is the agent's; past the bytes another writer
    appended with no newline before the agent's next line (``line[:at]``, foreign);
    None when no part verifies. The signed part always runs to the line's end and must
    carry a valid MAC of its own bytes: glued bytes can neither forge a line nor hide one,
    and a JSON string cannot hold START (its quotes would be escaped)."""
    if check(line):
        return 0
    at = line.rfind(START, 0, max(len(line) - SUFFIX_BYTES, 0))
    for _ in range(MAX_STARTS):
        if at <= 0:
            return None
        if check(line[at:]):
            return at
        at = line.rfind(START, 0, at)
    return None


class Verifier:
    """``signed`` for many lines under one key: the key's HMAC state is made once and
    copied per line (a third of a short line's MAC time)."""

    def __init__(self, key: bytes):
        base = hmac.new(key, digestmod=hashlib.sha256)
        # the OpenSSL state under it where there is one: its copy is C alone, where
        # ``HMAC.copy`` builds a Python object around it (1.5 of a 2 KB line's 5 us)
        self._base = getattr(base, "_hmac", None) or base

    def __call__(self, line: bytes) -> bool:
        at = len(line) - SUFFIX_BYTES
        if at < 1 or line[at:at + len(TAG)] != TAG or line[-2:] != b'"}':
            return False
        h = self._base.copy()
        h.update(line[:at])
        return hmac.compare_digest(h.hexdigest().encode(), line[at + len(TAG):-2])
