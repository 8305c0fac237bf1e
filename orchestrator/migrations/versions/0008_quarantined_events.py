"""quarantined events (journal lines that did not pass the decode boundary) and the unit of
a measurement's first divergence (token, or character for a runtime without a tokenizer)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quarantined_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("sweep_id", sa.String(length=64),
                  sa.ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("line_sha256", sa.String(length=64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("sweep_id", "node", "line_sha256", name="uq_quarantined_line"),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_divergence_unit", sa.String(length=16),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_column("first_divergence_unit")
    op.drop_table("quarantined_events")
