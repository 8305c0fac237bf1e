"""plans leases runs measurements telemetry

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 04:22:02.727845
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("env_id", sa.String(length=32), nullable=False),
        sa.Column("platform", sa.String(length=128), nullable=False),
        sa.Column("python", sa.String(length=16), nullable=False),
        sa.Column("wheels", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("env_id"),
    )
    op.create_table(
        "models",
        sa.Column("fingerprint", sa.String(length=80), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("source", sa.String(length=255), nullable=True),
        sa.Column("revision", sa.String(length=255), nullable=True),
        sa.Column("manifest", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint"),
    )
    op.create_table(
        "node_leases",
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=True),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node"),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("lock", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("plan_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("trigger", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("controller", sa.String(length=255), nullable=True))
        batch_op.create_index("ix_sweeps_created", ["created_at"], unique=False)
        batch_op.create_foreign_key("fk_sweeps_plan_id", "plans", ["plan_id"], ["id"])

    # The spine's per-generation table becomes "measurements"; "runs" is now one config
    # on one node with its identity. Rows are kept by renaming, not copied.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_series")
        batch_op.drop_constraint("uq_runs_index", type_="unique")
    op.rename_table("runs", "measurements")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.create_unique_constraint(
            "uq_measurements_index", ["sweep_id", "node", "run_index"]
        )
        batch_op.create_index(
            "ix_measurements_series", ["node", "workload", "mode", "num_draft_tokens"], unique=False
        )

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("context_bucket", sa.String(length=16), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("knob", sa.String(length=32), nullable=True),
        sa.Column("knob_value", sa.String(length=32), nullable=True),
        sa.Column("num_draft_tokens", sa.Integer(), nullable=False),
        sa.Column("config_key", sa.String(length=255), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("decode_tok_s_median", sa.Float(), nullable=True),
        sa.Column("decode_tok_s_p95", sa.Float(), nullable=True),
        sa.Column("decode_tok_s_cv", sa.Float(), nullable=True),
        sa.Column("acceptance_median", sa.Float(), nullable=True),
        sa.Column("unreliable", sa.Boolean(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("env_id", sa.String(length=32), nullable=True),
        sa.Column("mlx_version", sa.String(length=32), nullable=True),
        sa.Column("mlx_lm_version", sa.String(length=32), nullable=True),
        sa.Column("target_fingerprint", sa.String(length=80), nullable=True),
        sa.Column("draft_fingerprint", sa.String(length=80), nullable=True),
        sa.Column("prompt_sha256", sa.String(length=64), nullable=True),
        sa.Column("os_build", sa.String(length=64), nullable=True),
        sa.Column("chip", sa.String(length=128), nullable=True),
        sa.Column("power_source", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "sweep_id", "node", "workload", "mode", "config_key", name="uq_runs_config"
        ),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_runs_series",
            ["chip", "workload", "context_bucket", "target_fingerprint", "draft_fingerprint"],
            unique=False,
        )
    op.create_table(
        "sweep_nodes",
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("root", sa.Text(), nullable=True),
        sa.Column("job_path", sa.Text(), nullable=True),
        sa.Column("journal_path", sa.Text(), nullable=True),
        sa.Column("agent_dir", sa.Text(), nullable=True),
        sa.Column("python", sa.Text(), nullable=True),
        sa.Column("identity", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep_id", "node"),
    )
    op.create_table(
        "telemetry_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
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


def downgrade() -> None:
    op.drop_table("telemetry_samples")
    op.drop_table("sweep_nodes")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_series")
    op.drop_table("runs")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_measurements_series")
        batch_op.drop_constraint("uq_measurements_index", type_="unique")
    op.rename_table("measurements", "runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_unique_constraint("uq_runs_index", ["sweep_id", "node", "run_index"])
        batch_op.create_index(
            "ix_runs_series", ["node", "workload", "mode", "num_draft_tokens"], unique=False
        )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_constraint("fk_sweeps_plan_id", type_="foreignkey")
        batch_op.drop_index("ix_sweeps_created")
        batch_op.drop_column("controller")
        batch_op.drop_column("trigger")
        batch_op.drop_column("plan_id")
    op.drop_table("plans")
    op.drop_table("node_leases")
    op.drop_table("models")
    op.drop_table("environments")
