"""Adversarial audit (audit-c) of issues 31 and 32: inputs the team's own tests did not try.

Each test plants an input with a known right answer; the ones still wrong are marked
``xfail(strict=True)`` with why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.review.rules import fire, load_rules

ROOT = Path(__file__).resolve().parents[1]

# -- rules: a `when` that loads but cannot be evaluated ------------------------------------


@pytest.mark.parametrize("when, bad", [
    ("best_label > 3", "best_label"),           # a text metric compared with a number
    ('best_speedup < "1.0"', "'1.0'"),          # a quoted threshold
    ("best_config == 3", "best_config"),
])
def test_rule_comparing_text_is_refused_at_load(tmp_path, when, bad):
    """Before: these loaded, then `fire` raised TypeError inside the weekly review (or
    `best_k == "3"` silently never fired). A rule compares numbers: refused with its line."""
    path = tmp_path / "rules.yml"
    path.write_text(f"- id: odd\n  when: {when}\n  action: x\n")
    with pytest.raises(ConfigError, match=r"rules.yml:2: rule odd: when .*" + bad):
        load_rules(path)


def test_numeric_rules_still_load_and_fire(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text("- id: ok\n  when: best_speedup < 1.0 and not candidates\n  action: x\n"
                    "  evidence: [best_label, best_config]\n")
    (rule,) = load_rules(path)
    assert [f["rule"] for f in fire([rule], {"best_speedup": 0.9, "candidates": 0})] == ["ok"]
    assert fire([rule], {"best_speedup": 1.1, "candidates": 0}) == []


# -- knobs: declared but never applied ------------------------------------------------------

def _plan(model_pair, tmp_path, sweep_lines: str):
    from tests.locks import plan_text

    path = tmp_path / "plan.yml"
    text = plan_text(model_pair, widths=(2,)).replace(
        "  knobs: {num_draft_tokens: [2]}", sweep_lines)
    path.write_text(text)
    return path, text


@pytest.mark.parametrize("sweep, where, needs", [
    ("  knobs: {num_draft_tokens: [2]}\n  base: {top_p: 0.5}", "sweep.base.top_p",
     "temperature > 0"),
    ("  knobs: {top_k: [5, 10]}", "sweep.knobs.top_k", "temperature > 0"),
    ("  knobs: {num_draft_tokens: [2]}\n  base: {temperature: 1.0, min_tokens_to_keep: 5}",
     "sweep.base.min_tokens_to_keep", "min_p > 0"),
    ("  knobs: {num_draft_tokens: [2]}\n  base: {temperature: 1.0, xtc_threshold: 0.3}",
     "sweep.base.xtc_threshold", "xtc_probability > 0"),
    ("  knobs: {kv_group_size: [32, 128]}", "sweep.knobs.kv_group_size", "kv_bits set"),
    ("  knobs: {num_draft_tokens: [2]}\n  base: {quantized_kv_start: 0}",
     "sweep.base.quantized_kv_start", "kv_bits set"),
    ("  knobs: {num_draft_tokens: [2]}\n  baseline: {presence_context_size: 5}",
     "sweep.baseline.presence_context_size", "presence_penalty set"),
    # one knob at a time around the base: the top_p configs run at the base's temperature 0
    ("  knobs: {temperature: [0.7], top_p: [0.5]}", "sweep.knobs.top_p", "temperature > 0"),
])
def test_a_knob_the_engine_would_ignore_is_refused_at_lock(model_pair, tmp_path, sweep,
                                                           where, needs):
    """Before: each of these locked, ran, and was stored and labelled as its own config
    (``top_p 0.5``), though mlx-lm's greedy sampler (temperature 0) takes no top_p and an
    unquantised cache no group size: declared, never applied."""
    from orchestrator.sweep.plan import load_plan

    path, text = _plan(model_pair, tmp_path, sweep)
    name = where.rsplit(".", 1)[1]
    line = next(i for i, t in enumerate(text.splitlines(), 1)
                if f"{name}:" in t and t.strip().startswith(("knobs", "base", "baseline")))
    with pytest.raises(ConfigError, match=rf"{where}: {name} acts only with {needs}") as e:
        load_plan(path)
    assert (e.value.path, e.value.line) == (str(path), line)


@pytest.mark.parametrize("sweep", [
    "  knobs: {num_draft_tokens: [2]}\n  base: {temperature: 0.7, top_p: 0.5}",
    # sweeping the prerequisite itself compares with and without the knob acting: allowed
    "  knobs: {temperature: [0.0, 0.7]}\n  base: {top_p: 0.5}",
    "  knobs: {kv_group_size: [32]}\n  base: {kv_bits: 4, quantized_kv_start: 0}",
    "  knobs: {num_draft_tokens: [3], kv_bits: [4, 8]}\n  base: {quantized_kv_start: 0}",
    "  knobs: {num_draft_tokens: [2]}\n  base: {repetition_penalty: 1.3, "
    "repetition_context_size: 8}",
])
def test_knobs_with_their_prerequisite_still_lock(model_pair, tmp_path, sweep):
    from orchestrator.sweep.plan import load_plan

    path, _ = _plan(model_pair, tmp_path, sweep)
    load_plan(path)


def test_the_refused_combination_is_one_mlx_lm_ignores(model_pair):
    """The planted answer behind the refusal: at temperature 0, top_p 0.05 and top_k 1
    give token for token the output without them (at temperature 1.5 they do not)."""
    from mlx_lm import load

    from agent.generation import generate_trace

    target, tok = load(str(model_pair / "target"))
    ids = tok.encode("def fibonacci(n):\n    return n\n" * 4)

    def tokens(cfg):
        return generate_trace(target, tok, ids, cfg, 24).token_ids

    assert tokens({"top_p": 0.05, "top_k": 1}) == tokens({})
    assert tokens({"temperature": 1.5, "top_p": 0.05}) != tokens({"temperature": 1.5})


def _valid(knob):
    from hypothesis import strategies as st

    from agent.protocol import KNOBS

    cands = {"temperature": [0.0, 0.5], "top_k": [0, 5], "top_p": [1.0, 0.5],
             "min_p": [0.0, 0.2], "xtc_probability": [0.0, 0.5], "xtc_threshold": [0.1, 0.3],
             "min_tokens_to_keep": [1, 3], "repetition_penalty": [None, 1.2],
             "presence_penalty": [None, 0, 0.5], "frequency_penalty": [None, 0, 0.5],
             "repetition_context_size": [20, 5], "presence_context_size": [20, 5],
             "frequency_context_size": [20, 5]}[knob]
    assert all(KNOBS[knob].check(v) for v in cands)
    return st.sampled_from(cands)


def test_inert_knobs_match_what_mlx_lm_builds():
    """For any sampler/logits config: a sampler knob is flagged as needing temperature
    exactly when mlx-lm builds its greedy sampler, and a context size exactly when its
    penalty builds no processor."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from mlx_lm.sample_utils import greedy_sampler, make_logits_processors, make_sampler

    from agent.generation import mlx_arguments
    from agent.protocol import KNOB_DEFAULTS, inert_knobs

    names = ["temperature", "top_k", "top_p", "min_p", "xtc_probability", "xtc_threshold",
             "min_tokens_to_keep", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "repetition_context_size", "presence_context_size",
             "frequency_context_size"]

    @settings(max_examples=300, deadline=None)
    @given(st.fixed_dictionaries({n: _valid(n) for n in names}))
    def check(cfg):
        flagged = {(k, needs) for k, needs, _ in inert_knobs(cfg)}
        sampler, logits, _, _ = mlx_arguments(cfg, speculative=False)
        greedy = make_sampler(**sampler) is greedy_sampler
        for k in ("top_k", "top_p", "min_p", "xtc_probability", "xtc_threshold",
                  "min_tokens_to_keep"):
            assert ((k, "temperature") in flagged) == (greedy and cfg[k] != KNOB_DEFAULTS[k])
        for p in ("repetition", "presence", "frequency"):
            alone = {f"{p}_penalty": cfg[f"{p}_penalty"],
                     f"{p}_context_size": cfg[f"{p}_context_size"]}
            _, lg, _, _ = mlx_arguments(alone, speculative=False)
            off = not make_logits_processors(**lg)
            k = f"{p}_context_size"
            assert ((k, f"{p}_penalty") in flagged) == (off and cfg[k] != KNOB_DEFAULTS[k])

    check()


