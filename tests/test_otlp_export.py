"""`specfleet export otlp` and `--otlp`: the store's measurements reach a real OTLP/HTTP
receiver (tests/otlp_receiver.py, on the published opentelemetry-proto messages) as the
GenAI semantic conventions name them, and every point received equals the store."""

from __future__ import annotations

import json
import math
import socket
from collections import defaultdict
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.cli import main
from orchestrator.export.otlp import ExportError, export, metrics_url
from orchestrator.export.points import Selection, acceptance_length, tpot_s
from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement, Run
from orchestrator.sweep.decode import Decoder
from tests.history import config_values, generation, ingest_lines, new_sweep, night
from tests.journals import lines as recorded_lines
from tests.otlp_receiver import Receiver

AT = datetime(2026, 11, 24, 2, 0, tzinfo=timezone.utc)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92]


def plant(store) -> str:
    """One sweep on two nodes with known answers.

    mac-a (mlx-lm in process, pair "gemma / gemma-draft"): two baseline requests of 31
    tokens, TTFT 50 ms, E2E 350 ms → TPOT 10 ms each; three speculative k=3 requests, TTFT
    40 ms, E2E 190 ms → TPOT 5 ms, 24 of 32 drafted accepted in 8 rounds (acceptance 0.75,
    vLLM acceptance length 4.0), the third unreliable ("swap grew"): set aside. Config
    medians 100 and 150 tok/s: speedup 1.5.
    mac-b (a vLLM runtime on its chat endpoint): one baseline request.
    """
    sid = new_sweep(store, AT)
    night(store, AT, node="mac-a", chip="Apple M2 Pro", pair="gemma / gemma-draft",
          workload="code", sweep_id=sid,
          configs={("baseline", 0): config_values(100.0, jitter=0),
                   ("speculative", 3): config_values(150.0, acceptance=0.75, jitter=0)})
    gens = [generation("baseline", 0, ttft_ms=50.0, e2e_ms=350.0, generated_tokens=31)
            for _ in range(2)]
    gens += [generation("speculative", 3, ttft_ms=40.0, e2e_ms=190.0, generated_tokens=31,
                        drafted_tokens=32, accepted_tokens=24, acceptance_rate=0.75,
                        verify_rounds=8, unreliable=i == 2,
                        unreliable_reasons=["swap grew"] if i == 2 else [])
             for i in range(3)]
    ingest_lines(store, sid, "mac-a", gens, AT.timestamp())
    night(store, AT, node="mac-b", chip="Apple M4", pair="qwen / qwen-draft",
          workload="code", sweep_id=sid, engine="vllm (chat)",
          identity={"env_id": "env-b", "os_build": "25B78"},
          configs={("baseline", 0): config_values(80.0, jitter=0)})
    ingest_lines(store, sid, "mac-b", [generation(
        "baseline", 0, ttft_ms=120.0, e2e_ms=1120.0, generated_tokens=11, engine="http",
        runtime="vllm (chat)")], AT.timestamp())
    return sid


def by_name(points, name):
    return [p for p in points if p.metric == name]


