"""Opening a store from its URL: refusing URLs that name nothing usable, with the fix;
SQLite's pragmas; migrating to head on the way in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy import event as sa_event
from sqlalchemy.exc import SQLAlchemyError

from ..errors import StoreError
from .db import Store, resolve_url
from .migrate import upgrade

try:  # orjson reads JSON columns several times faster; the review reads a lot of them
    from orjson import loads as _json_loads
except ImportError:  # pragma: no cover - orjson is a dependency, but stay importable
    _json_loads = json.loads  # type: ignore[assignment]


def open_store(url: str | None = None, migrate: bool = True, must_exist: bool = False,
               create_folder: bool = False) -> Store:
    """Open (and by default migrate to head) the store at ``url``. ``must_exist``: a
    command that only reads refuses a SQLite file that is not there, rather than create
    an empty store and answer "nothing" (a mistyped --db looked like an empty fleet).
    A SQLite file whose folder does not exist is refused too (a mistyped folder made a new
    store elsewhere) unless ``create_folder`` (`specfleet db upgrade`: creating is explicit)."""
    url = resolve_url(url)
    check_url(url)
    path = sqlite_path(url)
    if must_exist and path is not None and not path.exists():
        raise StoreError(f"no store at {path}: nothing has been stored there (a sweep creates "
                         "it). Check --db, SPECFLEET_DB or the specfleet.toml in use")
    if path is not None and not path.parent.is_dir():
        if not create_folder:
            raise StoreError(
                f"no folder {path.parent} for the store {path}: check --db, SPECFLEET_DB or "
                f"the specfleet.toml in use (a mistyped folder would start an empty store). "
                f"To start a store there: `specfleet db upgrade --db sqlite:///{path}` "
                "creates it")
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # pre_ping: after a PostgreSQL restart, stale pooled connections are replaced
        engine = create_engine(url, pool_pre_ping=True, json_deserializer=_json_loads)
        if engine.dialect.name == "sqlite":
            sa_event.listen(engine, "connect", _sqlite_pragmas)
            sa_event.listen(engine, "begin", _sqlite_begin)
        if migrate:
            was, now = upgrade(engine, url)
            if was is not None and was != now:
                # a store someone downgraded on purpose is not moved back up silently
                print(f"specfleet: store {engine_url_for_humans(url)} upgraded from revision "
                      f"{was} to {now}", file=sys.stderr)
    except SQLAlchemyError as e:
        msg = str(getattr(e, "orig", None) or e).splitlines()[0]
        if "disk is full" in msg or "No space left" in msg:  # the migration rolled back
            raise StoreError(f"the store is out of disk space ({msg}); nothing stored so far "
                             f"is lost: free space and run the command again") from None
        raise StoreError(f"cannot open store {engine_url_for_humans(url)}: "
                         f"{e.__class__.__name__}: {str(e).splitlines()[0]}") from None
    return Store(engine)


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (None: another database, or SQLite in memory)."""
    if not url.startswith("sqlite:///"):
        return None
    rest = url[len("sqlite:///"):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def check_url(url: str) -> None:
    """Refuse, with the fix, what SQLAlchemy would answer with its own words: a bare path,
    another database, a folder."""
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is None:
        raise StoreError(f"--db {url!r} is not a store URL; for a SQLite file write "
                         f"sqlite:///{url} (sqlite://// + an absolute path)")
    if scheme not in ("sqlite", "postgresql", "postgresql+psycopg"):
        raise StoreError(f"--db: {scheme!r} stores are not supported; use sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST:PORT/DB")
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else None
    if scheme == "sqlite" and path == "":
        raise StoreError(f"--db {url}: names no file; e.g. sqlite:///specfleet.db")
    if path and Path(path).is_dir():
        raise StoreError(f"--db {url}: that is a folder; name a file in it, e.g. "
                         f"{url.rstrip('/')}/specfleet.db")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL: the review reads while the controller writes, and a commit is one append instead
    # of a rewritten journal. synchronous=NORMAL is still crash-safe for the process (only
    # a power cut can drop the newest commits, and re-ingesting a node journal restores
    # them). busy_timeout: a second writer waits instead of failing at once.
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=10000"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()
    # Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE, so CREATE,
    # DROP and ALTER committed on their own: a migration that failed halfway stayed
    # halfway, and a downgrade could not be tried and rolled back. SQLAlchemy's recipe:
    # the driver does no transaction handling, and every SQLAlchemy transaction is BEGIN.
    dbapi_conn.isolation_level = None


def _sqlite_begin(conn) -> None:
    conn.exec_driver_sql("BEGIN")


def engine_url_for_humans(url: str) -> str:
    from ..redact import redact_url

    return redact_url(url)
