"""Duplicate keys in a journal line: found at the boundary, so every reader of the stored
event sees what was checked.

orjson (like JSON.parse and PostgreSQL's jsonb) keeps the last of a key an object holds
twice; SQLite's JSON functions, which the store's SQL views read, keep the first. A line
with a duplicate key would be judged by one value and read by another, so the event is
stored as the object the boundary checked, written again (orjson), and the journal's line
kept beside it (``REWRITTEN``), which `sweeps verify` hashes for that seq.

Finding one cheaply: each key in the line's text is followed by exactly one ``:``, and any
other ``:`` sits inside a string. orjson writes the parsed object back the same way (one
``:`` per key, a string's colons as they are), so with no duplicate the two counts are
equal; a dropped duplicate leaves the text with more. Only a ``\\u003a`` escape can
hide a colon from the text's count: a line holding one (or counts that differ) is parsed
again, key by key, to say which key it is. The agent writes compact JSON, which orjson
writes back byte for byte: nearly every line costs one dump and one comparison.
"""

from __future__ import annotations

import json

import orjson

# how the reason of a line stored written again begins: not set aside (its event is stored),
# kept so `sweeps verify` knows the journal line the stored event came from
REWRITTEN = "rewritten:"


class _Twice(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Twice(k)
        out[k] = v
    return out


def duplicate_key(text: str, event: dict, raw: bytes | None = None) -> str | None:
    """The first key an object of the line holds twice, or None when none does. ``raw``:
    the line's bytes when the caller has them (the MAC was taken over them), so the line
    is not encoded again."""
    try:
        dumped = orjson.dumps(event)
    except orjson.JSONEncodeError:  # not written back: judged key by key below
        dumped = b""
    if dumped == (raw if raw is not None else text.encode("utf-8", "surrogateescape")):
        return None  # the line is its object written back: no key was dropped from it
    if dumped and "\\u003" not in text and text.count(":") == dumped.count(b":"):
        return None
    try:
        json.loads(text, object_pairs_hook=_unique)
    except _Twice as t:
        return t.key
    except (ValueError, RecursionError):  # refused elsewhere (the depth check says why)
        return None
    return None


def rewritten_reason(key: str, seq: int) -> str:
    return (f"{REWRITTEN} seq {seq} holds key {key[:60]!r} twice in one object: stored as the "
            "boundary checked it (each key's last value), written again; the store's readers "
            "would otherwise disagree which value is the event's")
