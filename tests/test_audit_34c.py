"""Audit 34c: calibration pairs attacked as a hostile node, a careless user and a
statistician would, with inputs written here (a target grown from the committed demo draft,
records forged by hand, planted nights). A strict xfail names what is wrong today, measured;
a plain test is a guard that held (or one fixed by this audit: said in its docstring)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.fingerprint import fingerprint
from orchestrator.calibration import (
    CALIBRATION_FILE,
    calibrate,
    ensure_calibration,
    measure_acceptance,
    shipped_prompts,
)
from orchestrator.calibration_record import calibration_check
from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.instrument import node_reading

QUIET = dict(log=lambda m: None)
WIDTH = 4  # the width a perturbed record's acceptance is measured at (MEASURE_WIDTH)


@pytest.fixture(scope="module")
def grown(model_pair, tmp_path_factory) -> dict[str, Path]:
    """The committed demo draft, an exact target grown to 4 layers and a perturbed one
    (asked for acceptance 0.8), each made by the real builder."""
    root = tmp_path_factory.mktemp("a34c")
    shutil.copytree(model_pair / "draft", root / "draft")
    shutil.copytree(model_pair / "target", root / "real")
    calibrate(root / "draft", root / "exact", layers=4, **QUIET)
    calibrate(root / "draft", root / "perturbed", layers=4, acceptance=0.8, **QUIET)
    return {n: root / n for n in ("draft", "real", "exact", "perturbed")}


def _load(folder: Path):
    from mlx_lm import load

    return load(str(folder))


def _record(folder: Path) -> dict:
    return json.loads((folder / CALIBRATION_FILE).read_text())


def _forge(folder: Path, **fields) -> None:
    """Rewrite the folder's record with ``fields`` (None: removed), its fingerprint the
    folder's own (what anyone with the folder can compute)."""
    path = folder / CALIBRATION_FILE
    record = json.loads(path.read_text()) if path.exists() else {}
    for k, v in fields.items():
        if v is None:
            record.pop(k, None)
        else:
            record[k] = v
    record["fingerprint"] = fingerprint(folder)
    path.write_text(json.dumps(record))


def _plan(tmp_path: Path, target: Path, draft: Path) -> tuple[Path, int]:
    from tests.locks import plan_text

    pair = tmp_path / "pair"
    text = plan_text(pair).replace(f"  target: {pair / 'target'}", f"  target: {target}") \
        .replace(f"  draft: {pair / 'draft'}", f"  draft: {draft}")
    plan = tmp_path / "plan.yml"
    plan.write_text(text)
    return plan, text.splitlines().index(f"  target: {target}") + 1


# --- statistician: what the stale marker compares -------------------------------------

def test_a_perturbed_pair_built_as_recorded_holds_on_each_workload_it_sweeps(grown, tmp_path):
    """Fixed (cal34c, record_holds): the record's 0.80 was pooled over the three shipped
    prompts at width 4 while the review compared one workload over all its widths, so code
    and memo were marked stale though built as recorded. The record now holds the builder's
    acceptance per workload and width (``measured.cells``) and each run is compared with
    its own (workload, width) within a binomial bound. Measured here as a sweep of the
    shipped prompts would (their 160 tokens, widths 1, 2, 4) and planted as a night through
    the real ingest: every series holds and none is unverified."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night
    from tests.store_templates import fresh_sqlite

    record = _record(grown["perturbed"])
    prompts = shipped_prompts()
    cells = {(c["workload"], c["num_draft_tokens"]) for c in record["measured"]["cells"]}
    assert cells == {(p["name"], k) for p in prompts for k in (1, 2, 3, 4, 6, 8)}
    target, tok = _load(grown["perturbed"])
    draft, _ = _load(grown["draft"])
    measured = {k: measure_acceptance(target, draft, tok, prompts, k, 160)["by_prompt"]
                for k in (1, 2, WIDTH)}
    lock = lock_doc("cal", {"target": {"fingerprint": record["fingerprint"],
                                       "calibration": record},
                            "draft": {"fingerprint": record["draft_fingerprint"]}})
    store = open_store(fresh_sqlite(tmp_path / "p.db"))
    at = datetime(2026, 3, 2, 2, tzinfo=timezone.utc)
    for p in prompts:
        night(store, at, node="mac-a", chip="Apple M2", workload=p["name"],
              pair="grown (calibration) / draft", lock=lock, identity={
                  "target_fingerprint": record["fingerprint"], "prompt_sha256":
                  p["prompt_sha256"], "draft_fingerprint": record["draft_fingerprint"]},
              configs={("baseline", 0): config_values(40.0, tokens=160),
                       **{("speculative", k): config_values(
                           96.0, acceptance=measured[k][p["name"]], jitter=0.0, tokens=160)
                          for k in measured}})
    a = analyse(store, "2026-W10", load_rules(), now=at + timedelta(days=5))
    judged = {s["series"]["workload"]: {k: v for k, v in s["calibration"].items()
                                        if k in ("no_longer_holds", "unverified")}
              for s in a["series"]}
    assert judged == {p["name"]: {} for p in prompts}, (record["measured"]["cells"],
                                                         measured, judged)


def _exact_nights(tmp_path, acceptances: list[float]):
    """An exact calibration pair's nights, one per value (its measured acceptance)."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night, week_nights
    from tests.store_templates import fresh_sqlite

    fp, dfp = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    lock = lock_doc("cal", {"target": {"fingerprint": fp, "calibration": {
        "expected_acceptance": 1.0, "fingerprint": fp, "draft_fingerprint": dfp,
        "construction": {"layers": 16, "noise_scale": 0.0}}}, "draft": {"fingerprint": dfp}})
    monday = datetime(2026, 3, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "n.db"))
    for at, acc in zip(week_nights(monday, len(acceptances)), acceptances):
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", lock=lock,
              identity={"target_fingerprint": fp, "draft_fingerprint": dfp},
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=acc)})
    return analyse(store, "2026-W10", load_rules(), now=monday + timedelta(days=6))