def test_kv_bits_that_never_takes_effect_is_refused_or_marked(model_pair, tmp_path):
    """The issue's own example, `kv_bits: [4, 8]`, on 32-token generations of short prompts:
    the planted answer is that mlx-lm keeps the cache unquantised (same bytes as no
    kv_bits). Before, the sweep stored and labelled kv_bits 4 and 8 as measured trade-offs;
    now the agent says so per generation and `plan lock` refuses the plan at its line."""
    from mlx_lm import load

    from agent.generation import generate_trace
    from orchestrator.sweep.plan import load_plan

    target, tok = load(str(model_pair / "target"))
    ids = tok.encode("def fibonacci(n):\n    return n\n" * 4)
    runs = {b: generate_trace(target, tok, ids, {"kv_bits": b}, 32).fields for b in (None, 4, 8)}
    assert runs[4]["kv_cache_bytes"] == runs[8]["kv_cache_bytes"] == runs[None]["kv_cache_bytes"]
    assert [runs[b]["kv_quantised"] for b in (None, 4, 8)] == [None, False, False]
    path, text = _plan(model_pair, tmp_path, "  knobs: {num_draft_tokens: [3], kv_bits: [4, 8]}")
    with pytest.raises(ConfigError, match=r"sweep.knobs.kv_bits: kv_bits 4 would never apply: "
                                          r".*quantized_kv_start \(5000\)") as e:
        load_plan(path)
    line = text.splitlines().index("  knobs: {num_draft_tokens: [3], kv_bits: [4, 8]}") + 1
    assert (e.value.path, e.value.line) == (str(path), line)


