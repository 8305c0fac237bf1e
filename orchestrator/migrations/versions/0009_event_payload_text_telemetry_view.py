"""events.payload kept as text; telemetry_samples becomes a view over the generation events

Why: ingest wrote each generation's telemetry window twice (in its event and as rows), and
PostgreSQL re-parsed every ``json`` payload the decode boundary had already checked. Both
cost more than the rest of ingest. No data moves: every sample is already in its event.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 15:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# (column, SQLite expression type, PostgreSQL cast) in the order of the old table
SAMPLE_COLUMNS = (("ts", "float8"), ("swap_used_bytes", "bigint"),
                  ("swap_in_bytes_total", "bigint"), ("rss_bytes", "bigint"),
                  ("memory_pressure", "varchar(16)"), ("thermal_throttled", "boolean"),
                  ("cpu_speed_limit_pct", "integer"), ("power_source", "varchar(16)"),
                  ("low_power_mode", "boolean"))


def _view_select(dialect: str) -> str:
    if dialect == "postgresql":
        cols = ", ".join(f"(j.value ->> '{c}')::{t} AS {c}" for c, t in SAMPLE_COLUMNS)
        return ("SELECT e.sweep_id, e.node, e.seq, (j.ordinality - 1)::integer AS idx, "
                f"{cols} FROM events e CROSS JOIN LATERAL json_array_elements("
                "e.payload::json -> 'telemetry') WITH ORDINALITY AS j(value, ordinality) "
                "WHERE e.type = 'generation'")
    cols = ", ".join(f"json_extract(j.value, '$.{c}') AS {c}" for c, _ in SAMPLE_COLUMNS)
    return ("SELECT e.sweep_id, e.node, e.seq, CAST(j.key AS INTEGER) AS idx, "
            f"{cols} FROM events e, json_each(e.payload, '$.telemetry') j "
            "WHERE e.type = 'generation'")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_table("telemetry_samples")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.alter_column("payload", existing_type=sa.JSON(), type_=sa.Text(),
                              existing_nullable=False,
                              postgresql_using="payload::text")
    op.execute(f"CREATE VIEW telemetry_samples AS {_view_select(dialect)}")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP VIEW telemetry_samples")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.alter_column("payload", existing_type=sa.Text(), type_=sa.JSON(),
                              existing_nullable=False,
                              postgresql_using="payload::json")
    op.create_table(
        "telemetry_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("swap_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("swap_in_bytes_total", sa.BigInteger(), nullable=True),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_pressure", sa.String(length=16), nullable=True),
        sa.Column("thermal_throttled", sa.Boolean(), nullable=True),
        sa.Column("cpu_speed_limit_pct", sa.Integer(), nullable=True),
        sa.Column("power_source", sa.String(length=16), nullable=True),
        sa.Column("low_power_mode", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "node", "seq", "idx", name="uq_telemetry_sample"),
    )
    # the rows come back from the events that always held them
    names = ", ".join(c for c, _ in SAMPLE_COLUMNS)
    op.execute(f"INSERT INTO telemetry_samples (sweep_id, node, seq, idx, {names}) "
               f"SELECT * FROM ({_view_select(dialect)}) AS v WHERE v.ts IS NOT NULL")