def test_an_exact_pair_that_rejected_tokens_on_two_of_five_nights_is_stale(tmp_path):
    """Fixed (cal34c, record_holds): an exact pair that rejected half its drafted tokens on
    2 of 5 nights (planted 1.0, 1.0, 1.0, 0.5, 0.5) held its record (the check read the
    median of the series' runs, 1.0) and, asked into the policy, was switched on. Each night
    is judged now: the two that missed are named, and the series is never switched on."""
    from orchestrator.review.verdict import policy

    a = _exact_nights(tmp_path, [1.0, 1.0, 1.0, 0.5, 0.5])
    [s] = a["series"]
    nights = [n.date().isoformat() for n in week_nights_of(5)]
    assert s["calibration"]["no_longer_holds"] == [
        f"the night of {d} (mac-a) measured acceptance 0.50 on code at width 4, off the "
        "record's 1.00 by more than 0.05" for d in nights[3:]], s["calibration"]
    [p] = policy(a, calibration=True)["series"]
    assert p["speculation"] is False


def week_nights_of(n: int) -> list[datetime]:
    from tests.history import week_nights

    return list(week_nights(datetime(2026, 3, 2, tzinfo=timezone.utc), n))


def test_an_exact_pair_that_measured_its_construction_every_night_holds(tmp_path):
    """Guard: five nights at 1.0 hold the record and the review names the pair as one."""
    a = _exact_nights(tmp_path, [1.0] * 5)
    [s] = a["series"]
    assert s["series"].get("calibration") is True
    assert "no_longer_holds" not in s["calibration"]


# --- careless user: a calibration target that loses its record ------------------------

def test_a_quantised_calibration_target_is_refused_with_what_to_do_instead(grown, tmp_path):
    """Fixed (calibration_record.refuse_quantising): `specfleet models quantize GROWN OUT --bits 4`
    wrote a 4-bit copy with no calibration record, which `plan lock` locked as a real model
    (measured: its acceptance with its draft is 0.82 at width 4, a known-answer instrument's
    win read as a model's). Quantising a calibration target is refused now, nothing
    written, and the message says what to do instead."""
    out = tmp_path / "grown-4bit"
    r = CliRunner().invoke(main, ["models", "quantize", str(grown["exact"]), str(out),
                                  "--bits", "4", "--group-size", "32"])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"{grown['exact']} is a calibration target ({grown['exact']}/{CALIBRATION_FILE}): " \
           "refusing to quantise it." in said, said
    assert "quantise its draft (`specfleet models quantize DRAFT OUT --bits N`)" in said
    assert f"If the folder is a real model's, remove its stray {CALIBRATION_FILE}" in said
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_calibration_target_given_as_the_draft_is_refused(grown, tmp_path):
    """Fixed (lock._calibrations): a calibration target given as the draft (models.draft:
    GROWN beside a real target) was locked, its series a real pair's (unmarked, in the
    policy). Refused now at the plan's line for the draft, and no lock written."""
    plan, _ = _plan(tmp_path, grown["real"], grown["exact"])
    line = plan.read_text().splitlines().index(f"  draft: {grown['exact']}") + 1
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"{plan}:{line}: models.draft: {grown['exact']} is a calibration target" in said
    assert "it has a known answer only as a target: give it as models.target" in said, said
    assert _record(grown["exact"])["draft_fingerprint"] in said
    assert not list(tmp_path.glob("*.lock.json"))