def test_planted_sweep_reaches_the_receiver_as_the_conventions_name_it(sqlite_url):
    store = open_store(sqlite_url)
    sid = plant(store)
    with Receiver() as r:
        result = export(store, Selection(sweep_ids=[sid]), r.url)
    assert r.paths == ["/v1/metrics"] and r.requests == 1
    assert result.endpoint == r.url + "/v1/metrics" and result.sweeps == [sid]

    tpot = by_name(r.points, "gen_ai.server.time_per_output_token")
    assert {p.unit for p in r.points if p.metric.startswith("gen_ai.")} == {"s"}
    assert all(p.kind == "histogram" for p in tpot)
    a_base = [p for p in tpot if p.resource["host.name"] == "mac-a"
              and p.attributes["specfleet.config"] == "baseline"]
    assert len(a_base) == 1 and a_base[0].count == 2
    assert a_base[0].sum == pytest.approx(0.02) and a_base[0].min == pytest.approx(0.01)
    assert a_base[0].bounds == TPOT_BUCKETS
    spec = sorted((p for p in tpot if p.attributes["specfleet.config"] == "speculative k=3"),
                  key=lambda p: p.count)
    assert [p.count for p in spec] == [1, 2]
    assert spec[0].attributes["specfleet.set_aside"] == "unreliable: swap grew"
    assert "specfleet.set_aside" not in spec[1].attributes
    assert spec[1].sum == pytest.approx(0.010)  # 2 × (0.19 − 0.04) / 30

    ttft = by_name(r.points, "gen_ai.server.time_to_first_token")
    assert {p.bounds == TTFT_BUCKETS for p in ttft} == {True}
    duration = by_name(r.points, "gen_ai.server.request.duration")
    assert {p.bounds == DURATION_BUCKETS for p in duration} == {True}
    b = [p for p in duration if p.resource["host.name"] == "mac-b"]
    assert len(b) == 1 and b[0].sum == pytest.approx(1.12)
    # the attributes: target's name, operation from the endpoint, what served it
    assert b[0].attributes["gen_ai.operation.name"] == "chat"
    assert b[0].attributes["gen_ai.provider.name"] == "vllm"
    assert b[0].attributes["gen_ai.request.model"] == "qwen"
    assert a_base[0].attributes["gen_ai.operation.name"] == "text_completion"
    assert a_base[0].attributes["gen_ai.provider.name"] == "mlx-lm"
    assert a_base[0].attributes["gen_ai.request.model"] == "gemma"
    # the resource: node, chip, OS build, environment
    assert a_base[0].resource["specfleet.node.chip"] == "Apple M2 Pro"
    assert a_base[0].resource["os.build_id"] == "24A335"
    assert a_base[0].resource["specfleet.environment.id"] == "env-a"
    assert b[0].resource["specfleet.environment.id"] == "env-b"
    assert b[0].resource["os.build_id"] == "25B78"

    length = by_name(r.points, "specfleet.speculative.acceptance_length")
    assert sum(p.count for p in length) == 3 and {p.min for p in length} == {4.0}
    acc = by_name(r.points, "specfleet.speculative.acceptance_rate")
    assert sum(p.sum for p in acc) == pytest.approx(2.25)
    (speedup,) = by_name(r.points, "specfleet.speculative.speedup")
    assert speedup.kind == "gauge" and speedup.value == pytest.approx(1.5)
    (width,) = by_name(r.points, "specfleet.speculative.num_draft_tokens")
    assert width.value == 3 and width.attributes["gen_ai.request.model"] == "gemma"
    # every request point received equals the store (see check_against_store)
    check_against_store(store, r.points, sid)
    assert result.data_points == len(r.points)
    # set aside: the unreliable request's values (TTFT, duration, TPOT, acceptance, length)
    assert result.set_aside == 5


def check_against_store(store, points, sid: str) -> None:
    """Each histogram point's count, sum, min and max equal the store's requests that
    carry its node, workload, config and reliability; and no stored request is missing."""
    want: dict[tuple, list[float]] = defaultdict(list)
    with Session(store.engine) as c:
        rows = c.execute(select(Measurement, Event.payload).join(
            Event, (Event.sweep_id == Measurement.sweep_id) & (Event.node == Measurement.node)
            & (Event.seq == Measurement.seq)).where(Measurement.sweep_id == sid)).all()
        # a config whose every trial was unreliable is set aside whole (default knobs here)
        aside = {(r.node, r.workload, r.mode, r.num_draft_tokens): r.unreliable
                 for r in c.execute(select(Run).where(Run.sweep_id == sid)).scalars()}
    for m, payload in rows:
        label = "baseline" if m.mode == "baseline" else f"speculative k={m.num_draft_tokens}"
        key = (m.node, m.workload, label, bool(m.unreliable) or aside.get(
            (m.node, m.workload, m.mode, m.num_draft_tokens), False))
        e2e = payload.get("e2e_ms") or payload["token_times_us"][-1] / 1e3
        want[("gen_ai.server.time_to_first_token", *key)].append(m.ttft_ms / 1e3)
        want[("gen_ai.server.request.duration", *key)].append(e2e / 1e3)
        if m.generated_tokens >= 2:
            want[("gen_ai.server.time_per_output_token", *key)].append(
                (e2e - m.ttft_ms) / 1e3 / (m.generated_tokens - 1))
    got = {}
    for p in points:
        if p.kind != "histogram" or not p.metric.startswith("gen_ai."):
            continue
        assert p.attributes["specfleet.sweep.id"] == sid
        key = (p.metric, p.resource["host.name"], p.attributes["specfleet.workload"],
               p.attributes["specfleet.config"], "specfleet.set_aside" in p.attributes)
        assert key not in got, f"two points for {key}"
        got[key] = p
    assert set(got) == set(want)
    for key, values in want.items():
        p = got[key]
        assert p.count == len(values), key
        assert p.sum == pytest.approx(sum(values)), key
        assert (p.min, p.max) == (pytest.approx(min(values)), pytest.approx(max(values)))
        assert sum(p.bucket_counts) == p.count


