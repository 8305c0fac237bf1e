"""Plans lock into exact inputs; a lock that no longer matches is refused with what changed."""

import json
import shutil

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.sweep.lock import load_lock, verify_lock, write_lock
from orchestrator.sweep.plan import load_plan
from tests.locks import make_lock, plan_text


@pytest.fixture
def pair_copy(model_pair, tmp_path):
    d = tmp_path / "pair"
    shutil.copytree(model_pair, d)
    return d


def test_lock_freezes_weights_prompts_and_job(pair_copy, tmp_path):
    lock = make_lock(tmp_path, pair_copy, use=("code", "memo"), widths=(2, 4),
                     context=("short", "long"))
    doc = load_lock(lock)
    assert lock.name == "plan.lock.json"
    assert set(doc["prompts"]) == {"code", "code-long", "memo", "memo-long"}
    assert doc["models"]["target"]["fingerprint"].startswith("sha256:")
    assert {f["path"] for f in doc["models"]["draft"]["manifest"]} >= {"model.safetensors",
                                                                      "tokenizer.json"}
    assert doc["job"]["knobs"] == {"num_draft_tokens": [2, 4]}
    assert doc["job"]["pins"]["mlx-lm"] == "0.32.2"
    verify_lock(doc, lock)  # fresh: matches


def test_changed_plan_weights_or_prompts_are_named(pair_copy, tmp_path):
    lock = make_lock(tmp_path, pair_copy)
    plan = tmp_path / "plan.yml"
    plan.write_text(plan.read_text().replace("repetitions: 1", "repetitions: 5"))
    with open(pair_copy / "draft" / "model.safetensors", "r+b") as f:
        f.seek(200)
        f.write(b"\x01\x02")
    with pytest.raises(ConfigError) as e:
        verify_lock(load_lock(lock), lock)
    msg = str(e.value)
    assert msg.startswith(f"{lock}: the lock no longer matches: the plan changed (sweep); "
                          "draft weights changed: model.safetensors")
    assert msg.endswith("Re-lock with `specfleet plan lock` and review the change.")


def test_changed_prompt_file_is_named(pair_copy, tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"name": "mine", "prompt": "def f(x):", "max_tokens": 16})
                    + "\n")
    lock = make_lock(tmp_path, pair_copy, use=("mine.jsonl",))
    mine.write_text(json.dumps({"name": "mine", "prompt": "def g(y):", "max_tokens": 16})
                    + "\n")
    with pytest.raises(ConfigError, match="prompt mine changed"):
        verify_lock(load_lock(lock), lock)


def test_sweep_refuses_a_stale_lock_before_touching_anything(pair_copy, tmp_path):
    lock = make_lock(tmp_path, pair_copy)
    (tmp_path / "plan.yml").write_text(plan_text(pair_copy, widths=(2, 3)))
    db = tmp_path / "s.db"
    r = CliRunner().invoke(main, ["sweep", str(lock), "--db", f"sqlite:///{db}"])
    assert r.exit_code == 1 and "the plan changed (sweep)" in r.output
    assert not db.exists()  # nothing was written


def test_a_lock_edited_by_hand_is_refused(pair_copy, tmp_path):
    """A lock is tamper-evident: its id is the digest of its own content, so more
    repetitions or another knob typed into the file never run under the old id."""
    lock = make_lock(tmp_path, pair_copy)
    doc = json.loads(lock.read_text())
    doc["job"]["repetitions"] = 5
    lock.write_text(json.dumps(doc, indent=2))
    db = tmp_path / "s.db"
    for cmd in (["plan", "check", str(lock)], ["sweep", str(lock), "--db", f"sqlite:///{db}"]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 1 and "the lock file itself was edited" in r.output, r.output
    assert not db.exists()
    doc["job"]["repetitions"] = 1  # put back exactly: the same content, the same id
    lock.write_text(json.dumps(doc))
    assert CliRunner().invoke(main, ["plan", "check", str(lock)]).exit_code == 0


def test_plan_lock_cli_and_check(pair_copy, tmp_path):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(pair_copy))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["lock"] == str(tmp_path / "plan.lock.json") and out["environments"] == {}
    r = CliRunner().invoke(main, ["plan", "check", out["lock"]])
    assert r.exit_code == 0 and "matches its plan, weights and prompts" in r.output


