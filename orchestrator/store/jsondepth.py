"""How deep a JSON value nests: the boundary refuses an event nested deeper than the
protocol allows (readers walk events recursively), checked without recursion."""

from __future__ import annotations

_CONTAINERS = {dict, list}


_NOT_OPENING = bytes(b for b in range(256) if b not in b"{[")


def openings(text: str) -> int:
    """How many objects and arrays a JSON text opens (brackets in strings too): a bound on
    its depth, so a line with fewer cannot be too deep. In UTF-8 no other character holds
    these bytes; ``translate`` counts both in one pass, twice ``str.count``'s speed."""
    return len(text.encode("utf-8", "surrogatepass").translate(None, _NOT_OPENING))


def too_deep(event: dict, limit: int) -> bool:
    """Nested deeper than ``limit`` objects/arrays (the event itself is level 1). Iterative:
    a hostile line must not exhaust the stack that reads it."""
    stack: list[tuple[dict | list, int]] = [(event, 1)]
    while stack:
        o, depth = stack.pop()
        values = o.values() if type(o) is dict else o
        if not _CONTAINERS.intersection(map(type, values)):  # C speed for flat arrays
            continue
        if depth >= limit:
            return True
        stack.extend((v, depth + 1) for v in values if type(v) is dict or type(v) is list)
    return False
