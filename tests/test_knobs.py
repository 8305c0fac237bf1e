"""Every knob changes what it should, on the real demo pair: a knob the agent ignored (or
mlx-lm dropped) fails here."""

import pytest

from agent.protocol import KNOBS, SAMPLING_DEFAULTS

# knob → (the settings that let it act, a value away from its default, what it changes)
EFFECT = {
    "num_draft_tokens": ({}, 1, "drafting"),
    "temperature": ({}, 1.5, "tokens"),
    "top_k": ({"temperature": 1.5}, 1, "tokens"),
    "top_p": ({"temperature": 1.5}, 0.05, "tokens"),
    "min_p": ({"temperature": 1.5}, 0.5, "tokens"),
    "xtc_probability": ({"temperature": 1.0}, 1.0, "tokens"),
    "xtc_threshold": ({"temperature": 1.0, "xtc_probability": 1.0}, 0.5, "tokens"),
    "min_tokens_to_keep": ({"temperature": 1.5, "min_p": 0.9}, 50, "tokens"),
    "repetition_penalty": ({}, 2.0, "tokens"),
    "repetition_context_size": ({"repetition_penalty": 2.0}, 1, "tokens"),
    "presence_penalty": ({}, 5.0, "tokens"),
    "presence_context_size": ({"presence_penalty": 5.0}, 1, "tokens"),
    "frequency_penalty": ({}, 5.0, "tokens"),
    "frequency_context_size": ({"frequency_penalty": 5.0}, 1, "tokens"),
    "kv_bits": ({"quantized_kv_start": 0}, 4, "kv"),
    "kv_group_size": ({"kv_bits": 4, "quantized_kv_start": 0}, 32, "kv"),
    "quantized_kv_start": ({"kv_bits": 4}, 0, "kv"),
    "max_kv_size": ({}, 32, "kv"),
    "prefill_step_size": ({}, 16, "prefill"),
}


@pytest.fixture(scope="module")
def pair(model_pair):
    from mlx_lm import load

    target, tok = load(str(model_pair / "target"))
    draft, _ = load(str(model_pair / "draft"))
    return target, draft, tok, tok.encode("def fibonacci(n):\n    return n\n" * 8)


def _run(pair, cfg: dict, speculative: bool = False, max_tokens: int = 48):
    """One generation: its trace and how many forward calls took more than one position
    (the prefill's steps)."""
    from agent.generation import generate_trace

    target, draft, tok, ids = pair
    cls = type(target)
    calls: list[int] = []
    real = cls.__call__

    def counting(self, inputs, *a, **kw):
        if self is target:
            calls.append(int(inputs.shape[1]))
        return real(self, inputs, *a, **kw)

    cls.__call__ = counting  # counts the real model's calls; the model still computes
    try:
        t = generate_trace(target, tok, ids, {**SAMPLING_DEFAULTS, "num_draft_tokens": 3,
                                              **cfg}, max_tokens,
                           draft_model=draft if speculative else None, seed=7)
    finally:
        cls.__call__ = real
    return t, sum(1 for n in calls if n > 1)


def test_every_knob_has_a_planted_effect():
    assert set(EFFECT) == set(KNOBS)


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_each_knob_changes_what_it_governs(knob, pair):
    context, value, what = EFFECT[knob]
    speculative = what == "drafting"
    before, calls_before = _run(pair, context, speculative)
    after, calls_after = _run(pair, {**context, knob: value}, speculative)
    if what == "tokens":
        assert after.token_ids != before.token_ids
    elif what == "drafting":  # one drafted token per round instead of three
        assert sum(after.from_draft) != sum(before.from_draft)
        assert after.token_ids == before.token_ids  # greedy speculation stays exact
    elif what == "kv":
        # smaller groups carry more scales: a knob can grow the cache as well as shrink it
        assert after.fields["kv_cache_bytes"] != before.fields["kv_cache_bytes"]
    else:  # the prompt's positions go through the target in steps of that size
        n = len(pair[3])
        assert calls_before == 1 and calls_after == -(-(n - 1) // value)


def test_kv_bits_order_the_cache_memory_in_both_modes(pair):
    """4-bit < 8-bit < unquantised, autoregressive and speculative alike; the size is the
    demo target's 2 layers x (keys, values) x 4 heads x 64 dims, in 256-position steps."""
    for speculative in (False, True):
        sizes = [_run(pair, {"kv_bits": b, "quantized_kv_start": 0}, speculative)[0]
                 .fields["kv_cache_bytes"] for b in (4, 8, None)]
        assert sizes[0] < sizes[1] < sizes[2]
    plain = _run(pair, {})[0]
    positions = -(-(len(pair[3]) + 48) // 256) * 256
    assert plain.fields["kv_cache_bytes"] == 2 * 2 * 4 * positions * 64 * 4  # float32


def test_max_kv_size_bounds_the_cache_and_is_refused_when_drafting(pair):
    t, _ = _run(pair, {"max_kv_size": 32})
    assert t.fields["kv_cache_bytes"] == 2 * 2 * 4 * 32 * 64 * 4
    with pytest.raises(ValueError, match="autoregressive generation only"):
        _run(pair, {"max_kv_size": 32}, speculative=True)


def test_a_knob_at_its_default_keeps_the_config_key():
    from agent.protocol import baseline_key, normal_config

    cfg = {**SAMPLING_DEFAULTS, "num_draft_tokens": 3}
    assert normal_config({**cfg, "kv_bits": None, "prefill_step_size": None}) == cfg
    assert normal_config({**cfg, "kv_bits": 4}) == {**cfg, "kv_bits": 4}
    # the draft width is not shared with the baseline; every other knob is
    assert baseline_key({**cfg, "num_draft_tokens": 5}) == baseline_key(cfg)
    assert baseline_key({**cfg, "kv_bits": 4}) != baseline_key(cfg)
