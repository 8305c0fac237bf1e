"""Declared = applied, for every key a plan accepts: the schema is enumerated, and each key
must have a demonstrated effect here (a new key without one fails the first test).

Each effect is shown where it is consumed: the lock's job (what the agent runs), the hosts
chosen, the review's classification, or the agent's own refusal."""

import json
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from agent.job import parse_job
from agent.loop import build_plan
from agent.mlxengine import MlxEngine, lineup_variants
from agent.protocol import KNOBS
from orchestrator.errors import ConfigError
from orchestrator.sweep.lock import write_lock
from orchestrator.sweep.plan import SPEC, load_plan
from tests.locks import plan_text


def leaves(spec: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in spec.items():
        out += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return out


def lock(model_pair: Path, folder: Path, edit=lambda t: t, name: str = "plan.yml") -> dict:
    plan = folder / name
    plan.write_text(edit(plan_text(model_pair, widths=(2, 3))))
    return json.loads(write_lock(load_plan(plan), lambda m: None).read_text())


def set_line(key: str, value: str):
    """Add ``key: value`` under its section of the plan text (a new section if needed)."""
    section, _, leaf = key.partition(".")

    def edit(text: str) -> str:
        if not leaf:
            return text.replace("name: test-plan", f"{key}: {value}")
        lines = text.splitlines()
        if f"{section}:" not in lines:
            return text + f"{section}:\n  {leaf}: {value}\n"
        at = lines.index(f"{section}:") + 1
        end = next((i for i in range(at, len(lines)) if not lines[i].startswith(" ")),
                   len(lines))
        for i in range(at, end):  # replace the key where the section already sets it
            if lines[i].startswith(f"  {leaf}:"):
                lines[i] = f"  {leaf}: {value}"
                return "\n".join(lines) + "\n"
        lines.insert(at, f"  {leaf}: {value}")
        return "\n".join(lines) + "\n"
    return edit


def job_of(doc: dict) -> dict:
    return doc["job"]


def slots(doc: dict) -> list:
    """The agent's own plan of generations for a lock's job (in-process mlx-lm engine)."""
    job = parse_job({**doc["job"], "job_id": "x", "models": {
        "target": {"path": "t"}, "draft": {"path": "d"}}})
    return build_plan(job, PlanFacts)  # type: ignore[arg-type]  # the engine's plan facts


class PlanFacts:
    """What build_plan reads of the in-process engine, without loading models: its name,
    variants for one pair, and that it holds both at once."""

    name = MlxEngine.name
    variants = lineup_variants((("target", "draft"),))
    holds_all_variants = MlxEngine.holds_all_variants
    field_knobs = MlxEngine.field_knobs


def soak(doc: dict, key: str):
    return doc["job"].get("soak", {}).get(key)


# key → (plan value, what must differ from the base lock)
CHANGES = {
    "name": ("other-name", lambda d: d["name"] == "other-name"),
    "environment.python": (None, None),  # below: the agent refuses another Python
    "environment.packages": (None, None),  # below: pins reach the job
    "environment.platforms": ("[macos-14-arm64]",
                              lambda d: list(d["platforms"]) == ["macos-14-arm64"] and any(
                                  w["name"] == "mlx-metal"
                                  for w in d["platforms"]["macos-14-arm64"]["wheels"])),
    "models.target": (None, None),  # below: the fingerprint follows the folder
    "models.draft": (None, None),
    "models.source": ("mlx-community/Llama-3.2-3B", lambda d: d["models"]["source"] ==
                      "mlx-community/Llama-3.2-3B"),
    "models.revision": ("abc123", lambda d: d["models"]["revision"] == "abc123"),
    "models.verify": ("always", lambda d: d["job"]["verify_weights"] == "always"),
    "workloads.use": ("[memo]", lambda d: {w["kind"] for w in d["job"]["workloads"]} ==
                      {"prose"} or all("memo" in w["name"] for w in d["job"]["workloads"])),
    "workloads.context": ("[medium]", lambda d: {w["context_bucket"] for w in
                                                 d["job"]["workloads"]} == {"medium"}),
    "workloads.max_tokens": ("17", lambda d: {w["max_tokens"] for w in
                                              d["job"]["workloads"]} == {17}),
    "workloads.quality": ("true", lambda d: len(d["job"].get("quality_tasks", [])) > 0),
    # top_p / top_k act only when sampling (temperature > 0): greedy would ignore them
    "sweep.base": ("{temperature: 0.7, top_p: 0.9}",
                   lambda d: all(s.config["top_p"] == 0.9 for s in slots(d))),
    "sweep.baseline": ("{temperature: 0.7, top_k: 5}", lambda d: all(s.config["top_k"] == (
        5 if s.mode == "baseline" else 0) for s in slots(d))),
    "sweep.knobs": (None, None),  # below: every knob, every engine
    "sweep.repetitions": ("3", lambda d: {s.repetition for s in slots(d)} == {0, 1, 2}),
    "sweep.warmup_tokens": ("5", lambda d: d["job"]["warmup_tokens"] == 5),
    "sweep.seed": ("42", lambda d: d["job"]["seed"] == 42),
    "sweep.cv_threshold": ("0.3", lambda d: d["job"]["cv_threshold"] == 0.3),
    "sweep.contention_threshold": ("0.5", lambda d: d["job"]["contention_threshold"] == 0.5),
    "sweep.adaptive": (None, None),  # tests/test_adaptive.py (a lock's adaptive sweep)
    "gates.acceptance_floor": (None, None),  # below: the review classifies by them
    "gates.min_speedup": (None, None),
    "gates.itl_p95_ceiling_ms": (None, None),
    "gates.swap_ceiling_bytes": (None, None),
    "gates.ttft_regression_limit": (None, None),
    "nodes.limit": (None, None),  # below: the hosts chosen
    "nodes.labels": (None, None),
    "soak.duration_s": ("7", lambda d: d["job"].get("mode") == "soak" and
                        d["job"]["soak"]["duration_s"] == 7),
    "soak.num_draft_tokens": ("4", lambda d: soak(d, "num_draft_tokens") == 4),
    "soak.max_tokens": ("9", lambda d: soak(d, "max_tokens") == 9),
    "soak.workload": (None, None),  # below: refused when not a workload
    "soak.rss_growth_limit": ("0.2", lambda d: soak(d, "rss_growth_limit") == 0.2),
    "soak.sample_every_s": ("3", lambda d: soak(d, "sample_every_s") == 3),
    "soak.variant": (None, None),  # tests/test_plan_lock.py, tests/test_shared_loop.py
    "engine": (None, None),        # tests/test_http_sweep.py (a plan's engine on a node)
    "background": (None, None),    # tests/test_background.py (a co-tenant during a sweep)
    "load": (None, None),          # tests/test_load.py (a plan's ramps stored and reviewed)
}


def test_every_key_of_the_plan_schema_has_a_demonstrated_effect():
    assert sorted(leaves(SPEC)) == sorted(CHANGES), "a plan key without an effect test"


@pytest.mark.parametrize("key", sorted(k for k, (v, _) in CHANGES.items() if v is not None))
def test_a_key_changes_the_lock(key, model_pair, tmp_path):
    value, check = CHANGES[key]
    base = lock(model_pair, tmp_path, name="base.yml")
    doc = lock(model_pair, tmp_path, set_line(key, value))
    assert check(doc), f"{key}: {value} did not take effect"
    assert not check(base), f"{key}: the base plan already shows the effect"
    assert doc["lock_id"] != base["lock_id"]


def test_pins_and_python_reach_the_agent_which_refuses_another(model_pair, tmp_path):
    from agent.checks import check_environment
    from agent.errors import EnvironmentMismatch

    doc = lock(model_pair, tmp_path)
    assert doc["job"]["pins"] == {p.split("==")[0]: p.split("==")[1] for p in doc["packages"]}
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert doc["job"]["python"] == mine
    other = lock(model_pair, tmp_path, lambda t: t.replace(f'python: "{mine}"',
                                                           'python: "3.99"'), name="p.yml")
    job = parse_job({**other["job"], "job_id": "x", "models": {
        "target": {"path": str(model_pair / "target")},
        "draft": {"path": str(model_pair / "draft")}}})
    with pytest.raises(EnvironmentMismatch, match=rf"Python {mine} runs the agent but the "
                                                  r"plan declares 3.99 \(environment.python\)"):
        check_environment(job, tmp_path / "fp.json")


def test_the_model_folders_are_the_fingerprints(model_pair, tmp_path):
    import shutil

    base = lock(model_pair, tmp_path, name="base.yml")
    pair = tmp_path / "pair"
    shutil.copytree(model_pair, pair)
    (pair / "draft" / "config.json").write_text(
        (pair / "draft" / "config.json").read_text().replace("}", ', "note": 1}', 1))
    doc = lock(pair, tmp_path)
    assert doc["models"]["target"]["fingerprint"] == base["models"]["target"]["fingerprint"]
    assert doc["models"]["draft"]["fingerprint"] != base["models"]["draft"]["fingerprint"]


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_every_knob_reaches_each_engine_that_honours_it_and_is_refused_by_the_others(
        knob, model_pair, tmp_path):
    import inspect

    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    from agent.engines import ENGINES
    from agent.generation import mlx_arguments
    from agent.httpruntime import _body
    from tests.test_knobs import EFFECT

    value = EFFECT[knob][1]  # a value away from its default, valid for it
    assert KNOBS[knob].check(value) and value != KNOBS[knob].default
    mlx, http = ENGINES["mlx-lm"], ENGINES["http"]
    # mlx-lm takes it under the registry's name, in the function the agent hands it to
    arg = mlx.knobs[knob]
    taken = {p for f in (make_sampler, make_logits_processors, generate_step,
                         speculative_generate_step) for p in inspect.signature(f).parameters}
    assert arg in taken
    sampler, logits, gen, max_kv = mlx_arguments(
        {"num_draft_tokens": 3, knob: value}, speculative=knob == "num_draft_tokens")
    assert {**sampler, **logits, **gen, "max_kv_size": max_kv}[arg] == value
    # the settings that let it act (top_p needs temperature > 0): an inert knob is refused
    context = EFFECT[knob][0]

    def with_base(ctx: dict) -> str:
        return f"\n  base: {json.dumps(ctx)}" if ctx else ""

    def mutate(t: str) -> str:
        return t.replace("knobs: {num_draft_tokens: [2, 3]}",
                         f"knobs: {{{knob}: [{value}]}}" + with_base(context))

    if knob in mlx.autoregressive_only:  # every config of a sweep is paired with speculation
        with pytest.raises(ConfigError, match=rf"honours {knob} in autoregressive generation "
                                              r"only") as e:
            lock(model_pair, tmp_path, mutate)
        assert e.value.line is not None
    else:
        doc = lock(model_pair, tmp_path, mutate)
        assert any(s.config[knob] == value and s.knob == knob for s in slots(doc))
    engine = ("engine:\n  type: http\n  variants:\n    - {name: plain, base_url: "
              "'http://127.0.0.1:1'}\n    - {name: d, speculative: true, base_url: "
              "'http://127.0.0.1:2'}\n")
    plan = tmp_path / "http.yml"
    plan.write_text(plan_text(model_pair, widths=None, extra=engine).replace(
        "knobs: {temperature: [0.0]}", f"knobs: {{{knob}: [{value}]}}" + with_base(
            {k: v for k, v in context.items() if k in http.knobs})))
    if knob in http.knobs:
        job = json.loads(write_lock(load_plan(plan), lambda m: None).read_text())["job"]
        assert job["knobs"] == {knob: [value]}
        cfg = {**job.get("base", {}), knob: value}
        assert _body("completions", "p", 4, cfg, {})[http.knobs[knob]] == value
    else:
        with pytest.raises(ConfigError, match=rf"the http engine cannot honour {knob}") as e:
            load_plan(plan)
        assert e.value.line is not None and str(plan) in str(e.value)


def test_plan_gates_change_the_review(tmp_path):
    """Each gate, set by a plan, moves the same planted week's classification."""
    import random

    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values as V
    from tests.history import night, week_nights
    from tests.test_weekly_review import NOW, W20

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    rng = random.Random(1)
    for at in week_nights(W20):
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="p", workload="w",
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 4): V(130.0, acceptance=0.70, ttft=51.5, itl_p95=20.0,
                                             swap=0, rng=rng)})
    rules = load_rules()
    (s,) = analyse(store, "2026-W20", rules, now=NOW + timedelta(0))["series"]
    assert s["configs"][1]["classification"] == "production candidate"
    for gate, value, missed in [("min_speedup", 1.5, "speedup"),
                                ("acceptance_floor", 0.9, "acceptance"),
                                ("itl_p95_ceiling_ms", 5.0, "itl_p95_ms"),
                                ("ttft_regression_limit", 0.01, "ttft_change"),
                                ("swap_ceiling_bytes", -1, "swap_peak_bytes")]:
        (s,) = analyse(store, "2026-W20", rules, {gate: value}, now=NOW)["series"]
        assert s["configs"][1]["classification"] == f"just misses: {missed}", gate


def test_nodes_limit_and_labels_choose_the_hosts(model_pair, tmp_path):
    from orchestrator.cli.base import plan_hosts

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    lab:\n      hosts:\n"
                   "        a: {ansible_connection: local, specfleet_labels: [quiet, m2]}\n"
                   "        b: {ansible_connection: local, specfleet_labels: [m2]}\n"
                   "    other:\n      hosts:\n        c: {ansible_connection: local}\n")

    def hosts(edit) -> list[str]:
        doc = lock(model_pair, tmp_path, edit)
        chosen, _ = plan_hosts(doc, tmp_path / "plan.lock.json", {
            "limit": None, "inventory_path": [str(inv)], "vault_password_file": None})
        return sorted(h.name for h in chosen)

    assert hosts(lambda t: t) == ["a", "b", "c"]
    assert hosts(set_line("nodes.limit", "lab")) == ["a", "b"]
    assert hosts(set_line("nodes.labels", "[quiet]")) == ["a"]


def test_soak_workload_must_be_one_of_the_plans(model_pair, tmp_path):
    with pytest.raises(ConfigError, match=r"soak.workload: 'nope' is not one of the plan's "
                                          r"workloads"):
        lock(model_pair, tmp_path, set_line("soak.workload", "nope"))