# -- OTLP export: an answer that is not a success ------------------------------------------

def test_a_partial_success_is_not_reported_as_an_export(sqlite_url):
    """Before: a collector answering 200 with partial_success (5 of 18 points rejected)
    left `export` returning its ExportResult as if all had arrived (the SDK's exporter
    counts any 200 as success). Now: a clear ExportError naming the count and the reason."""
    from orchestrator.export.otlp import ExportError, export
    from orchestrator.export.points import Selection
    from orchestrator.store import open_store
    from tests.otlp_receiver import Receiver
    from tests.test_otlp_export import plant

    store = open_store(sqlite_url)
    sid = plant(store)
    with Receiver() as r:
        whole = export(store, Selection(sweep_ids=[sid]), r.url)
        r.partial = (5, "too many attributes")
        with pytest.raises(ExportError, match=rf"rejected 5 of {whole.data_points} data "
                                              r"points \(too many attributes\)\. Nothing in "
                                              "the store changed"):
            export(store, Selection(sweep_ids=[sid]), r.url)
        assert r.requests == 2


@pytest.mark.parametrize("mode, k", [("speculative", 3), ("baseline", 0)])
def test_two_http_variants_of_one_width_are_not_pooled_in_the_export(sqlite_url, mode, k):
    """Two variants of one runtime at one width, differing only in their server command
    (e.g. a quantised KV cache set at start-up): their config differs in ``variant``, but
    the label skips it, so every attribute matched and the SDK folded both variants'
    requests into one histogram point (TTFT 40 ms and 400 ms as one count-2 point)."""
    from datetime import datetime, timezone

    from orchestrator.export.otlp import export
    from orchestrator.export.points import TTFT, Selection
    from orchestrator.store import open_store
    from tests.history import event_config, generation, ingest_lines, new_sweep
    from tests.otlp_receiver import Receiver

    store = open_store(sqlite_url)
    at = datetime(2026, 11, 24, 2, 0, tzinfo=timezone.utc)
    sid = new_sweep(store, at)
    gens = [generation(mode, k, config={**event_config(mode, k), "variant": v},
                       variant=v, engine="http", runtime="llama-server", ttft_ms=ttft,
                       e2e_ms=ttft + 310.0, generated_tokens=32)
            for v, ttft in (("llama-kv-q8", 40.0), ("llama-kv-f16", 400.0))]
    ingest_lines(store, sid, "mac-a", gens, at.timestamp())
    with Receiver() as r:
        export(store, Selection(sweep_ids=[sid]), r.url)
    ttft = sorted((p.count, p.sum) for p in r.points if p.metric == TTFT)
    assert ttft == [(1, pytest.approx(0.04)), (1, pytest.approx(0.4))]


# -- Grafana: the dashboard's series must not pool configs --------------------------------