# --- hostile user: forged and copied records ------------------------------------------

def test_an_exact_record_on_weights_whose_draft_layers_were_edited_does_not_hold(grown,
                                                                                tmp_path):
    """Fixed (calibration_record._copied_as_drafts): an exact record was checked only on
    its added layers' residual writes. Forged: the exact 4-layer target with layer 0's
    mlp.down_proj tripled and the record's fingerprint recomputed held and was locked as an
    exact pair, while its measured acceptance with its draft is 0.67 at width 4. The record
    now holds the digest of the tensors copied from the draft, and they must match it."""
    forged = _tripled(grown, tmp_path)
    target, tok = _load(forged)
    draft, _ = _load(grown["draft"])
    acc = measure_acceptance(target, draft, tok, shipped_prompts(), WIDTH, 64)["acceptance"]
    assert acc < 0.95  # planted: the known answer is gone
    record, why = calibration_check(forged)
    assert record is None and "the draft's layers were edited since it was grown" in why, \
        (acc, why)


def test_a_record_whose_draft_digest_was_rewritten_is_refused_by_plan_lock(grown, tmp_path):
    """Fixed (lock._calibrations, calibration_record.draft_holds): the forger rewrites the
    record's digest to fit the edited weights too (anyone can hash a folder); `plan lock`
    hashes the plan's draft itself and refuses at the plan's line, writing no lock."""
    from orchestrator.calibration_record import tensors_digest

    forged = _tripled(grown, tmp_path)
    c = _record(forged)["construction"]
    _forge(forged, construction={**c, "draft_tensors_sha256": tensors_digest(forged, 2)})
    assert calibration_check(forged)[1] is None  # the record alone cannot tell
    plan, line = _plan(tmp_path, forged, grown["draft"])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    said = " ".join(r.output.split())
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"{plan}:{line}: models.target: {forged}/{CALIBRATION_FILE} does not hold: its " \
           f"digest of the draft's tensors is {tensors_digest(forged, 2)}, but the draft " \
           f"{grown['draft']} hashes to {tensors_digest(grown['draft'])}" in said, said
    assert not list(tmp_path.glob("*.lock.json"))


def _tripled(grown, tmp_path: Path) -> Path:
    """The exact target with layer 0's mlp.down_proj tripled, its fingerprint recomputed."""
    import mlx.core as mx

    forged = tmp_path / "forged"
    shutil.copytree(grown["exact"], forged)
    w = mx.load(str(forged / "model.safetensors"))
    w["model.layers.0.mlp.down_proj.weight"] = w["model.layers.0.mlp.down_proj.weight"] * 3
    mx.save_safetensors(str(forged / "model.safetensors"), w, metadata={"format": "mlx"})
    _forge(forged)
    return forged


