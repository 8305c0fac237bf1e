"""the tier each model's weights are stored at, part of a run's identity

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 16:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("target_quant", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("draft_quant", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("draft_quant")
        batch_op.drop_column("target_quant")
