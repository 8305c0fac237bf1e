"""The agent on the real model pair with real mlx-lm on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.protocol import EVENT_SCHEMA
from orchestrator.sweep.jobspec import build_job
from tests.blas import openblas

ROOT = Path(__file__).resolve().parents[1]


def run_agent(job_path: Path, journal: Path, *extra: str, timeout: float = 600, env=None):
    """The agent as the controller runs it, with its lock and cache beside the journal."""
    return subprocess.run([sys.executable, "-m", "agent", "run", str(job_path), "--journal",
                           str(journal), "--lock", str(journal.parent / "agent.lock"),
                           "--cache-dir", str(journal.parent / "cache"), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def sweep_events(model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("agent")
    job = build_job(model_pair, max_tokens=96)  # quality events: tests/test_measurements.py
    (d / "job.json").write_text(json.dumps(job))
    proc = run_agent(d / "job.json", d / "events.jsonl",
                     env={**os.environ, **openblas()})  # tests/blas.py
    assert proc.returncode == 0, proc.stderr
    journal = (d / "events.jsonl").read_text().splitlines()
    stdout = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return [json.loads(ln) for ln in journal], stdout, journal


def test_events_are_versioned_sequenced_and_echoed(sweep_events):
    events, stdout, journal = sweep_events
    assert stdout == journal
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e["schema"] == 1 for e in events)
    types = [e["type"] for e in events]
    assert types[:4] == ["job_started", "environment_checked", "models_loaded", "plan"]
    assert events[1]["quantization"] == {"target": "unquantised", "draft": "unquantised"}
    assert events[0]["event_schema"] == EVENT_SCHEMA
    assert types[-1] == "job_finished"
    assert {e["job_id"] for e in events} == {events[0]["job_id"]}
    plan = events[3]
    gens = [e for e in events if e["type"] == "generation"]
    assert len(gens) == plan["total_generations"] == 3 * 4 * 2  # workloads × widths × (A, B)


def test_baseline_interleaved_and_one_knob_at_a_time(sweep_events):
    gens = [e for e in sweep_events[0] if e["type"] == "generation"]
    assert [g["mode"] for g in gens[:4]] == ["baseline", "speculative"] * 2
    spec = [g for g in gens if g["mode"] == "speculative" and g["workload"] == "code"]
    assert [g["num_draft_tokens"] for g in spec] == [2, 3, 4, 6]
    assert {g["knob"] for g in gens} == {"num_draft_tokens"}


def test_each_generation_carries_the_measurements(sweep_events):
    for g in (e for e in sweep_events[0] if e["type"] == "generation"):
        assert g["ttft_ms"] > 0 and g["decode_tok_s"] > 0
        assert 0 <= g["itl_p50_ms"] <= g["itl_p95_ms"] <= g["itl_p99_ms"]
        assert g["peak_mlx_memory_bytes"] > 0 and g["rss_bytes"] > 0
        assert len(g["token_times_us"]) == len(g["token_ids"]) == g["generated_tokens"]
        assert g["token_times_us"] == sorted(g["token_times_us"])
        if g["mode"] == "speculative":
            # accounting rebuilt from from_draft is consistent with the raw flags
            assert g["accepted_tokens"] == g["from_draft"].count("1")
            assert g["accepted_tokens"] <= g["drafted_tokens"]
            assert sum(p["accepted"] for p in g["acceptance_by_position"]) == \
                g["accepted_tokens"]


def test_greedy_speculation_is_exact(sweep_events):
    gens = [e for e in sweep_events[0] if e["type"] == "generation"]
    spec = [g for g in gens if g["mode"] == "speculative"]
    assert all(g["exact_match"] is True and g["exactness"] == "identical" for g in spec)
    base = {}
    for g in gens:
        if g["mode"] == "baseline":
            base.setdefault(g["workload"], g["token_ids"])
    for g in spec:
        assert g["token_ids"] == base[g["workload"]]


def test_acceptance_is_non_trivial_and_depends_on_workload(sweep_events):
    gens = [e for e in sweep_events[0] if e["type"] == "generation"
            and e["mode"] == "speculative"]
    acc = {(g["workload"], g["num_draft_tokens"]): g["acceptance_rate"] for g in gens}
    for k in (2, 3, 4, 6):
        for w in ("code", "memo", "translation"):
            assert 0.05 < acc[w, k] < 0.95, (w, k)
        assert acc["code", k] > acc["memo", k] + 0.1
    # wider drafts accept a smaller share: later positions are harder
    assert acc["code", 2] > acc["code", 6]


def test_malformed_job_file_names_file_and_line(tmp_path):
    job = tmp_path / "job.json"
    job.write_text('{"schema": 1,\n "job_id": "x",\n "models": {,}\n}')
    proc = run_agent(job, tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert f"{job}:3:13: invalid JSON" in proc.stderr
    event = json.loads((tmp_path / "j.jsonl").read_text().splitlines()[-1])
    assert event["type"] == "job_failed" and event["error"] == "job_invalid"


def test_wrong_schema_is_refused(tmp_path, model_pair):
    job = build_job(model_pair)
    job["schema"] = 2
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "unsupported job schema 2; this agent speaks schema 1" in proc.stderr


def test_fingerprint_mismatch_refuses_before_measuring(tmp_path, model_pair):
    job = build_job(model_pair)
    job["models"]["draft"]["fingerprint"] = "sha256:" + "0" * 64
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 3
    events = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["job_started", "job_failed"]
    assert events[-1]["error"] == "environment_mismatch"
    assert "draft model at" in events[-1]["message"]
    assert "job expects sha256:000" in events[-1]["message"]


def test_model_directory_that_does_not_load(tmp_path, model_pair):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (broken / f).write_bytes((model_pair / "target" / f).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    job = build_job(model_pair)
    job["models"]["target"] = {"path": str(broken)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 4, proc.stderr
    assert f"agent: target model at {broken} does not load" in proc.stderr


def test_journal_continues_sequence_after_restart(tmp_path, model_pair):
    journal = tmp_path / "j.jsonl"
    journal.write_text('{"schema":1,"seq":41,"type":"job_started","ts":1}\n{"torn')
    job = tmp_path / "job.json"
    job.write_text("{}")
    run_agent(job, journal)
    last = json.loads(journal.read_text().splitlines()[-1])
    assert last["seq"] == 42 and last["type"] == "job_failed"
    lines = journal.read_text().splitlines()
    assert len(lines) == 2 and '"torn' not in journal.read_text()


def test_acceptance_split_by_context_bucket_and_position(sweep_events):
    events = sweep_events[0]
    rows = next(e for e in events if e["type"] == "acceptance_by_bucket")["rows"]
    gens = [e for e in events if e["type"] == "generation" and e["mode"] == "speculative"]
    for row in rows:
        mine = [g for g in gens if g["num_draft_tokens"] == row["num_draft_tokens"]
                and g["context_bucket"] == row["context_bucket"]]
        assert row["accepted_tokens"] == sum(g["accepted_tokens"] for g in mine)
        assert len(row["acceptance_by_position"]) == row["num_draft_tokens"]
        rates = [p["rate"] for p in row["acceptance_by_position"]]
        assert rates == sorted(rates, reverse=True)  # a later position needs all earlier ones