@pytest.mark.postgres
def test_the_dashboard_keeps_configs_that_differ_in_a_knob_apart(pg_url):
    """One node, one pair, one sweep: speculative k=3 at kv_bits 4 (decode 100 tok/s) and at
    kv_bits 8 (200 tok/s), and two http-free model pairs' baselines (60 and 90 tok/s).
    Before: the dashboard's series were `node · mode k=width`, so its decode panel drew one
    line at the median of both kv_bits configs (150) and one of both pairs (75)."""
    import json
    import re
    from datetime import datetime, timezone
    from pathlib import Path

    from sqlalchemy import text

    from orchestrator.store import open_store
    from tests.history import generation, ingest_lines, new_sweep
    from tests.test_grafana_views import _grafana

    store = open_store(pg_url)
    at = datetime(2026, 11, 24, 2, 0, tzinfo=timezone.utc)
    sid = new_sweep(store, at, knobs={"kv_bits": [4, 8]})
    gens = [generation("speculative", 3, {"kv_bits": b}, decode_tok_s=v, knob="kv_bits",
                       knob_value=b)
            for b, v in ((4, 100.0), (8, 200.0)) for _ in range(2)]
    gens += [generation("baseline", 0, lineup=f"{t}+draft", decode_tok_s=v)
             for t, v in (("target", 60.0), ("target-2", 90.0)) for _ in range(2)]
    ingest_lines(store, sid, "mac-a", gens, at.timestamp())
    root = Path(__file__).resolve().parents[1]
    dash = json.loads((root / "docs" / "grafana-dashboard.json").read_text())
    (panel,) = [p for p in dash["panels"] if p["title"].startswith("Decode tok/s")]
    with store.engine.connect() as c:
        got = c.execute(text(_grafana(panel["targets"][0]["rawSql"]))).mappings().all()
    values = sorted(r["decode_tok_s_p50"] for r in got)
    assert values == [60.0, 90.0, 100.0, 200.0]
    labels = {r["metric"] for r in got}
    assert len(labels) == 4 and any(re.search("kv_bits.{0,4}4", m) for m in labels)


@pytest.mark.postgres
def test_a_config_set_aside_as_a_whole_is_marked_in_the_view(pg_url):
    """A config whose decode rate varied too much (its config_summary unreliable, CV 30%)
    is set aside by the review and marked by the OTLP export, though each generation was
    fine alone. Before: grafana_measurements said unreliable = false for its generations,
    so the dashboard's "reliable generations" panel drew them (decode 300 tok/s)."""
    from sqlalchemy import text

    from tests.history import config_values, generation, ingest_lines, night
    from tests.test_grafana_views import _grafana
    from tests.test_otlp_export import AT

    store = open_store_pg(pg_url)
    why = "decode tok/s CV 30% ≥ 10%: rerun with more repetitions"
    sid = night(store, AT, node="mac-a", chip="Apple M2", pair="gemma / gemma-draft",
                workload="code", configs={("speculative", 3): config_values(300.0)},
                unreliable=why)
    night(store, AT, node="mac-a", chip="Apple M2", pair="gemma / gemma-draft",
          workload="code", configs={("baseline", 0): config_values(100.0)}, sweep_id=sid)
    ingest_lines(store, sid, "mac-a", [generation("speculative", 3, decode_tok_s=300.0),
                                       generation("baseline", 0, decode_tok_s=100.0)],
                 AT.timestamp())
    with store.engine.connect() as c:
        rows = c.execute(text("SELECT mode, unreliable, unreliable_reasons "
                              "FROM grafana_measurements ORDER BY mode")).mappings().all()
        assert [(r["mode"], r["unreliable"]) for r in rows] == [("baseline", False),
                                                               ("speculative", True)]
        assert why in rows[1]["unreliable_reasons"]
        dash = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
        (panel,) = [p for p in dash["panels"] if p["title"].startswith("Decode tok/s")]
        got = c.execute(text(_grafana(panel["targets"][0]["rawSql"]))).mappings().all()
    assert [r["decode_tok_s_p50"] for r in got] == [100.0]


def open_store_pg(url):
    from orchestrator.store import open_store

    return open_store(url)


