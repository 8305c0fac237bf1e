"""The same migrations and ingest on SQLite and on a real PostgreSQL database."""

import json
from datetime import datetime, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import JSON, DateTime, create_engine, func, inspect, select
from sqlalchemy import column as sa_column
from sqlalchemy import table as sa_table

from orchestrator.errors import StoreError
from orchestrator.store import open_store
from orchestrator.store.db import alembic_config, downgrade, measurement_row, upgrade
from orchestrator.store.models import Base, Event, Measurement

HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
NEW_IN_0002 = {"context_bucket", "itl_p99_ms", "swap_in_bytes", "bandwidth_utilisation",
               "unreliable", "unreliable_reasons",
               "first_divergence_unit",  # 0008
               "pair",  # 0011
               "measured_at", "e2e_ms"}  # 0013; 0001 had none of them

JOB = {"schema": 1, "models": {"target": {"fingerprint": "sha256:t"},
                               "draft": {"fingerprint": "sha256:d"}}}


def _generation(seq: int, index: int, mode: str = "speculative") -> dict:
    return {"schema": 1, "seq": seq, "type": "generation", "ts": 1000.0 + seq,
            "run_index": index, "workload": "code", "prompt_sha256": "ab" * 32, "mode": mode,
            "knob": "num_draft_tokens", "knob_value": 3, "num_draft_tokens": 3,
            "config": {"temperature": 0.0}, "repetition": 0, "generated_tokens": 10,
            "ttft_ms": 5.0, "decode_tok_s": 100.0, "itl_p50_ms": 1.0, "itl_p95_ms": 2.0,
            "drafted_tokens": 9, "accepted_tokens": 6, "acceptance_rate": 0.6667,
            "peak_mlx_memory_bytes": 1 << 20, "exact_match": True, "first_divergence": None,
            "output_text": "x = 1"}


def _events():
    return [{"schema": 1, "seq": 1, "type": "job_started", "ts": 1000.0},
            _generation(2, 0, "baseline"), _generation(3, 1),
            {"schema": 1, "seq": 4, "type": "job_finished", "ts": 1004.0}]


def test_migrations_match_models(empty_any_url):
    store = open_store(empty_any_url)
    assert store.current_revision() == HEAD
    with store.engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    assert diff == []



def _schema(url: str) -> dict:
    """Every table's columns and indexes, and every view, as the database reports them."""
    i = inspect(create_engine(url))
    return {"views": sorted(i.get_view_names()), **{
        t: ([(c["name"], str(c["type"]), c["nullable"]) for c in i.get_columns(t)],
            sorted((x["name"], tuple(x["column_names"])) for x in i.get_indexes(t)))
        for t in i.get_table_names()}}


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_copied_store_is_the_one_the_migrations_build(kind, request, tmp_path):
    """The stores the other tests get are copies of one migrated per worker (tests/
    store_templates.py): the same schema as a store migrated here and now, at head, empty."""
    any_url = request.getfixturevalue("sqlite_url" if kind == "sqlite" else "pg_url")
    empty_any_url = (f"sqlite:///{tmp_path / 'fresh.db'}" if kind == "sqlite"
                     else request.getfixturevalue("empty_pg_url"))
    fresh = open_store(empty_any_url)
    copied = open_store(any_url, migrate=False)  # as copied: not migrated on the way in
    assert copied.current_revision() == fresh.current_revision() == HEAD
    assert _schema(any_url) == _schema(empty_any_url)
    with copied.engine.connect() as c:
        assert all(c.scalar(select(func.count()).select_from(sa_table(t))) == 0
                   for t in inspect(c).get_table_names() if t != "alembic_version")


