"""grafana_measurements carries each generation's whole config and its http variant

Why: the view named a config by mode, width, one swept knob and temperature only, so two
configs differing in any other setting (kv_bits 4 vs 8 in base, an http variant's server
command) looked alike and the dashboard's series pooled them. ``config`` is the config as
the generation's event recorded it (every knob, the variant); ``variant`` the http variant.
And ``unreliable`` now also marks a generation whose config was set aside as a whole (its
config_summary unreliable: a decode rate too variable), as the review and the OTLP export
do; ``unreliable_reasons`` then adds the config's reasons.

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


# the generation's run (its config on its node in its sweep): set aside as a whole or not
_EDITS = (
    ("COALESCE(m.unreliable, false) AS unreliable",
     "(COALESCE(m.unreliable, false) OR COALESCE(r.unreliable, false)) AS unreliable"),
    ("m.unreliable_reasons::text AS unreliable_reasons",
     "CASE WHEN COALESCE(r.unreliable, false) THEN (COALESCE(m.unreliable_reasons::jsonb, "
     "'[]'::jsonb) || COALESCE(r.summary::jsonb -> 'unreliable_reasons', '[]'::jsonb))::text "
     "ELSE m.unreliable_reasons::text END AS unreliable_reasons"),
    (_TAIL, _COLUMNS),
    ("LEFT JOIN sweep_nodes sn",
     "LEFT JOIN runs r ON r.sweep_id = m.sweep_id AND r.node = m.node "
     "AND r.workload = m.workload AND r.mode = m.mode AND r.pair IS NOT DISTINCT FROM m.pair "
     "AND r.config::jsonb = (e.payload::json -> 'config')::jsonb\nLEFT JOIN sweep_nodes sn"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    view = _view_0013()
    for before, after in _EDITS:
        assert view.count(before) == 1, before
        view = view.replace(before, after)
    op.execute("DROP VIEW IF EXISTS grafana_measurements")
    op.execute(view)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP VIEW IF EXISTS grafana_measurements")
    op.execute(_view_0013())
