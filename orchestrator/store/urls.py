"""Store URLs as the store's driver reads them (for callers that check or rewrite one
before any store is open, e.g. a schedule entry)."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

__all__ = ["URL", "make_url"]
