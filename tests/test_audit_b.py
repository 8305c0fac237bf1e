"""Adversarial audit (audit-b) of issues 27 and 34: planted inputs whose answers are known
without the code, each a case the team's own tests did not plant."""

from __future__ import annotations

from agent.calibrate import predicted_speedup
from orchestrator.instrument import judge

# predicted by hand: k=4: 5 tokens / (4·2 + 30) ms = 131.58 tok/s = 2.6316× a 20 ms step
COSTS = {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {3: 26.0, 5: 30.0}}
LOOP = {"ratio": 0.99, "bare_tok_s": 100.0, "agent_tok_s": 99.0}


def _gens(spec_speedup: float, ids=(1, 2, 3, 4), prompts=("p",)) -> list[dict]:
    out = []
    for p in prompts:
        tok = None if ids is None else [*ids, ord(p[0])]
        out += [{"mode": "baseline", "workload": "code", "context_bucket": "short",
                 "prompt_sha256": p, "num_draft_tokens": 0, "decode_tok_s": 50.0,
                 "token_ids": tok, "unreliable": False}]
        out += [{"mode": "speculative", "workload": "code", "context_bucket": "short",
                 "prompt_sha256": p, "num_draft_tokens": 4, "decode_tok_s": 50.0 * spec_speedup,
                 "drafted_tokens": 10, "accepted_tokens": 10, "token_ids": tok,
                 "unreliable": False}]
    return out


def _rounds(ratio: float = 1.02) -> dict:
    p = predicted_speedup(COSTS, 4)
    return {4: {"rounds": 5, "predicted": p, "measured": p * ratio, "ratio": ratio,
                "spread": [ratio - 0.02, ratio + 0.02]}}


def test_instrument_is_not_ok_when_the_sweep_measured_far_from_the_prediction():
    """The sweep stored width 4 at 1.00× the baseline against 2.63× predicted (−62%): the
    product's own measurement contradicts the node's rounds; "instrument ok" would hide it."""
    c = judge("mac-a", _gens(1.0), COSTS, LOOP, _rounds())
    assert c.status != "ok", c.line
    assert "the sweep measured width 4 at 1.00× vs predicted 2.63× (-62%)" in c.line, c.line
    # a sweep that agrees with the rounds (2.63× · 1.05) stays ok
    c = judge("mac-a", _gens(predicted_speedup(COSTS, 4) * 1.05), COSTS, LOOP, _rounds())
    assert c.status == "ok", c.line


def test_identical_output_is_unverified_when_no_token_ids_were_recorded():
    """Neither side recorded token ids (an old agent, a runtime with no tokenizer): nothing
    was compared, so "output identical" is a reading that was not taken."""
    c = judge("mac-a", _gens(predicted_speedup(COSTS, 4), ids=None), COSTS, LOOP, _rounds())
    assert c.status == "unverified", c.line
    assert c.identical is None and "output identical" not in c.line, c.line
    assert "output identity unverified: no token ids recorded" in c.line


def test_each_prompt_is_compared_with_its_own_baseline():
    """Two prompts in one workload, speculation reproducing each exactly: the check must
    compare each with its own baseline, not every one with the last baseline stored."""
    c = judge("mac-a", _gens(predicted_speedup(COSTS, 4), prompts=("a", "b")), COSTS, LOOP,
              _rounds())
    assert c.status == "ok" and c.identical is True, c.line
