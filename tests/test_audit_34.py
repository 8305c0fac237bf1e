"""Audit of issue 34 (calibration pairs): hostile drafts and folders, hand-edited records,
a calibration series beside a real pair of the same name, the policy's marker and the
instrument check's edges. Plain tests are guards that held; strict xfails name gaps."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.calibrate import predicted_speedup
from agent.fingerprint import fingerprint
from orchestrator.calibration import CALIBRATION_FILE, calibrate, calibration_of
from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.instrument import TOLERANCE, judge
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


def test_a_draft_without_a_tokenizer_is_refused(model_pair, tmp_path):
    # audit 34 (fixed): a draft without a tokenizer gave a target without one (mlx-lm cannot
    # load it)
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


def test_a_users_folder_named_like_the_scratch_folder_is_not_deleted(model_pair, tmp_path):
    # audit 34 (fixed): calibrate() cleared OUT.partial with rmtree(ignore_errors): a user's
    # folder of that name was deleted
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


def test_a_huge_layer_count_is_refused_before_any_weight_is_grown(model_pair, tmp_path):
    # audit 34 (fixed): --layers had no bound: 3200000 grew layers until the process died
    # (SIGSEGV under a 6 GiB cap)
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


def test_a_perturbed_pair_claiming_acceptance_one_is_no_calibration(model_pair, tmp_path):
    # audit 34 (fixed): a record claiming acceptance 1.0 beside noise scale > 0 was accepted
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


def test_weights_that_are_not_the_construction_are_no_exact_calibration(model_pair,
                                                                        tmp_path):
    # audit 34 (fixed): an exact record was taken on its word: noisy added layers
    # (fingerprint updated) passed as exact
    assert calibration_of(_perturbed(model_pair, tmp_path)) is None


def test_the_exact_pairs_own_record_still_marks_it(model_pair, tmp_path):
    record = calibrate(model_pair / "draft", tmp_path / "cal", layers=4, **QUIET)
    assert calibration_of(tmp_path / "cal") == record


def test_a_perturbed_pair_never_records_acceptance_one(model_pair, tmp_path):
    # audit 34 (fixed): --acceptance 0.999 recorded expected acceptance 1.0 for noise scale 0.002
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


@pytest.mark.parametrize("calibration_last", [False, True])
def test_a_calibration_and_a_real_pair_of_one_name_are_two_series(tmp_path,
                                                                  calibration_last):
    # audit 34 (fixed): a series was keyed by names (chip, pair, workload, bucket, engine):
    # a calibration target swept under a real pair's name shared its series, one of the two
    # weeks hidden behind the other's latest run; the lock's record is now part of the key
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


def test_exactly_ten_percent_off_either_side_is_judged_alike(tmp_path):
    # audit 34 (fixed): exactly +10% was 'off' and -10% 'ok' (1.1 - 1 > 0.1 in binary)
    assert predicted_speedup(COSTS, 2) == 2.0
    over = judge("n", _gens([50.0] * 3, [110.0] * 3), COSTS, OK_LOOP)   # 2.2x: +10%
    under = judge("n", _gens([50.0] * 3, [90.0] * 3), COSTS, OK_LOOP)   # 1.8x: -10%
    assert over.status == under.status == "ok", (over.line, under.line)


def test_a_node_is_one_line(tmp_path):
    for g in (_gens([50.0] * 3, [100.0] * 3), _gens([50.0] * 3, [150.0] * 3), []):
        c = judge("mac-a", g, COSTS, OK_LOOP)
        assert "\n" not in c.line and c.line.startswith("mac-a: instrument ")


def test_noisy_sweep_timings_without_rounds_are_unverified_never_ok():
    # audit 34 (fixed): without rounds, repetitions at 20/50/80 tok/s read 'instrument ok'
    # medians 50 and 100 tok/s: exactly the predicted 2.00x, but each side's repetitions
    # span ±60% of their median — noise the 10% check cannot resolve
    c = judge("n", _gens([20.0, 50.0, 80.0], [40.0, 100.0, 160.0]), COSTS, OK_LOOP)
    assert c.status == "unverified", c.line


def test_too_noisy_rounds_are_unverified_never_ok():
    p = predicted_speedup(COSTS, 2)
    speed = {2: {"rounds": 5, "predicted": p, "measured": p, "ratio": 1.0,
                 "spread": [0.7, 1.3], "ratios": [0.7, 0.7, 1.0, 1.3, 1.3]}}
    c = judge("n", _gens([50.0] * 3, [100.0] * 3), COSTS, OK_LOOP, speed)
    assert c.status == "unverified" and "too noisy" in c.line


@settings(max_examples=300, deadline=None)
@given(base=st.lists(st.floats(10, 100), min_size=1, max_size=5),
       spec=st.lists(st.floats(10, 300), min_size=1, max_size=5))
def test_any_sweep_without_rounds_is_ok_exactly_when_its_medians_agree_and_its_noise_is_small(
        base, spec):
    """Worked out beside the code: each side's spread is (max - min) / median; the speed is
    judged only when the two spreads sum to at most twice the tolerance, and then it is off
    exactly when the median speedup misses the predicted 2.00x by more than 10%."""
    spread = sum((max(x) - min(x)) / statistics.median(x) for x in (base, spec))
    off = statistics.median(spec) / statistics.median(base) / 2.0 - 1
    if min(abs(spread - 2 * TOLERANCE), abs(abs(off) - TOLERANCE)) < 1e-6:
        return  # at the edge floating point decides
    c = judge("n", _gens(base, spec), COSTS, OK_LOOP)
    quiet = spread <= 2 * TOLERANCE
    assert (c.status == "ok") == (quiet and abs(off) <= TOLERANCE), c.line
    assert (c.status == "off") == (quiet and abs(off) > TOLERANCE), c.line
    assert (c.status == "unverified") == (not quiet) and "\n" not in c.line


@pytest.fixture(scope="module")
def exact_pair(model_pair, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exact") / "cal"
    calibrate(model_pair / "draft", out, layers=4, **QUIET)
    return out


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layer=st.sampled_from([2, 3]), write=st.sampled_from([0, 1]),
       where=st.floats(0, 1, exclude_max=True), byte=st.integers(1, 255))
def test_any_nonzero_byte_in_an_added_residual_write_unmarks_an_exact_pair(
        exact_pair, tmp_path, layer, write, where, byte):
    """Flip one byte of an added layer's residual write (and update the record's fingerprint,
    as a hostile edit would): the exact pair's known answer no longer holds, so it is no
    calibration; the untouched copy still is one."""
    import struct

    d = tmp_path / f"c{layer}{write}{byte}{int(where * 1e6)}"
    shutil.copytree(exact_pair, d)
    assert calibration_of(d) is not None
    f = d / "model.safetensors"
    raw = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = f"model.layers.{layer}." + ("self_attn.o_proj.weight", "mlp.down_proj.weight")[write]
    a, b = header[name]["data_offsets"]
    raw[8 + n + a + int(where * (b - a))] = byte
    f.write_bytes(bytes(raw))
    record = json.loads((d / CALIBRATION_FILE).read_text())
    record["fingerprint"] = fingerprint(d)
    (d / CALIBRATION_FILE).write_text(json.dumps(record))
    assert calibration_of(d) is None


# --- compare and the site: is a calibration pair marked there? -------------------------

def _two_weeks(tmp_path) -> tuple:
    """A calibration pair (its lock marks the target) and a real pair, under names that do
    not say which is which, one night in each of two weeks."""
    store = open_store(fresh_sqlite(tmp_path / "w.db"))
    lock = lock_doc("demo-calibration", CAL_LOCK["models"])
    for at in (MONDAY - timedelta(days=7) + timedelta(hours=2), MONDAY + timedelta(hours=2)):
        common = dict(node="mac-a", chip="Apple M2", workload="code")
        night(store, at, pair="grown / draft", **common,
              identity={"target_fingerprint": CAL_FP}, lock=lock,
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=1.0)})
        night(store, at + timedelta(minutes=5), pair="target / draft", **common,
              configs={("baseline", 0): config_values(300.0),
                       ("speculative", 4): config_values(180.0, acceptance=0.5)})
    return store


def test_compare_marks_the_calibration_pairs_rows(tmp_path):
    # audit 34 (fixed): compare rows carried no calibration mark (compare never read the lock)
    from orchestrator.review.compare import compare

    c = compare(_two_weeks(tmp_path), "2026-W09", "2026-W10")
    cal = [r for r in c["rows"] if r["pair"] == "grown / draft"]
    real = [r for r in c["rows"] if r["pair"] == "target / draft"]
    assert cal and real  # two pairs a side: one row each, never pooled (this held)
    assert all(r.get("calibration") == ["A", "B"] for r in cal)
    assert not any(r.get("calibration") for r in real)
    from orchestrator.review.compare import as_text

    text = as_text(c).splitlines()
    assert all(("calibration pair: A/B" in line) == ("grown / draft" in line) for line in text
               if "speculative k=4" in line or "baseline" in line)


def test_compare_never_pools_two_differently_named_pairs(tmp_path):
    from orchestrator.review.compare import compare

    c = compare(_two_weeks(tmp_path), "2026-W09", "2026-W10")
    spec = {r["pair"]: r for r in c["rows"] if r["config"] == "speculative k=4"
            and r["metric"] == "decode_tok_s"}
    assert spec["grown / draft"]["a"] == pytest.approx(96.0, rel=0.05)
    assert spec["target / draft"]["a"] == pytest.approx(180.0, rel=0.05)


def test_the_site_marks_a_stale_calibration_series(tmp_path):
    # audit 34 (fixed): the site's index marked a calibration series only through the
    # week's verdict text: a week later (stale) its row said nothing of calibration
    from orchestrator.review.site import write_site

    store = _two_weeks(tmp_path)
    index = write_site(store, tmp_path / "site", week="2026-W12",
                       now=MONDAY + timedelta(days=20))
    html = index.read_text()
    row = html[html.index("grown"):][:2000]
    assert "calibration" in row.lower()
    rows = {r.split('"', 1)[0]: r.split("</tr>")[0] for r in html.split('<tr data-label="')[1:]}
    [cal] = [r for label, r in rows.items() if "grown" in label]
    [real] = [r for label, r in rows.items() if "target / draft" in label]
    assert 'data-calibration="yes"' in cal and "calibration pair" in cal
    assert "calibration" not in real


# --- a hand-edited record at plan lock ----------------------------------------------------

@pytest.mark.parametrize("edit", ["fingerprint", "noise"])
def test_the_lock_refuses_a_calibration_record_that_no_longer_holds(model_pair, tmp_path, edit):
    """A target carrying a record that does not hold (wrong fingerprint; acceptance 1.0
    claimed beside noise) would be swept as a model, unmarked: its series could then reach
    the policy as a real pair's. `plan lock` refuses it at the plan's line for the folder,
    as every other bad setting is, and writes no lock."""
    # audit 34 (fixed): the lock dropped such a record without a word, then only warned
    from tests.locks import plan_text

    pair = tmp_path / "pair"
    shutil.copytree(model_pair / "draft", pair / "draft")
    calibrate(pair / "draft", pair / "target", layers=3, **QUIET)
    if edit == "fingerprint":
        _edit(pair / "target", fingerprint="sha256:" + "0" * 64)
    else:
        _edit(pair / "target", noise_scale=0.05)
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(pair))
    line = plan.read_text().splitlines().index(f"  target: {pair / 'target'}") + 1
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    # what the user reads: where, which file, why
    assert f"{plan}:{line}: models.target: {pair / 'target'}/{CALIBRATION_FILE} does not " \
        "hold: " in r.output, r.output
    why = {"fingerprint": "it records the fingerprint sha256:" + "0" * 64 + ", but the "
           "folder's weights are sha256:", "noise": "it claims expected acceptance 1.0 beside "
           "noise scale 0.05"}[edit]
    assert why in r.output and "specfleet models calibrate" in r.output, r.output
    assert not list(tmp_path.glob("*.lock.json"))


def _layer_bytes(draft: Path) -> int:
    """fp32 bytes of the draft's last decoder layer, read from the safetensors header (the
    size of each added layer, worked out without the builder)."""
    import struct

    raw = (draft / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    last = json.loads((draft / "config.json").read_text())["num_hidden_layers"] - 1
    return sum(math.prod(h["shape"]) * 4 for k, h in header.items()
               if k.startswith(f"model.layers.{last}."))


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.floats(1.01, 1000))
def test_any_layer_count_beyond_this_machines_memory_is_refused_up_front(model_pair, tmp_path,
                                                                         times):
    import os

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    layers = 2 + math.ceil(ram * times / _layer_bytes(model_pair / "draft"))
    with pytest.raises(ConfigError, match=f"--layers {layers}: the added layers alone"):
        calibrate(model_pair / "draft", tmp_path / "cal", layers=layers, **QUIET)
    assert not (tmp_path / "cal").exists()
