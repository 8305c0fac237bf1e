"""Gate evidence states the comparison the gate made: for any missed gate, the number
shown and the limit shown compare the way the text says (never "1.16 < 1.16")."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.review.config_stats import at_least, at_most
from orchestrator.review.verdict import gate_text
from orchestrator.review.weekly import DEFAULT_GATES

LIMITS = st.floats(0.01, 1e10, allow_nan=False, allow_infinity=False)
NUM = r"([0-9.]+)"


@given(limit=st.floats(1.01, 3.0), below=st.floats(1e-7, 0.2))
def test_a_missed_speedup_reads_below_its_floor(limit, below):
    value = limit * (1 - below)
    if at_least(value, limit):  # within the gate's tolerance: it passed, nothing to state
        return
    text = gate_text("speedup", value, {**DEFAULT_GATES, "min_speedup": limit})
    shown, lim = map(float, re.fullmatch(rf"speedup {NUM} < {NUM}", text).groups())
    assert shown < lim


@given(limit=st.floats(0.01, 0.5), above=st.floats(1e-7, 0.5))
def test_a_missed_ttft_guard_reads_above_its_limit(limit, above):
    value = limit * (1 + above)
    if at_most(value, limit):
        return
    text = gate_text("ttft_change", value, {**DEFAULT_GATES, "ttft_regression_limit": limit})
    shown, lim = map(float, re.fullmatch(rf"TTFT \+{NUM}% > \+{NUM}%", text).groups())
    assert shown > lim


@given(limit=st.floats(1e6, 1e10), above=st.floats(1e-7, 1.0))
def test_a_missed_swap_ceiling_reads_above_it(limit, above):
    value = limit * (1 + above)
    if at_most(value, limit):
        return
    text = gate_text("swap_peak_bytes", value, {**DEFAULT_GATES, "swap_ceiling_bytes": limit})
    shown, lim = map(float, re.fullmatch(rf"peak swap {NUM} MB > {NUM} MB", text).groups())
    assert shown > lim


def test_the_edges_the_issue_found():
    g = DEFAULT_GATES
    assert gate_text("speedup", 1.1599, g) == "speedup 1.1599 < 1.16"
    assert gate_text("ttft_change", 54.01 / 50 - 1, g) == "TTFT +8.02% > +8%"
    assert gate_text("swap_peak_bytes", 210e6, {**g, "swap_ceiling_bytes": 200e6}) == \
        "peak swap 210.0 MB > 200 MB"
