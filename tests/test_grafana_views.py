"""Grafana-ready PostgreSQL (issue 32): views with one row per measurement and per load level,
a timestamp, numeric columns and the identity; the documented query and the dashboard's
queries run on the real PostgreSQL; the timestamp and E2E columns are filled for stored
rows by the migration on both stores, and derive again equal (`sweeps verify`)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import func, select, text

from orchestrator.store import open_store
from orchestrator.store.db import downgrade, upgrade
from orchestrator.store.derived import measurement_mismatches
from orchestrator.store.models import Measurement
from tests.history import ingest_lines
from tests.test_otlp_export import AT, plant

ROOT = Path(__file__).resolve().parents[1]


def plant_load(store, sid: str) -> None:
    """One load level on mac-b: 4 streams, 3 of 4 requests good, e2e p95 900 ms."""
    ingest_lines(store, sid, "mac-b", [{
        "type": "load_level", "workload": "code", "variant": "draft-3", "mode": "speculative",
        "load": "concurrency", "level": 4, "status": "ok", "stop_reason": None,
        "requests": 4, "completed": 4, "errors": 0, "error_examples": [], "wall_s": 2.0,
        "output_tokens": 400, "output_tok_s_total": 200.0, "requests_per_s": 2.0,
        "offered_rps": 2.0, "served_rps": 2.0, "ttft_ms_p50": 100.0, "ttft_ms_p95": 150.0,
        "tpot_ms_p50": 8.0, "e2e_ms_p50": 800.0, "e2e_ms_p95": 900.0, "e2el_ms_p99": 880.0,
        "slo": {"e2el": 850}, "good_requests": 3, "goodput_rps": 1.5,
        "rss_peak_bytes": 2_000_000_000, "unreliable": False, "unreliable_reasons": []}],
        AT.timestamp() + 60)


def _grafana(sql: str) -> str:
    """Grafana's PostgreSQL macros and variables as Grafana expands them, for a range that
    holds the planted week."""
    sql = re.sub(r"\$__timeGroupAlias\((\w+), '1d'\)", "date_trunc('day', \\1) AS \"time\"",
                 sql)
    sql = re.sub(r"\$__timeFilter\((\w+)\)",
                 r"\1 BETWEEN '2026-11-23T00:00:00Z' AND '2026-11-30T00:00:00Z'", sql)
    return sql.replace("$workload", "'code'")


@pytest.mark.postgres
def test_views_give_one_row_per_measurement_and_load_level(pg_url):
    store = open_store(pg_url)
    sid = plant(store)
    plant_load(store, sid)
    with store.engine.connect() as c:
        n = c.execute(select(func.count()).select_from(Measurement)).scalar()
        rows = c.execute(text("SELECT * FROM grafana_measurements ORDER BY node, run_index")
                         ).mappings().all()
        load = c.execute(text("SELECT * FROM grafana_load_levels")).mappings().all()
    assert len(rows) == n == 6
    assert {r["time"] for r in rows} == {AT}
    a_base = [r for r in rows if r["node"] == "mac-a" and r["mode"] == "baseline"]
    assert [r["tpot_ms"] for r in a_base] == [pytest.approx(10.0)] * 2
    assert {(r["chip"], r["os_build"], r["env_id"], r["target"], r["engine"])
            for r in a_base} == {("Apple M2 Pro", "24A335", "env-a", "gemma", "mlx-lm")}
    (b,) = [r for r in rows if r["node"] == "mac-b"]
    assert (b["engine"], b["target"], b["e2e_ms"], b["env_id"]) == ("vllm (chat)", "qwen",
                                                                     1120.0, "env-b")
    spec = [r for r in rows if r["mode"] == "speculative"]
    assert [r["unreliable"] for r in spec] == [False, False, True]
    assert json.loads(spec[2]["unreliable_reasons"]) == ["swap grew"]
    assert all(isinstance(r["decode_tok_s"], float) and r["num_draft_tokens"] in (0, 3)
               for r in rows)
    (lv,) = load
    assert lv["time"] == AT + timedelta(seconds=60)
    assert (lv["node"], lv["chip"], lv["variant"], lv["load"], lv["level"], lv["status"]) == \
        ("mac-b", "Apple M4", "draft-3", "concurrency", 4.0, "ok")
    assert (lv["e2e_ms_p95"], lv["e2el_ms_p99"], lv["goodput_rps"], lv["good_requests"]) == \
        (900.0, 880.0, 1.5, 3)
    assert lv["rss_peak_bytes"] == 2_000_000_000 and lv["unreliable"] is False
    assert lv["e2e_ms_p99"] is None  # not reported: empty, not zero
    # a closed loop's served rate is a count: no bound beside it
    assert (lv["served_rps"], lv["served_rps_at_most"]) == (2.0, None)


@pytest.mark.postgres
def test_an_open_loop_level_gives_its_served_point_and_bound(pg_url):
    """Issue 27: served_rps is the point estimate, served_rps_at_most the 95% bound the
    verdict rests on (migration 0019 adds the column, last)."""
    store = open_store(pg_url)
    sid = plant(store)
    ingest_lines(store, sid, "mac-b", [{
        "type": "load_level", "workload": "code", "variant": "draft-3", "mode": "speculative",
        "load": "request_rate", "level": 8, "status": "saturated", "requests": 16,
        "completed": 16, "errors": 0, "offered_rps": 8.0, "served_rps": 4.6,
        "served_rps_at_most": 5.1}], AT.timestamp() + 60)
    with store.engine.connect() as c:
        (lv,) = c.execute(text("SELECT * FROM grafana_load_levels")).mappings().all()
        cols = list(lv.keys())
    assert (lv["offered_rps"], lv["served_rps"], lv["served_rps_at_most"]) == (8.0, 4.6, 5.1)
    assert cols[-1] == "served_rps_at_most"


@pytest.mark.postgres
def test_the_documented_query_and_the_dashboards_queries_run(pg_url):
    store = open_store(pg_url)
    sid = plant(store)
    plant_load(store, sid)
    doc = (ROOT / "docs" / "grafana.md").read_text()
    (example,) = re.findall(r"```sql\n(.*?)```", doc, re.S)
    with store.engine.connect() as c:
        got = c.execute(text(_grafana(example))).mappings().all()
        # the example's answer: the median decode tok/s of each node's reliable runs
        # a series names the whole config (its knobs as JSON after the width)
        assert {r["metric"].split(" · {")[0]: r["decode_tok_s_p50"] for r in got} == {
            "mac-a · gemma / gemma-draft · mlx-lm · code · short · baseline k=0": 100.0,
            "mac-a · gemma / gemma-draft · mlx-lm · code · short · speculative k=3": 100.0,
            "mac-b · qwen / qwen-draft · vllm (chat) · code · short · baseline k=0": 100.0}
        assert all(json.loads(r["metric"].split(" · ", 6)[6])["num_draft_tokens"] in (0, 3)
                   for r in got)
        dash = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
        queries = [t["rawSql"] for p in dash["panels"] for t in p["targets"]]
        queries += [v["query"] for v in dash["templating"]["list"]]
        assert len(queries) == 6
        for q in queries:
            assert c.execute(text(_grafana(q))).all(), q
    assert "docs/grafana.md" in (ROOT / "docs" / "metrics.md").read_text()


def test_the_migration_fills_time_and_e2e_for_stored_rows(any_url):
    """Rows stored before 0013 (planted at head, then the columns dropped by a downgrade):
    the upgrade fills each from its event, equal to what ingest derives (verify passes)."""
    store = open_store(any_url)
    sid = plant(store)
    downgrade(store.engine, any_url, "0012")
    upgrade(store.engine, any_url)
    with store.engine.connect() as c:
        got = c.execute(select(Measurement.node, Measurement.measured_at, Measurement.e2e_ms)
                        .order_by(Measurement.node, Measurement.run_index)).all()
    assert [(n, e) for n, _, e in got] == [("mac-a", 350.0)] * 2 + [("mac-a", 190.0)] * 3 + \
        [("mac-b", 1120.0)]
    assert {t.astimezone(AT.tzinfo) for _, t, _ in got} == {AT}
    for node in ("mac-a", "mac-b"):
        assert measurement_mismatches(store, sid, node) == []


def test_an_edited_timestamp_is_a_conflict_verify_names(sqlite_url):
    store = open_store(sqlite_url)
    sid = plant(store)
    with store.engine.begin() as c:
        c.execute(Measurement.__table__.update().where(Measurement.node == "mac-b").values(
            measured_at=AT + timedelta(days=1)))
    (bad,) = measurement_mismatches(store, sid, "mac-b")
    assert "measured_at" in bad["problem"]


@given(st.floats(0, 4e9, allow_nan=False))
def test_measured_at_is_the_events_time_to_the_microsecond(ts):
    from datetime import datetime

    from orchestrator.store.db import measured_at

    t = datetime.fromisoformat(measured_at(ts))
    assert t.utcoffset() == timedelta(0) and abs(t.timestamp() - ts) <= 1e-6 * max(1, ts / 1e9)