FORGED = {
    "no acceptance, no noise": dict(expected_acceptance=None, construction={}),
    "acceptance as text": dict(expected_acceptance="1.0", construction={"noise_scale": 0.1}),
    "acceptance as a flag": dict(expected_acceptance=True, construction={"noise_scale": 0.0}),
    "acceptance NaN": dict(expected_acceptance=math.nan, construction={"noise_scale": 0.1}),
    "acceptance above 1": dict(expected_acceptance=1.5, construction={"noise_scale": 0.1}),
    "negative noise": dict(expected_acceptance=0.7, construction={"noise_scale": -0.1}),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_forged_record_on_a_real_model_does_not_hold(grown, tmp_path, case):
    """Fixed by this audit (calibration_record._numbers): a record missing its expected
    acceptance and noise scale held on any weights (neither an exact claim to check nor a
    noise claim to refuse), so a real model carrying one was locked as a calibration target
    whose series could never be stale (no number to drift from) and, asked into the
    policy, was switched on after one night. Every forged number is refused now."""
    real = tmp_path / "real"
    shutil.copytree(grown["real"], real)
    (real / CALIBRATION_FILE).write_text(json.dumps({
        "schema": "specfleet-calibration/1",
        "draft_fingerprint": fingerprint(grown["draft"])}))
    _forge(real, **FORGED[case])
    record, why = calibration_check(real)
    assert record is None and why, (case, why)


def test_a_forged_record_is_refused_by_plan_lock_at_the_plans_line(grown, tmp_path):
    """The lock says which file and why, at the plan's line for the folder (and writes no
    lock)."""
    real = tmp_path / "real"
    shutil.copytree(grown["real"], real)
    (real / CALIBRATION_FILE).write_text(json.dumps({
        "schema": "specfleet-calibration/1", "construction": {},
        "draft_fingerprint": fingerprint(grown["draft"])}))
    _forge(real)
    plan, line = _plan(tmp_path, real, grown["draft"])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert f"{plan}:{line}: models.target: {real}/{CALIBRATION_FILE} does not hold: its " \
           "expected acceptance None is not a number in [0, 1]" in r.output, r.output
    assert not list(tmp_path.glob("*.lock.json"))


def test_a_record_copied_next_to_other_weights_is_refused_at_the_plans_line(grown, tmp_path):
    """Guard: the exact record copied into a real target's folder is refused naming both
    fingerprints (and, fixed by this audit, says how a real model gets rid of it)."""
    real = tmp_path / "real"
    shutil.copytree(grown["real"], real)
    shutil.copyfile(grown["exact"] / CALIBRATION_FILE, real / CALIBRATION_FILE)
    plan, line = _plan(tmp_path, real, grown["draft"])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code != 0, r.output
    assert f"{plan}:{line}: models.target:" in r.output
    assert fingerprint(real) in r.output and _record(grown["exact"])["fingerprint"] in r.output
    # fixed by this audit: the refusal said only "Remake it with `specfleet models
    # calibrate`", advice that fits no real model carrying a stray record
    assert f"if the folder is a real model's, not a calibration target, remove its " \
           f"{CALIBRATION_FILE}" in " ".join(r.output.split()), r.output


def test_the_builders_own_records_still_hold(grown):
    """Guard for the fix: the exact and the perturbed record the builder wrote hold."""
    for name in ("exact", "perturbed"):
        record, why = calibration_check(grown[name])
        assert why is None and record == _record(grown[name]), (name, why)


# --- careless user: the instrument check's cache ----------------------------------------

def test_the_instrument_checks_cache_never_removes_a_users_folder(grown, tmp_path):
    """Fixed by this audit (calibration._replaceable): ``specfleet calibrate --workdir W``
    grows its target at W/calibration-N and removed whatever folder was there when it held
    no matching record (``shutil.rmtree``): a real model, or a perturbed target made with
    `models calibrate` (minutes of measuring). Both are refused now, untouched; an exact
    target of other inputs (regrown from them in seconds) is still replaced."""
    for name in ("real", "perturbed"):
        out = tmp_path / f"{name}-w" / "calibration-4"
        shutil.copytree(grown[name], out)
        before = fingerprint(out)
        with pytest.raises(ConfigError, match="not an exact calibration target"):
            ensure_calibration(grown["draft"], out, 4, **QUIET)
        assert fingerprint(out) == before
    out = tmp_path / "exact-w" / "calibration-4"
    calibrate(grown["draft"], out, layers=3, **QUIET)
    ensure_calibration(grown["draft"], out, 4, **QUIET)
    assert _record(out)["construction"]["layers"] == 4


# --- hostile node: the instrument check's reading --------------------------------------

def _reply(ratio: float, lo: float, hi: float) -> dict:
    return {"costs": {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {"5": 30.0}},
            "overhead": {"ratio": 1.0},
            "speed": {"4": {"rounds": 5, "predicted": 2.0, "measured": 2.0 * ratio,
                            "ratio": ratio, "spread": [lo, hi]}}}


@settings(max_examples=200, deadline=None)
@given(lo=st.floats(0.2, 3.0), width=st.floats(0.0, 0.5), at=st.floats(-1.0, 2.0))
def test_a_nodes_median_ratio_outside_its_own_quartiles_is_refused(lo, width, at):
    """Fixed by this audit (instrument._rounds): a node replying ratio 1.00 with quartiles
    0.50–0.60 (a median outside its own quartiles, impossible for any rounds) was judged
    "instrument ok" on the median. A reading is taken exactly when lo <= ratio <= hi."""
    hi = lo + width
    ratio = lo + at * width if width else lo * (1 + at)
    value, problem = node_reading(_reply(ratio, lo, hi))
    inside = lo * (1 - 1e-9) <= ratio <= hi * (1 + 1e-9)
    assert (value is not None) is inside, (ratio, lo, hi, problem)


def test_a_nodes_impossible_reading_is_not_judged_ok():
    from orchestrator.instrument import judge

    value, problem = node_reading(_reply(1.0, 0.5, 0.6))
    assert value is None and "outside its own quartiles" in problem
    gens = [{"mode": m, "num_draft_tokens": k, "decode_tok_s": v, "drafted_tokens": d,
             "accepted_tokens": d, "token_ids": [1, 2], "workload": "code"}
            for m, k, v, d in (("baseline", 0, 40.0, 0), ("speculative", 4, 80.0, 8))]
    check = judge("mac-a", gens, None, None, None)
    assert check.status != "ok", check.line


# --- the README's commands as written -----------------------------------------------------

def test_the_readmes_calibrate_command_runs_as_written(grown, tmp_path, monkeypatch):
    """Guard: `specfleet models calibrate models/draft models/draft-grown-16 --layers 16`
    from the README's block, in a folder holding models/draft: exit 0, an exact record
    that holds; run again, it refuses the existing folder without touching it."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(grown["draft"], tmp_path / "models" / "draft")
    args = ["models", "calibrate", "models/draft", "models/draft-grown-16", "--layers", "16"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    out = tmp_path / "models" / "draft-grown-16"
    record, why = calibration_check(out)
    assert why is None and record["expected_acceptance"] == 1.0
    assert record["construction"]["added_layers"] == 14
    assert f"expected acceptance 1.0) written to models/draft-grown-16 ({record['fingerprint']})" \
        in r.output
    before = fingerprint(out)
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "exists" in again.output and fingerprint(out) == before


# --- interleaved nights: a target regrown under the same name ----------------------------

def _regrown_nights(tmp_path, order: list[str]):
    """Nights of one calibration pair name whose target was regrown between them: "exact"
    (record 1.0, measured 1.0) or "perturbed" (record 0.80, measured 0.80), other weights."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night, week_nights
    from tests.store_templates import fresh_sqlite

    dfp = "sha256:" + "b" * 64
    kinds = {"exact": ("sha256:" + "a" * 64, 1.0, 0.0, 96.0),
             "perturbed": ("sha256:" + "e" * 64, 0.8, 0.02, 70.0)}
    monday = datetime(2026, 3, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "g.db"))
    for at, kind in zip(week_nights(monday, len(order)), order):
        fp, expected, noise, spec = kinds[kind]
        lock = lock_doc(kind, {"target": {"fingerprint": fp, "calibration": {
            "expected_acceptance": expected, "fingerprint": fp, "draft_fingerprint": dfp,
            "construction": {"layers": 16, "noise_scale": noise}}},
            "draft": {"fingerprint": dfp}})
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", lock=lock,
              identity={"target_fingerprint": fp, "draft_fingerprint": dfp},
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(spec, acceptance=expected)})
    return analyse(store, "2026-W10", load_rules(), now=monday + timedelta(days=6))


