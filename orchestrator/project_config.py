"""`specfleet.toml`: settings a folder declares for every command run in it (or below).

    # specfleet.toml
    db = "sqlite:///.specfleet-demo/specfleet.db"   # relative paths: from this file's folder
    inventory = ["lab/inventory/"]

Precedence, highest first: the command line, the environment (``SPECFLEET_DB``), this
file, the built-in default. ``SPECFLEET_CONFIG`` names another file, or ``none`` to read
no file (the tests do).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

NAME = "specfleet.toml"
KEYS = {"db": str, "inventory": list}


@dataclass(frozen=True)
class ProjectConfig:
    path: Path
    db: str | None = None
    inventory: tuple[Path, ...] = ()


def find(start: Path | None = None) -> Path | None:
    chosen = os.environ.get("SPECFLEET_CONFIG")
    if chosen:
        return None if chosen.lower() == "none" else Path(chosen)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / NAME).is_file():
            return folder / NAME
    return None


def load(path: Path) -> ProjectConfig:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read it ({e.strerror})", str(path)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", str(path)) from None
    for key, value in data.items():
        if key not in KEYS:
            raise ConfigError(f"unknown setting {key!r} (known: {', '.join(KEYS)})", str(path))
        if not isinstance(value, KEYS[key]) or key == "inventory" and not all(
                isinstance(v, str) for v in value):
            raise ConfigError(f"{key}: expected " + ("a string" if KEYS[key] is str else
                                                      "a list of paths"), str(path))
    base = path.resolve().parent
    db = data.get("db")
    if db and db.startswith("sqlite:///") and not db.startswith("sqlite:////"):
        db = f"sqlite:///{base / db[len('sqlite:///'):]}"  # relative to this file
    return ProjectConfig(path=path, db=db,
                         inventory=tuple(base / p for p in data.get("inventory", [])))


def defaults(cfg: ProjectConfig, group) -> dict:
    """click's default_map for every command under ``group`` that takes --db or -i."""
    import click

    out: dict = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            sub = defaults(cfg, cmd)
            if sub:
                out[name] = sub
            continue
        names = {p.name for p in cmd.params}
        entry: dict = {}
        if cfg.db and "db_url" in names:
            entry["db_url"] = cfg.db
        if cfg.inventory and "inventory_path" in names:
            entry["inventory_path"] = list(cfg.inventory)
        if entry:
            out[name] = entry
    return out
