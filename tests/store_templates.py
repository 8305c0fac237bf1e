"""Fresh stores already at head, made by copying one migrated per test worker.

Migrating a new store runs every Alembic revision (SQLite rebuilds tables for each batch
step): ~0.15 CPU-s on SQLite and ~0.4 on PostgreSQL (the client and the server's share),
per test that asks for a store (a Hypothesis property that makes one per example pays it
each time). A test that checks what a store holds gets the same schema from a copy of a
store this checkout's own migrations built once per process (a SQLite file copied:
``fresh_sqlite``; a PostgreSQL database created with it as its TEMPLATE, and after the
test emptied and renamed for the next rather than dropped: ``PgDatabases``); the tests of
migrating itself (tests/test_store.py, `db upgrade`/`downgrade`) ask for an empty one
(``empty_pg_url``, ``empty_any_url`` in tests/conftest.py), and so does every store the
commands under test create themselves.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql+psycopg://postgres@127.0.0.1:5432/"


def pg_admin():
    # NullPool: a test may restart PostgreSQL, which kills pooled connections; and a
    # template database must have no connection left open when it is copied
    return create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)


def new_pg_database(prefix: str = "specfleet_test", template: str | None = None,
                    name: str | None = None) -> str:
    """A new database (a copy of ``template`` when given); returns its name."""
    name = name or f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = pg_admin()
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'
                       + (f' TEMPLATE "{template}"' if template else "")))
    admin.dispose()
    return name


def drop_pg_database(name: str) -> None:
    admin = pg_admin()
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def migrated_pg_template() -> str:
    """A database migrated to head by this checkout's migrations, every connection to it
    closed (PostgreSQL copies a template only when nobody is connected)."""
    from orchestrator.store import open_store

    name = new_pg_database("specfleet_template")
    open_store(PG_BASE + name).engine.dispose()
    admin = pg_admin()
    with admin.connect() as c:  # nor autovacuum: a copy fails while anyone is connected
        c.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'))
    admin.dispose()
    return name


class PgDatabases:
    """One worker's fresh PostgreSQL databases at head. A test's database is not dropped
    after it: DROP DATABASE forces a checkpoint of the whole server (2-3 s under load, for
    every test and every other one writing then). It is renamed aside instead, its
    connections ended (nothing left running can write into the next test's), and the next
    test gets it emptied (every row deleted, every sequence restarted) under a new name,
    once it is seen to be the template's schema at head; anything else is dropped and
    copied anew."""

    def __init__(self) -> None:
        self.template = migrated_pg_template()
        self.shape: tuple | None = None  # read from the first copy (the template takes none)
        self.spare: list[str] = []

    def take(self) -> str:
        name = f"specfleet_test_{uuid.uuid4().hex[:10]}"
        while self.spare:
            old = self.spare.pop()
            try:
                _rename(old, name)
                if _pg_shape(name) == self.shape:
                    _empty(name, self.shape)
                    return name
            except SQLAlchemyError:
                pass
            drop_pg_database(old)
            drop_pg_database(name)
        new_pg_database(template=self.template, name=name)
        if self.shape is None:
            self.shape = _pg_shape(name)
        return name

    def give_back(self, name: str) -> None:
        spare = f"specfleet_spare_{uuid.uuid4().hex[:10]}"
        try:
            _rename(name, spare)
        except SQLAlchemyError:
            drop_pg_database(name)
            return
        self.spare.append(spare)

    def close(self) -> None:
        for name in [*self.spare, self.template]:
            drop_pg_database(name)


def _rename(old: str, new: str) -> None:
    """Rename a database, ending every connection to it first (as DROP ... WITH (FORCE))."""
    admin = pg_admin()
    with admin.connect() as c:
        c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": old})
        c.execute(text(f'ALTER DATABASE "{old}" RENAME TO "{new}"'))
    admin.dispose()


def _pg_shape(name: str) -> tuple:
    """What a reused database must match: its revision, and every table's and view's
    columns with their types (one query each)."""
    engine = create_engine(PG_BASE + name, poolclass=NullPool)
    try:
        with engine.connect() as c:
            version = tuple(c.execute(text("SELECT version_num FROM alembic_version")).scalars())
            columns = tuple(tuple(r) for r in c.execute(text(
                "SELECT c.table_name, t.table_type, c.column_name, c.data_type "
                "FROM information_schema.columns c JOIN information_schema.tables t "
                "USING (table_schema, table_name) WHERE c.table_schema = 'public' "
                "ORDER BY 1, 3")).all())
            return version, columns
    finally:
        engine.dispose()


def _empty(name: str, shape: tuple) -> None:
    """Every row gone and every sequence back at its start, as in a new copy (DELETE: a
    TRUNCATE makes new files for each table and index, twice as slow here)."""
    tables = sorted({t for t, kind, _, _ in shape[1]
                     if kind == "BASE TABLE" and t != "alembic_version"})
    engine = create_engine(PG_BASE + name, poolclass=NullPool)
    try:
        with engine.begin() as c:
            c.execute(text("SET LOCAL session_replication_role = replica"))  # no FK order
            for t in tables:
                c.execute(text(f'DELETE FROM "{t}"'))
            for seq in c.execute(text("SELECT sequence_name FROM information_schema.sequences "
                                      "WHERE sequence_schema = 'public'")).scalars().all():
                c.execute(text(f'ALTER SEQUENCE "{seq}" RESTART'))
    finally:
        engine.dispose()


def migrated_sqlite_template(folder: Path) -> Path:
    """A SQLite store migrated to head, its write-ahead log folded in (the copy is one file)."""
    from orchestrator.store import open_store

    path = folder / "template.db"
    store = open_store(f"sqlite:///{path}")
    with store.engine.connect() as c:
        c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.engine.dispose()
    return path


_TEMPLATES: dict[str, Path] = {}


def fresh_sqlite(path: Path) -> str:
    """The URL of a SQLite store at ``path``: where nothing is there yet, a copy of this
    process's migrated template (what ``open_store`` would have built); else the file that is
    there, as it is. A path whose folder is missing is left to ``open_store`` to refuse."""
    path = Path(path)
    if not path.exists() and path.parent.is_dir():
        if "sqlite" not in _TEMPLATES:
            folder = Path(tempfile.mkdtemp(prefix="specfleet-template-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _TEMPLATES["sqlite"] = migrated_sqlite_template(folder)
        shutil.copyfile(_TEMPLATES["sqlite"], path)
    return f"sqlite:///{path}"


def planted_sqlite(key: str, build: Callable[[str], object], path: Path) -> str:
    """The URL of a SQLite store at ``path``: a copy of the one ``build(url)`` planted into a
    fresh store once per process (per ``key``). For a fixture that plants the same history
    for every test of a module (seeded, so every planting is alike): each test gets a copy
    of its own to write into, and the planting through the real ingest is paid once."""
    path = Path(path)
    if key not in _TEMPLATES:
        import sqlite3

        folder = Path(tempfile.mkdtemp(prefix="specfleet-planted-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        url = fresh_sqlite(folder / "planted.db")
        build(url)
        with sqlite3.connect(folder / "planted.db") as c:  # the copy is one file
            busy = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        assert busy == 0, f"{key}: the planted store's log could not be folded in"
        _TEMPLATES[key] = folder / "planted.db"
    shutil.copyfile(_TEMPLATES[key], path)
    return f"sqlite:///{path}"
