"""Ansible INI inventories: ``[group]``, ``[group:vars]``, ``[group:children]``, host ranges."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .errors import ConfigError

RANGE = re.compile(r"\[(\d+):(\d+)\]")


def _value(text: str):
    """INI values as Ansible reads them: integers, booleans, else strings."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text in ("True", "true", "yes"):
        return True
    if text in ("False", "false", "no"):
        return False
    return text


def expand_range(name: str) -> list[str]:
    """``mac[01:03]`` → mac01, mac02, mac03 (zero padding kept)."""
    m = RANGE.search(name)
    if not m:
        return [name]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") else 0
    out = []
    for i in range(int(lo), int(hi) + 1):
        out += expand_range(name[:m.start()] + str(i).zfill(width) + name[m.end():])
    return out


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
            m = re.fullmatch(r"\[([^\]:]+)(?::(vars|children))?\]", line)
            if not m:
                raise ConfigError(f"invalid section header {line!r}", str(path), lineno)
            section, kind = m.group(1), m.group(2) or "hosts"
            group(section)["line"] = group(section)["line"] or lineno
            continue
        g = group(section)
        if kind == "vars":
            key, sep, val = line.partition("=")
            if not sep:
                raise ConfigError(f"expected key=value in [{section}:vars]", str(path), lineno)
            g["vars"][key.strip()] = (_value(val.strip().strip("'\"")), lineno)
        elif kind == "children":
            g["children"].append(line.split()[0])
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
                hvars[key] = (_value(val), lineno)
            for name in expand_range(parts[0]):
                if name in g["hosts"]:
                    raise ConfigError(f"duplicate host {name!r} in [{section}] (first on line "
                                      f"{g['hosts'][name][1]})", str(path), lineno)
                g["hosts"][name] = (hvars, lineno)
    return groups
