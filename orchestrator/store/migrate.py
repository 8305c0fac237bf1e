"""Migrating a store with Alembic: up (once per store, under a lock on PostgreSQL), down
inside a transaction, and what a downgrade would delete, found by trying it."""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(url: str) -> Config:
    # alembic is imported where a migration runs: a store already at head (every command
    # but the first) opens without it, about a fifth of a short command's start-up
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATION_LOCK = 0x5F5EC_F1EE7  # pg advisory lock key: one migrating controller at a time


@functools.cache
def script_head() -> str | None:
    """The newest revision of migrations/versions, read from the files' ``revision`` and
    ``down_revision`` lines; None unless the history is one plain chain (alembic decides)."""
    revs: dict[str, str | None] = {}
    for f in (MIGRATIONS / "versions").glob("*.py"):
        src = f.read_text(encoding="utf-8")
        rev = re.search(r'^revision\s*(?::[^=]*)?=\s*["\'](\w+)["\']', src, re.M)
        down = re.search(r'^down_revision\s*(?::[^=]*)?=\s*(?:["\'](\w+)["\']|None)\s*$',
                         src, re.M)
        if not rev or not down:
            return None
        revs[rev.group(1)] = down.group(1)
    heads = set(revs) - set(revs.values())
    return heads.pop() if len(heads) == 1 else None


def at_head(engine: Engine) -> bool:
    """The store's recorded revision is the newest migration (a read, no lock: a store
    mid-migration elsewhere still reads its old revision and takes the full path)."""
    head = script_head()
    if head is None:
        return False
    try:
        with engine.connect() as c:
            return c.execute(text("SELECT version_num FROM alembic_version")).scalars().all() \
                == [head]
    except SQLAlchemyError:  # no table yet: a new store
        return False


def upgrade(engine: Engine, url: str, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate up; returns the revisions before and after."""
    if revision == "head" and at_head(engine):
        head = script_head()
        return head, head
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    cfg = alembic_config(url)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # Two controllers opening a fresh database at once would race on CREATE TABLE.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        was = MigrationContext.configure(conn).get_current_revision()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        return was, MigrationContext.configure(conn).get_current_revision()


def downgrade(engine: Engine, url: str, revision: str) -> None:
    with _downgrading(engine, url, revision) as conn:
        conn.commit()


@contextlib.contextmanager
def _downgrading(engine: Engine, url: str, revision: str):
    """Migrate down inside one transaction and hand it over, to commit or roll back."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    cfg = alembic_config(url)
    known = [s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()]
    with engine.connect() as conn:
        conn.begin()
        try:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
        except CommandError as e:
            raise StoreError(f"cannot downgrade to {revision!r}: {str(e).splitlines()[0]}; "
                             f"revisions: base, {', '.join(sorted(known))}") from None
        yield conn


def downgrade_losses(engine: Engine, url: str, revision: str) -> list[str]:
    """What a downgrade to ``revision`` would delete, found by doing it in a transaction
    and rolling it back (both stores migrate in transactions): each dropped table with its
    rows, each dropped column with its values where there are any (a value equal to the
    column's default says nothing the older store cannot), and rows a step deletes."""
    from sqlalchemy import inspect

    def shape(conn) -> dict[str, dict[str, str | None]]:
        insp = inspect(conn)
        return {t: {c["name"]: c.get("default") for c in insp.get_columns(t)}
                for t in insp.get_table_names() if t != "alembic_version"}

    def rows(conn, tables) -> dict[str, int]:
        return {t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar() or 0
                for t in tables}

    with engine.connect() as conn:
        before = shape(conn)
        counted = rows(conn, before)
    with _downgrading(engine, url, revision) as conn:
        after = shape(conn)
        left = rows(conn, after)
        conn.rollback()
    losses = []
    with engine.connect() as conn:
        for table, cols in sorted(before.items()):
            if table not in after:
                if counted[table]:
                    losses.append(f"table {table}: {counted[table]} row(s)")
                continue
            if left[table] < counted[table]:
                losses.append(f"table {table}: {counted[table] - left[table]} row(s)")
            for col in sorted(set(cols) - set(after[table])):
                where = f'"{col}" IS NOT NULL'
                default = (cols[col] or "").strip("()'\"")
                if default:
                    where += f""" AND CAST("{col}" AS TEXT) <> '{default.replace("'", "''")}'"""
                n = conn.exec_driver_sql(
                    f'SELECT count(*) FROM "{table}" WHERE {where}').scalar() or 0
                if n:
                    losses.append(f"column {table}.{col}: {n} value(s)")
    return losses