def test_a_soak_plan_names_one_of_its_workloads(tmp_path, model_pair):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, extra="soak:\n  duration_s: 5\n  workload: cdoe-short"))
    with pytest.raises(ConfigError, match=r"soak.workload: 'cdoe-short' is not one of the "
                                          r"plan's workloads \(code\)") as e:
        write_lock(load_plan(plan), lambda m: None)
    assert e.value.line == plan.read_text().splitlines().index("  workload: cdoe-short") + 1


def test_a_bad_engine_section_stops_at_lock_time_with_its_line(tmp_path, model_pair):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=None,
                              extra="engine:\n  type: http\n  api: grpc\n  variants: []"))
    with pytest.raises(ConfigError, match=r"plan.yml:\d+: engine.api: completions or chat"):
        write_lock(load_plan(plan), lambda m: None)
    plan.write_text(plan_text(model_pair, widths=None,
                              extra="engine:\n  type: http\n  variants: []"))
    with pytest.raises(ConfigError, match=r"engine.variants: a list of \{name, base_url") as e:
        write_lock(load_plan(plan), lambda m: None)
    # the line of the key at fault (the agent's error names its field), not its section's
    assert e.value.line == plan.read_text().splitlines().index("  variants: []") + 1


def test_a_variant_name_too_long_to_key_a_run_is_refused_with_its_line(tmp_path, model_pair):
    """A run is keyed by its config, the variant's name in it (255 characters in all): a
    200-character name lost its label and its speedup in the review (audit 44), so the
    plan refuses it at lock time, at the line of the engine's variants."""
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=None, extra="\n".join([
        "engine:", "  type: http", "  variants:",
        "    - {name: plain, base_url: 'http://127.0.0.1:1'}",
        f"    - {{name: {'v' * 65}, speculative: true, base_url: 'http://127.0.0.1:2'}}"])))
    with pytest.raises(ConfigError, match=r"engine.variants: a variant's name is text of at "
                                          r"most 64 characters \(got 'vvvv") as e:
        write_lock(load_plan(plan), lambda m: None)
    assert e.value.line == plan.read_text().splitlines().index("  variants:") + 1


def test_the_baseline_variant_comes_first(tmp_path, model_pair):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=None, extra="\n".join([
        "engine:", "  type: http", "  variants:",
        "    - {name: draft, speculative: true, base_url: 'http://127.0.0.1:1'}",
        "    - {name: plain, base_url: 'http://127.0.0.1:2'}"])))
    with pytest.raises(ConfigError, match="list the baseline \\(non-speculative\\) variant first"):
        write_lock(load_plan(plan), lambda m: None)


def test_settings_an_engine_cannot_honour_are_refused_at_lock_time(tmp_path, model_pair):
    """Declared = applied, or refused with the plan's line: a draft-width knob with an http
    engine was once accepted and ignored, and so was a soak section with an http engine
    (the shared loop soaks http runtimes now, but only ones it can watch)."""
    engine = "engine:\n  type: http\n  variants:\n    - {name: plain, base_url: 'http://x:1'}"
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=(2, 3), extra=engine))
    lines = plan.read_text().splitlines()
    with pytest.raises(ConfigError, match=r"sweep.knobs.num_draft_tokens: the http engine "
                                          r"cannot honour num_draft_tokens") as e:
        load_plan(plan)
    assert e.value.line == next(i for i, ln in enumerate(lines, 1) if "num_draft_tokens" in ln)
    plan.write_text(plan_text(model_pair, widths=None, extra=engine + "\nsoak:\n  duration_s: 5"))
    soak_line = next(i for i, ln in enumerate(plan.read_text().splitlines(), 1)
                     if ln.startswith("soak:"))
    with pytest.raises(ConfigError, match=r"soak.variant: 'plain' has no command: a soak "
                                          r"watches the runtime's memory") as e:
        write_lock(load_plan(plan), lambda m: None)
    assert e.value.line == soak_line
    plan.write_text(plan_text(model_pair, widths=None, extra=engine + "\nsoak:\n  "
                              "num_draft_tokens: 4"))
    with pytest.raises(ConfigError, match=r"soak.num_draft_tokens: an http variant fixes its "
                                          r"own draft width"):
        write_lock(load_plan(plan), lambda m: None)
    plan.write_text(plan_text(model_pair, widths=(2,), extra="soak:\n  variant: draft"))
    with pytest.raises(ConfigError, match=r"soak.variant: only for an http engine"):
        write_lock(load_plan(plan), lambda m: None)
    plan.write_text(plan_text(model_pair, widths=(2,)).replace(
        "knobs: {num_draft_tokens: [2]}", "knobs: {num_draft_tokens: [2]}\n  base: {top_p: 1.5}"))
    with pytest.raises(ConfigError, match=r"sweep.base.top_p: top_p=1.5 is not valid; it must "
                                          r"be a number in \(0, 1\]"):
        load_plan(plan)


