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

from ..errors import ConfigError
from ..yamlfile import LineDict, VaultText, load_yaml
from .host_patterns import select_names
from .inventory_ini import host_pattern, parse_ini
from .vault import VaultError, decrypt, read_password

SPECFLEET_VARS = {
    "specfleet_python": "interpreter with mlx-lm on the node (default python3)",
    "specfleet_base_python": "interpreter that `provision` builds envs from (default python3)",
    "specfleet_root": "folder for agent, envs, blobs and journals (default ~/.specfleet)",
    "specfleet_chip": "chip name when the node cannot report it (e.g. M2 Max)",
    "specfleet_memory_bandwidth_gbs": "memory bandwidth override for the roofline",
    "specfleet_weights_root": "where content-addressed weights live (default ROOT/blobs)",
    "specfleet_labels": "free-form labels for plans",
    "specfleet_become_user": "owner of the specfleet root created by `node prepare`",
    "specfleet_machine_lock": "machine-wide agent lock (default /tmp/specfleet-machine.lock)",
}


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
#                                  "children": [...], "line": n, "path": source}}

# What Ansible skips in an inventory folder (INVENTORY_IGNORE_EXTS and the vars folders).
IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig",
                ".cfg", ".retry")
IGNORED_NAMES = ("host_vars", "group_vars", "vars_plugins")


def _new_group(line: int | None = None) -> dict:
    return {"hosts": {}, "vars": {}, "children": [], "line": line}


def _yaml_groups(path: Path, data) -> dict:
    groups: dict[str, dict] = {}

    def walk(name: str, body, line: int | None):
        g = groups.setdefault(name, _new_group(line))
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
            entry = {k: (v, _line(hvars, k)) for k, v in (hvars or {}).items()}
            try:
                names, port = host_pattern(str(h))
            except ConfigError as e:
                raise ConfigError(str(e), str(path), _line(hosts, h)) from None
            if port is not None:
                entry["ansible_port"] = (port, _line(hosts, h))
            for n in names:
                g["hosts"][n] = (entry, _line(hosts, h))
        children = body.get("children") or {}
        if not isinstance(children, dict):
            raise ConfigError(f"group {name}: 'children' must be a mapping", str(path),
                              _line(body, "children"))
        for child, cbody in children.items():
            if child not in g["children"]:
                g["children"].append(child)
            walk(child, cbody, _line(children, child))

    if not isinstance(data, dict) or not data:
        raise ConfigError("an inventory needs groups at the top level (e.g. 'all:')", str(path),
                          _line(data))
    for name, body in data.items():
        walk(name, body, _line(data, name))
    return groups


def _json_groups(path: Path, data: dict) -> dict:
    """What ``ansible-inventory --list`` prints: groups with hosts / children / vars, and
    every host's merged variables under ``_meta.hostvars``."""
    def value(v):  # a vaulted value prints as {"__ansible_vault": "$ANSIBLE_VAULT;..."}
        if isinstance(v, dict) and set(v) == {"__ansible_vault"}:
            return VaultText(str(v["__ansible_vault"]))
        return v

    hostvars = {h: {k: value(v) for k, v in (hv or {}).items()}
                for h, hv in ((data.get("_meta") or {}).get("hostvars") or {}).items()}
    groups: dict[str, dict] = {}
    placed: set[str] = set()
    for name, body in data.items():
        if name == "_meta":
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"group {name}: expected an object", str(path))
        g = groups.setdefault(name, _new_group())
        g["vars"] = {k: (value(v), None) for k, v in (body.get("vars") or {}).items()}
        g["children"] = [str(c) for c in body.get("children") or []]
        for h in body.get("hosts") or []:
            hv = hostvars.get(h) if h not in placed else None
            placed.add(h)
            g["hosts"][str(h)] = ({k: (v, None) for k, v in (hv or {}).items()}, None)
    for h, hv in hostvars.items():  # a host only in _meta belongs to all
        if h not in placed:
            groups.setdefault("all", _new_group())["hosts"][h] = (
                {k: (v, None) for k, v in hv.items()}, None)
    return groups


def _line(d, key=None) -> int | None:
    if isinstance(d, LineDict):
        return d.key_lines.get(key, d.line) if key is not None else d.line
    return None


def _vars_file(folder: Path, name: str) -> list[tuple[Path, dict]]:
    """``folder/name.yml`` (or .yaml / .json / no suffix) and every such file in
    ``folder/name/``."""
    out = []
    for cand in (folder / f"{name}.yml", folder / f"{name}.yaml", folder / f"{name}.json",
                 folder / name):
        if cand.is_file():
            out.append(cand)
        elif cand.is_dir():
            out += sorted(p for p in cand.iterdir()
                          if p.suffix in (".yml", ".yaml", ".json") and p.is_file())
    result = []
    for p in out:
        data = load_yaml(p) or {}
        if not isinstance(data, dict):
            raise ConfigError("a vars file must hold a mapping", str(p))
        result.append((p, data))
    return result