def test_a_reused_postgresql_database_is_as_new(tmp_path):
    """A test's PostgreSQL database is set aside after it and emptied for the next one
    (tests/store_templates.py): the next test sees no row of it, ids from 1 again, the
    schema at head; the old name is gone (nothing left running writes into the new one);
    a database left at another revision is not reused."""
    from tests.store_templates import PG_BASE, PgDatabases

    pool = PgDatabases()
    try:
        first = pool.take()
        store = open_store(PG_BASE + first)
        planted = _events()
        store.create_sweep("s1", JOB, None)
        store.ingest("s1", "n1", planted, [json.dumps(e) for e in planted])
        with store.engine.connect() as c:
            ids = c.execute(select(Event.id).order_by(Event.id)).scalars().all()
        assert len(ids) == 4
        held = store.engine.connect()  # a connection a test left open
        pool.give_back(first)
        second = pool.take()
        assert second != first and pool.spare == []
        with pytest.raises(Exception, match="does not exist"):
            create_engine(PG_BASE + first).connect()
        again = open_store(PG_BASE + second, migrate=False)
        assert again.current_revision() == HEAD and again.latest_sweep_id() is None
        again.create_sweep("s2", JOB, None)
        again.ingest("s2", "n1", planted, [json.dumps(e) for e in planted])
        with again.engine.connect() as c:
            assert c.execute(select(Event.id).order_by(Event.id)).scalars().all() == ids
        fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
        open_store(fresh)
        assert {t for t, v in _schema(PG_BASE + second).items() if t != "views"} == {
            t for t, v in _schema(fresh).items() if t != "views"}
        again.engine.dispose()
        downgrade(open_store(PG_BASE + second, migrate=False).engine, PG_BASE + second, "0012")
        pool.give_back(second)
        third = pool.take()  # not the downgraded one: a new copy at head
        assert open_store(PG_BASE + third, migrate=False).current_revision() == HEAD
        pool.give_back(third)
        held.close()
    finally:
        pool.close()

def test_ingest_twice_stores_once(any_url):
    store = open_store(any_url)
    store.create_sweep("s1", JOB, None)
    # an overlapping batch (a reconnecting reader) adds only what is new
    assert store.ingest("s1", "node1", _events()[:2]) == 2
    assert store.ingest("s1", "node1", _events()) == 2
    assert store.ingest("s1", "node1", _events()) == 0
    # a line after the job's end is set aside with its reason, never stored
    refused: list = []
    more = _events()[2:] + [{"schema": 1, "seq": 5, "type": "note", "ts": 1005.0}]
    assert store.ingest("s1", "node1", more, refused=refused) == 0
    assert [(r.seq, r.reason) for r in refused] == [
        (5, "after the job's end: seq 5 follows its job_finished at seq 4")]
    with store.engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(Event)) == 4
        assert c.scalar(select(func.count()).select_from(Measurement)) == 2
        payload = c.scalar(select(Event.payload).where(Event.seq == 3))
    assert payload == json.loads(json.dumps(_generation(3, 1)))


def test_downgrade_and_upgrade_keep_working(empty_any_url):
    store = open_store(empty_any_url)
    downgrade(store.engine, empty_any_url, "base")
    assert "runs" not in inspect(create_engine(empty_any_url)).get_table_names()
    upgrade(store.engine, empty_any_url)
    assert {"runs", "measurements", "events", "sweeps", "node_outcomes", "node_leases",
            "plans", "environments", "models", "sweep_nodes"} <= set(
        inspect(create_engine(empty_any_url)).get_table_names())
    assert "telemetry_samples" in inspect(create_engine(empty_any_url)).get_view_names()


def _with_telemetry(seq: int, index: int) -> dict:
    window = [{"ts": 1000.0 + seq + i / 2, "swap_used_bytes": 1 << 30, "rss_bytes": 5 << 27,
               "swap_in_bytes_total": None, "memory_pressure": "warn",
               "thermal_throttled": bool(i), "cpu_speed_limit_pct": 100,
               "power_source": "ac", "low_power_mode": False} for i in range(2)]
    return {**_generation(seq, index), "telemetry": window}


