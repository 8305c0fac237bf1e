"""Schema revisions of an open store, for `specfleet db`: what a downgrade would delete,
and the downgrade itself (``db`` runs Alembic on the store's engine)."""

from __future__ import annotations

from .migrate import downgrade, downgrade_losses


def losses_on_downgrade(store, url: str, revision: str) -> list[str]:
    """What downgrading the store to ``revision`` would delete (tables and columns)."""
    return downgrade_losses(store.engine, url, revision)


def downgrade_store(store, url: str, revision: str) -> None:
    downgrade(store.engine, url, revision)