def _source_files(path: Path) -> list[Path]:
    """An inventory source: a file, or every inventory file in a folder as Ansible reads it
    (hidden files, vars folders and README-like extensions skipped)."""
    if not path.exists():
        raise ConfigError("file not found", str(path))
    if not path.is_dir():
        return [path]
    out: list[Path] = []
    for p in sorted(path.iterdir()):
        if p.name.startswith(".") or p.name in IGNORED_NAMES or p.name.endswith(IGNORED_EXTS):
            continue
        out += _source_files(p) if p.is_dir() else [p]
    if not out:
        raise ConfigError("no inventory file in this folder", str(path))
    return out


def _parse_source(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    head = text.lstrip()
    if path.suffix == ".json" or head.startswith("{"):
        import json

        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"invalid JSON: {e}", str(path)) from None
        if not isinstance(data, dict):
            raise ConfigError("a JSON inventory must be an object (ansible-inventory --list)",
                              str(path))
        return _json_groups(path, data)
    is_yaml = path.suffix in (".yml", ".yaml") or (
        path.suffix not in (".ini",) and not head.startswith(("[", "#", ";")) and
        ":" in text.split("\n", 1)[0])
    return _yaml_groups(path, load_yaml(path)) if is_yaml else parse_ini(path, text)


def load_inventory(paths, vault_password_file: str | Path | None = None, *,
                   choose_python: bool = True) -> Inventory:
    """Load one or several inventory sources (files or folders, YAML, INI or the JSON of
    ``ansible-inventory --list``) with the ``host_vars/`` and ``group_vars/`` beside each,
    as Ansible merges them. With ``choose_python=False`` (an inventory named by a settings
    file, not on the command line) a host that names its interpreter is refused."""
    sources = [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]
    groups: dict[str, dict] = {}
    vars_dirs: list[Path] = []
    for src in sources:
        for f in _source_files(src):
            for name, g in _parse_source(f).items():
                into = groups.setdefault(name, _new_group(g["line"]))
                for h, (hv, line) in g["hosts"].items():
                    into["hosts"][h] = ({k: (v, ln, f) for k, (v, ln) in hv.items()}, line, f)
                for k, (v, line) in g["vars"].items():
                    into["vars"][k] = (v, line, f)
                into["children"] += [c for c in g["children"] if c not in into["children"]]
        folder = src if src.is_dir() else src.parent
        if folder not in vars_dirs:
            vars_dirs.append(folder)
    groups.setdefault("all", _new_group())
    groups.setdefault("ungrouped", _new_group())
    for name in list(groups):  # every group is a descendant of all
        if name != "all" and name not in groups["all"]["children"]:
            groups["all"]["children"].append(name)
    return _build(sources[0], groups, vars_dirs, read_password(vault_password_file),
                  choose_python)


# host variables that decide what runs, or where the code and files it runs come from
# (an agent folder under the root is reused as it is, a lock file is truncated): only an
# inventory named on the command line may set them
INTERPRETER_VARS = ("specfleet_python", "ansible_python_interpreter", "specfleet_base_python",
                    "specfleet_root", "specfleet_weights_root", "specfleet_become_user",
                    "specfleet_machine_lock")


def _depths(groups: dict) -> dict[str, int]:
    parents: dict[str, set[str]] = {g: set() for g in groups}
    for g, body in list(groups.items()):
        for c in body["children"]:
            parents.setdefault(c, set()).add(g)
            groups.setdefault(c, _new_group())
    depth: dict[str, int] = {}

    def d(g: str, seen=()) -> int:
        if g in seen:
            raise ConfigError(f"group {g} is its own ancestor")
        if g not in depth:
            depth[g] = 0 if g == "all" else 1 + max((d(p, seen + (g,)) for p in parents[g]
                                                     if p != g), default=0)
        return depth[g]

    for g in list(groups):
        d(g)
    return depth


def _ordered_members(groups: dict) -> dict[str, list[str]]:
    """Each group's hosts in Ansible's order: its own, then its children's, level by level
    (what ``macs[0]`` indexes)."""
    out: dict[str, list[str]] = {}
    for g in groups:
        seen_groups, level, hosts = {g}, [g], []
        while level:
            nxt = []
            for name in level:
                hosts += [h for h in groups[name]["hosts"] if h not in hosts]
                nxt += [c for c in groups[name]["children"] if c not in seen_groups]
                seen_groups.update(groups[name]["children"])
            level = nxt
        out[g] = hosts
    return out