def test_a_real_recorded_journal_exports_every_generation(sqlite_url):
    """The agent's own journal (recorded from a real mlx-lm sweep, written before the agent
    reported e2e_ms): durations come from the last token's arrival time."""
    store = open_store(sqlite_url)
    sid = new_sweep(store, AT)
    decoder = Decoder("local")
    events, raw = [], []
    for line in recorded_lines():
        e = decoder.decode(line)
        events.append(e)
        raw.append(line)
    store.ingest(sid, "local", events, raw)
    gens = [json.loads(x) for x in raw if json.loads(x)["type"] == "generation"]
    with Receiver() as r:
        result = export(store, Selection(sweep_ids=[sid]), r.url)
    ttft = by_name(r.points, "gen_ai.server.time_to_first_token")
    assert sum(p.count for p in ttft) == len(gens) == 16
    assert sum(p.sum for p in ttft) == pytest.approx(sum(g["ttft_ms"] for g in gens) / 1e3)
    dur = by_name(r.points, "gen_ai.server.request.duration")
    assert sum(p.sum for p in dur) == pytest.approx(
        sum(g["token_times_us"][-1] for g in gens) / 1e6)
    check_against_store(store, r.points, sid)
    assert result.values >= 3 * len(gens) and result.data_points == len(r.points)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_unreachable_or_refusing_endpoint_is_a_clear_error_and_loses_nothing(sqlite_url):
    store = open_store(sqlite_url)
    sid = plant(store)

    def stored():
        with store.engine.connect() as c:
            return (c.execute(select(func.count()).select_from(Measurement)).scalar(),
                    c.execute(select(func.count()).select_from(Event)).scalar())

    before = stored()
    port = _closed_port()
    with pytest.raises(ExportError, match=rf"OTLP export to http://127.0.0.1:{port}/v1/"
                       r"metrics failed: \[Errno 111\] Connection refused\. Nothing in the "
                       "store changed"):
        export(store, Selection(sweep_ids=[sid]), f"http://127.0.0.1:{port}", timeout_s=1.0)
    with Receiver() as r:
        r.status = 400  # not retryable: refused at once
        with pytest.raises(ExportError, match="failed: HTTP 400 Bad Request"):
            export(store, Selection(sweep_ids=[sid]), r.url, timeout_s=1.0)
        assert r.points == []
    assert stored() == before
    with Receiver() as r:  # and the same store exports whole once the endpoint is back
        export(store, Selection(sweep_ids=[sid]), r.url)
        check_against_store(store, r.points, sid)


def test_cli_export_otlp(sqlite_url):
    from tests.test_docs import help_examples

    store = open_store(sqlite_url)
    sid = plant(store)
    (example,) = [x for n, x in help_examples() if n == "export otlp"]
    with Receiver() as r:
        # the --help example as written, with this receiver for the collector, and the
        # planted sweep's week for "last"
        args = example.split()[1:]
        args = [a.replace("http://collector:4318", r.url) for a in args]
        args[args.index("last")] = "2026-W48"
        out = CliRunner().invoke(main, [*args, "--db", sqlite_url])
        assert out.exit_code == 0, out.output
        assert f"from 1 sweep(s) to {r.url}/v1/metrics" in out.output
        assert "exported 26 values (5 set aside, marked) as 18 data points" in out.output
        assert r.requests == 1 and r.points
        out = CliRunner().invoke(main, ["export", "otlp", "--endpoint", r.url, "--sweep", sid,
                                        "--db", sqlite_url])
        assert out.exit_code == 0 and r.requests == 2
    bad = CliRunner().invoke(main, ["export", "otlp", "--endpoint", "collector:4318",
                                    "--sweep", sid, "--db", sqlite_url])
    assert bad.exit_code == 1 and "is not an http(s) URL, like http://collector:4318" in \
        bad.output
    bad = CliRunner().invoke(main, ["export", "otlp", "--endpoint", "http://x:4318",
                                    "--sweep", "nosuch", "--db", sqlite_url])
    assert bad.exit_code == 1 and "no sweep nosuch in the store" in bad.output
    bad = CliRunner().invoke(main, ["export", "otlp", "--endpoint", "http://x:4318",
                                    "--db", sqlite_url])
    assert bad.exit_code == 2 and "say what to export" in bad.output
    bad = CliRunner().invoke(main, ["export", "otlp", "--endpoint", "http://x:4318",
                                    "--since", "yesterday", "--db", sqlite_url])
    assert bad.exit_code == 2 and "'yesterday' is not a date" in bad.output


