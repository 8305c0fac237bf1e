"""The result store: SQLite by default, PostgreSQL for teams; Alembic migrations."""

from .db import DEFAULT_URL, Store, resolve_url
from .opening import open_store

__all__ = ["DEFAULT_URL", "Store", "open_store", "resolve_url"]
