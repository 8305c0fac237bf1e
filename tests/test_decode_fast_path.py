"""The decode boundary's fast path (store/fastcheck) passes exactly what the worded checks
(store/eventcheck) pass, and is the path a real journal's lines take."""

from __future__ import annotations

import copy
import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from orchestrator.store.eventcheck import event_problem
from orchestrator.store.fastcheck import FAST_CHECKS
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
