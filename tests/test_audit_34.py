"""Audit of issue 34 (calibration pairs): hostile drafts and folders, hand-edited records,
a calibration series beside a real pair of the same name, the policy's marker and the
instrument check's edges. Plain tests are guards that held; strict xfails name gaps."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.calibrate import predicted_speedup
from agent.fingerprint import fingerprint
from orchestrator.calibration import CALIBRATION_FILE, calibrate, calibration_of
from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.instrument import judge
from orchestrator.review.rules import load_rules
from orchestrator.review.verdict import MIN_RUNS, policy
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import config_values, lock_doc, night, week_nights
from tests.store_templates import fresh_sqlite
from tests.test_calibration_review import CAL_FP, CAL_LOCK, MONDAY, WEEK

ROOT = Path(__file__).resolve().parents[1]
QUIET = dict(log=lambda m: None)


def _draft_copy(model_pair: Path, dst: Path, *, tokenizer: bool = True) -> Path:
    shutil.copytree(model_pair / "draft", dst)
    if not tokenizer:
        for f in dst.glob("tokenizer*"):
            f.unlink()
    return dst


# --- the builder against careless users and hostile folders ---------------------------

def test_a_folder_that_is_no_mlx_llama_draft_is_refused_and_nothing_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    noweights = tmp_path / "noweights"
    noweights.mkdir()
    (noweights / "config.json").write_text(json.dumps({"model_type": "llama",
                                                       "num_hidden_layers": 2}))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    for i, d in enumerate((empty, other, noweights, garbage)):
        out = tmp_path / f"out{i}"
        with pytest.raises(ConfigError):
            calibrate(d, out, layers=3, **QUIET)
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()


@pytest.mark.xfail(strict=True, reason="audit 34: a draft without a tokenizer gives a target "
                   "without one (mlx-lm cannot load it as a target); the builder copies "
                   "whatever tokenizer files exist and writes the target anyway")
def test_a_draft_without_a_tokenizer_is_refused(model_pair, tmp_path):
    d = _draft_copy(model_pair, tmp_path / "draft", tokenizer=False)
    with pytest.raises(ConfigError):
        calibrate(d, tmp_path / "cal", layers=3, **QUIET)
    assert not (tmp_path / "cal").exists()


def test_out_existing_with_other_files_is_refused_and_left_untouched(model_pair, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="exists"):
        calibrate(model_pair / "draft", out, layers=3, **QUIET)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.xfail(strict=True, reason="audit 34: calibrate() clears OUT.partial with "
                   "rmtree(ignore_errors) before writing: a user's folder of that name is "
                   "deleted without a word")
def test_a_users_folder_named_like_the_scratch_folder_is_not_deleted(model_pair, tmp_path):
    mine = tmp_path / "cal.partial"
    mine.mkdir()
    (mine / "thesis.tex").write_text("months of work")
    calibrate(model_pair / "draft", tmp_path / "cal", layers=3, **QUIET)
    assert (mine / "thesis.tex").read_text() == "months of work"


def test_out_inside_the_draft_leaves_the_drafts_identity_alone(model_pair, tmp_path):
    d = _draft_copy(model_pair, tmp_path / "draft")
    before = fingerprint(d)
    record = calibrate(d, d / "cal", layers=3, **QUIET)
    assert fingerprint(d) == before == record["draft_fingerprint"]
    assert calibration_of(d / "cal") == record
    assert calibration_of(d) is None  # the draft did not become a calibration


def test_out_equal_to_the_draft_is_refused(model_pair, tmp_path):
    d = _draft_copy(model_pair, tmp_path / "draft")
    before = sorted(p.name for p in d.iterdir())
    with pytest.raises(ConfigError, match="exists"):
        calibrate(d, d, layers=3, **QUIET)
    assert sorted(p.name for p in d.iterdir()) == before


@pytest.mark.parametrize("args", [["--layers", "0"], ["--layers", "-1"], ["--layers", "x"],
                                  ["--acceptance", "0"], ["--acceptance", "1.5"],
                                  ["--acceptance", "-0.1"],
                                  ["--acceptance", "inf"]])
def test_out_of_range_arguments_are_usage_errors(model_pair, tmp_path, args):
    out = tmp_path / "cal"
    r = CliRunner().invoke(main, ["models", "calibrate", str(model_pair / "draft"), str(out),
                                  *args])
    assert r.exit_code == 2, r.output
    assert not out.exists()


def test_nan_acceptance_is_refused_with_its_name_and_nothing_written(model_pair, tmp_path):
    # click's FloatRange lets NaN through (every compare is false); the builder refuses it
    r = CliRunner().invoke(main, ["models", "calibrate", str(model_pair / "draft"),
                                  str(tmp_path / "cal"), "--acceptance", "nan"])
    assert r.exit_code != 0 and "--acceptance nan" in r.output
    assert not (tmp_path / "cal").exists()
    for a in (math.nan, 0.0, 1.5, -1.0, math.inf):
        with pytest.raises(ConfigError):
            calibrate(model_pair / "draft", tmp_path / "cal", layers=3, acceptance=a, **QUIET)
    assert not (tmp_path / "cal").exists()


def test_layers_not_above_the_drafts_are_refused(model_pair, tmp_path):
    r = CliRunner().invoke(main, ["models", "calibrate", str(model_pair / "draft"),
                                  str(tmp_path / "cal"), "--layers", "2"])
    assert r.exit_code != 0 and "already has 2 layers" in r.output
    assert not (tmp_path / "cal").exists()


@pytest.mark.xfail(strict=True, reason="audit 34: --layers has no upper bound: a typo "
                   "(--layers 3200000) starts growing millions of layers in memory instead of "
                   "being refused up front")
def test_a_huge_layer_count_is_refused_before_any_weight_is_grown(model_pair, tmp_path):
    # a child with its memory capped and a deadline: the current code must not take the
    # shared machine down while it fails
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30));"
            "from orchestrator.cli import main; sys.argv[0] = 'specfleet'; main()")
    try:
        r = subprocess.run([sys.executable, "-c", code, "models", "calibrate",
                            str(model_pair / "draft"), str(tmp_path / "cal"), "--layers",
                            "3200000"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("still growing after 60 s")
    assert r.returncode != 0 and "--layers 3200000" in r.stderr, r.stderr[-500:]
    assert "Traceback" not in r.stderr, r.stderr[-500:]
    assert not (tmp_path / "cal").exists()


def test_same_inputs_same_fingerprint_different_inputs_different(model_pair, tmp_path):
    a = calibrate(model_pair / "draft", tmp_path / "a", layers=3, **QUIET)
    b = calibrate(model_pair / "draft", tmp_path / "b", layers=3, **QUIET)
    c = calibrate(model_pair / "draft", tmp_path / "c", layers=4, **QUIET)
    assert a["fingerprint"] == b["fingerprint"] == fingerprint(tmp_path / "a")
    assert a["key"] == b["key"] and c["key"] != a["key"]
    assert c["fingerprint"] != a["fingerprint"]
    # a different draft (one weight byte changed) gives a different target and record
    d = _draft_copy(model_pair, tmp_path / "draft2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg.get("rms_norm_eps", 1e-5) * 2
    (d / "config.json").write_text(json.dumps(cfg))
    e = calibrate(d, tmp_path / "e", layers=3, **QUIET)
    assert e["draft_fingerprint"] != a["draft_fingerprint"] and e["fingerprint"] != \
        a["fingerprint"]


# --- a record edited by hand ----------------------------------------------------------

def _edit(folder: Path, **changes) -> None:
    path = folder / CALIBRATION_FILE
    record = json.loads(path.read_text())
    for k, v in changes.items():
        if k == "noise_scale":
            record["construction"]["noise_scale"] = v
        else:
            record[k] = v
    path.write_text(json.dumps(record))


def test_a_record_with_a_wrong_fingerprint_marks_nothing(model_pair, tmp_path):
    calibrate(model_pair / "draft", tmp_path / "cal", layers=3, **QUIET)
    _edit(tmp_path / "cal", fingerprint="sha256:" + "0" * 64)
    assert calibration_of(tmp_path / "cal") is None


@pytest.mark.xfail(strict=True, reason="audit 34: the record is not checked against itself: "
                   "a perturbed pair (noise scale > 0) whose record is edited to claim "
                   "acceptance 1.0 'by construction' is accepted as an exact pair (the record "
                   "file is outside the fingerprint, so the weights still match)")
def test_a_perturbed_pair_claiming_acceptance_one_is_no_calibration(model_pair, tmp_path):
    calibrate(model_pair / "draft", tmp_path / "cal", layers=3, **QUIET)
    _edit(tmp_path / "cal", noise_scale=0.05)  # what a perturbed pair's record says
    assert calibration_of(tmp_path / "cal") is None


def _perturbed(model_pair: Path, tmp_path: Path) -> Path:
    """An exact pair's folder whose added layer's residual writes were swapped for noise
    (a hostile edit), with its record's fingerprint updated to match the new weights."""
    from orchestrator.calibration import _load_draft, _write, grow

    exact = tmp_path / "exact"
    calibrate(model_pair / "draft", exact, layers=3, **QUIET)
    config, weights = _load_draft(model_pair / "draft")
    out = tmp_path / "hostile"
    _write(out, model_pair / "draft", *grow(config, weights, 3, scale=0.05))
    record = json.loads((exact / CALIBRATION_FILE).read_text())
    record["fingerprint"] = fingerprint(out)
    (out / CALIBRATION_FILE).write_text(json.dumps(record))
    return out


