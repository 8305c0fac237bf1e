"""Ingest's rows straight through the driver (SQLite executemany, PostgreSQL COPY).

SQLAlchemy's per-row parameter processing cost more than the database itself; values here
are already plain (JSON pre-serialised). The ledger (``ledger.admit``) has already read
which of a batch's rows are stored, so usually none is: ``fresh`` rows go in with no
savepoint to fall back to (on PostgreSQL two round trips fewer per table, most of what
ingest cost beyond the bare COPY: bench/ingest.py). Should another writer have stored one
meanwhile, ``Collided`` is raised, the transaction is lost with it, and the caller runs the
batch again not fresh (each row ON CONFLICT DO NOTHING).
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError


class Collided(Exception):
    """A row the ledger found unstored was stored meanwhile (PostgreSQL, ``fresh``): the
    transaction is lost; run the batch again, not fresh."""


def bulk(c, table: str, columns: tuple[str, ...], rows: list[tuple],
         fresh: bool = False) -> int:
    """INSERT … ON CONFLICT DO NOTHING of ``rows`` on connection ``c``; rows inserted."""
    cols = ", ".join(columns)
    if c.dialect.name == "postgresql":
        import psycopg

        try:
            return _copy(c, table, cols, rows, fresh)
        except psycopg.Error as e:
            # the raw cursor bypasses SQLAlchemy: give callers the error they handle
            # (the follower retries SQLAlchemyError while the store is down)
            raise DBAPIError.instance(f"COPY {table}", None, e, psycopg.Error) from e
    values = ", ".join("?" for _ in columns)
    result = c.exec_driver_sql(f"INSERT INTO {table} ({cols}) VALUES ({values}) "
                               "ON CONFLICT DO NOTHING", rows)
    return max(result.rowcount, 0)


def _copy(c, table: str, cols: str, rows: list[tuple], fresh: bool) -> int:
    import psycopg

    cur = c.connection.driver_connection.cursor()
    if fresh:
        try:
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                for row in rows:
                    cp.write_row(row)
        except psycopg.errors.UniqueViolation as e:
            raise Collided(table) from e
        return len(rows)
    # Not fresh (stored rows likely): COPY straight in under a savepoint; if any row
    # exists, undo that and take the idempotent path.
    cur.execute("SAVEPOINT specfleet_bulk")
    try:
        with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
            for row in rows:
                cp.write_row(row)
        cur.execute("RELEASE SAVEPOINT specfleet_bulk")
        return len(rows)
    except psycopg.errors.UniqueViolation:
        cur.execute("ROLLBACK TO SAVEPOINT specfleet_bulk")
    # COPY into a per-transaction scratch table, then one INSERT … SELECT that skips
    # what is already stored.
    scratch = f"_in_{table}"
    cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {scratch} AS SELECT {cols} FROM "
                f"{table} WITH NO DATA")
    with cur.copy(f"COPY {scratch} ({cols}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)
    cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {scratch} "
                "ON CONFLICT DO NOTHING")
    inserted = cur.rowcount
    cur.execute(f"TRUNCATE {scratch}")
    return max(inserted, 0)