@pytest.mark.parametrize("order", [["exact", "exact", "perturbed"],
                                   ["perturbed", "perturbed", "exact"],
                                   ["exact", "perturbed", "exact"]])
def test_a_target_regrown_under_its_name_is_judged_on_its_latest_record_only(tmp_path,
                                                                           order):
    """Guard: the series is judged on the latest night's record and only the nights of its
    weights (the other target's numbers are not pooled in; provisional with their count),
    the identities marked mixed, and the latest record holds for what it measured."""
    a = _regrown_nights(tmp_path, order)
    [s] = a["series"]
    latest = order[-1]
    assert s["calibration"]["expected_acceptance"] == {"exact": 1.0, "perturbed": 0.8}[latest]
    assert "no_longer_holds" not in s["calibration"], s["calibration"]
    assert s["mixed_identities"] is True
    spec = next(c for c in s["configs"] if c["mode"] == "speculative")
    same = order.count(latest)  # the nights of the latest weights (A, B, A: two of A)
    assert spec["runs"] == same
    assert s["verdict"].get("provisional") == {"nights": same, "needed": 3}


# --- what a consumer that ignores the marker still sees -----------------------------------

@pytest.mark.parametrize("source", [None, "meta-llama/Llama-3.2-1B"])
def test_a_calibration_pairs_name_carries_its_mark_even_under_a_real_source(grown, tmp_path,
                                                                           source):
    """Guard: a consumer reading only the pair's name (the review's model_pair, export's
    gen_ai.request.model) still sees "(calibration)": with folder names, and with a plan
    whose models.source names a real hub model."""
    from orchestrator.export.points import target_name
    from orchestrator.sweep.lock import load_lock
    from orchestrator.sweep.pair_names import model_pair_name

    plan, _ = _plan(tmp_path, grown["exact"], grown["draft"])
    if source:
        plan.write_text(plan.read_text().replace("models:\n", f"models:\n  source: {source}\n"))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    name = model_pair_name(load_lock(plan.with_suffix(".lock.json")))
    assert "(calibration)" in name and "(calibration)" in target_name(name, None), name


# --- careless user: odd arguments to the builder ------------------------------------------

@pytest.mark.parametrize("layers,says", [("2", "the draft already has 2 layers"),
                                         ("100000000", "more than this machine's"),
                                         ("1", "1 is not in the range x>=2")])
