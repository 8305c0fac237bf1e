"""Quantisation tiers: made by mlx-lm's own conversion, recorded with their source, named
in every run's identity, never pooled."""

import json
import random
import shutil

from click.testing import CliRunner

from agent.checks import quant_tier
from agent.fingerprint import fingerprint
from orchestrator.cli import main
from orchestrator.review.rules import load_rules
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.test_weekly_review import NOW, W19, W20


def test_quantize_writes_a_recorded_tier_that_mlx_lm_loads(model_pair, tmp_path):
    src = tmp_path / "draft"
    shutil.copytree(model_pair / "draft", src)
    out = tmp_path / "draft-4bit"
    r = CliRunner().invoke(main, ["models", "quantize", str(src), str(out), "--bits", "4",
                                  "--json"])
    assert r.exit_code == 0, r.output
    record = json.loads(r.stdout)
    assert record["tier"] == quant_tier(out) == "4-bit g64"
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 4
    tier = json.loads((out / "specfleet-tier.json").read_text())
    assert tier["source_fingerprint"] == fingerprint(src) and tier["group_size"] == 64
    assert record["fingerprint"] == fingerprint(out) != fingerprint(src)
    assert quant_tier(src) == "unquantised"
    from mlx_lm import generate, load

    model, tok = load(str(out))
    assert isinstance(generate(model, tok, "def f(x):", max_tokens=4), str)
    # refusals, each one line: another bit width, a tier of a tier, an existing folder
    bad = [(["--bits", "7"], "quantises to 2, 3, 4, 5, 6, 8 bits"),
           (["--bits", "4"], "exists; choose a new folder")]
    for extra, words in bad:
        r = CliRunner().invoke(main, ["models", "quantize", str(src), str(out), *extra])
        assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["models", "quantize", str(out), str(tmp_path / "x"),
                                  "--bits", "2"])
    assert r.exit_code == 1 and "is already quantised (4-bit g64)" in r.output
    # a plan with the 4-bit draft locks it with its tier and where it came from
    from tests.locks import plan_text

    pair = tmp_path / "pair"
    shutil.copytree(model_pair, pair)
    shutil.rmtree(pair / "draft")
    shutil.copytree(out, pair / "draft")
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(pair))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    lock = json.loads((tmp_path / "plan.lock.json").read_text())
    assert lock["models"]["draft"]["tier"] == {"tier": "4-bit g64", "bits": 4, "group_size": 64,
                                               "source_fingerprint": fingerprint(src),
                                               "mlx_lm": tier["mlx_lm"]}
    assert lock["models"]["target"]["tier"] == {"tier": "unquantised"}


def test_a_tier_change_is_an_identity_change_never_pooled(tmp_path):
    """Last week the draft was 8-bit, this week 4-bit: the regression names the tier, and
    this week's numbers come from the 4-bit runs only."""
    rng = random.Random(6)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    common = dict(node="mac-01", chip="Apple M4", pair="p", workload="code")
    for at in week_nights(W19):
        night(store, at, **common, identity={"draft_quant": "8-bit g64",
                                             "draft_fingerprint": "sha256:" + "8" * 64},
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 3): V(140.0, acceptance=0.7, rng=rng)})
    for at in week_nights(W20):
        night(store, at, **common, identity={"draft_quant": "4-bit g64",
                                             "draft_fingerprint": "sha256:" + "4" * 64},
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 3): V(120.0, acceptance=0.6, rng=rng)})
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    assert s["identity"]["draft_quant"] == "4-bit g64"
    (spec,) = [c for c in s["configs"] if c["mode"] == "speculative"]
    assert spec["decode_p50"] < 125  # only the 4-bit runs
    (reg,) = [r for r in s["regressions"] if r["config"] == "speculative k=3"
              and r["period"] == "week over week"]
    assert "draft tier 8-bit g64 → 4-bit g64" in reg["cause"]
