"""Ansible host patterns for ``--limit``: ``group``, ``a:b``, ``a:!b``, ``a:&b``, ``web*``,
``~regex``, and ``@file`` (one name or pattern per line, as written by a failed fan-out)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from .errors import ConfigError


def _terms(pattern: str) -> list[str]:
    out = []
    for term in re.split(r"[,:]", pattern):
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


def _match(term: str, hosts: list[str], groups: dict[str, set[str]]) -> set[str]:
    if term.startswith("~"):
        rx = re.compile(term[1:])
        return {h for h in hosts if rx.search(h)} | {
            h for g, members in groups.items() if rx.search(g) for h in members}
    if any(c in term for c in "*?["):
        return set(fnmatch.filter(hosts, term)) | {
            h for g in fnmatch.filter(list(groups), term) for h in groups[g]}
    if term in groups:
        return set(groups[term])
    return {term} if term in hosts else set()


def select_names(pattern: str, hosts: list[str], groups: dict[str, set[str]]) -> list[str]:
    """Host names matching ``pattern``, in inventory order; unknown plain names are errors."""
    include: set[str] = set()
    intersect: list[set[str]] = []
    exclude: set[str] = set()
    unknown = []
    for term in _terms(pattern):
        op, body = (term[0], term[1:]) if term[0] in "!&" else ("", term)
        found = _match(body, hosts, groups)
        if not found and not any(c in body for c in "*?[~"):
            unknown.append(body)
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
