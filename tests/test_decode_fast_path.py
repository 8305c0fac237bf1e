"""The decode boundary's fast path (store/fastcheck) passes exactly what the worded checks
(store/eventcheck) pass, and is the path a real journal's lines take."""

from __future__ import annotations

import copy
import json

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.protocol import GENERATION_METRICS
from orchestrator.store.eventcheck import (
    GENERATION_RULES,
    SAMPLE_RULES,
    event_problem,
)
from orchestrator.store.fastcheck import FAST_CHECKS
from orchestrator.store.jsondepth import openings
from orchestrator.store.typedcheck import GenerationShape
from orchestrator.sweep.decode import Decoder
from tests.hostile import journal
from tests.test_hostile_lines import damaged_journal

REAL = [x.decode() for x in journal()]


def _fast(text: str) -> bool:
    e = orjson.loads(text)
    return FAST_CHECKS[e["type"]](e, text)


def test_every_line_of_a_real_journal_takes_the_fast_path():
    kinds = {json.loads(x)["type"] for x in REAL}
    assert {"generation", "config_summary", "job_finished"} <= kinds
    assert [x for x in REAL if not _fast(x)] == []


def _generation() -> dict:
    return next(json.loads(x) for x in REAL if json.loads(x)["type"] == "generation")


# each a valid generation changed one way the worded checks refuse (known from the rules,
# not from the code under test)
REFUSED = {
    "a negative metric": lambda e: e.update(ttft_ms=-1.0),
    "a metric that is text": lambda e: e.update(decode_tok_s="fast"),
    "a count that is a float": lambda e: e.update(generated_tokens=3.5),
    "a bool for an integer": lambda e: e.update(run_index=True),
    "a workload longer than its column": lambda e: e.update(workload="w" * 200),
    "a knob_value longer than its column": lambda e: e.update(knob_value="9" * 300),
    "a telemetry sample with text for bytes": lambda e: e["telemetry"].append(
        {"ts": 1.0, "rss_bytes": "big"}),
    "an acceptance position 0": lambda e: e.update(acceptance_by_position=[
        {"position": 0, "drafted": 1, "accepted": 1}]),
    "reasons that are not strings": lambda e: e.update(unreliable_reasons=[1]),
    "a temperature that is text": lambda e: e["config"].update(temperature="hot"),
    "seq 0": lambda e: e.update(seq=0),
    "a time past 9999": lambda e: e.update(ts=1e12),
    "another major schema": lambda e: e.update(schema=2),
    "a required field missing": lambda e: e.pop("mode"),
    "a pair of unknown roles": lambda e: e.update(models={"target": "draft", "draft": None}),
}


@pytest.mark.parametrize("change", REFUSED.values(), ids=list(REFUSED))
def test_what_the_worded_checks_refuse_the_fast_path_never_passes(change):
    e = _generation()
    change(e)
    text = json.dumps(e)
    assert event_problem(copy.deepcopy(e), text) is not None
    assert FAST_CHECKS["generation"](e, text) is False


def test_a_nul_in_model_output_goes_the_worded_way_and_is_kept():
    """Model output may hold a NUL: not the fast path's to judge; the boundary keeps the
    event with the NUL replaced, as before."""
    e = _generation()
    e["output_text"] = "a\x00b"
    text = json.dumps(e)
    assert FAST_CHECKS["generation"](orjson.loads(text), text) is False
    kept = Decoder("n1").decode(text)
    assert isinstance(kept, dict) and kept["output_text"] == "a\ufffdb"


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(damaged_journal())
def test_on_any_damaged_journal_the_fast_path_passes_only_what_the_checks_pass(case):
    for line in case.lines:
        try:
            text = line.data.decode()
            e = orjson.loads(text)
        except (UnicodeDecodeError, orjson.JSONDecodeError):
            continue
        if type(e) is not dict or type(e.get("type")) is not str or e["type"] not in FAST_CHECKS:
            continue
        # a fresh parse, not deepcopy: a 1,000-deep line would overflow deepcopy's recursion
        slow = event_problem(orjson.loads(text), text)
        if FAST_CHECKS[e["type"]](e, text):
            assert slow is None, (slow, text[:300])
        elif slow is None:  # the one valid event it leaves to the checks: a NUL to replace
            assert "\\u0000" in text, text[:300]


