"""grafana_measurements carries each generation's whole config and its http variant

Why: the view named a config by mode, width, one swept knob and temperature only, so two
configs differing in any other setting (kv_bits 4 vs 8 in base, an http variant's server
command) looked alike and the dashboard's series pooled them. ``config`` is the config as
the generation's event recorded it (every knob, the variant); ``variant`` the http variant.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 16:00:00
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _view_0013() -> str:
    spec = importlib.util.spec_from_file_location(
        "_m0013", Path(__file__).with_name("0013_measured_at_and_grafana_views.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MEASUREMENTS_VIEW


_TAIL = "AS unreliable_reasons\nFROM measurements m"
# new columns go last: a view's existing columns keep their order for saved dashboards
_COLUMNS = ("AS unreliable_reasons,\n  e.payload::json ->> 'config' AS config,"
            "\n  e.payload::json ->> 'variant' AS variant\nFROM measurements m")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    old = _view_0013()
    assert old.count(_TAIL) == 1
    op.execute("DROP VIEW IF EXISTS grafana_measurements")
    op.execute(old.replace(_TAIL, _COLUMNS))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP VIEW IF EXISTS grafana_measurements")
    op.execute(_view_0013())
