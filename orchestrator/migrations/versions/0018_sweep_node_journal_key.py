"""sweep_nodes.journal_key: the secret the node's agent signs its journal lines with

Why: anyone who could append to a node's journal got forged lines stored ahead of the
agent's own (a measurement, a seq, a plan, an end; issue 28). The controller now makes a
key per sweep node at launch, hands it to the agent over the SSH session's stdin and keeps
it here, so a controller that attaches or resumes later checks the lines' MACs too. A node
launched before this (no key) is read as before.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweep_nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("journal_key", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweep_nodes", schema=None) as batch_op:
        batch_op.drop_column("journal_key")