def test_telemetry_samples_view_reads_every_window_and_survives_a_downgrade(empty_any_url):
    """Since 0009 the samples are read from the events that carry them (one write per
    generation); the view has the old table's columns and types, and going back to 0008
    rebuilds the table from the same events."""
    from orchestrator.store.models import TelemetrySample

    store = open_store(empty_any_url)
    store.create_sweep("s1", JOB, None)
    store.ingest("s1", "n1", [_with_telemetry(2, 0), _with_telemetry(3, 1),
                              {"schema": 1, "seq": 4, "type": "note", "ts": 1.0}])
    with store.engine.connect() as c:
        view = [tuple(r) for r in c.execute(select(TelemetrySample).order_by(
            TelemetrySample.c.seq, TelemetrySample.c.idx))]
    assert view == [("s1", "n1", seq, i, 1000.0 + seq + i / 2, 1 << 30, None, 5 << 27, "warn",
                     bool(i), 100, "ac", False) for seq in (2, 3) for i in range(2)]
    assert [c["name"] for c in inspect(create_engine(empty_any_url)).get_columns(
        "telemetry_samples")] == [c.name for c in TelemetrySample.c]
    downgrade(store.engine, empty_any_url, "0008")
    with store.engine.connect() as c:
        old = c.exec_driver_sql("SELECT sweep_id, node, seq, idx, ts, rss_bytes, "
                                "memory_pressure FROM telemetry_samples ORDER BY seq, idx").all()
    assert [tuple(r) for r in old] == [("s1", "n1", seq, i, 1000.0 + seq + i / 2, 5 << 27, "warn")
                                       for seq in (2, 3) for i in range(2)]
    upgrade(store.engine, empty_any_url)
    with store.engine.connect() as c:
        assert c.scalar(select(func.count()).select_from(TelemetrySample)) == 4
        assert c.scalar(select(Event.payload).where(Event.seq == 2))["telemetry"][1][
            "thermal_throttled"] is True


def test_unopenable_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match=r"cannot open store postgresql\+psycopg://nobody@"
                                         r"127.0.0.1:1/x"):
        open_store("postgresql+psycopg://nobody@127.0.0.1:1/x")


def test_upgrade_from_0001_keeps_stored_runs(empty_any_url):
    store = open_store(empty_any_url, migrate=False)
    upgrade(store.engine, empty_any_url, "0001")
    spine_columns = {c.name for c in Measurement.__table__.columns} - NEW_IN_0002
    spine_runs = sa_table("runs", *(sa_column(n) for n in spine_columns))
    spine_sweeps = sa_table("sweeps", sa_column("id"), sa_column("status"),
                            sa_column("created_at", DateTime(timezone=True)),
                            sa_column("job", JSON()))
    with store.engine.begin() as c:  # rows written by the spine's schema
        c.execute(spine_sweeps.insert().values(
            id="old", created_at=datetime.now(timezone.utc), status="ok", job=JOB))
        row = {k: v for k, v in measurement_row("old", "n1", _generation(2, 0)).items()
               if k in spine_columns}
        c.execute(spine_runs.insert().values(**row))
    upgrade(store.engine, empty_any_url)
    assert store.current_revision() == HEAD
    with store.engine.connect() as c:  # the per-generation rows now live in "measurements"
        r = c.execute(select(Measurement.workload, Measurement.acceptance_rate,
                             Measurement.unreliable)).one()
    assert tuple(r) == ("code", 0.6667, None)


def test_concurrent_first_opens_of_a_postgresql_store(empty_pg_url):
    """Two controllers starting against a fresh database both get a migrated store."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: open_store(empty_pg_url), range(4)))
    assert {s.current_revision() for s in stores} == {HEAD}


def test_a_store_at_head_opens_without_alembic_and_an_older_one_is_migrated(tmp_path):
    """The quick check reads the same head as alembic; a command on a store at head does
    not import alembic (a fifth of its start-up), one on an older store migrates it."""
    import subprocess
    import sys

    from orchestrator.store.db import script_head

    assert script_head() == HEAD
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_store(url)
    probe = ("import sys; from orchestrator.store import open_store; s = open_store(sys.argv[1]);"
             " print('alembic' in sys.modules, s.current_revision())")

    def opened() -> tuple[str, str]:
        r = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()[0], r.stderr

    assert opened() == ("False", "")
    downgrade(open_store(url, migrate=False).engine, url, "0011")
    imported, err = opened()
    assert imported == "True" and f"upgraded from revision 0011 to {HEAD}" in err
    assert open_store(url, migrate=False).current_revision() == HEAD
