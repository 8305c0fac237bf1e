"""Each definition in docs/metrics.md on a planted stream with a known answer (issue 32):
ITL as the gap between chunks, TPOT = (E2E − TTFT)/(tokens − 1), E2E with and without the
client's queueing, vLLM's SLO names for goodput, and acceptance length both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.load import SLO_KEYS, Outcome, check_load, meets, summarize
from agent.stats import acceptance_summary
from agent.trace import Trace, metrics

ROOT = Path(__file__).resolve().parents[1]


def test_itl_of_one_chunk_per_100_ms_is_100_ms_whatever_tokens_it_carries():
    """The issue's example: one chunk every 100 ms, 4 tokens each. Per token the gaps
    inside a chunk would be 0 (p50 0.0 ms); per chunk, as vLLM defines ITL, 100 ms."""
    times = [0.2 + 0.1 * i for i in range(10)]  # TTFT 200 ms, E2E 1100 ms
    o = Outcome(0.0, 0.0, chunk_times=times, end=times[-1], tokens=40)
    m = summarize([o], times[-1], closed=True)
    assert m["itl_ms_p50"] == pytest.approx(100.0) and m["itl_ms_p99"] == pytest.approx(100.0)
    assert m["ttft_ms_p50"] == pytest.approx(200.0)
    assert m["tpot_ms_p50"] == pytest.approx(900.0 / 39, abs=1e-3)


def test_e2e_counts_client_queueing_and_e2el_does_not():
    """An open-loop request scheduled at 0 s that found no free slot until 0.5 s: first
    chunk 100 ms after it was sent, last 200 ms after. E2E (ours, from the scheduled time)
    700 ms; vLLM's E2EL (from the send) 200 ms; the wait 500 ms."""
    o = Outcome(0.0, 0.5, chunk_times=[0.1, 0.2], end=0.7, tokens=2)
    m = summarize([o], 0.7)
    assert m["e2e_ms_p50"] == pytest.approx(700.0)
    assert m["e2el_ms_p50"] == pytest.approx(200.0)
    assert m["queued_ms_p99"] == pytest.approx(500.0)


def test_vllm_slo_names_judge_goodput_as_vllm_does():
    """ttft/tpot/e2el in ms, per request, as `vllm bench serve --goodput`: the queued
    request above meets e2el 250 (200 ms from its send) but not e2e_ms 250 (700 ms)."""
    o = Outcome(0.0, 0.5, chunk_times=[0.1, 0.2, 0.3], end=0.8, tokens=3)
    assert meets(o, {"ttft": 100.5, "tpot": 100.5, "e2el": 300.5})
    assert not meets(o, {"tpot": 99.5})          # (300 − 100) / 2 = 100 ms
    assert not meets(o, {"e2el": 299.5})         # 300 ms from its send
    assert not meets(o, {"e2e_ms": 300.5})       # 800 ms from its scheduled time
    assert meets(o, {"ttft_ms": 100.5, "itl_p95_ms": 100.5, "e2e_ms": 800.5})  # old keys
    m = summarize([o, Outcome(0.0, 0.0, chunk_times=[0.4], end=0.4, tokens=1)], 1.0,
                  slo={"ttft": 150})
    assert m["good_requests"] == 1 and m["goodput_rps"] == pytest.approx(1.0)
    for keys in ({"ttft": 5, "tpot": 5, "e2el": 5}, {"ttft_ms": 5, "e2e_ms": 5}):
        assert check_load({"concurrency": [1], "slo": keys}, "http") is None
    assert set(SLO_KEYS) >= {"ttft", "tpot", "e2el", "ttft_ms", "itl_p95_ms", "e2e_ms"}


def test_acceptance_length_ours_and_vllms():
    """Draft width 3: rounds accept 3 (then the target's bonus token), 1 (then the target's
    token), 0 (the target's token): 4 accepted in 3 rounds. Ours: 4/3 accepted drafts per
    round; vLLM's (bonus token counted): 1 + 4/3 = 7 tokens / 3 rounds."""
    from_draft = [True, True, True, False, True, False, False]
    s = acceptance_summary(from_draft, 3, 64)
    assert s["verify_rounds"] == 3 and s["accepted_tokens"] == 4
    assert s["mean_accepted_len"] == pytest.approx(4 / 3, abs=1e-4)
    assert s["mean_acceptance_length_vllm"] == pytest.approx(7 / 3, abs=1e-4)


@given(st.integers(1, 8).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(st.integers(0, k), min_size=1, max_size=60))))
def test_vllms_acceptance_length_is_ours_plus_one(case):
    """Any stream of verify rounds (each: some accepted drafts, then the target's token):
    vLLM's length is ours + 1, and equals the tokens emitted per round."""
    k, accepted = case
    from_draft = [f for a in accepted for f in [True] * a + [False]]
    s = acceptance_summary(from_draft, k, 10_000)
    assert s["verify_rounds"] == len(accepted)
    assert s["mean_acceptance_length_vllm"] == pytest.approx(s["mean_accepted_len"] + 1,
                                                             abs=2e-4)
    assert s["mean_acceptance_length_vllm"] == pytest.approx(
        len(from_draft) / len(accepted), abs=2e-4)


def test_a_generation_reports_e2e_and_its_tpot_follows():
    """mlx-lm in process: tokens at 50, 60, …, 350 ms (31 tokens): TTFT 50 ms, E2E 350 ms,
    TPOT (350 − 50)/30 = 10 ms (what `export otlp` sends as time per output token)."""
    from orchestrator.export.points import tpot_s

    times = [0.05 + 0.01 * i for i in range(31)]
    m = metrics(Trace(arrivals=times, token_times=times, output_text="x"),
                speculative=False, num_draft_tokens=0, max_tokens=64, decode_skip=0)
    assert m["ttft_ms"] == pytest.approx(50.0) and m["e2e_ms"] == pytest.approx(350.0)
    assert tpot_s(m["e2e_ms"] / 1e3, m["ttft_ms"] / 1e3, m["generated_tokens"]) == \
        pytest.approx(0.010)


def test_the_definitions_page_names_every_metric_and_each_peer():
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "e2el_ms", "decode_tok_s",
                 "acceptance_rate", "mean_accepted_len", "mean_acceptance_length_vllm",
                 "goodput_rps", "gen_ai.server.time_per_output_token", "vLLM", "GuideLLM",
                 "AIPerf"):
        assert name in text, name
    assert "docs/metrics.md" in (ROOT / "README.md").read_text()
