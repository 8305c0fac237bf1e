"""the lineup pair a run and a measured generation belong to ("target+draft-2")

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 18:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("runs", "measurements"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("pair", sa.String(length=40), nullable=True))


def downgrade() -> None:
    for table in ("measurements", "runs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("pair")
