"""the co-tenant load a run was measured beside ("busy: 512 MB + 1 CPU"); null when idle

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 19:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("background", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("background")