@pytest.mark.xfail(strict=True, reason="audit 34: a record saying 'noise scale 0, acceptance "
                   "1.0 by construction' is taken on its word: weights whose added layers "
                   "write noise (fingerprint updated) are marked an exact calibration pair")
def test_weights_that_are_not_the_construction_are_no_exact_calibration(model_pair,
                                                                        tmp_path):
    assert calibration_of(_perturbed(model_pair, tmp_path)) is None


def test_the_exact_pairs_own_record_still_marks_it(model_pair, tmp_path):
    record = calibrate(model_pair / "draft", tmp_path / "cal", layers=4, **QUIET)
    assert calibration_of(tmp_path / "cal") == record


@pytest.mark.xfail(strict=True, reason="audit 34: --acceptance 0.999 on the demo draft picks "
                   "noise scale 0.002, whose measured acceptance on the shipped prompts was "
                   "1.0, and records expected acceptance 1.0 for a perturbed pair (nearer "
                   "0.999 than the 0.9873 measured at 0.00355): a noisy target passes for "
                   "an exact one")
def test_a_perturbed_pair_never_records_acceptance_one(model_pair, tmp_path):
    record = calibrate(model_pair / "draft", tmp_path / "cal", layers=3, acceptance=0.999,
                       **QUIET)
    assert record["construction"]["noise_scale"] > 0
    assert record["expected_acceptance"] < 1.0
    assert record["measured"]["asked"] == 0.999


