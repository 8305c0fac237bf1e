"""grafana_load_levels gets ``served_rps_at_most`` (PostgreSQL only; SQLite has no views)

Why: an open loop level's ``served_rps`` was Sen's 95% bound of its served rate, shown as
the measurement (issue 27). The agent now reports the point estimate as ``served_rps`` and
the bound the saturation verdict rests on as ``served_rps_at_most``; the view gives both,
the new column last (older levels: null, their ``served_rps`` the bound).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 04:15:00
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _load_view() -> str:
    """0013's grafana_load_levels, as it created it (the module's name starts with a digit)."""
    path = Path(__file__).with_name("0013_measured_at_and_grafana_views.py")
    spec = importlib.util.spec_from_file_location("_migration_0013", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LOAD_VIEW


def _with_bound(view: str) -> str:
    head, sep, tail = view.partition("\nFROM events e")
    assert sep, "0013's view changed: no FROM clause found"
    return (head.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1)
            + ",\n  (j.p ->> 'served_rps_at_most')::float8 AS served_rps_at_most" + sep + tail)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_with_bound(_load_view()))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW IF EXISTS grafana_load_levels")
        op.execute(_load_view())