def test_export_after_sweep_warns_and_changes_nothing(sqlite_url, capsys):
    """`--otlp URL` on sweep/nightly: an unreachable endpoint is a warning with the command
    that sends the sweep later; a reachable one gets the sweep."""
    from orchestrator.cli.exporting import export_after_sweep

    store = open_store(sqlite_url)
    sid = plant(store)
    port = _closed_port()
    export_after_sweep(sqlite_url, sid, f"http://127.0.0.1:{port}", timeout_s=1.0)
    err = capsys.readouterr().err
    assert f"warning: OTLP export to http://127.0.0.1:{port}/v1/metrics failed" in err
    assert f"specfleet export otlp --sweep {sid} --endpoint http://127.0.0.1:{port}" in err
    with Receiver() as r:
        export_after_sweep(sqlite_url, sid, r.url)
        check_against_store(store, r.points, sid)
    assert f"of sweep {sid} as {len(r.points)} data points" in capsys.readouterr().err


@pytest.mark.postgres
def test_export_from_postgresql(pg_url):
    store = open_store(pg_url)
    sid = plant(store)
    with Receiver() as r:
        export(store, Selection(since=AT.replace(hour=0), until=AT.replace(hour=3)), r.url)
    check_against_store(store, r.points, sid)


def test_sweep_and_nightly_take_otlp():
    for cmd in ("sweep", "nightly"):
        out = CliRunner().invoke(main, [cmd, "--help"], terminal_width=200).output
        assert "--otlp URL" in out


@given(ttft=st.floats(0, 100), extra=st.floats(0, 1000), tokens=st.integers(-3, 100_000))
def test_tpot_recovers_the_duration(ttft, extra, tokens):
    """For any request: TTFT + TPOT × (tokens − 1) is its duration; none below 2 tokens."""
    e2e = ttft + extra
    t = tpot_s(e2e, ttft, tokens)
    if tokens < 2:
        assert t is None
    else:
        assert t is not None and t >= 0
        assert math.isclose(ttft + t * (tokens - 1), e2e, rel_tol=1e-9, abs_tol=1e-9)


@given(accepted=st.integers(0, 10_000), rounds=st.integers(0, 10_000))
def test_acceptance_length_counts_the_bonus_token(accepted, rounds):
    got = acceptance_length(accepted, rounds)
    if rounds == 0:
        assert got is None
    else:
        assert got is not None and got >= 1.0 and got * rounds == pytest.approx(rounds + accepted)


@given(host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
       port=st.integers(1, 65535), path=st.sampled_from(["", "/", "/v1/metrics", "/otel/"]))
def test_metrics_url_is_idempotent(host, port, path):
    url = metrics_url(f"http://{host}:{port}{path}")
    assert url.endswith("/v1/metrics") and metrics_url(url) == url


def test_real_sweep_and_nightly_with_otlp(fleet, model_pair, tmp_path, sqlite_url):
    """A real sweep (sshd node, mlx-lm on the CPU) with --otlp: its every request arrives and
    equals the store; a nightly whose endpoint is down warns, and its result and exit status
    are those of the sweep."""
    from tests.locks import make_lock

    lock = make_lock(tmp_path, model_pair, widths=(2,), repetitions=1, max_tokens=24,
                     # about the export, not reliability: a busy host's runs stay `ok`
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    common = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", sqlite_url,
              "--no-provision", "--limit", "node1"]
    with Receiver() as r:
        out = CliRunner().invoke(main, ["sweep", str(lock), *common, "--otlp", r.url])
        assert out.exit_code == 0, out.output
    store = open_store(sqlite_url)
    sid = store.latest_sweep_id()
    assert f"of sweep {sid} as {len(r.points)} data points to {r.url}/v1/metrics" in out.output
    check_against_store(store, r.points, sid)
    assert {p.resource["host.name"] for p in r.points} == {"node1"}
    with Session(store.engine) as c:
        gens = c.execute(select(func.count()).select_from(Measurement)).scalar()
    assert sum(p.count for p in r.points
               if p.metric == "gen_ai.server.time_to_first_token") == gens > 0
    # the agent's own fields: E2E, and vLLM's acceptance length beside ours (+1: the bonus)
    with Session(store.engine) as c:
        spec = [p for p in c.execute(select(Event.payload).where(
            Event.sweep_id == sid, Event.type == "generation")).scalars()
            if p["mode"] == "speculative"]
        run_id = c.execute(select(Run.id).where(Run.sweep_id == sid,
                                                Run.mode == "speculative")).scalar()
    assert spec and all(p["e2e_ms"] >= p["ttft_ms"] > 0 for p in spec)
    assert all(p["mean_acceptance_length_vllm"] == pytest.approx(
        p["mean_accepted_len"] + 1, abs=2e-4) for p in spec)
    shown = CliRunner().invoke(main, ["runs", "show", str(run_id), "--db", sqlite_url])
    assert "mean_accepted_len" in shown.output and "mean_acceptance_length_vllm" in \
        shown.output

    port = _closed_port()
    out = CliRunner().invoke(main, ["nightly", str(lock), *common, "--otlp",
                                    f"http://127.0.0.1:{port}"])
    assert out.exit_code == 0, out.output
    assert f"warning: OTLP export to http://127.0.0.1:{port}/v1/metrics failed: " \
        "[Errno 111] Connection refused" in out.output
    assert ": ok (1/1 nodes ok)" in out.output
    night_id = store.latest_sweep_id()
    assert night_id != sid and store.sweep(night_id).status == "ok"


