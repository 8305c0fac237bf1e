"""`specfleet.toml`: settings a folder declares for every command run in it (or below).

    # specfleet.toml
    db = "sqlite:///.specfleet-demo/specfleet.db"   # relative paths: from this file's folder
    inventory = ["lab/inventory/"]

Precedence, highest first: the command line, the environment (``SPECFLEET_DB``), this
file, the built-in default. ``SPECFLEET_CONFIG`` names another file, or ``none`` to read
no file (the tests do).

A file that picks the store and the inventory is trusted input, so it is treated as
OpenSSH treats ``~/.ssh/config``: the search stops at the repository root and at
``$HOME`` (a file above either is never read), the file in use is named on stderr, and one
that another user could have written (owner not you or root, group/other-writable, or in
such a folder) is refused. Nothing in it is executed: an inventory it names may not choose
an interpreter (see ``fleet.inventory.load_inventory``).
"""

from __future__ import annotations

import os
import stat
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
    """The settings file for a command run in ``start`` (default: the current folder):
    ``$SPECFLEET_CONFIG``, else the nearest ``specfleet.toml`` at or below the repository
    root and ``$HOME``, whichever comes first going up."""
    chosen = os.environ.get("SPECFLEET_CONFIG")
    if chosen:
        return None if chosen.lower() == "none" else Path(chosen)
    here = (start or Path.cwd()).resolve()
    home = Path.home().resolve()
    for folder in (here, *here.parents):
        if (folder / NAME).is_file():
            return folder / NAME
        # a file above the project or above home belongs to someone else's tree
        if folder == home or (folder / ".git").exists():
            return None
    return None


def check_safe(path: Path) -> None:
    """Refuse a settings file another user could have written, as OpenSSH refuses such a
    ``~/.ssh/config``: it and every folder above it must be owned by you or root and not
    writable by group or others (a root-owned sticky folder such as /tmp is fine: nobody
    else can replace what you put in it)."""
    target = path.resolve()
    # the link and the folders it sits in count too: a symlink in a folder others can
    # write can be pointed elsewhere whatever its target's modes
    here = Path(os.path.abspath(path))
    chain = [target, *target.parents] + ([here, *here.parents] if here != target else [])
    for p in dict.fromkeys(chain):
        _check_one(p, target)


def _check_one(p: Path, target: Path) -> None:
    """One path of ``target``'s chain: owned by you or root, not group/other-writable."""
    try:
        st = p.lstat() if p.is_symlink() else p.stat()
    except OSError as e:
        raise ConfigError(f"cannot check it ({e.strerror})", str(p)) from None
    what = "it" if p == target else f"its folder {p}" if stat.S_ISDIR(st.st_mode) else str(p)
    if st.st_uid not in (os.getuid(), 0):
        raise ConfigError(
            f"refused: {what} is owned by uid {st.st_uid}, not by you or root, so "
            f"another user could have chosen your store and nodes. Fix: chown "
            f"{os.getuid()} {p}, or set SPECFLEET_CONFIG=none to ignore it", str(target))
    sticky_root = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0
    if st.st_mode & 0o022 and not sticky_root and not stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"refused: {what} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so another user could have chosen "
            f"your store and nodes. Fix: chmod go-w {p}, or set SPECFLEET_CONFIG=none "
            "to ignore it", str(target))


def check_tree_safe(path: Path) -> None:
    """check_safe for an inventory the settings file names: the path and, for a folder,
    every file and folder inside it (group_vars/, host_vars/)."""
    check_safe(path)  # the path and every folder above it, once
    if path.is_dir():
        for folder, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                entry = Path(folder) / name
                # inside the tree only the entry itself is new; a link leads elsewhere
                check_safe(entry) if entry.is_symlink() else _check_one(entry, path.resolve())


def load(path: Path) -> ProjectConfig:
    check_safe(path)
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
    inventory = tuple(base / p for p in data.get("inventory", []))
    for inv in inventory:  # what the file names is as trusted as the file, or refused
        if inv.exists():
            check_tree_safe(inv)
    return ProjectConfig(path=path, db=db, inventory=inventory)


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