def test_the_builder_refuses_odd_layer_counts_without_writing(grown, tmp_path, layers, says):
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["models", "calibrate", str(grown["draft"]), str(out),
                                  "--layers", layers])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert says in r.output, r.output
    assert not out.exists() and not list(tmp_path.glob(".out.partial-*"))


# --- hostile node: an identity that steps around the drift check -------------------------

def test_a_node_reporting_a_draft_no_lock_holds_cannot_escape_the_drift_check(tmp_path):
    """Fixed (cal34c, record_holds): acceptance was judged only with the record's draft,
    and any other draft fingerprint was exempt, one no lock held too. Planted: an exact
    pair's node reports the record's target and a draft sha256:00…0 in no lock, measuring
    acceptance 0.30 on 3 nights: the series is stale ("measured another draft") and not
    switched on."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.verdict import policy
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, lock_doc, night, week_nights
    from tests.store_templates import fresh_sqlite

    fp, dfp, other = ("sha256:" + c * 64 for c in "ab0")
    lock = lock_doc("cal", {"target": {"fingerprint": fp, "calibration": {
        "expected_acceptance": 1.0, "fingerprint": fp, "draft_fingerprint": dfp,
        "construction": {"layers": 16, "noise_scale": 0.0}}}, "draft": {"fingerprint": dfp}})
    monday = datetime(2026, 3, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "h.db"))
    for at in week_nights(monday, 3):
        night(store, at, node="mac-a", chip="Apple M2", workload="code",
              pair="grown (calibration) / draft", lock=lock,
              identity={"target_fingerprint": fp, "draft_fingerprint": other},
              configs={("baseline", 0): config_values(40.0),
                       ("speculative", 4): config_values(96.0, acceptance=0.3)})
    a = analyse(store, "2026-W10", load_rules(), now=monday + timedelta(days=6))
    [s] = a["series"]
    assert s["calibration"]["no_longer_holds"] == [
        f"measured another draft: {'0' * 12}, neither the record's ({'b' * 12}) nor any its "
        "sweep's lock holds"], s["calibration"]
    [p] = policy(a, calibration=True)["series"]
    assert p["speculation"] is False


# --- a lineup: whose adaptive stops are the instrument's ----------------------------------

def _lineup_with_a_calibration_target_2(tmp_path):
    """One lineup sweep: a real ``target`` and a calibration ``target-2`` (its lock marks
    only target-2), the draft with each, and one adaptive stop per pair as the agent words
    it (variant ``speculative@T+draft``)."""
    from orchestrator.store import open_store
    from tests.history import config_values, ingest_lines, lock_doc, night
    from tests.store_templates import fresh_sqlite

    real, cal, dfp = ("sha256:" + c * 64 for c in "rcd")
    lock = lock_doc("lineup", {
        "target": {"fingerprint": real}, "draft": {"fingerprint": dfp},
        "target-2": {"fingerprint": cal, "calibration": {
            "expected_acceptance": 1.0, "fingerprint": cal, "draft_fingerprint": dfp,
            "construction": {"layers": 16, "noise_scale": 0.0}}}})
    at = datetime(2026, 3, 2, 2, tzinfo=timezone.utc)
    store = open_store(fresh_sqlite(tmp_path / "l.db"))
    common = dict(node="mac-a", chip="Apple M2", workload="code")
    sid = night(store, at, **common, pair="real / draft", lineup="target+draft", lock=lock,
                identity={"target_fingerprint": real, "draft_fingerprint": dfp},
                configs={("baseline", 0): config_values(300.0),
                         ("speculative", 4): config_values(180.0, acceptance=0.5)})
    night(store, at, **common, pair="grown (calibration) / draft", sweep_id=sid,
          lineup="target-2+draft", identity={"target_fingerprint": cal,
                                             "draft_fingerprint": dfp},
          configs={("baseline", 0): config_values(40.0),
                   ("speculative", 4): config_values(96.0, acceptance=1.0)})
    ingest_lines(store, sid, "mac-a", [
        {"type": "notice", "workload": "code", "variant": f"speculative@{t}+draft",
         "adaptive": True, "repetitions": 4,
         "message": f"adaptive: num_draft_tokens=4 stops repeating: {why}"}
        for t, why in (("target", "slower than the best"),
                       ("target-2", "settled as the best"))], at.timestamp())
    return store, sid


def test_a_lineups_adaptive_stops_are_marked_by_their_own_pair(tmp_path):
    """Fixed (adaptive_stops.marked_stops): in a lineup of a real target and a calibration
    target-2 (planted), the weekly review marked the real pair's stop 'calibration' too (any
    marked role marked every stop of the sweep) and the sweep page marked neither (it looked
    only at the role 'target'). Each stop is marked by its own pair's target now."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.sweep_page import review_data
    from orchestrator.review.weekly import analyse

    store, sid = _lineup_with_a_calibration_target_2(tmp_path)
    a = analyse(store, "2026-W10", load_rules(),
                now=datetime(2026, 3, 8, tzinfo=timezone.utc))
    # the series themselves are marked by pair (the guard that holds)
    assert {s["series"]["model_pair"]: bool(s["calibration"]) for s in a["series"]} == {
        "real / draft": False, "grown (calibration) / draft": True}
    want = {"speculative@target+draft": False, "speculative@target-2+draft": True}
    assert {t["variant"]: t["calibration"] for t in a["adaptive_stops"]} == want
    page = review_data(store, sid)
    assert {t["variant"]: t["calibration"] for t in page["adaptive_stops"]} == want


