"""Ansible host patterns for ``--limit``: ``group``, ``a:b``, ``a:!b``, ``a:&b``, ``web*``,
``~regex``, subscripts (``macs[0]``, ``macs[-1]``, ``macs[0:1]``, ``macs[1:]``; the end is
inclusive, as in Ansible) and ``@file`` (one name or pattern per line, as written by a
failed fan-out)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from ..errors import ConfigError

# Ansible's PATTERN_WITH_SUBSCRIPT: a pattern, then [n], [-n], [x:y] or [x:]
SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")


def _split(pattern: str) -> list[str]:
    """Split on commas, and on colons outside brackets (``macs[0:1]`` is one term)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in pattern:
        depth += ch == "["
        depth -= ch == "]" and depth > 0
        if ch == "," or (ch == ":" and depth == 0):
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _terms(pattern: str) -> list[str]:
    out = []
    for term in _split(pattern):
        term = term.strip()
        if term.startswith("@"):
            path = Path(term[1:]).expanduser()
            try:
                lines = path.read_text().splitlines()
            except OSError as e:
                raise ConfigError(f"--limit file: {e.strerror}", str(path)) from None
            out += [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
        elif term:
            out.append(term)
    return out


def _subscript(term: str) -> tuple[str, tuple[int, int | None] | None]:
    if term.startswith("~"):
        return term, None
    m = SUBSCRIPT.match(term)
    if not m:
        return term, None
    body, idx, start, sep, end = m.groups()
    if idx is not None:
        return body, (int(idx), None)
    if sep == "-":
        raise ConfigError(f"--limit {term!r}: write ranges as [x:y] (inclusive), not [x-y]")
    return body, (int(start), int(end) if end else -1)


def _apply(hosts: list[str], sub: tuple[int, int | None] | None, term: str) -> list[str]:
    if sub is None:
        return hosts
    start, end = sub
    if end is None or end == 0 and start == 0:
        try:
            return [hosts[start]]
        except IndexError:
            raise ConfigError(f"--limit {term!r}: the pattern matches {len(hosts)} host(s); "
                              f"there is no index {start}") from None
    if end == -1:
        end = len(hosts) - 1
    return hosts[start:end + 1]


def _match(term: str, hosts: list[str], groups: dict[str, list[str]]) -> list[str]:
    def unique(names) -> list[str]:
        return list(dict.fromkeys(names))

    if term.startswith("~"):
        rx = re.compile(term[1:])
        return unique([h for h in hosts if rx.search(h)] + [
            h for g, members in groups.items() if rx.search(g) for h in members])
    if term in groups:
        return list(groups[term])
    if term in hosts:
        return [term]
    if any(c in term for c in "*?["):
        return unique(fnmatch.filter(hosts, term) + [
            h for g in fnmatch.filter(list(groups), term) for h in groups[g]])
    return []


def select_names(pattern: str, hosts: list[str], groups: dict[str, list[str]]) -> list[str]:
    """Host names matching ``pattern``, in inventory order; unknown plain names are errors."""
    include: set[str] = set()
    intersect: list[set[str]] = []
    exclude: set[str] = set()
    unknown = []
    for term in _terms(pattern):
        op, body = (term[0], term[1:]) if term[0] in "!&" else ("", term)
        body, sub = _subscript(body)
        matched = _match(body, hosts, groups)
        if not matched and not any(c in body for c in "*?[~"):
            unknown.append(body)
        found = set(_apply(matched, sub, term))
        if op == "!":
            exclude |= found
        elif op == "&":
            intersect.append(found)
        else:
            include |= found
    if unknown:
        raise ConfigError(f"--limit names unknown hosts or groups: {', '.join(unknown)}")
    if not include and (intersect or exclude):
        include = set(hosts)  # "!b" alone means everything but b, as Ansible does
    for s in intersect:
        include &= s
    include -= exclude
    return [h for h in hosts if h in include]
