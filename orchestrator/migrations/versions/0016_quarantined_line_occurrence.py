"""quarantined_events.occurrence: identical set-aside lines are one row each

Why: set-aside lines were unique by content, so five identical unreadable lines (a disk
block zeroed alike) became one row; the node's outcome then said 4 lines never reached the
store while `sweeps verify` said complete. A line is now kept once per occurrence of its
content in the journal (the follower counts them in journal order; a re-read counts the
same lines again from 1, so reading a hole again adds nothing).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 21:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quarantined_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("occurrence", sa.Integer(), nullable=False,
                                      server_default="1"))
        batch_op.drop_constraint("uq_quarantined_line", type_="unique")
        batch_op.create_unique_constraint(
            "uq_quarantined_line_occurrence", ["sweep_id", "node", "line_sha256", "occurrence"])


def downgrade() -> None:
    # a later occurrence of a line kept earlier has no place in the old key: it goes
    op.execute("DELETE FROM quarantined_events WHERE occurrence > 1")
    with op.batch_alter_table("quarantined_events", schema=None) as batch_op:
        batch_op.drop_constraint("uq_quarantined_line_occurrence", type_="unique")
        batch_op.create_unique_constraint("uq_quarantined_line",
                                          ["sweep_id", "node", "line_sha256"])
        batch_op.drop_column("occurrence")
