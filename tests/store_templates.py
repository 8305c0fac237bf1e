"""Fresh stores already at head, made by copying one migrated per test worker.

Migrating a new store runs every Alembic revision (SQLite rebuilds tables for each batch
step): ~0.15 CPU-s on SQLite and ~0.4 on PostgreSQL (the client and the server's share),
per test that asks for a store (a Hypothesis property that makes one per example pays it
each time). A test that checks what a store holds gets the same schema from a copy of a
store this checkout's own migrations built once per process (a SQLite file copied:
``fresh_sqlite``; a PostgreSQL database created with it as its TEMPLATE); the tests of
migrating itself (tests/test_store.py, `db upgrade`/`downgrade`) ask for an empty one
(``empty_pg_url``, ``empty_any_url`` in tests/conftest.py), and so does every store the
commands under test create themselves.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql+psycopg://postgres@127.0.0.1:5432/"


def pg_admin():
    # NullPool: a test may restart PostgreSQL, which kills pooled connections; and a
    # template database must have no connection left open when it is copied
    return create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=NullPool)


def new_pg_database(prefix: str = "specfleet_test", template: str | None = None) -> str:
    """A new database (a copy of ``template`` when given); returns its name."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
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
