"""measurements get a timestamp and their end-to-end time; on PostgreSQL, Grafana-ready views
with one row per measurement and per load level (docs/grafana.md)

Why: a team with Grafana on PostgreSQL could not chart measurements over time (they carried
no timestamp) and load results sat in events' JSON text. The views give each row a time,
numeric columns and the identity fields (node, chip, OS build, environment, pair, config).
Existing rows are filled from their events: the event's time, and its ``e2e_ms`` (or, for
journals written before the agent reported it, its last token's arrival).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 15:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# the identity of a node's part in a sweep, from sweep_nodes.identity (json)
_IDENTITY = ("chip", "os_build", "env_id", "mlx_version", "mlx_lm_version", "model_pair",
             "target_fingerprint", "draft_fingerprint", "target_quant", "draft_quant",
             "background", "power_source")
_IDENTITY_SQL = ", ".join(f"sn.identity ->> '{k}' AS {k}" for k in _IDENTITY) + \
    ", split_part(sn.identity ->> 'model_pair', ' / ', 1) AS target"

MEASUREMENTS_VIEW = f"""
CREATE VIEW grafana_measurements AS
SELECT m.measured_at AS "time", m.id AS measurement_id, m.sweep_id, m.node, {_IDENTITY_SQL},
  COALESCE(e.payload::json ->> 'runtime', 'mlx-lm') AS engine,
  m.workload, m.context_bucket, m.mode, m.knob, m.knob_value, m.num_draft_tokens,
  m.temperature, m.pair, m.prompt_sha256, m.run_index, m.repetition,
  m.generated_tokens, m.ttft_ms, m.e2e_ms,
  CASE WHEN m.generated_tokens > 1 THEN (m.e2e_ms - m.ttft_ms) / (m.generated_tokens - 1)
  END AS tpot_ms,
  m.decode_tok_s, m.itl_p50_ms, m.itl_p95_ms, m.itl_p99_ms,
  m.drafted_tokens, m.accepted_tokens, m.acceptance_rate,
  m.peak_mlx_memory_bytes, m.swap_in_bytes, m.bandwidth_utilisation, m.exact_match,
  COALESCE(m.unreliable, false) AS unreliable, m.unreliable_reasons::text AS unreliable_reasons
FROM measurements m
JOIN events e ON e.sweep_id = m.sweep_id AND e.node = m.node AND e.seq = m.seq
LEFT JOIN sweep_nodes sn ON sn.sweep_id = m.sweep_id AND sn.node = m.node
"""

# a load_level event's numbers (agent/load.py summarize, and the loop's telemetry)
_LOAD_INTS = ("requests", "completed", "errors", "output_tokens", "good_requests",
              "rss_peak_bytes", "swap_in_bytes")
_LOAD_FLOATS = ("wall_s", "output_tok_s_total", "output_tok_s_per_stream_p50",
                "requests_per_s", "offered_rps", "served_rps", "goodput_rps",
                "queue_growth_ms", "queued_ms_p99", "acceptance_rate", "cpu_other_share",
                *(f"{m}_p{p}" for m in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "e2el_ms")
                  for p in (50, 90, 95, 99)))
LOAD_VIEW = f"""
CREATE VIEW grafana_load_levels AS
SELECT to_timestamp(e.ts) AS "time", e.id AS event_id, e.sweep_id, e.node, {_IDENTITY_SQL},
  j.p ->> 'workload' AS workload, j.p ->> 'variant' AS variant, j.p ->> 'mode' AS mode,
  j.p ->> 'load' AS load, (j.p ->> 'level')::float8 AS level, j.p ->> 'status' AS status,
  j.p ->> 'stop_reason' AS stop_reason, j.p ->> 'arrivals' AS arrivals,
  {", ".join(f"(j.p ->> '{k}')::float8::bigint AS {k}" for k in _LOAD_INTS)},
  {", ".join(f"(j.p ->> '{k}')::float8 AS {k}" for k in _LOAD_FLOATS)},
  CASE WHEN json_typeof(j.p -> 'unreliable_reasons') = 'array'
       THEN json_array_length(j.p -> 'unreliable_reasons') > 0 ELSE false END AS unreliable,
  (j.p -> 'unreliable_reasons')::text AS unreliable_reasons, (j.p -> 'slo')::text AS slo
FROM events e CROSS JOIN LATERAL (SELECT e.payload::json AS p) j
LEFT JOIN sweep_nodes sn ON sn.sweep_id = e.sweep_id AND sn.node = e.node
WHERE e.type = 'load_level'
"""


def upgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measured_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("e2e_ms", sa.Float(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("""
            UPDATE measurements m SET measured_at = to_timestamp(e.ts),
              e2e_ms = COALESCE((e.payload::json ->> 'e2e_ms')::float8,
                                ((e.payload::json -> 'token_times_us') ->> -1)::float8 / 1000.0)
            FROM events e
            WHERE e.sweep_id = m.sweep_id AND e.node = m.node AND e.seq = m.seq""")
        op.execute(MEASUREMENTS_VIEW)
        op.execute(LOAD_VIEW)
    else:  # SQLite: the columns only (UTC text with microseconds, as ingest writes it)
        op.execute("""
            UPDATE measurements SET
              measured_at = (SELECT strftime('%Y-%m-%d %H:%M:%S', e.ts, 'unixepoch')
                                    || printf('.%06d', CAST(round((e.ts - CAST(e.ts AS INTEGER))
                                                                  * 1000000) AS INTEGER))
                                    || '+00:00'
                             FROM events e WHERE e.sweep_id = measurements.sweep_id
                             AND e.node = measurements.node AND e.seq = measurements.seq),
              e2e_ms = (SELECT COALESCE(json_extract(e.payload, '$.e2e_ms'),
                                        json_extract(e.payload, '$.token_times_us[#-1]')
                                        / 1000.0)
                        FROM events e WHERE e.sweep_id = measurements.sweep_id
                        AND e.node = measurements.node AND e.seq = measurements.seq)""")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP VIEW IF EXISTS grafana_load_levels")
        op.execute("DROP VIEW IF EXISTS grafana_measurements")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_column("e2e_ms")
        batch_op.drop_column("measured_at")
