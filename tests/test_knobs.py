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


def test_a_kv_bits_sweep_shows_memory_speed_and_exactness_per_setting(model_pair, tmp_path):
    """A plan sweeping kv_bits [4, 8] on the demo pair: each setting is its own row on the
    sweep page and its own config in the weekly review, KV memory 4 < 8 < unquantised,
    and each speculative run's exactness is judged against the baseline of its own KV
    settings (a quantised cache changes greedy output, so any other baseline would show)."""
    import json

    from sqlalchemy import select

    from agent.protocol import baseline_key
    from orchestrator.review.rules import load_rules
    from orchestrator.review.sweep_page import review_data
    from orchestrator.review.weekly import analyse
    from orchestrator.store.models import Event
    from tests.locks import plan_text
    from tests.test_review import sweep_locally

    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=(3,), max_tokens=48,
                              extra="  contention_threshold: 1.0").replace(
        "knobs: {num_draft_tokens: [3]}",
        "knobs: {num_draft_tokens: [3], kv_bits: [4, 8]}\n  base: {quantized_kv_start: 0}"))
    store, result = sweep_locally(plan, tmp_path)
    (section,) = review_data(store, result.sweep_id)["sections"]
    rows = {r.label: r for r in section["rows"]}
    assert list(rows) == ["baseline (autoregressive)", "baseline, kv_bits=4",
                          "baseline, kv_bits=8", "speculative, draft width 3",
                          "speculative, kv_bits=4 (draft width 3)",
                          "speculative, kv_bits=8 (draft width 3)"]
    for mode, head in (("baseline", "baseline, kv_bits={}"),
                       ("speculative", "speculative, kv_bits={} (draft width 3)")):
        plain = rows["baseline (autoregressive)" if mode == "baseline"
                     else "speculative, draft width 3"]
        four, eight = rows[head.format(4)], rows[head.format(8)]
        assert four.kv_cache_mb < eight.kv_cache_mb < plain.kv_cache_mb
        assert all(r.decode_tok_s and r.ttft_ms for r in (four, eight, plain))
    with store.engine.connect() as c:
        gens = [json.loads(p) if isinstance(p, str) else p for p in c.execute(
            select(Event.payload).where(Event.sweep_id == result.sweep_id,
                                        Event.type == "generation")).scalars()]
    bases = {(g["workload"], g["repetition"], baseline_key(g["config"])): g["token_ids"]
             for g in gens if g["mode"] == "baseline"}
    assert len(set(map(tuple, bases.values()))) > 1  # the KV settings change greedy output
    spec = [g for g in gens if g["mode"] == "speculative"]
    assert {g["config"].get("kv_bits") for g in spec} == {None, 4, 8}
    for g in spec:
        ref = bases[(g["workload"], g["repetition"], baseline_key(g["config"]))]
        assert g["exact_match"] is (g["token_ids"] == ref)
    for label in ("speculative, kv_bits=4 (draft width 3)",
                  "speculative, kv_bits=8 (draft width 3)"):
        exact = [g["exact_match"] for g in spec if g["knob"] == "kv_bits"
                 and f"kv_bits={g['knob_value']} " in label]
        assert rows[label].exactness == ("identical" if all(exact) else rows[label].exactness)
        assert rows[label].exactness.startswith("identical" if all(exact) else "diverged")
    weekly = analyse(store, None, load_rules())
    (series,) = weekly["series"]
    configs = {c["label"]: c for c in series["configs"]}
    start = " · quantized_kv_start 0"  # the plan's base, away from its default: shown too
    assert set(configs) == {f"{head}{bits}{start}" for head in ("baseline", "speculative k=3")
                            for bits in ("", " · kv_bits 4", " · kv_bits 8")}
    for head in ("baseline", "speculative k=3"):
        assert configs[f"{head} · kv_bits 4{start}"]["kv_cache"] < \
            configs[f"{head} · kv_bits 8{start}"]["kv_cache"] < configs[head + start]["kv_cache"]



def _value(knob):
    """Hypothesis values a knob accepts: its default, and the planted one."""
    from hypothesis import strategies as st

    return st.sampled_from([KNOBS[knob].default, EFFECT[knob][1]])