def _build(path: Path, groups: dict, vars_dirs: list[Path], password: bytes | None,
           choose_python: bool = True) -> Inventory:
    depth = _depths(groups)
    members = _ordered_members(groups)
    # ungrouped: hosts in no group but all (Ansible's reconcile_inventory)
    in_named = {h for g, hs in members.items() if g not in ("all", "ungrouped") for h in hs}
    groups["ungrouped"]["hosts"] = {
        h: e for h, e in groups["ungrouped"]["hosts"].items() if h not in in_named}
    for h, e in groups["all"]["hosts"].items():
        if h not in in_named and h not in groups["ungrouped"]["hosts"]:
            groups["ungrouped"]["hosts"][h] = ({}, e[1], e[2])
    members = _ordered_members(groups)
    order: list[str] = []
    definitions: dict[str, list[tuple]] = {}
    for g in sorted(groups, key=lambda x: (depth[x], x)):
        for h, (hvars, line, src) in groups[g]["hosts"].items():
            if h not in definitions:
                order.append(h)
            definitions.setdefault(h, []).append((g, hvars, line, src))
    hosts = []
    for h in order:
        with_vars = [d for d in definitions[h] if d[1]]
        if len(with_vars) > 1:
            (g1, _, l1, p1), (g2, _, l2, p2) = with_vars[:2]
            first = f"line {l1}" if p1 == p2 else f"{p1}:{l1}"
            raise ConfigError(f"host {h} is defined twice with variables (group {g1} {first}, "
                              f"group {g2} line {l2}); define its variables once", str(p2), l2)
        in_groups = sorted((g for g in groups if h in members[g]), key=lambda x: (depth[x], x))
        merged: dict = {}
        origin: dict = {}
        for g in in_groups:
            for k, (v, line, src) in groups[g]["vars"].items():
                merged[k], origin[k] = v, (src, line)
            for folder in vars_dirs:
                for p, data in _vars_file(folder / "group_vars", g):
                    for k, v in data.items():
                        merged[k], origin[k] = v, (p, _line(data, k))
        for k, (v, line, src) in (with_vars[0][1] if with_vars else {}).items():
            merged[k], origin[k] = v, (src, line)
        for folder in vars_dirs:
            for p, data in _vars_file(folder / "host_vars", h):
                for k, v in data.items():
                    merged[k], origin[k] = v, (p, _line(data, k))
        for k, v in merged.items():
            if isinstance(v, VaultText):
                merged[k] = _unvault(h, k, v, origin[k], password)
        hosts.append(_host(h, merged, origin, tuple(in_groups), choose_python))
    if not hosts:
        raise ConfigError("inventory has no hosts", str(path))
    return Inventory(path=path, hosts=tuple(hosts),
                     groups={g: hs for g, hs in members.items()})


def _unvault(host: str, key: str, value: VaultText, origin: tuple, password: bytes | None):
    src, line = origin
    if password is None:
        raise ConfigError(f"host {host}: {key} is vault-encrypted and no vault password was "
                          "given (--vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)",
                          str(src), value.line or line)
    try:
        return decrypt(value.ciphertext, password)
    except VaultError as e:
        raise ConfigError(f"host {host}: {key}: {e}", str(src), value.line or line) from None


def _host(name: str, hvars: dict, origin: dict, groups: tuple[str, ...],
          choose_python: bool = True) -> Host:
    def err(msg: str, key: str) -> ConfigError:
        p, line = origin.get(key, (None, None))
        return ConfigError(f"host {name}: {msg}", str(p) if p else None, line)

    for key in INTERPRETER_VARS:
        if key in hvars and not choose_python:
            raise err(f"{key} is refused in an inventory named by specfleet.toml: a settings "
                      "file found by walking up folders must not choose what runs or where "
                      "its code comes from. Name this inventory with -i on the command line "
                      "instead", key)

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
    # A local node runs the agent with the controller's own interpreter by default; a
    # node's ansible_python_interpreter is its Python unless specfleet_python says otherwise.
    python = hvars.get("specfleet_python", hvars.get(
        "ansible_python_interpreter", sys.executable if connection == "local" else "python3"))
    return Host(name=name, address=str(hvars.get("ansible_host", name)), port=port,
                user=hvars.get("ansible_user"), key_file=hvars.get("ansible_ssh_private_key_file"),
                connection=connection, python=str(python),
                root=str(hvars.get("specfleet_root", "~/.specfleet")), groups=groups,
                vars=dict(hvars))