# -- the generation's typed shape (store/typedcheck) says what the worded checks say ---------

_EDGES = [0, -1, 1, 2**31 - 2, 2**31 - 1, 2**31, -(2**31 - 1), -(2**31), 2**63 - 1, 2**63,
          -(2**63), 0.0, -0.0, -1.5, 1.5, 1e308, True, False, None, "", "x", "x" * 16,
          "x" * 17, "x" * 32, "x" * 33, "x" * 64, "x" * 65, "x" * 128, "x" * 129, [], {},
          ["a"], [1], {"a": 1}, [{"position": 1, "drafted": 1, "accepted": 1}],
          [{"position": 0, "drafted": 1, "accepted": 1}], [{"ts": 1.0}], [{"ts": "1"}],
          [{"ts": 1.0, "rss_bytes": -1}], [{"ts": 1.0, "memory_pressure": "x" * 17}],
          {"temperature": 0.5}, {"temperature": None}, {"target": "target", "draft": "draft"},
          {"target": "draft", "draft": None}]
_VALUES = st.one_of(st.sampled_from(_EDGES), st.integers(), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=140), st.booleans(), st.none())
_NAMES = {  # per object of the event: the names a check reads there, and one it does not
    "top": sorted({*(f.name for f in msgspec.structs.fields(GenerationShape)), "knob_value",
                   "method", "job_id"}),  # not "type": the type chose this check
    "config": ["temperature", "top_k"],
    "sample": [r[0] for r in SAMPLE_RULES] + ["other"],
    "position": ["position", "drafted", "accepted", "rate"],
}
_CHANGE = st.sampled_from(sorted(_NAMES)).flatmap(lambda where: st.tuples(
    st.just(where), st.sampled_from(_NAMES[where]), st.one_of(st.just("drop"), _VALUES)))


@settings(max_examples=600, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_CHANGE, min_size=1, max_size=3))
def test_the_typed_generation_check_passes_exactly_what_the_worded_checks_pass(changes):
    e = _generation()
    e["telemetry"] = [{"ts": 1.0, "rss_bytes": 1}]
    e["acceptance_by_position"] = [{"position": 1, "drafted": 2, "accepted": 1}]
    targets = {"top": e, "config": e["config"], "sample": e["telemetry"][0],
               "position": e["acceptance_by_position"][0]}
    for where, name, value in changes:
        target = targets[where]  # the object as it was: a replaced one changes nothing
        if value == "drop" and type(value) is str:
            target.pop(name, None)
        else:
            target[name] = value
    text = json.dumps(e)  # the line a node would send, parsed as the boundary does
    fast = FAST_CHECKS["generation"](orjson.loads(text), text)
    slow = event_problem(orjson.loads(text), text)
    if "\\u0000" not in text:  # a NUL in model output: kept, but the worded way
        assert fast == (slow is None), (slow, changes)


def test_the_typed_shape_is_derived_from_the_columns():
    """A column the store adds is checked without being named: every column rule and every
    metric is a field of the shape, with the column's length."""
    names = {f.name: f for f in msgspec.structs.fields(GenerationShape)}
    assert {r[0] for r in GENERATION_RULES} | set(GENERATION_METRICS) <= set(names)
    assert "max_length=128" in repr(names["workload"].type)  # measurements.workload
    assert names["output_text"].required and not names["knob"].required


@settings(max_examples=500, deadline=None, database=None)
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=200))
def test_openings_counts_every_opening_bracket_of_any_text(text):
    # surrogates too (a line read with surrogateescape), and every other character
    assert openings(text) == text.count("{") + text.count("[")


def test_openings_planted():
    assert openings('{"a":[1,{"b":"[é{"}],"c":"\udcff"}') == 5
    assert openings("") == 0