def test_config_identity_properties():
    """For any config of registry values: normalising is idempotent, leaves a keyed knob in
    and an unkeyed one at its default out; the baseline key ignores only the draft width,
    so two configs differing in any other knob never share a baseline."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from agent.protocol import baseline_key, normal_config

    configs = st.fixed_dictionaries({k: _value(k) for k in KNOBS})

    @settings(max_examples=200, deadline=None)
    @given(configs, configs)
    def check(a, b):
        na = normal_config(a)
        assert normal_config(na) == na
        assert all(k in na for k, kn in KNOBS.items() if kn.keyed)
        assert all(k not in na for k, kn in KNOBS.items()
                   if not kn.keyed and a[k] == kn.default)
        same = all(a[k] == b[k] for k in KNOBS if k != "num_draft_tokens")
        assert (baseline_key(a) == baseline_key(b)) is same

    check()


def test_an_unknown_metric_in_any_rule_is_refused(tmp_path):
    """Any name outside METRICS in a rule's condition stops the load, at the rule's line."""
    import keyword

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from orchestrator.errors import ConfigError
    from orchestrator.review.rules import METRICS, load_rules

    names = st.from_regex(r"[a-z][a-z_]{0,20}", fullmatch=True).filter(
        lambda n: n not in METRICS and not keyword.iskeyword(n)
        and not keyword.issoftkeyword(n))

    @settings(max_examples=50, deadline=None)
    @given(names)
    def check(name):
        f = tmp_path / "r.yml"
        f.write_text(f"- id: r\n  when: {name} > 1\n  action: x\n")
        with pytest.raises(ConfigError, match=rf"r.yml:2: rule r: when names unknown metric "
                                              rf"'{name}'"):
            load_rules(f)

    check()


def test_a_batched_load_ramp_refuses_a_quantised_kv_cache(tmp_path):
    """A ramp in process runs the base config through mlx-lm's BatchGenerator, which has no
    kv_bits: refused when the job is read, not silently run unquantised."""
    from agent.errors import JobFileError
    from agent.job import parse_job

    job = {"schema": 1, "job_id": "j", "models": {"target": {"path": "t"},
                                                  "draft": {"path": "d"}},
           "workloads": [{"name": "w", "prompt": "p", "max_tokens": 4}],
           "base": {"kv_bits": 4},
           "load": {"concurrency": [1, 2], "variants": ["autoregressive"]}}
    with pytest.raises(JobFileError, match="BatchGenerator cannot quantise the KV cache"):
        parse_job(job, tmp_path / "job.json")
    job["base"] = {"repetition_penalty": 1.2}  # a batch takes logits processors: fine
    assert parse_job(job, tmp_path / "job.json").base["repetition_penalty"] == 1.2


def test_engines_are_told_apart_only_through_the_registry():
    """No module compares an engine's name: what differs between engines is declared in
    agent/engines.py (knobs honoured, in process or not, variants as configs)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(  # a stored column filtered by a user's value (Run.engine) is fine
        r"(?<!Run\.)\bengine(?:\.name|_name|_type)?\s*[!=]="
        r"""|[!=]=\s*["'](?:http|mlx-lm)["']|["'](?:http|mlx-lm)["']\s+if\s""")
    found = [f"{p.relative_to(root)}:{i}" for folder in ("agent", "orchestrator")
             for p in (root / folder).rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


@pytest.mark.parametrize("extra, message, line_of", [
    ("engine:\n  type: vllm-x\n  variants: []\n",
     r"engine.type: 'vllm-x' is not one of 'http'", "  type: vllm-x"),
    ("  base: {kv_bits: 4}\nengine:\n  type: http\n  variants:\n    - {name: a, base_url: "
     "'http://127.0.0.1:1'}\n", r"sweep.base.kv_bits: the http engine cannot honour kv_bits "
     r"\(.*\); a runtime sets it at start-up", "  base: {kv_bits: 4}"),
    ("  base: {max_kv_size: 512}\n", r"sweep.base.max_kv_size: the mlx-lm engine honours "
     r"max_kv_size in autoregressive generation only", "  base: {max_kv_size: 512}"),
])
def test_plan_lock_refuses_what_the_engine_cannot_honour_with_file_and_line(
        model_pair, tmp_path, extra, message, line_of):
    from orchestrator.errors import ConfigError
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    # an http engine sweeps no draft width (each variant fixes its own)
    text = plan_text(model_pair, widths=None if "http" in extra else (2,), extra=extra)
    plan.write_text(text)
    line = text.splitlines().index(line_of) + 1
    with pytest.raises(ConfigError, match=message) as e:
        load_plan(plan)
    assert (e.value.path, e.value.line) == (str(plan), line)