# --- a calibration series and a real pair of the same name ------------------------------

def _same_names(tmp_path, *, calibration_last: bool) -> dict:
    store = open_store(fresh_sqlite(tmp_path / "r.db"))
    lock = lock_doc("demo-calibration", CAL_LOCK["models"])
    common = dict(node="mac-a", chip="Apple M2", workload="code", pair="target / draft")
    for at in week_nights(MONDAY, 3):
        cal_at, real_at = (at + timedelta(minutes=5), at) if calibration_last else \
            (at, at + timedelta(minutes=5))
        night(store, cal_at, **common, identity={"target_fingerprint": CAL_FP}, lock=lock,
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=1.0)})
        night(store, real_at, **common,
              configs={("baseline", 0): config_values(300.0),
                       ("speculative", 4): config_values(180.0, acceptance=0.5)})
    return analyse(store, WEEK, load_rules(), now=MONDAY + timedelta(days=6))


@pytest.mark.xfail(strict=True, reason="audit 34: a series is keyed by names (chip, pair, "
                   "workload, bucket, engine): a calibration target swept under a real pair's "
                   "name shares its series, so one of the two weeks disappears behind the "
                   "other's latest run (and the section is marked by whichever ran last)")
@pytest.mark.parametrize("calibration_last", [False, True])
def test_a_calibration_and_a_real_pair_of_one_name_are_two_series(tmp_path,
                                                                  calibration_last):
    a = _same_names(tmp_path, calibration_last=calibration_last)
    marked = [s for s in a["series"] if s.get("calibration")]
    real = [s for s in a["series"] if not s.get("calibration")]
    assert len(marked) == 1 and len(real) == 1
    assert real[0]["verdict"]["decision"] == "keep autoregressive"
    assert marked[0]["verdict"]["decision"] == "production candidate"


