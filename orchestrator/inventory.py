"""Ansible inventories as teams keep them: YAML or INI, with ``host_vars/`` and ``group_vars/``.

Connection variables: ``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_connection`` (``local`` = the controller
itself). Ours live under a ``specfleet_`` prefix; an unknown one is an error naming its
file and line, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .host_patterns import select_names
from .inventory_ini import parse_ini
from .yamlfile import LineDict, load_yaml

SPECFLEET_VARS = {
    "specfleet_python": "interpreter with mlx-lm on the node (default python3)",
    "specfleet_base_python": "interpreter that `provision` builds envs from (default python3)",
    "specfleet_root": "folder for agent, envs, blobs and journals (default ~/.specfleet)",
    "specfleet_chip": "chip name when the node cannot report it (e.g. M2 Max)",
    "specfleet_memory_bandwidth_gbs": "memory bandwidth override for the roofline",
    "specfleet_weights_root": "where content-addressed weights live (default ROOT/blobs)",
    "specfleet_labels": "free-form labels for plans",
    "specfleet_become_user": "owner of the specfleet root created by `node prepare`",
}
INVENTORY_NAMES = ("hosts.yml", "hosts.yaml", "hosts.ini", "hosts", "inventory.yml",
                   "inventory.ini")


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int | None = None  # None: ~/.ssh/config decides (else 22)
    user: str | None = None
    key_file: str | None = None
    connection: str = "ssh"
    python: str = "python3"
    root: str = "~/.specfleet"
    groups: tuple[str, ...] = ()
    vars: dict = field(default_factory=dict, compare=False)

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{self.port or 22}"


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: tuple[Host, ...]
    groups: dict = field(default_factory=dict, compare=False)

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching an Ansible pattern (``a:b``, ``a:!b``, ``a:&b``, ``web*``, ``@file``)."""
        if not limit:
            return list(self.hosts)
        try:
            names = select_names(limit, [h.name for h in self.hosts], self.groups)
        except ConfigError as e:
            raise ConfigError(str(e), str(self.path)) from None
        by_name = {h.name: h for h in self.hosts}
        return [by_name[n] for n in names]


def host_labels(h: Host) -> set[str]:
    """``specfleet_labels`` as a list or a comma-separated string."""
    raw = h.vars.get("specfleet_labels") or []
    items = raw.split(",") if isinstance(raw, str) else [str(x) for x in raw]
    return {x.strip() for x in items if x.strip()}


def with_labels(hosts: list[Host], labels: list[str], where: str = "plan") -> list[Host]:
    """The hosts carrying every one of ``labels`` (a plan's ``nodes.labels``)."""
    if not labels:
        return hosts
    kept = [h for h in hosts if set(labels) <= host_labels(h)]
    if not kept:
        have = "; ".join(f"{h.name}: {', '.join(sorted(host_labels(h))) or 'none'}"
                         for h in hosts[:10])
        raise ConfigError(f"{where}: no selected host carries all of the labels "
                          f"{', '.join(labels)} (specfleet_labels of the hosts: {have})")
    return kept


# -- reading sources into {group: {"hosts": {h: (vars, line)}, "vars": {k: (v, line)},
#                                  "children": [...], "line": n}}

def _yaml_groups(path: Path, data) -> dict:
    groups: dict[str, dict] = {}

    def walk(name: str, body, line: int | None):
        g = groups.setdefault(name, {"hosts": {}, "vars": {}, "children": [], "line": line})
        if body is None:
            return
        if not isinstance(body, dict):
            raise ConfigError(f"group {name}: expected a mapping", str(path), line)
        for key in body:
            if key not in ("hosts", "children", "vars"):
                raise ConfigError(f"group {name}: unknown key {key!r} (expected hosts, "
                                  "children, vars)", str(path), _line(body, key))
        gvars = body.get("vars") or {}
        if not isinstance(gvars, dict):
            raise ConfigError(f"group {name}: 'vars' must be a mapping", str(path),
                              _line(body, "vars"))
        for k, v in gvars.items():
            g["vars"][k] = (v, _line(gvars, k))
        hosts = body.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise ConfigError(f"group {name}: 'hosts' must be a mapping of host names",
                              str(path), _line(body, "hosts"))
        for h, hvars in hosts.items():
            if hvars is not None and not isinstance(hvars, dict):
                raise ConfigError(f"host {h}: variables must be a mapping", str(path),
                                  _line(hosts, h))
            g["hosts"][str(h)] = ({k: (v, _line(hvars, k)) for k, v in (hvars or {}).items()},
                                  _line(hosts, h))
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise ConfigError(f"group {name}: 'children' must be a mapping", str(path),
                              _line(body, "children"))
        for child, cbody in children.items():
            g["children"].append(child)
            walk(child, cbody, _line(children, child))

    if not isinstance(data, dict) or not data:
        raise ConfigError("an inventory needs groups at the top level (e.g. 'all:')", str(path),
                          _line(data))
    for name, body in data.items():
        walk(name, body, _line(data, name))
    return groups


def _line(d, key=None) -> int | None:
    if isinstance(d, LineDict):
        return d.key_lines.get(key, d.line) if key is not None else d.line
    return None


def _vars_file(folder: Path, name: str) -> list[tuple[Path, dict]]:
    """``folder/name.yml`` (or .yaml / no suffix) and every YAML file in ``folder/name/``."""
    out = []
    for cand in (folder / f"{name}.yml", folder / f"{name}.yaml", folder / name):
        if cand.is_file():
            out.append(cand)
        elif cand.is_dir():
            out += sorted(p for p in cand.iterdir() if p.suffix in (".yml", ".yaml"))
    result = []
    for p in out:
        data = load_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError("a vars file must hold a mapping", str(p))
        result.append((p, data))
    return result


