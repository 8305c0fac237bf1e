"""Ansible INI inventories: ``[group]``, ``[group:vars]``, ``[group:children]``, host ranges.

Values are read as Ansible's ini plugin reads them: ``ast.literal_eval`` when the text is a
Python literal (``8080``, ``True``, ``[1, 2]``, ``"M2 Pro"``), the text itself otherwise
(``yes``, ``true`` and ``FALSE`` stay strings). Host lines are split like a shell line first.
"""

from __future__ import annotations

import ast
import re
import shlex
import string
import warnings
from pathlib import Path

from ..errors import ConfigError

SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
PORT = re.compile(r"^(?P<host>[^:\[\]]+|\[[^\]]+\]|.*\][^:]*):(?P<port>\d+)$")


def ini_value(text: str):
    """An INI value as Ansible's ini plugin reads it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            v = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _plain(v)


def _plain(v):
    if isinstance(v, (list, tuple, set)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if v is ... or isinstance(v, complex):
        return str(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "surrogateescape")
    return v


def expand_range(name: str) -> list[str]:
    """Ansible host ranges: ``mac[01:03]`` (zero padding kept), ``mac[01:10:2]`` (a step),
    ``db-[a:f]`` (letters), nested ranges expanded left to right."""
    if "[" not in name or "]" not in name:
        return [name]
    head, rest = name.split("[", 1)
    body, tail = rest.split("]", 1)
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ConfigError(f"host range [{body}] must be begin:end or begin:end:step")
    beg, end = bounds[0] or "0", bounds[1]
    step = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ConfigError(f"host range [{body}] must give an end")
    if not step.isdigit() or int(step) < 1:
        raise ConfigError(f"host range [{body}]: step must be a positive integer")
    if beg[0] == "0" and len(beg) > 1:
        if len(beg) != len(end):
            raise ConfigError(f"host range [{body}]: begin and end must have the same width")
        width = len(beg)
    else:
        width = 0
    letters = string.ascii_letters
    if beg in letters and end in letters and len(beg) == len(end) == 1:
        i, j = letters.index(beg), letters.index(end)
        if i > j:
            raise ConfigError(f"host range [{body}]: begin must not come after end")
        seq: list[str] = list(letters[i:j + 1:int(step)])
    elif beg.isdigit() and end.isdigit():
        seq = [str(n).zfill(width) for n in range(int(beg), int(end) + 1, int(step))]
    else:
        raise ConfigError(f"host range [{body}]: expected numbers or single letters")
    out: list[str] = []
    for item in seq:
        out += expand_range(head + item + tail)
    return out


def host_pattern(token: str) -> tuple[list[str], int | None]:
    """A host definition's name: expanded ranges and an optional ``:port``."""
    port = None
    m = PORT.match(token)
    outside = re.sub(r"\[[^\]]*\]", "", token)
    if m and outside.count(":") == 1:  # a bare IPv6 address has several colons
        token, port = m.group("host"), int(m.group("port"))
        if token.startswith("[") and token.endswith("]") and ":" in token:
            token = token[1:-1]  # [IPv6]:port
    return expand_range(token), port


def parse_ini(path: Path, text: str) -> dict:
    """Groups in the same shape the YAML loader produces.

    ``{group: {"hosts": {host: (vars, line)}, "vars": {k: (v, line)}, "children": [..]}}``
    """
    groups: dict[str, dict] = {}

    def group(name: str) -> dict:
        return groups.setdefault(name, {"hosts": {}, "vars": {}, "children": [], "line": None})

    section, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            m = SECTION.match(line)
            if not m or (m.group(2) or "hosts") not in ("hosts", "vars", "children"):
                raise ConfigError(f"invalid section header {line!r}", str(path), lineno)
            section, kind = m.group(1), m.group(2) or "hosts"
            group(section)["line"] = group(section)["line"] or lineno
            continue
        g = group(section)
        if kind == "vars":
            key, sep, val = line.partition("=")
            if not sep:
                raise ConfigError(f"expected key=value in [{section}:vars]", str(path), lineno)
            g["vars"][key.strip()] = (ini_value(val.strip()), lineno)
        elif kind == "children":
            m = GROUP_NAME.match(line)
            if not m:
                raise ConfigError(f"expected a group name in [{section}:children], got "
                                  f"{line!r}", str(path), lineno)
            g["children"].append(m.group(1))
        else:
            try:
                parts = shlex.split(line, comments=True)
            except ValueError as e:
                raise ConfigError(f"cannot parse host line: {e}", str(path), lineno) from None
            hvars = {}
            for p in parts[1:]:
                key, sep, val = p.partition("=")
                if not sep:
                    raise ConfigError(f"expected key=value after the host name, got {p!r}",
                                      str(path), lineno)
                hvars[key] = (ini_value(val), lineno)
            try:
                names, port = host_pattern(parts[0])
            except ConfigError as e:
                raise ConfigError(str(e), str(path), lineno) from None
            if port is not None:
                hvars["ansible_port"] = (port, lineno)
            for name in names:
                if name in g["hosts"]:
                    raise ConfigError(f"duplicate host {name!r} in [{section}] (first on line "
                                      f"{g['hosts'][name][1]})", str(path), lineno)
                g["hosts"][name] = (hvars, lineno)
    return groups