def test_review_json_otel_block_names_the_target_the_endpoint_and_per_request_tpot(tmp_path):
    """The review's JSON `otel` block: the target's name (not two paths), `chat` for a
    runtime's chat endpoint, and TPOT as the median of (E2E − TTFT)/(tokens − 1): 31 tokens,
    TTFT 50 ms, E2E 350 ms → 0.01 s (1/decode rate would give 1/150 s)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    at = datetime(2026, 5, 12, 2, tzinfo=timezone.utc)  # ISO week 2026-W20
    night(store, at, node="mac-01", chip="Apple M2 Max", pair="gemma / gemma-draft",
          workload="chatty", engine="vllm (chat)",
          configs={("baseline", 0): config_values(100.0, ttft=50.0, e2e=350.0, tokens=31,
                                                  jitter=0),
                   ("speculative", 3): config_values(150.0, ttft=50.0, e2e=250.0, tokens=31,
                                                     acceptance=0.8, jitter=0)})
    out = CliRunner().invoke(main, ["review", "--week", "2026-W20", "--db", url, "--out",
                                    str(tmp_path / "out"), "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads((tmp_path / "out" / "review-2026-W20.json").read_text())
    (series,) = data["series"]
    base, spec = series["configs"]
    for c in (base, spec):
        assert c["otel"]["gen_ai.request.model"] == "gemma"
        assert c["otel"]["gen_ai.operation.name"] == "chat"
        assert c["otel"]["gen_ai.provider.name"] == "vllm"
    assert base["otel"]["medians"]["gen_ai.server.time_per_output_token"] == pytest.approx(0.01)
    assert spec["otel"]["medians"]["gen_ai.server.time_per_output_token"] == pytest.approx(
        0.2 / 30)
    assert spec["otel"]["medians"]["specfleet.speculative.speedup"] == pytest.approx(1.5)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(1.0, 5000.0), st.floats(0.0, 60_000.0),
                          st.integers(1, 4096), st.booleans()), min_size=1, max_size=12))
def test_any_stored_requests_arrive_equal_to_the_store(tmp_path_factory, requests):
    """For any requests (TTFT, time after it, tokens, set aside or not): every point the
    receiver decodes equals the store, and each request is counted once."""
    store = open_store(f"sqlite:///{tmp_path_factory.mktemp('h') / 's.db'}")
    sid = new_sweep(store, AT)
    night(store, AT, node="mac-a", chip="Apple M2", pair="gemma / gemma-draft",
          workload="code", sweep_id=sid, configs={("baseline", 0): config_values(
              100.0, jitter=0)})
    ingest_lines(store, sid, "mac-a", [
        generation("baseline", 0, ttft_ms=ttft, e2e_ms=ttft + extra, generated_tokens=n,
                   unreliable=aside, unreliable_reasons=["contended"] if aside else [])
        for ttft, extra, n, aside in requests], AT.timestamp())
    with Receiver() as r:
        export(store, Selection(sweep_ids=[sid]), r.url)
    check_against_store(store, r.points, sid)
    assert sum(p.count for p in r.points if p.metric == "gen_ai.server.request.duration") \
        == len(requests)
