"""Schema revisions of an open store, for `specfleet db`: what a downgrade would delete,
and the downgrade itself (``db`` runs Alembic on the store's engine)."""

from __future__ import annotations

from .migrate import downgrade, downgrade_losses


def losses_on_downgrade(store, url: str, revision: str) -> list[str]:
    """What downgrading the store to ``revision`` would delete (tables and columns)."""
    return downgrade_losses(store.engine, url, revision)


def downgrade_store(store, url: str, revision: str) -> None:
    downgrade(store.engine, url, revision)


KEYS_REVISION = "0018"  # sweep_nodes.journal_key: the keys signed journals are checked with


def keyed_nodes_still_running(store, revision: str) -> list[str]:
    """"SWEEP/NODE" of each sweep node whose signed journal a downgrade to ``revision``
    would leave without its key while the agent may still write: a later --attach would
    read it unkeyed, and any line appended to it would pass as the agent's."""
    from sqlalchemy import select

    from .models import SweepNode

    current = store.current_revision() or ""
    if current < KEYS_REVISION or (revision != "base" and revision >= KEYS_REVISION):
        return []  # no keys stored yet, or the downgrade keeps them
    with store.engine.connect() as c:
        rows = c.execute(select(SweepNode.sweep_id, SweepNode.node).where(
            SweepNode.journal_key.is_not(None),
            SweepNode.state.in_(("launching", "running")))).all()
    return [f"{sid}/{node}" for sid, node in rows]