def _draft_with(model_pair, tmp_path, edit) -> object:
    """A copy of the demo pair whose draft's tokenizer.json went through ``edit``."""
    pair = tmp_path / "pair"
    shutil.copytree(model_pair, pair)
    tok_path = pair / "draft" / "tokenizer.json"
    tok = json.loads(tok_path.read_text())
    edit(tok)
    tok_path.write_text(json.dumps(tok))
    return pair


def test_a_draft_of_another_vocabulary_is_refused_at_lock_with_what_differs(model_pair,
                                                                           tmp_path):
    """Same size, other ids: mlx-lm's own check (sizes only) would let it run with its
    acceptance destroyed; the lock names the difference and the plan's line."""
    def swap(tok):
        vocab = tok["model"]["vocab"]
        a, b = "the", "of"
        vocab[a], vocab[b] = vocab[b], vocab[a]

    pair = _draft_with(model_pair, tmp_path, swap)
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(pair))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 1
    line = next(i for i, x in enumerate(plan.read_text().splitlines(), 1) if "draft:" in x)
    assert f"plan.yml:{line}: models.draft:" in r.output
    assert "does not share the target's vocabulary" in r.output
    assert "2 token(s) have other ids" in r.output and "in the draft" in r.output
    assert not (tmp_path / "plan.lock.json").exists()

    def grow(tok):
        tok["model"]["vocab"]["zzz-new"] = len(tok["model"]["vocab"])
        tok["added_tokens"].append({"id": 5000, "content": "<|tool|>", "special": True})

    pair2 = _draft_with(model_pair, tmp_path / "b", grow)
    with pytest.raises(ConfigError) as e:
        load_plan(_write(tmp_path / "b" / "plan.yml", plan_text(pair2)))
    msg = str(e.value)
    assert "vocabulary of 1906 tokens (target) vs 1907 (draft)" in msg
    assert "1 token(s) only in the draft: 'zzz-new'" in msg
    assert "added/special tokens differ: '<|tool|>=5000'" in msg


def _write(path, text):
    path.write_text(text)
    return path


def test_the_demo_pair_shares_one_vocabulary(model_pair):
    from orchestrator.sweep.vocab import differences, vocabulary

    assert differences(vocabulary(model_pair / "target"), vocabulary(model_pair / "draft")) == []


@pytest.mark.parametrize(("threshold", "said"), [("0", "0"), ("-0.05", "-0.05"), (".inf", "inf")])
def test_a_spread_limit_not_above_zero_is_refused_with_its_line(tmp_path, model_pair,
                                                               threshold, said):
    """cv_threshold 0 sets aside every config of two or more trials on a quiet node (every
    verdict 'decided through the noise'); a negative one writes a spread limit the boundary
    refuses; an infinite one is no number. Each stops when the plan is read, at its line."""
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, extra=f"  cv_threshold: {threshold}"))
    line = next(i for i, ln in enumerate(plan.read_text().splitlines(), 1)
                if "cv_threshold" in ln)
    with pytest.raises(ConfigError, match=r"cv_threshold: the decode tok/s spread over which "
                                          r"a config's repetitions are set aside, above 0 "
                                          rf"\(0.10 is 10%\), got {said}") as e:
        load_plan(plan)
    assert (e.value.path, e.value.line) == (str(plan), line)


def test_a_spread_limit_in_range_reaches_the_job(tmp_path, model_pair):
    plan = tmp_path / "plan.yml"
    # a limit over 100% sets nothing aside (a spread can pass 100%): allowed
    plan.write_text(plan_text(model_pair, extra="  cv_threshold: 5"))
    doc = json.loads(write_lock(load_plan(plan), lambda m: None).read_text())
    assert doc["job"]["cv_threshold"] == 5
