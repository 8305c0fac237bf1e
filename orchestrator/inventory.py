"""Ansible-style YAML inventories: ``all: hosts: / children:``, with host variables.

Only what the spine needs: ``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_connection`` (``local`` for the
controller's own machine) and ``specfleet_*`` variables.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .yamlfile import line_of, load_yaml

SPECFLEET_VARS = {"specfleet_python", "specfleet_root", "specfleet_chip", "specfleet_labels",
                  "specfleet_memory_bandwidth_gbs"}
ANSIBLE_VARS = {"ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                "ansible_connection"}


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = 22
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


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: tuple[Host, ...]

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching a comma/colon separated list of host or group names."""
        if not limit:
            return list(self.hosts)
        names = {n for n in limit.replace(",", ":").split(":") if n}
        chosen = [h for h in self.hosts if h.name in names or names & set(h.groups)]
        unknown = names - {h.name for h in self.hosts} - {g for h in self.hosts for g in h.groups}
        if unknown:
            names_text = ", ".join(sorted(unknown))
            raise ConfigError(f"--limit names unknown hosts or groups: {names_text}",
                              str(self.path))
        return chosen


def _host_from_vars(name: str, hvars: dict, groups: tuple[str, ...], path: Path) -> Host:
    for key in hvars:
        if key.startswith("specfleet_") and key not in SPECFLEET_VARS:
            raise ConfigError(f"host {name}: unknown variable {key!r}", str(path),
                              line_of(hvars, key))
    port = hvars.get("ansible_port", 22)
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError(f"host {name}: ansible_port must be a port number, got {port!r}",
                          str(path), line_of(hvars, "ansible_port"))
    connection = hvars.get("ansible_connection", "ssh")
    if connection not in ("ssh", "local"):
        raise ConfigError(f"host {name}: ansible_connection must be ssh or local",
                          str(path), line_of(hvars, "ansible_connection"))
    # A local node runs the agent with the controller's own interpreter by default.
    python = hvars.get("specfleet_python", sys.executable if connection == "local" else "python3")
    return Host(name=name, address=str(hvars.get("ansible_host", name)), port=port,
                user=hvars.get("ansible_user"), key_file=hvars.get("ansible_ssh_private_key_file"),
                connection=connection, python=str(python),
                root=str(hvars.get("specfleet_root", "~/.specfleet")), groups=groups,
                vars=dict(hvars))


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file or a folder holding one (``hosts.yml``)."""
    path = Path(path)
    if path.is_dir():
        candidates = [path / n for n in ("hosts.yml", "hosts.yaml")]
        path = next((p for p in candidates if p.exists()), candidates[0])
    data = load_yaml(path)
    if not isinstance(data, dict) or "all" not in data:
        raise ConfigError("an inventory needs a top-level 'all:' group", str(path), line_of(data))
    found: dict[str, tuple[dict, list[str]]] = {}

    def walk(group_name: str, group, inherited: dict, trail: tuple[str, ...]):
        if group is None:
            return
        if not isinstance(group, dict):
            raise ConfigError(f"group {group_name}: expected a mapping", str(path))
        for key in group:
            if key not in ("hosts", "children", "vars"):
                raise ConfigError(f"group {group_name}: unknown key {key!r} "
                                  "(expected hosts, children, vars)", str(path),
                                  line_of(group, key))
        gvars = {**inherited, **(group.get("vars") or {})}
        hosts = group.get("hosts") or {}
        if not isinstance(hosts, dict):
            raise ConfigError(f"group {group_name}: 'hosts' must be a mapping of host names",
                              str(path), line_of(group, "hosts"))
        for name, hvars in hosts.items():
            if hvars is not None and not isinstance(hvars, dict):
                raise ConfigError(f"host {name}: variables must be a mapping", str(path),
                                  line_of(hosts, name))
            merged = type(hvars)() if isinstance(hvars, dict) else {}
            merged.update(gvars)
            merged.update(hvars or {})
            if hasattr(hvars, "key_lines"):
                merged.key_lines, merged.line = hvars.key_lines, hvars.line
            prev = found.get(name)
            found[name] = (merged if prev is None else {**prev[0], **merged},
                           sorted(set((prev[1] if prev else []) + list(trail))))
        for child, body in (group.get("children") or {}).items():
            walk(child, body, gvars, trail + (child,))

    walk("all", data["all"], {}, ("all",))
    hosts = tuple(_host_from_vars(n, v, tuple(g), path) for n, (v, g) in found.items())
    if not hosts:
        raise ConfigError("inventory has no hosts", str(path), line_of(data))
    return Inventory(path=path, hosts=hosts)
