"""The job as one typed contract (agent/job.py): a versioned document that reads back as the
same job, errors that name the field they are about, and a plan lock that places the
agent's refusal at the plan's own line by that field, not by reading the sentence."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.errors import JobFileError
from agent.job import Job, parse_job
from agent.protocol import JOB_SCHEMA, KNOBS, knob_problem

CANDIDATES = [None, 0, 1, 2, 3, 4, 8, 20, 32, 64, 0.0, 0.1, 0.5, 0.7, 0.95, 1.0, 1.2, 5000]


def _valid_values(name: str) -> list:
    return [v for v in CANDIDATES if knob_problem(name, v) is None]


def _doc(**over) -> dict:
    doc = {"schema": 1, "job_id": "j1",
           "models": {"target": {"path": "/m/t", "fingerprint": "sha256:t"},
                      "draft": {"path": "/m/d"}},
           "workloads": [{"name": "w1", "prompt": "def f(x):", "max_tokens": 8},
                         {"name": "w2", "prompt": "Dear", "max_tokens": 4,
                          "context_bucket": "medium"}]}
    return {**doc, **over}


@st.composite
def jobs(draw) -> dict:
    names = [n for n in KNOBS if _valid_values(n)]
    base = {n: draw(st.sampled_from(_valid_values(n)))
            for n in draw(st.lists(st.sampled_from(names), max_size=4, unique=True))}
    knobs = {n: draw(st.lists(st.sampled_from(_valid_values(n)), min_size=1, max_size=3))
             for n in draw(st.lists(st.sampled_from(names), max_size=3, unique=True))}
    extra = draw(st.fixed_dictionaries({}, optional={
        "repetitions": st.integers(1, 5), "seed": st.integers(0, 2**31),
        "warmup_tokens": st.integers(0, 64), "cv_threshold": st.floats(0.01, 1),
        "contention_threshold": st.floats(0.01, 1), "python": st.just("3.11"),
        "verify_weights": st.sampled_from(["always", "daily", "never"]),
        "memory_bandwidth_gbs": st.floats(1, 800), "pins": st.just({"mlx-lm": "0.32.2"}),
        "soak": st.fixed_dictionaries({"duration_s": st.integers(1, 600)})}))
    return _doc(base=base, knobs=knobs, **extra)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_a_job_written_as_json_reads_back_as_the_same_job(doc):
    try:
        job = Job.from_json(doc)
    except JobFileError:
        assume(False)  # a combination the engine refuses: not this property's subject
    wire = json.loads(json.dumps(job.to_json()))  # what a node is sent
    again = Job.from_json(wire)
    assert again == job
    assert again.to_json() == wire  # one document per job
    assert wire["schema"] == Job.SCHEMA == JOB_SCHEMA


def test_the_document_leaves_out_what_is_empty_and_keeps_what_was_set():
    wire = Job.from_json(_doc(soak={"duration_s": 30})).to_json()
    assert "engine" not in wire and "load" not in wire and "python" not in wire
    assert wire["soak"] == {"duration_s": 30}
    assert wire["models"] == {"target": {"path": "/m/t", "fingerprint": "sha256:t"},
                              "draft": {"path": "/m/d"}}
    assert [w["context_bucket"] for w in wire["workloads"]] == ["short", "medium"]


# each a valid job changed one way, and the field the error must name (known from the change)
FIELDS = [
    ({"knobs": {"top_p": [2]}}, "knobs.top_p"),
    ({"knobs": {"nope": [1]}}, "knobs.nope"),
    ({"base": {"temperature": -1}}, "base.temperature"),
    ({"baseline": {"kv_bits": 7}}, "baseline.kv_bits"),
    ({"soak": {"workload": "w9"}}, "soak.workload"),
    ({"soak": {"duration_s": 0}}, "soak.duration_s"),
    ({"repetitions": 0}, "repetitions"),
    ({"verify_weights": "hourly"}, "verify_weights"),
    ({"contention_threshold": 2}, "contention_threshold"),
    ({"engine": {"type": "http", "api": "grpc", "variants": []}}, "engine.api"),
    ({"engine": {"type": "vllm-x"}}, "engine.type"),
    ({"lineup": [["target", "target"]]}, "lineup"),
    ({"schema": 2}, "schema"),
    ({"mode": "race"}, "mode"),
]


@pytest.mark.parametrize("change, field", FIELDS, ids=[f for _, f in FIELDS])
def test_an_error_names_the_field_it_is_about(change, field):
    with pytest.raises(JobFileError) as e:
        parse_job(_doc(**change))
    assert e.value.field == field
    assert str(e.value) == f"<job>: {e.value.problem}"


def test_a_workloads_error_names_its_index():
    doc = _doc()
    doc["workloads"][1]["max_tokens"] = 0
    with pytest.raises(JobFileError) as e:
        parse_job(doc)
    assert e.value.field == "workloads[1].max_tokens"


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(KNOBS)), st.one_of(st.none(), st.booleans(), st.integers(),
                                                st.floats(allow_nan=False), st.text(max_size=4)))
def test_any_refused_knob_value_is_named_by_its_section_and_knob(name, value):
    assume(knob_problem(name, value) is not None)
    for section, doc in (("knobs", _doc(knobs={name: [value]})),
                         ("base", _doc(base={name: value}))):
        with pytest.raises(JobFileError) as e:
            parse_job(doc)
        assert e.value.field == f"{section}.{name}"


@pytest.mark.parametrize("extra, key", [
    ("  adaptive: {tolerance: 3}", "  adaptive: {tolerance: 3}"),
    ("soak:\n  duration_s: 5\n  variant: fast", "  variant: fast"),
])
def test_plan_lock_places_the_agents_refusal_at_the_plans_line(model_pair, tmp_path, extra,
                                                               key):
    """The agent's parser refuses (soak.variant without an http engine; adaptive's
    tolerance); the lock names the plan's line of that very key."""
    from orchestrator.errors import ConfigError
    from orchestrator.sweep.lock import write_lock
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, repetitions=4, extra=extra))
    with pytest.raises(ConfigError) as e:
        write_lock(load_plan(plan), lambda m: None)
    assert e.value.line == plan.read_text().splitlines().index(key) + 1


def test_the_plans_sweep_and_soak_sections_are_typed_by_the_job():
    """One definition: the plan's sweep and soak keys and types are the job's, so a key the
    agent would refuse cannot pass a plan (and the reverse)."""
    import typing

    from agent.job import SOAK_FIELDS, SOAK_KEYS
    from orchestrator.sweep.plan import SPEC

    hints = typing.get_type_hints(Job)
    assert SPEC["soak"] == SOAK_FIELDS and set(SOAK_FIELDS) == SOAK_KEYS
    assert SPEC["sweep"] == {k: hints[k] for k in SPEC["sweep"]}
