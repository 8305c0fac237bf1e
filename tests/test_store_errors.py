"""The store's failures, mapped once (orchestrator/store/errors.py): real SQLite and
PostgreSQL errors, each of a kind known before the mapping is asked."""

import sqlite3

import pytest
from sqlalchemy import create_engine, text

from orchestrator.errors import SpecfleetError, StoreError
from orchestrator.store.errors import (
    StoreDown,
    StoreFailure,
    StoreFull,
    StoreRefused,
    failure,
    translated,
)


def _raised(fn) -> BaseException:
    try:
        fn()
    except Exception as e:  # the real driver error, as SQLAlchemy raises it
        return e
    raise AssertionError("nothing was raised")


def test_a_constraint_the_store_refuses_is_refused(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 's.db'}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (k INTEGER PRIMARY KEY)"))
        c.execute(text("INSERT INTO t VALUES (1)"))

    def again():
        with engine.begin() as c:
            c.execute(text("INSERT INTO t VALUES (1)"))

    e = _raised(again)
    got = failure(e)
    assert type(got) is StoreRefused and got.original is e
    assert got.driver_message == "UNIQUE constraint failed: t.k"
    assert got.first_line == "(sqlite3.IntegrityError) UNIQUE constraint failed: t.k"
    assert str(got) == str(e)  # the message is the driver's, whole
    with pytest.raises(StoreRefused) as caught:
        with translated():
            again()
    assert isinstance(caught.value.__cause__, type(e))


def test_a_store_locked_by_another_process_is_down(tmp_path):
    path = tmp_path / "s.db"
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (k INTEGER)"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # as another process's long write would
    try:
        def write():
            with engine.begin() as c:
                c.execute(text("INSERT INTO t VALUES (1)"))

        got = failure(_raised(write))
        assert type(got) is StoreDown and got.driver_message == "database is locked"
        with pytest.raises(StoreDown):
            with translated():
                write()
    finally:
        holder.close()


def test_a_full_disk_is_full_not_down(tmp_path):
    """SQLite's own "database or disk is full", reached for real by capping the file's
    pages: an OperationalError like a lock, but waiting would never end it."""
    engine = create_engine(f"sqlite:///{tmp_path / 's.db'}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (b BLOB)"))

    def fill():
        with engine.begin() as c:
            c.execute(text("PRAGMA max_page_count = 3"))
            c.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))

    e = _raised(fill)
    got = failure(e)
    assert type(got) is StoreFull and got.driver_message == "database or disk is full"


def test_a_postgresql_that_is_not_listening_is_down():
    # port 9 (discard) on loopback: nothing listens there in the test machine
    engine = create_engine("postgresql+psycopg://postgres@127.0.0.1:9/none",
                           connect_args={"connect_timeout": 5})
    got = failure(_raised(lambda: engine.connect().close()))
    assert type(got) is StoreDown
    assert "127.0.0.1" in got.first_line and "9" in got.first_line


def test_what_is_not_a_store_error_passes_through_untouched():
    assert failure(ValueError("x")) is None
    with pytest.raises(ValueError):
        with translated():
            raise ValueError("x")
    mapped = StoreRefused(RuntimeError("already ours"))
    assert failure(mapped) is mapped  # mapped once, never wrapped again
    with pytest.raises(StoreRefused) as caught:
        with translated():
            raise mapped
    assert caught.value is mapped


def test_every_kind_is_the_projects_own_error():
    for kind in (StoreDown, StoreFull, StoreRefused):
        assert issubclass(kind, StoreFailure) and issubclass(kind, StoreError)
        assert issubclass(kind, SpecfleetError)  # the CLI's edge turns it into one line
