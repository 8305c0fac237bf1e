"""kv_bits declared = applied: mlx-lm 0.32.2 quantises the KV cache only once it holds
``quantized_kv_start`` positions. The agent reports per generation whether it did; a run
where it did not is set aside (shown, never pooled as quantised); a plan whose start no
generation can reach is refused at `plan lock` with its line. Real mlx-lm on the demo pair."""

import pytest

from agent.protocol import SAMPLING_DEFAULTS

PROMPT = "def fibonacci(n):\n    return n\n" * 4


@pytest.fixture(scope="module")
def pair(model_pair):
    from mlx_lm import load

    target, tok = load(str(model_pair / "target"))
    draft, _ = load(str(model_pair / "draft"))
    return target, draft, tok


def _fields(pair, cfg: dict, max_tokens: int, speculative: bool = False) -> dict:
    from agent.generation import generate_trace

    target, draft, tok = pair
    t = generate_trace(target, tok, tok.encode(PROMPT), {**SAMPLING_DEFAULTS,
                                                         "num_draft_tokens": 3, **cfg},
                       max_tokens, draft_model=draft if speculative else None)
    return {**t.fields, "generated": len(t.token_ids or [])}


def test_the_agent_reports_whether_the_cache_was_quantised(pair):
    """For any start around the end of a generation: autoregressive mlx-lm runs the prompt
    and one forward call per token, so the cache holds prompt + max_tokens positions and is
    quantised exactly when the start is at most that (the planted answer, from mlx-lm's
    maybe_quantize_kv_cache); a quantised cache is smaller than the unquantised one."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    n, m = len(pair[2].encode(PROMPT)), 6
    plain = _fields(pair, {}, m)
    assert plain["kv_quantised"] is None and plain["kv_positions"] == n + m

    @settings(max_examples=8, deadline=None)
    @given(st.integers(min_value=0, max_value=n + m + 8))
    def check(start):
        f = _fields(pair, {"kv_bits": 4, "quantized_kv_start": start}, m)
        assert f["generated"] == m and f["kv_positions"] == n + m
        assert f["kv_quantised"] is (start <= n + m)
        assert (f["kv_cache_bytes"] < plain["kv_cache_bytes"]) is (start <= n + m)

    check()
    # speculation: a verify step holds the drafted positions before rejected ones are
    # rewound, so only the two ends are planted: reached at the end, never reached at all
    for start, quantised in ((n + m - 1, True), (n + m + 3 + 2, False)):
        f = _fields(pair, {"kv_bits": 8, "quantized_kv_start": start}, m, speculative=True)
        assert f["kv_quantised"] is quantised


def test_the_lock_bound_holds_for_any_text(pair):
    """A token covers at least one byte: for any text, the demo tokenizer's count is within
    the bound the lock computes from bytes (it must never refuse a start that applies)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from orchestrator.sweep.kvstart import positions_bound

    tok = pair[2]

    @settings(max_examples=150, deadline=None)
    @given(st.text(max_size=200), st.integers(1, 64), st.integers(1, 8))
    def check(text, max_tokens, width):
        reached = len(tok.encode(text)) + max_tokens + width + 1
        assert reached <= positions_bound([(text, max_tokens)], [width])

    check()
    assert positions_bound([("abc", 10), ("é", 30)], [2, 5]) == 2 + 16 + 30 + 5 + 1


@pytest.mark.parametrize("sweep, where", [
    ("  knobs: {num_draft_tokens: [3]}\n  base: {kv_bits: 4}", "  base: {kv_bits: 4}"),
    ("  knobs: {quantized_kv_start: [0, 100000]}\n  base: {kv_bits: 4}",
     "  knobs: {quantized_kv_start: [0, 100000]}"),
    ("  knobs: {kv_bits: [4]}\n  base: {quantized_kv_start: 0}\n"
     "  baseline: {quantized_kv_start: 9000}", "  baseline: {quantized_kv_start: 9000}"),
])
def test_a_start_no_generation_reaches_is_refused_at_its_line(model_pair, tmp_path, sweep,
                                                              where):
    from orchestrator.errors import ConfigError
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    text = plan_text(model_pair, widths=(3,)).replace("  knobs: {num_draft_tokens: [3]}",
                                                      sweep)
    plan.write_text(text)
    with pytest.raises(ConfigError, match=r"kv_bits 4 would never apply") as e:
        load_plan(plan)
    assert (e.value.path, e.value.line) == (str(plan), text.splitlines().index(where) + 1)


def test_a_run_where_kv_bits_did_not_apply_is_set_aside_and_said(pair, model_pair, tmp_path):
    """A start the lock cannot rule out (the prompts' bytes allow it) that the prompts'
    tokens never reach: every kv_bits 4 generation is stored with kv_quantised false, its
    rows on the sweep page are set aside with the reason, and the weekly review never
    pools it as a 4-bit result."""
    import json

    from sqlalchemy import select

    from orchestrator.review.rules import load_rules
    from orchestrator.review.sweep_page import review_data
    from orchestrator.review.weekly import analyse
    from orchestrator.store.models import Event
    from orchestrator.sweep.jobspec import load_workloads
    from orchestrator.sweep.kvstart import positions_bound
    from tests.locks import plan_text
    from tests.test_review import sweep_locally

    tok, m = pair[2], 6
    prompts = [w["prompt"] for w in load_workloads("code", ("short",))]
    start = max(len(tok.encode(p)) for p in prompts) + m + 3 + 2
    assert start <= positions_bound([(p, m) for p in prompts], [3])  # the lock allows it
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=(3,), max_tokens=m,
                              extra="  contention_threshold: 1.0").replace(
        "knobs: {num_draft_tokens: [3]}",
        f"knobs: {{num_draft_tokens: [3], kv_bits: [4]}}\n  base: {{quantized_kv_start: "
        f"{start}}}"))
    store, result = sweep_locally(plan, tmp_path)
    with store.engine.connect() as c:
        gens = [json.loads(p) if isinstance(p, str) else p for p in c.execute(
            select(Event.payload).where(Event.sweep_id == result.sweep_id,
                                        Event.type == "generation")).scalars()]
    assert {g["config"].get("kv_bits") for g in gens} == {None, 4}
    for g in gens:
        four = g["config"].get("kv_bits") == 4
        assert g["kv_quantised"] is (False if four else None)
        assert g["unreliable"] is four
    (section,) = review_data(store, result.sweep_id)["sections"]
    rows = {r.label: r for r in section["rows"]}
    for label in ("baseline, kv_bits=4", "speculative, kv_bits=4 (draft width 3)"):
        assert rows[label].set_aside and "kv_bits 4 not applied" in rows[label].set_aside
        assert rows[label].speedup is None
    assert rows["speculative, draft width 3"].set_aside is None
    weekly = analyse(store, None, load_rules())
    (series,) = weekly["series"]
    four = [c for c in series["configs"] if c["knobs"].get("kv_bits") == 4]
    assert len(four) == 2 and all(c["set_aside"] and c["speedup"] is None for c in four)
    assert any("kv_bits 4 not applied" in r for x in series["set_aside"] for r in x["reasons"])
