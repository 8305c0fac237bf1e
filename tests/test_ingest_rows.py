"""Ingest's per-generation helpers, rewritten for speed (issue 31, bench/ingest.py), say
exactly what they said before: planted cases whose answer is known without the code, and
properties against the plain formulation for any input."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.store.eventcheck import MAX_TS
from orchestrator.store.job_configs import _said, config_problem
from orchestrator.store.rows import measured_at


def test_measured_at_on_planted_times():
    # 1e9 s after the epoch is 2001-09-09 01:46:40 UTC (a well-known date)
    assert measured_at(1e9) == "2001-09-09 01:46:40.000000+00:00"  # a whole second
    assert measured_at(1e9 + 0.25) == "2001-09-09 01:46:40.250000+00:00"
    assert measured_at(0) == "1970-01-01 00:00:00.000000+00:00"
    assert measured_at(1.9999999) == "1970-01-01 00:00:02.000000+00:00"  # rounds up a second


# a fraction a rounding away from the next microsecond or second (half to even, carried)
_EDGES = st.builds(lambda n, f: n + f, st.integers(0, int(MAX_TS) - 2),
                   st.sampled_from([0.9999995, 0.9999994999, 0.0000005, 0.0000015, 0.0000025,
                                    0.5, 0.999999, 0.9999999]))


@given(st.one_of(st.floats(0, MAX_TS, exclude_max=True), st.integers(0, int(MAX_TS) - 1),
                 _EDGES))
def test_measured_at_is_the_microsecond_isoformat(ts):
    assert measured_at(ts) == datetime.fromtimestamp(ts, timezone.utc).isoformat(
        sep=" ", timespec="microseconds")


def _plain(allowed: dict, e: dict) -> str | None:
    """config_problem as it was written before (every candidate listed, then judged)."""
    cfg = e.get("config")
    said = [(f"config {k}", k, v) for k, v in (cfg.items() if isinstance(cfg, dict) else ())
            if k in allowed]
    if "num_draft_tokens" in e:
        said.append(("num_draft_tokens", "num_draft_tokens", e["num_draft_tokens"]))
    if isinstance(knob := e.get("knob"), str) and knob in allowed and "knob_value" in e:
        said.append((f"knob_value of {knob}", knob, e["knob_value"]))
    for where, k, v in said:
        if v not in allowed[k]:
            return (f"not in the job: {where} {str(v)[:40]} is not a value the sweep's job "
                    f"gives {k} ({_said(allowed[k])})")
    return None


ALLOWED = {"num_draft_tokens": [2, 4, 0], "temperature": [0.0]}


def test_config_problem_on_planted_generations():
    ok = {"config": {"temperature": 0, "top_k": 9}, "num_draft_tokens": 4,
          "knob": "num_draft_tokens", "knob_value": 4}
    assert config_problem(ALLOWED, ok) is None  # top_k: no value the job fixes
    assert config_problem(ALLOWED, {**ok, "config": {"temperature": 0.7}}) == (
        "not in the job: config temperature 0.7 is not a value the sweep's job gives "
        "temperature (0.0)")
    assert config_problem(ALLOWED, {**ok, "knob_value": 3}) == (
        "not in the job: knob_value of num_draft_tokens 3 is not a value the sweep's job "
        "gives num_draft_tokens (2, 4, 0)")


VALUES = st.one_of(st.sampled_from([0, 2, 3, 4, 0.0, 0.5, True, None, "4"]),
                   st.integers(-3, 9))


@given(config=st.one_of(st.none(), st.dictionaries(
           st.sampled_from(["temperature", "num_draft_tokens", "top_k", "top_p"]), VALUES)),
       ndt=st.one_of(st.just("absent"), VALUES),
       knob=st.one_of(st.just("absent"), st.sampled_from(["num_draft_tokens", "top_k", 3])),
       kv=st.one_of(st.just("absent"), VALUES))
def test_config_problem_says_what_the_plain_form_says(config, ndt, knob, kv):
    e: dict = {"config": config}
    for k, v in (("num_draft_tokens", ndt), ("knob", knob), ("knob_value", kv)):
        if v != "absent":
            e[k] = v
    assert config_problem(ALLOWED, e) == _plain(ALLOWED, e)