@pytest.mark.parametrize("sweep, where", [
    ("  knobs: {kv_group_size: [32, 128]}\n  base: {kv_bits: 4, quantized_kv_start: 0}",
     "sweep.knobs.kv_group_size"),
    ("  knobs: {num_draft_tokens: [3]}\n  base: {kv_bits: 4, kv_group_size: 128, "
     "quantized_kv_start: 0}", "sweep.base.kv_group_size"),
])
def test_a_group_size_that_does_not_divide_the_head_size_is_refused_at_lock(
        model_pair, tmp_path, sweep, where):
    """The demo target's heads are 64 wide (hidden 256 / 4 heads). Before: kv_group_size
    128 locked, and then every generation failed on the node with mlx's "[quantize] The
    last dimension of the matrix needs to be divisible by the quantization group size"."""
    from mlx_lm import load

    from agent.generation import generate_trace
    from orchestrator.sweep.plan import load_plan

    target, tok = load(str(model_pair / "target"))
    with pytest.raises(ValueError, match="divisible by the quantization group size 128"):
        generate_trace(target, tok, tok.encode("def f(x):"),
                       {"kv_bits": 4, "kv_group_size": 128, "quantized_kv_start": 0}, 4)
    path, text = _plan(model_pair, tmp_path, sweep)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "128" in t)
    with pytest.raises(ConfigError, match=rf"{where}: 128 does not divide the target's "
                                          r"attention head size 64") as e:
        load_plan(path)
    assert e.value.line == line
    path, _ = _plan(model_pair, tmp_path, sweep.replace("128", "64"))
    load_plan(path)  # a divisor locks


def test_an_export_names_why_a_config_was_set_aside(sqlite_url):
    """A config set aside for a decode rate too variable (each trial fine alone): its
    requests and its width/speedup points carry specfleet.set_aside with that reason.
    Before: "unreliable: every trial of its config", which is not what happened."""
    from orchestrator.export.otlp import export
    from orchestrator.export.points import TTFT, WIDTH, Selection
    from orchestrator.store import open_store
    from tests.history import config_values, generation, ingest_lines, night
    from tests.otlp_receiver import Receiver
    from tests.test_otlp_export import AT

    store = open_store(sqlite_url)
    why = "decode tok/s CV 30% ≥ 10%: rerun with more repetitions"
    sid = night(store, AT, node="mac-a", chip="Apple M2", pair="gemma / gemma-draft",
                workload="code", configs={("speculative", 3): config_values(300.0)},
                unreliable=why)
    ingest_lines(store, sid, "mac-a", [generation("speculative", 3, decode_tok_s=300.0)],
                 AT.timestamp())
    with Receiver() as r:
        export(store, Selection(sweep_ids=[sid]), r.url)
    marks = {p.metric: p.attributes.get("specfleet.set_aside") for p in r.points
             if p.metric in (TTFT, WIDTH)}
    assert marks == {TTFT: f"unreliable: {why}", WIDTH: f"unreliable: {why}"}


@pytest.mark.parametrize("since, until, found", [
    ("2026-11-24T01:00+00:00", "2026-11-24T03:00+00:00", True),
    ("2026-11-24T03:00+02:00", "2026-11-24T05:00+02:00", True),   # 01:00–03:00 UTC
    ("2026-11-23T20:00-07:00", "2026-11-23T21:00-07:00", False),  # 03:00–04:00 UTC
    ("2026-11-24T04:00+02:00", None, True),                       # from 02:00 UTC
])
def test_export_range_with_an_offset_selects_by_the_instant(any_url, since, until, found):
    """The planted sweep was created at 02:00 UTC. Before: on SQLite a bound with an offset
    was compared as if it were UTC (03:00+02:00 read as 03:00), so the sweep was missed."""
    from datetime import datetime

    from orchestrator.export.points import Selection, read_points
    from orchestrator.store import open_store
    from tests.test_otlp_export import plant

    store = open_store(any_url)
    sid = plant(store)
    sel = Selection(since=datetime.fromisoformat(since),
                    until=datetime.fromisoformat(until) if until else None)
    assert read_points(store, sel)[0] == ([sid] if found else [])


# -- the store: two long configs are two runs ---------------------------------------------

LONG_BASE = dict(temperature=0.7, repetition_penalty=1.1, repetition_context_size=64,
                 presence_penalty=0.5, presence_context_size=64, frequency_penalty=0.5,
                 frequency_context_size=64, kv_bits=4, kv_group_size=32, quantized_kv_start=0,
                 prefill_step_size=256, min_p=0.05, min_tokens_to_keep=2, xtc_probability=0.5)