def _find_file(path: Path) -> Path:
    if path.is_dir():
        for n in INVENTORY_NAMES:
            if (path / n).is_file():
                return path / n
        raise ConfigError(f"no inventory file in folder (looked for {', '.join(INVENTORY_NAMES)})",
                          str(path))
    if not path.exists():
        raise ConfigError("file not found", str(path))
    return path


def load_inventory(path: str | Path) -> Inventory:
    """Load a YAML or INI inventory (or a folder holding one) with its host/group vars."""
    path = _find_file(Path(path))
    text = path.read_text(encoding="utf-8")
    is_yaml = path.suffix in (".yml", ".yaml") or (
        path.suffix not in (".ini",) and not text.lstrip().startswith(("[", "#")) and
        ":" in text.split("\n", 1)[0])
    groups = _yaml_groups(path, load_yaml(path)) if is_yaml else parse_ini(path, text)
    groups.setdefault("all", {"hosts": {}, "vars": {}, "children": [], "line": None})
    for name in list(groups):  # every group is a child of all
        if name != "all" and name not in groups["all"]["children"]:
            groups["all"]["children"].append(name)
    return _build(path, groups)


def _depths(groups: dict) -> dict[str, int]:
    parents: dict[str, set[str]] = {g: set() for g in groups}
    for g, body in groups.items():
        for c in body["children"]:
            parents.setdefault(c, set()).add(g)
            groups.setdefault(c, {"hosts": {}, "vars": {}, "children": [], "line": None})
    depth: dict[str, int] = {}

    def d(g: str, seen=()) -> int:
        if g in seen:
            raise ConfigError(f"group {g} is its own ancestor")
        if g not in depth:
            depth[g] = 0 if g == "all" else 1 + max((d(p, seen + (g,)) for p in parents[g]
                                                     if p != g), default=0)
        return depth[g]

    for g in groups:
        d(g)
    return depth


def _build(path: Path, groups: dict) -> Inventory:
    depth = _depths(groups)
    members: dict[str, set[str]] = {}

    def hosts_of(g: str, seen=()) -> set[str]:
        if g not in members:
            out = set(groups[g]["hosts"])
            for c in groups[g]["children"]:
                if c not in seen:
                    out |= hosts_of(c, seen + (g,))
            members[g] = out
        return members[g]

    for g in groups:
        hosts_of(g)
    order: list[str] = []
    definitions: dict[str, list[tuple[str, dict, int | None]]] = {}
    for g in sorted(groups, key=lambda x: (depth[x], x)):
        for h, (hvars, line) in groups[g]["hosts"].items():
            if h not in definitions:
                order.append(h)
            definitions.setdefault(h, []).append((g, hvars, line))
    folder = path.parent
    hosts = []
    for h in order:
        with_vars = [d for d in definitions[h] if d[1]]
        if len(with_vars) > 1:
            (g1, _, l1), (g2, _, l2) = with_vars[:2]
            raise ConfigError(f"host {h} is defined twice with variables (group {g1} line "
                              f"{l1}, group {g2} line {l2}); define its variables once",
                              str(path), l2)
        in_groups = sorted((g for g in groups if h in members[g]), key=lambda x: (depth[x], x))
        merged: dict = {}
        origin: dict = {}
        for g in in_groups:
            for k, (v, line) in groups[g]["vars"].items():
                merged[k], origin[k] = v, (path, line)
            for p, data in _vars_file(folder / "group_vars", g):
                for k, v in data.items():
                    merged[k], origin[k] = v, (p, _line(data, k))
        for k, (v, line) in (with_vars[0][1] if with_vars else {}).items():
            merged[k], origin[k] = v, (path, line)
        for p, data in _vars_file(folder / "host_vars", h):
            for k, v in data.items():
                merged[k], origin[k] = v, (p, _line(data, k))
        hosts.append(_host(h, merged, origin, tuple(g for g in in_groups)))
    if not hosts:
        raise ConfigError("inventory has no hosts", str(path))
    return Inventory(path=path, hosts=tuple(hosts), groups=members)


def _host(name: str, hvars: dict, origin: dict, groups: tuple[str, ...]) -> Host:
    def err(msg: str, key: str) -> ConfigError:
        p, line = origin.get(key, (None, None))
        return ConfigError(f"host {name}: {msg}", str(p) if p else None, line)

    for key in hvars:
        if key.startswith("specfleet_") and key not in SPECFLEET_VARS:
            close = difflib.get_close_matches(key, SPECFLEET_VARS, n=1)
            hint = f"did you mean {close[0]}?" if close else \
                "known: " + ", ".join(sorted(SPECFLEET_VARS))
            raise err(f"unknown variable {key!r} ({hint})", key)
    port = hvars.get("ansible_port")
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                             or not 0 < port < 65536):
        raise err(f"ansible_port must be a port number, got {port!r}", "ansible_port")
    connection = hvars.get("ansible_connection", "ssh")
    if connection not in ("ssh", "local"):
        raise err("ansible_connection must be ssh or local", "ansible_connection")
    # A local node runs the agent with the controller's own interpreter by default.
    python = hvars.get("specfleet_python", sys.executable if connection == "local" else "python3")
    return Host(name=name, address=str(hvars.get("ansible_host", name)), port=port,
                user=hvars.get("ansible_user"), key_file=hvars.get("ansible_ssh_private_key_file"),
                connection=connection, python=str(python),
                root=str(hvars.get("specfleet_root", "~/.specfleet")), groups=groups,
                vars=dict(hvars))
