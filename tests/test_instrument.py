"""The instrument check: a calibration pair's known answer judged per node (planted
generations and costs whose verdict is worked out by hand, and one real run on this
machine through the CLI)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.calibrate import expected_tokens, predicted_speedup, predicted_tok_s, speed_rounds
from orchestrator.cli import main
from orchestrator.instrument import TOLERANCE, judge

ROOT = Path(__file__).resolve().parents[1]
# predicted by hand: k=2: 3 tokens / (2·2 + 26) ms = 100 tok/s = 2.00× a 20 ms step;
# k=4: 5 / (4·2 + 30) ms = 131.58 tok/s = 2.6316×
COSTS = {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {3: 26.0, 5: 30.0}}
OK_LOOP = {"ratio": 0.99, "bare_tok_s": 100.0, "agent_tok_s": 99.0}


def _gens(speedups: dict[int, float], *, base=50.0, rejected=0, differ_at=None,
          unreliable=False) -> list[dict]:
    ids = [1, 2, 3, 4]
    out = [{"mode": "baseline", "workload": "code", "num_draft_tokens": 0,
            "decode_tok_s": base, "token_ids": ids, "unreliable": unreliable,
            "unreliable_reasons": ["contended: other processes used 60% of the CPU"]
            if unreliable else []} for _ in range(3)]
    for k, s in speedups.items():
        out.append({"mode": "speculative", "workload": "code", "num_draft_tokens": k,
                    "decode_tok_s": base * s, "drafted_tokens": 10,
                    "accepted_tokens": 10 - (rejected if k == max(speedups) else 0),
                    "token_ids": [9, 9] if k == differ_at else ids, "unreliable": False})
    return out


def test_a_node_whose_speedups_match_its_costs_is_ok():
    assert abs(predicted_speedup(COSTS, 2) - 2.0) < 1e-12
    assert abs(predicted_speedup(COSTS, 4) - 100 / 38) < 1e-12
    c = judge("mac-a", _gens({2: 2.0, 4: 100 / 38 * 1.05}), COSTS, OK_LOOP)
    assert c.status == "ok" and c.acceptance == 1.0 and c.identical
    assert c.line == ("mac-a: instrument ok (acceptance 1.0, output identical) — "
                      "measured/predicted k=2 2.00×/2.00× (+0%), k=4 2.76×/2.63× (+5%); "
                      "loop 0.99× bare")


def test_what_is_off_is_named_with_its_size():
    c = judge("mac-a", _gens({2: 2.0, 4: 100 / 38 * 1.15}), COSTS, OK_LOOP)
    assert c.status == "off" and "width 4 measured 3.03× vs predicted 2.63× (+15%)" in c.line
    c = judge("mac-a", _gens({2: 2.0, 4: 2.6}, rejected=1, differ_at=4), COSTS, OK_LOOP)
    assert c.status == "off"
    assert "acceptance 0.95 ≠ 1.0 (1 of 20 drafted tokens rejected)" in c.line
    assert "output differs from autoregressive in 1 of 2 generations (first at width 4)" \
        in c.line
    c = judge("mac-a", _gens({2: 2.0}), COSTS, {**OK_LOOP, "ratio": 0.9})
    assert c.status == "off" and "the agent's loop decodes at 0.90× a bare mlx-lm loop" in c.line


def test_a_reading_that_could_not_be_taken_is_unverified_never_ok():
    c = judge("mac-a", _gens({2: 2.0}, unreliable=True), COSTS, OK_LOOP)
    assert c.status == "unverified" and c.line.startswith(
        "mac-a: instrument unverified: speed unverified: 3 of 4 generations set aside "
        "(contended)")
    c = judge("mac-a", _gens({2: 2.0}), None, None)
    assert c.status == "unverified" and "step costs could not be measured" in c.line
    assert judge("mac-a", [], COSTS, OK_LOOP).status == "failed"


def test_a_nodes_reply_is_input_checked_at_one_boundary():
    from orchestrator.instrument import node_reading

    good = {"costs": {"target_ms": 20, "draft_ms": 2, "verify_ms": {"3": 26}},
            "overhead": {"ratio": 0.99}}
    value, problem = node_reading(good)
    assert problem is None and value["costs"]["verify_ms"] == {3: 26}
    for bad in ({}, {"costs": {**good["costs"], "draft_ms": -2}, "overhead": {"ratio": 1}},
                {"costs": {**good["costs"], "verify_ms": {"x": 1}}, "overhead": {"ratio": 1}},
                {"costs": good["costs"], "overhead": {"ratio": True}}, "not json"):
        value, problem = node_reading(bad)
        assert value is None and problem.startswith("unreadable reply from the node")
    speed = {"2": {"rounds": 3, "predicted": 2.0, "measured": 1.9, "ratio": 0.95,
                   "spread": [0.9, 1.0]}, "4": {"rounds": 0}}
    value, problem = node_reading({**good, "speed": speed})
    assert problem is None and value["speed"] == {2: speed["2"], 4: {"rounds": 0}}
    for bad_speed in ({"2": {**speed["2"], "spread": [1.0, 0.9]}},
                      {"2": {**speed["2"], "rounds": -1}}, {"2": {**speed["2"], "ratio": 0}},
                      {"x": speed["2"]}):
        value, problem = node_reading({**good, "speed": bad_speed})
        assert value is None and problem.startswith("unreadable reply from the node")


@settings(max_examples=300, deadline=None)
@given(draft=st.floats(0.1, 10), target=st.floats(1, 100), grow=st.floats(1.0, 3.0),
       k=st.sampled_from([2, 3, 4, 6]), factor=st.floats(0.5, 1.5))
def test_any_node_is_ok_exactly_when_every_width_is_within_the_tolerance(
        draft, target, grow, k, factor):
    costs = {"target_ms": target, "draft_ms": draft, "verify_ms": {k + 1: target * grow}}
    p = predicted_speedup(costs, k)
    assert abs(p - (k + 1) * target / (k * draft + target * grow)) < 1e-9 * p
    if abs(abs(factor - 1) - TOLERANCE) < 1e-6:
        return  # at the edge floating point decides
    c = judge("n", _gens({k: p * factor}), costs, OK_LOOP)
    assert (c.status == "ok") == (abs(factor - 1) <= TOLERANCE)


@given(alpha=st.floats(0, 1), k=st.integers(1, 8))
def test_expected_tokens_per_round_lies_between_one_and_k_plus_one(alpha, k):
    e = expected_tokens(alpha, k)
    assert 1.0 - 1e-9 <= e <= k + 1 + 1e-9
    assert expected_tokens(1.0, k) == k + 1 and expected_tokens(0.0, k) == 1.0
    # at acceptance 1 the tok/s model reduces to (k+1) / (k·draft + verify(k+1))
    costs = {"draft_ms": 1.0, "verify_ms": {k + 1: 10.0}}
    assert abs(predicted_tok_s(costs, k) - (k + 1) / (k + 10.0) * 1e3) < 1e-9


def test_alternating_rounds_give_medians_the_ratio_per_round_and_its_quartiles():
    """Planted rounds with known answers: round r predicts k=2 at (COSTS scaled) and
    measures AR and speculative back to back; every statistic is worked out by hand."""
    # per round the costs (hence the prediction) move with the machine: k=2 predicts
    # 2.0× in each (every step scales alike), and measured speedups 1.8, 2.0, 2.2, 2.4, 1.9
    scale = iter([1.0, 1.5, 0.8, 1.2, 1.0])
    measured = iter([50, 90, 40, 80, 60, 132, 30, 72, 50, 95])  # AR, k=2, AR, k=2, …

    def costs_of():
        f = next(scale)
        return {"target_ms": 20.0 * f, "draft_ms": 2.0 * f, "verify_ms": {3: 26.0 * f}}

    r = speed_rounds(costs_of, lambda k: next(measured), [2], 5)[2]
    assert r["rounds"] == 5 and abs(r["predicted"] - 2.0) < 1e-12
    assert abs(r["measured"] - 2.0) < 1e-12 and abs(r["ratio"] - 1.0) < 1e-12
    # ratios 0.9, 1.0, 1.1, 1.2, 0.95: inclusive quartiles 0.95 and 1.1
    assert [round(x, 12) for x in r["spread"]] == [0.95, 1.1]
    # a round that could not be timed is no sample; none at all is "0 rounds"
    assert speed_rounds(lambda: COSTS, lambda k: None, [2, 4], 3) == {2: {"rounds": 0},
                                                                      4: {"rounds": 0}}


def _speed(ratio: float, lo: float, hi: float, k: int = 4) -> dict:
    p = predicted_speedup(COSTS, k)
    # five rounds whose quartiles are lo and hi and whose range (the 94% interval of the
    # median: min and max of 5) is lo to hi too
    return {k: {"rounds": 5, "predicted": p, "measured": p * ratio, "ratio": ratio,
                "spread": [lo, hi], "ratios": [lo, lo, ratio, hi, hi]}}


def test_the_robust_reading_judges_the_median_ratio_and_shows_its_spread():
    # the sweep's own runs were contended: with the rounds' reading the speed is still
    # judged (each ratio pairs costs and speeds taken in the same round)
    gens = _gens({4: 1.0}, unreliable=True)
    c = judge("mac-a", gens, COSTS, OK_LOOP, _speed(1.05, 1.01, 1.08))
    assert c.status == "unverified" and c.line == (
        "mac-a: instrument unverified: 3 of 4 generations set aside (contended): run the "
        "check again when the node is quiet; loop overhead unverified (read beside the same "
        "load) (acceptance 1.0, output "
        "identical) — measured/predicted k=4 2.76×/2.63× (+5%, spread +1% to +8%)")
    # the sweep's stored runs agree with the rounds (a sweep that does not: test_audit_b)
    c = judge("mac-a", _gens({4: 100 / 38 * 1.05}), COSTS, OK_LOOP, _speed(1.05, 1.01, 1.08))
    assert c.status == "ok" and c.line.endswith("(+5%, spread +1% to +8%); loop 0.99× bare")
    c = judge("mac-a", _gens({4: 1.0}), COSTS, OK_LOOP, _speed(1.15, 1.12, 1.18))
    assert c.status == "off" and ("width 4 measured 3.03× vs predicted 2.63× (+15%, median "
                                  "of 5 rounds; 94% interval of the median +12% to +18% over "
                                  "5 rounds, wholly outside ±10%)") in c.line
    c = judge("mac-a", _gens({4: 1.0}), COSTS, OK_LOOP, _speed(1.0, 0.85, 1.06))
    assert c.status == "unverified" and (
        "speed unverified at width 4: too noisy to judge (measured/predicted +0%, 94% "
        "interval of the median -15% to +6% over 5 rounds, crosses ±10%; per-round spread "
        "0.85–1.06)") in c.line
    c = judge("mac-a", _gens({4: 1.0}), COSTS, OK_LOOP, {4: {"rounds": 0}})
    assert c.status == "unverified" and "no round could be timed" in c.line
    two = _speed(1.3, 1.29, 1.31)
    two[4]["rounds"], two[4]["ratios"] = 2, [1.29, 1.31]  # two rounds that agree by chance:
    c = judge("mac-a", _gens({4: 1.0}), COSTS, OK_LOOP, two)  # no interval, no verdict
    assert c.status == "unverified" and ("speed unverified at width 4: 2 round(s) timed, "
                                         "fewer than the 5 whose range covers the median "
                                         "with 90% confidence") in c.line


@settings(max_examples=300, deadline=None)
@given(ratio=st.floats(0.5, 1.5), lo=st.floats(0.0, 0.4), hi=st.floats(0.0, 0.4))
def test_any_robust_reading_is_ok_exactly_when_its_interval_is_within_tolerance(
        ratio, lo, hi):
    """Five rounds lo, lo, ratio, hi, hi: the median's 94% interval is their range; ok
    exactly when it lies within ±10%, off exactly when it lies wholly outside."""
    spread = [ratio - lo, ratio + hi]
    edge = min(abs(abs(x - 1) - TOLERANCE) for x in spread)
    if edge < 1e-6 or spread[0] <= 0:
        return  # at the edge floating point decides
    c = judge("n", _gens({4: 100 / 38 * ratio}), COSTS, OK_LOOP, _speed(ratio, *spread))
    inside = 1 - TOLERANCE <= spread[0] and spread[1] <= 1 + TOLERANCE
    outside = spread[1] < 1 - TOLERANCE or spread[0] > 1 + TOLERANCE
    assert (c.status == "ok") == inside
    assert c.status in ("ok", "off", "unverified")
    assert (c.status == "off") == outside


def test_calibrate_checks_this_machine_with_one_line(tmp_path, monkeypatch):
    """The whole check on the local node, through the CLI: acceptance exactly 1.0 and
    identical output (which no load can change), the node's own step costs measured, and
    an exit status that says what the line says."""
    monkeypatch.setenv("HOME", str(tmp_path))
    r = CliRunner().invoke(main, [
        "calibrate", "-i", str(ROOT / "orchestrator" / "inventory" / "local.yml"), "--workdir",
        str(tmp_path / "w"), "--layers", "4", "--repetitions", "1", "--max-tokens", "24",
        "--rounds", "5", "--db", f"sqlite:///{tmp_path / 's.db'}", "--json"])
    assert r.exit_code in (0, 1, 3), r.output
    (c,) = json.loads(r.stdout)
    assert c["status"] != "failed", (c["line"], r.output[-3000:])
    assert c["node"] == "local" and c["acceptance"] == 1.0 and c["identical"] is True
    assert sorted(c["costs"]["verify_ms"]) == ["3", "4", "5", "7"]
    # the speed verdict's reading: every width, from alternating rounds, with its spread
    assert [w["k"] for w in c["widths"]] == [2, 3, 4, 6]
    assert all(w["rounds"] == 5 and w["spread"][0] <= w["spread"][1] for w in c["widths"])
    assert {"ok": 0, "off": 1, "unverified": 3}[c["status"]] == r.exit_code
    word = "OFF" if c["status"] == "off" else c["status"]
    assert c["line"].startswith(f"local: instrument {word}")
    print(c["line"])
