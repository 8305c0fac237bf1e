"""a partial index on events for the ledger's third per-batch look-up: a node's job_failed
events

Why: ``journal_ends.failed_ends`` asks for each batch which of the node's events are a
job_failed; without an index that read every event the node had stored so far, so a
sweep's ingest slowed as it grew (SQLite, 5,000 generations: 4 µs of every event's ingest,
twice that at 20,000). Partial, like 0015's: the generation rows do not pay for it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 21:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    where = sa.text("type = 'job_failed'")
    op.create_index("ix_events_failed", "events", ["sweep_id", "node", "seq"], unique=False,
                    sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    op.drop_index("ix_events_failed", table_name="events")
