"""partial indexes on events for the ledger's two per-batch look-ups: a node's plan event
and its job_finished

Why: ingest's ledger asks for each batch where the node's plan and end are; without an
index both read every event the node has stored so far (a long sweep's ingest slowed as it
grew). Partial (one type each): the millions of generation rows do not pay for them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 18:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

MARKS = {"ix_events_plan": "plan", "ix_events_finished": "job_finished"}


def upgrade() -> None:
    for name, kind in MARKS.items():
        where = sa.text(f"type = '{kind}'")
        op.create_index(name, "events", ["sweep_id", "node", "seq"], unique=False,
                        sqlite_where=where, postgresql_where=where)


def downgrade() -> None:
    for name in MARKS:
        op.drop_index(name, table_name="events")