# --- statistician: what one node's verdict line is worth ---------------------------------

def _verdicts(true_ratio: float, sigma: float, rounds: int = 5, trials: int = 2000,
              seed: int = 34) -> dict[str, float]:
    """Share of "ok" / "off" / "unverified" lines the check gives a node whose measured
    speedup is ``true_ratio`` × predicted, each round's ratio drawn log-normal around it
    (per-round noise ``sigma``), the sweep's own median agreeing with the truth."""
    import random

    from agent.calibrate import summarise_rounds
    from orchestrator.instrument import judge

    rng = random.Random(seed)
    predicted = 2.0
    gens = [{"mode": m, "num_draft_tokens": k, "decode_tok_s": v, "drafted_tokens": d,
             "accepted_tokens": d, "token_ids": [1, 2, 3], "workload": "code"}
            for m, k, v, d in (("baseline", 0, 40.0, 0),
                               ("speculative", 4, 40.0 * predicted * true_ratio, 8))]
    out = {"ok": 0, "off": 0, "unverified": 0}
    for _ in range(trials):
        r = [true_ratio * math.exp(rng.gauss(0.0, sigma)) for _ in range(rounds)]
        speed = {4: summarise_rounds({"predicted": [predicted] * rounds,
                                      "measured": [predicted * x for x in r], "ratio": r})}
        out[judge("mac-a", gens, None, {"ratio": 1.0}, speed).status] += 1
    return {k: v / trials for k, v in out.items()}


def test_a_noisy_nodes_line_is_wrong_for_at_most_one_node_in_twenty():
    """Fixed (instrument.judge_width): with 5 rounds the check judged the median ratio
    against ±10% whenever the quartiles spanned <= 0.20: a node measuring exactly as
    predicted at 12% per-round noise was called 'instrument OFF' for 9.3% of nodes, one
    15% off at 8% noise 'instrument ok' for 14%. It judges a 90% distribution-free interval
    for the median now (each wrong line bounded by 5%); measured here: 0.0% and 0.05%."""
    right = _verdicts(1.0, 0.12)
    off_by_15 = _verdicts(1.15, 0.08)
    assert right["off"] <= 0.05 and off_by_15["ok"] <= 0.05, (right, off_by_15)


def test_a_quiet_nodes_line_is_right():
    """Guard: at 4% per-round noise a node measuring as predicted is never off and ok in
    most trials, one 30% off is off in every trial. (Before the interval it was ok in every
    trial at 5 rounds, on the median; the 5 rounds' range crosses +-10% for about 1 node in
    18 at 4% noise (P(|z| > 2.38) per round), which is now "unverified: too noisy", never a
    wrong line; with 9 rounds ok in over 99%.)"""
    quiet = _verdicts(1.0, 0.04, trials=300)
    assert quiet["off"] == 0 and quiet["ok"] >= 0.9, quiet
    assert _verdicts(1.0, 0.04, rounds=9, trials=300)["ok"] >= 0.98
    assert _verdicts(1.3, 0.04, trials=300)["off"] == 1.0


# the largest j whose [x_(j), x_(n+1-j)] covers the median with >= 90%, from binomial tables
# (coverage 1 - 2 P(Bin(n, 1/2) <= j - 1)): n=5 .9375 (j=1), n=8 .9297 (j=2), n=11 .9346 (j=3)
ORDER = {5: 1, 6: 1, 7: 1, 8: 2, 9: 2, 10: 2, 11: 3, 12: 3}


def test_the_interval_of_the_median_is_the_order_statistics_planted():
    from agent.stats import median_interval

    assert median_interval([1.0, 0.9, 1.2, 0.8, 1.1]) == (0.8, 1.2, 0.9375)
    assert median_interval(list(range(1, 10))) == (2, 8, 1 - 2 * 10 / 512)
    assert median_interval(list(range(1, 12))) == (3, 9, 1 - 2 * 67 / 2048)
    assert median_interval([1.0, 1.0, 1.0, 1.0]) is None  # [min, max] of 4 covers 87.5%