def test_two_configs_past_255_characters_are_two_runs(any_url):
    """A plan with many knobs set (409 characters of config JSON) sweeping xtc_threshold
    [0.2, 0.3]: the stored key was cut at 255 characters, before xtc_threshold, so both
    configs had one key and the second's run was dropped by ON CONFLICT DO NOTHING, with no
    word (decode 200 tok/s lost). Now each is its own run, with its own numbers."""
    from sqlalchemy import select

    from orchestrator.store import open_store
    from orchestrator.store.db import config_key
    from orchestrator.store.models import Run
    from tests.history import C, config_values, night
    from tests.test_otlp_export import AT

    store = open_store(any_url)
    sid = night(store, AT, node="mac-a", chip="Apple M2", pair="g / d", workload="code",
                configs={C("speculative", 3, **LONG_BASE, xtc_threshold=t):
                         config_values(v, jitter=0) for t, v in ((0.2, 100.0), (0.3, 200.0))})
    with store.engine.connect() as c:
        runs = c.execute(select(Run.config, Run.decode_tok_s_median, Run.config_key)
                         .where(Run.sweep_id == sid)).all()
    assert sorted((r.config["xtc_threshold"], r.decode_tok_s_median) for r in runs) == [
        (0.2, 100.0), (0.3, 200.0)]
    assert all(len(r.config_key) == 255 for r in runs)
    short = {"temperature": 0.7, "num_draft_tokens": 3}
    assert config_key("target+draft-2", short) == 'target+draft-2 {"num_draft_tokens": 3, ' \
        '"temperature": 0.7}'  # a key that fits is kept as it was


def test_distinct_configs_get_distinct_keys_of_at_most_255():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from orchestrator.store.db import config_key

    configs = st.dictionaries(st.sampled_from(sorted(LONG_BASE) + ["xtc_threshold", "top_p"]),
                              st.one_of(st.integers(0, 10**6), st.floats(0, 1, exclude_min=True,
                                                                   exclude_max=True)),
                              min_size=1)
    pairs = st.sampled_from([None, "target+draft", "target-2+draft-2"])

    @settings(max_examples=300, deadline=None)
    @given(pairs, configs, pairs, configs)
    def check(pa, a, pb, b):
        ka, kb = config_key(pa, a), config_key(pb, b)
        assert len(ka) <= 255 and len(kb) <= 255
        assert (ka == kb) == ((pa, a) == (pb, b))

    check()


def test_any_numeric_rule_that_loads_fires_without_error(tmp_path_factory):
    """For any `when` over numeric metrics, numbers and and/or/not that loads, `fire`
    answers True or False for any metric values (None included): never a TypeError."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from orchestrator.review.rules import METRICS, TEXT_METRICS

    numeric = sorted(set(METRICS) - TEXT_METRICS)
    atom = st.builds(lambda m, op, v: f"{m} {op} {v}", st.sampled_from(numeric),
                     st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
                     st.one_of(st.integers(-5, 5), st.floats(-10, 10, allow_nan=False)))
    when = st.recursive(atom, lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) or ({b})", inner, inner),
        st.builds(lambda a: f"not ({a})", inner)), max_leaves=4)
    values = st.dictionaries(st.sampled_from(numeric),
                             st.one_of(st.none(), st.integers(0, 9), st.floats(0, 9)))
    folder = tmp_path_factory.mktemp("rules")

    @settings(max_examples=200, deadline=None)
    @given(when, values)
    def check(w, metrics):
        path = folder / "rules.yml"
        path.write_text(f"- id: r\n  when: \"{w}\"\n  action: x\n")
        (rule,) = load_rules(path)
        assert len(fire([rule], metrics)) in (0, 1)

    check()


def test_a_negative_threshold_is_a_number(tmp_path):
    """load_mem_growth is "last level over first, minus 1": below zero when memory shrank.
    Before: `load_mem_growth < -0.1` was refused ("found USub"), as any negative number."""
    path = tmp_path / "rules.yml"
    path.write_text("- id: shrank\n  when: load_mem_growth < -0.1\n  action: x\n")
    (rule,) = load_rules(path)
    assert [f["rule"] for f in fire([rule], {"load_mem_growth": -0.2})] == ["shrank"]
    assert fire([rule], {"load_mem_growth": -0.05}) == []
    path.write_text("- id: odd\n  when: -best_k < 1\n  action: x\n")  # a sign on a metric
    with pytest.raises(ConfigError, match=r"rules.yml:2: rule odd: only comparisons"):
        load_rules(path)