def test_a_shared_name_never_switches_on_a_real_pair_from_calibration_numbers(tmp_path):
    """What held: whichever pair ran last, no real (unmarked) policy entry is switched on
    and a calibration entry is only there when asked."""
    for last in (False, True):
        (tmp_path / str(last)).mkdir()
        a = _same_names(tmp_path / str(last), calibration_last=last)
        for p in policy(a)["series"]:
            assert not p.get("calibration") and p["speculation"] is False, p


# --- the policy: asked-in calibration series ---------------------------------------------

def _cal_week(tmp_path, nights: int, **kw) -> dict:
    store = open_store(fresh_sqlite(tmp_path / "p.db"))
    lock = lock_doc("demo-calibration", CAL_LOCK["models"])
    for at in week_nights(MONDAY, nights):
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", identity={"target_fingerprint": CAL_FP},
              lock=lock, **kw)
    return analyse(store, WEEK, load_rules(), now=MONDAY + timedelta(days=6))


def test_an_asked_calibration_series_that_failed_a_gate_is_never_switched_on(tmp_path):
    # acceptance 0.2 is below every floor the gates know: width 4 is 2.4x but fails
    a = _cal_week(tmp_path, 1, configs={
        ("baseline", 0): config_values(40.0),
        ("speculative", 4): config_values(96.0, acceptance=0.2)})
    [s] = a["series"]
    assert s["calibration"] and s["verdict"]["decision"] != "production candidate"
    [p] = policy(a, calibration=True)["series"]
    assert p["calibration"] is True and p["speculation"] is False and \
        p["num_draft_tokens"] is None
    assert policy(a)["series"] == []


def test_an_asked_calibration_series_whose_runs_were_all_set_aside_is_off(tmp_path):
    a = _cal_week(tmp_path, 2, unreliable="contended: other processes used 60% of the CPU",
                  configs={("baseline", 0): config_values(40.0),
                           ("speculative", 4): config_values(96.0, acceptance=1.0)})
    [s] = a["series"]
    assert s["verdict"]["decision"] == "needs more data"
    [p] = policy(a, calibration=True)["series"]
    assert p["speculation"] is False and p["calibration"] is True
    assert "candidate" not in p


@pytest.mark.parametrize("nights", [1, 2, 3])
def test_the_provisional_marker_is_there_exactly_when_nights_are_short(tmp_path, nights):
    a = _cal_week(tmp_path, nights, configs={
        ("baseline", 0): config_values(40.0),
        ("speculative", 4): config_values(96.0, acceptance=1.0)})
    [p] = policy(a, calibration=True)["series"]
    assert p["speculation"] is True and p["num_draft_tokens"] == 4
    if nights < MIN_RUNS:
        assert p["provisional"] == {"nights": nights, "needed": MIN_RUNS}
    else:
        assert "provisional" not in p
    # a reader of the JSON tells the calibration entry apart without the series name
    assert json.loads(json.dumps(p))["calibration"] is True