@settings(max_examples=300, deadline=None)
@given(xs=st.lists(st.floats(0.1, 10.0), min_size=5, max_size=40))
def test_any_rounds_interval_holds_their_median_at_its_stated_coverage(xs):
    """For any 5 or more rounds: the interval is two of the rounds, the sample median lies
    in it, its coverage is at least 90%, and one step narrower would cover less."""
    from agent.stats import median_interval

    lo, hi, cover = median_interval(xs)
    x, n = sorted(xs), len(xs)
    j = x.index(lo) + 1  # its order (with ties: the first of them)
    assert lo in xs and hi in xs and lo <= statistics.median(xs) <= hi
    assert cover >= 0.90
    narrower = 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n
    assert narrower < 0.90 or x[j] == lo, (n, j, cover, narrower)


@settings(max_examples=300, deadline=None)
@given(ratios=st.lists(st.floats(0.5, 1.6), min_size=1, max_size=12))
def test_any_rounds_are_judged_ok_or_off_only_by_an_interval_clear_of_the_tolerance(ratios):
    """For any rounds: ok only when the median's 90% interval (planted order statistics)
    lies within +-10%, off only when it lies wholly outside, else unverified; under 5
    rounds never ok or off."""
    from agent.calibrate import summarise_rounds
    from orchestrator.instrument import TOLERANCE, judge

    x, n = sorted(ratios), len(ratios)
    gens = [{"mode": m, "num_draft_tokens": k, "decode_tok_s": v, "drafted_tokens": d,
             "accepted_tokens": d, "token_ids": [1], "workload": "code"}
            for m, k, v, d in (("baseline", 0, 40.0, 0),
                               ("speculative", 4, 80.0 * statistics.median(x), 8))]
    speed = {4: summarise_rounds({"predicted": [2.0] * n, "measured": [2 * r for r in x],
                                  "ratio": ratios})}
    status = judge("n", gens, None, {"ratio": 1.0}, speed).status
    if n not in ORDER:
        assert status == "unverified"
        return
    lo, hi = x[ORDER[n] - 1], x[n - ORDER[n]]
    if min(abs(abs(b - 1) - TOLERANCE) for b in (lo, hi)) < 1e-6:
        return  # at the edge floating point decides
    inside = 1 - TOLERANCE < lo and hi < 1 + TOLERANCE
    outside = hi < 1 - TOLERANCE or lo > 1 + TOLERANCE
    assert status == ("ok" if inside else "off" if outside else "unverified"), (x, status)


# --- hostile user: the lock's copy of the record -------------------------------------------

def test_a_lock_edited_to_unmark_a_calibration_target_is_refused(grown, tmp_path):
    """Closed finding (low): the lock's calibration mark was never re-read from the folder;
    a lock of the exact pair with models.target.calibration deleted and its lock_id
    recomputed (an unkeyed sha256 anyone can recompute) passed verify_lock, so the
    instrument's win reached the policy as a real pair's. verify_lock now compares the
    mark with the folder's record, both ways."""
    from orchestrator.sweep.lock import load_lock, lock_digest, verify_lock

    plan, _ = _plan(tmp_path, grown["exact"], grown["draft"])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    path = plan.with_suffix(".lock.json")
    doc = load_lock(path)
    assert doc["models"]["target"].pop("calibration")
    doc["lock_id"] = lock_digest(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="does not mark it a calibration target"):
        verify_lock(load_lock(path), path)
    # and a mark the folder's record no longer backs: the record removed after locking
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    record = Path(grown["exact"]) / "specfleet-calibration.json"
    kept = record.read_bytes()
    record.unlink()
    try:
        with pytest.raises(ConfigError, match="specfleet-calibration.json is gone"):
            verify_lock(load_lock(path), path)
    finally:
        record.write_bytes(kept)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1,
                      max_size=6, unique=True))
def test_any_lineups_stop_is_read_back_to_the_target_its_variant_runs(pairs):
    """For any lineup (roles as plans name them: target, target-2, …, draft, draft-2, …),
    the role a stop is marked by is the target the agent's own variant runs."""
    from agent.mlxengine import lineup_variants
    from orchestrator.review.adaptive_stops import stop_role

    def role(kind: str, i: int) -> str:
        return kind if i == 1 else f"{kind}-{i}"

    lineup = tuple((role("target", t), role("draft", d)) for t, d in pairs)
    if len(lineup) == 1:
        lineup = (("target", lineup[0][1]),)  # one pair: the plan's one target
    for v in lineup_variants(lineup):
        assert stop_role(v.name) == v.models[0], (lineup, v.name)