def test_a_policy_reader_tells_a_real_entry_from_a_calibration_one(tmp_path):
    """Every entry of an asked-in policy says which it is: the real pair's has no
    ``calibration`` key, the calibration's has ``true`` (a consumer reads one key)."""
    from tests.test_calibration_review import _plant

    store = open_store(fresh_sqlite(tmp_path / "c.db"))
    _plant(store, 1)
    a = analyse(store, WEEK, load_rules(), now=MONDAY + timedelta(days=6))
    by = {p["model_pair"]: p for p in json.loads(json.dumps(policy(a, True)))["series"]}
    assert by["grown-32 (calibration) / draft"]["calibration"] is True
    assert "calibration" not in by["target / draft"]
    assert by["target / draft"]["speculation"] is False


# --- the instrument check's edges --------------------------------------------------------

COSTS = {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {3: 26.0}}  # k=2 predicts 2.00x
OK_LOOP = {"ratio": 0.99, "bare_tok_s": 100.0, "agent_tok_s": 99.0}


def _gens(base: list[float], spec: list[float], k: int = 2) -> list[dict]:
    ids = [1, 2, 3]
    out = [{"mode": "baseline", "workload": "code", "num_draft_tokens": 0,
            "decode_tok_s": b, "token_ids": ids, "unreliable": False} for b in base]
    out += [{"mode": "speculative", "workload": "code", "num_draft_tokens": k,
             "decode_tok_s": s, "drafted_tokens": 10, "accepted_tokens": 10,
             "token_ids": ids, "unreliable": False} for s in spec]
    return out


@pytest.mark.xfail(strict=True, reason="audit 34: 'within 10%' is decided by a float "
                   "compare: a speedup exactly 10% above its prediction is off (1.1 - 1 > 0.1 "
                   "in binary) while exactly 10% below is ok")
def test_exactly_ten_percent_off_either_side_is_judged_alike(tmp_path):
    assert predicted_speedup(COSTS, 2) == 2.0
    over = judge("n", _gens([50.0] * 3, [110.0] * 3), COSTS, OK_LOOP)   # 2.2x: +10%
    under = judge("n", _gens([50.0] * 3, [90.0] * 3), COSTS, OK_LOOP)   # 1.8x: -10%
    assert over.status == under.status == "ok", (over.line, under.line)


def test_a_node_is_one_line(tmp_path):
    for g in (_gens([50.0] * 3, [100.0] * 3), _gens([50.0] * 3, [150.0] * 3), []):
        c = judge("mac-a", g, COSTS, OK_LOOP)
        assert "\n" not in c.line and c.line.startswith("mac-a: instrument ")


@pytest.mark.xfail(strict=True, reason="audit 34: without the node's alternating rounds "
                   "(an older agent's reply), the sweep's medians are judged with no look at "
                   "their spread: repetitions at 20, 50 and 80 tok/s read 'instrument ok'")
def test_noisy_sweep_timings_without_rounds_are_unverified_never_ok():
    # medians 50 and 100 tok/s: exactly the predicted 2.00x, but each side's repetitions
    # span ±60% of their median — noise the 10% check cannot resolve
    c = judge("n", _gens([20.0, 50.0, 80.0], [40.0, 100.0, 160.0]), COSTS, OK_LOOP)
    assert c.status == "unverified", c.line


def test_too_noisy_rounds_are_unverified_never_ok():
    p = predicted_speedup(COSTS, 2)
    speed = {2: {"rounds": 5, "predicted": p, "measured": p, "ratio": 1.0,
                 "spread": [0.7, 1.3]}}
    c = judge("n", _gens([50.0] * 3, [100.0] * 3), COSTS, OK_LOOP, speed)
    assert c.status == "unverified" and "too noisy" in c.line
