"""Audit of issue 34 (calibration pairs) as a careless user and a hostile node meet it:
a plain test per guard that held, a strict xfail per finding (severity, what the user saw).
Cheap: targets of 3-6 layers grown from the committed demo draft, no full sweep (the
instrument check is driven only where it fails before measuring)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.calibrate import summarise_rounds
from agent.fingerprint import fingerprint
from agent.lock import NodeLock
from orchestrator.calibration import CALIBRATION_FILE, ensure_calibration
from orchestrator.cli import main
from orchestrator.demo import CALIBRATION_REPETITIONS
from orchestrator.errors import ConfigError
from orchestrator.instrument import judge

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "orchestrator" / "inventory" / "local.yml"
QUIET = {"log": lambda m: None}


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _edit(record: Path, **change) -> None:
    d = json.loads(record.read_text())
    for k, v in change.items():
        if "." in k:
            a, b = k.split(".")
            d[a][b] = v
        else:
            d[k] = v
    record.write_text(json.dumps(d))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gens(unreliable: bool) -> list[dict]:
    ids = [1, 2, 3]
    why = ["contended: other processes used 50% of the CPU (limit 25%)"] if unreliable else []
    base = [{"mode": "baseline", "workload": "code", "num_draft_tokens": 0, "decode_tok_s": 50.0,
             "token_ids": ids, "unreliable": unreliable, "unreliable_reasons": why}]
    spec = [{"mode": "speculative", "workload": "code", "num_draft_tokens": 2,
             "decode_tok_s": 100.0, "drafted_tokens": 10, "accepted_tokens": 10,
             "token_ids": ids, "unreliable": unreliable, "unreliable_reasons": why}]
    return base + spec


COSTS = {"target_ms": 20.0, "draft_ms": 2.0, "verify_ms": {3: 26.0}}
LOOP = {"ratio": 0.99, "bare_tok_s": 100.0, "agent_tok_s": 99.0}


def _steady(k: int = 2) -> dict:
    """Five rounds whose measured speedup is exactly the predicted 2.0× (ratio 1)."""
    return {k: summarise_rounds({"predicted": [2.0] * 5, "measured": [2.0] * 5,
                                 "ratio": [1.0] * 5})}


# --- 1. specfleet models calibrate: guards that held ---------------------------------

def test_same_inputs_give_the_same_fingerprint_from_any_copy_of_the_draft(model_pair, tmp_path):
    copy = tmp_path / "elsewhere" / "draft"
    shutil.copytree(model_pair / "draft", copy)
    a = _run("models", "calibrate", model_pair / "draft", tmp_path / "a", "--layers", 3, "--json")
    b = _run("models", "calibrate", copy, tmp_path / "b", "--layers", 3, "--json")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ra, rb = json.loads(a.stdout), json.loads(b.stdout)
    assert ra["fingerprint"] == rb["fingerprint"] == fingerprint(tmp_path / "a")
    assert ra["draft_fingerprint"] == rb["draft_fingerprint"]
    assert {k: v for k, v in ra.items() if k != "draft"} == \
        {k: v for k, v in rb.items() if k != "draft"}  # only the draft's path differs


def test_out_inside_the_draft_leaves_the_drafts_fingerprint_alone(model_pair, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(model_pair / "draft", draft)
    before = fingerprint(draft)
    r = _run("models", "calibrate", draft, draft / "grown", "--layers", 3)
    assert r.exit_code == 0, r.output
    assert fingerprint(draft) == before
    assert json.loads((draft / "grown" / CALIBRATION_FILE).read_text())[
        "draft_fingerprint"] == before


def test_bad_layers_and_acceptance_are_refused_before_anything_is_written(model_pair, tmp_path):
    d = model_pair / "draft"
    r = _run("models", "calibrate", d, tmp_path / "o", "--layers", 0)
    assert r.exit_code == 2 and "--layers" in r.output
    r = _run("models", "calibrate", d, tmp_path / "o", "--layers", 10**8)
    assert r.exit_code == 1 and "GiB" in r.output and "give fewer layers" in r.output
    for bad in ("1.5", "nan", "-0.1"):
        r = _run("models", "calibrate", d, tmp_path / "o", "--acceptance", bad)
        assert r.exit_code in (1, 2) and "--acceptance" in r.output, (bad, r.output)
    r = _run("models", "calibrate", tmp_path / "missing", tmp_path / "o")
    assert r.exit_code == 2 and "does not exist" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no partial folder left


def test_a_missing_parent_of_out_is_made(model_pair, tmp_path):
    r = _run("models", "calibrate", model_pair / "draft", tmp_path / "a" / "b" / "c",
             "--layers", 3)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a" / "b" / "c" / CALIBRATION_FILE).is_file()


# --- 2. the instrument check's target cache and node lines: guards that held ---------

def test_a_target_whose_recorded_fingerprint_was_tampered_is_grown_again(model_pair, tmp_path):
    out = tmp_path / "cal"
    ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    good = json.loads((out / CALIBRATION_FILE).read_text())["fingerprint"]
    _edit(out / CALIBRATION_FILE, fingerprint="sha256:" + "0" * 64)
    ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    assert json.loads((out / CALIBRATION_FILE).read_text())["fingerprint"] == good


def test_a_target_whose_record_contradicts_itself_is_refused_never_removed(model_pair,
                                                                           tmp_path):
    out = tmp_path / "cal"
    ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    _edit(out / CALIBRATION_FILE, expected_acceptance=0.5)  # beside noise 0: no construction
    with pytest.raises(ConfigError, match="not an exact calibration target"):
        ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    assert json.loads((out / CALIBRATION_FILE).read_text())["expected_acceptance"] == 0.5


def test_an_unreachable_node_gets_one_line_naming_why_and_exit_1(model_pair, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = tmp_path / "closed.yml"
    inv.write_text("all:\n  hosts:\n    dead:\n      ansible_host: 127.0.0.1\n"
                   f"      ansible_port: {_closed_port()}\n      ansible_user: nobody\n")
    r = _run("calibrate", "-i", inv, "--draft", model_pair / "draft", "--workdir",
             tmp_path / "w", "--layers", 3, "--repetitions", 1, "--max-tokens", 16,
             "--db", f"sqlite:///{tmp_path / 's.db'}", "--accept-new-host-keys", "--json")
    assert r.exit_code == 1, r.output
    (c,) = json.loads(r.stdout)
    assert c["status"] == "failed" and c["line"].startswith("dead: instrument")
    assert "connection refused" in c["line"]


def test_a_contended_node_is_never_ok_even_when_its_rounds_agree():
    c = judge("local", _gens(unreliable=True), COSTS, LOOP, _steady())
    assert c.status == "unverified"
    assert judge("local", _gens(unreliable=False), COSTS, LOOP, _steady()).status == "ok"


# --- findings -------------------------------------------------------------------------

# fixed: the line says the generations set aside, why, and to run again when quiet.
def test_a_contended_nodes_line_says_its_runs_were_set_aside():
    c = judge("local", _gens(unreliable=True), COSTS, LOOP, _steady())
    assert "set aside" in c.line or "contended" in c.line


# fixed: `agent costs` takes the machine lock before it reads the job (agent/__main__.py).
def test_the_nodes_cost_rounds_refuse_a_machine_another_job_holds(tmp_path):
    lock = tmp_path / "machine.lock"
    with NodeLock(lock, "other-bench", shared=True, note="audit"):
        r = subprocess.run([sys.executable, "-m", "agent", "costs", str(tmp_path / "job.json"),
                            "--reps", "1", "--rounds", "1"], cwd=ROOT, capture_output=True,
                           text=True, env={"PATH": "/usr/bin:/bin",
                                           "SPECFLEET_MACHINE_LOCK": str(lock),
                                           "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "busy" in (r.stdout + r.stderr)


# fixed: a busy node is 'instrument unverified: the node is busy', status unverified, exit 3.
def test_a_busy_nodes_line_status_and_exit_agree(model_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    lock = tmp_path / "machine.lock"
    monkeypatch.setenv("SPECFLEET_MACHINE_LOCK", str(lock))
    with NodeLock(lock, "other-bench", shared=True, note="audit"):
        r = _run("calibrate", "-i", LOCAL, "--draft", model_pair / "draft", "--workdir",
                 tmp_path / "w", "--layers", 3, "--repetitions", 1, "--max-tokens", 16,
                 "--db", f"sqlite:///{tmp_path / 's.db'}", "--json")
    (c,) = json.loads(r.stdout)
    assert "busy" in c["line"]
    word = c["line"].split(": instrument ")[1].split(":")[0].lower()
    assert word == c["status"] and r.exit_code == 3


# fixed: the line's off is the shown medians' ratio; the per-round median is ratio_median.
def test_each_widths_numbers_on_the_line_agree():
    rounds = {2: summarise_rounds({"predicted": [1.0, 1.0, 2.0, 2.0, 3.0],
                                   "measured": [1.0, 1.0, 2.0, 2.0, 1.0],
                                   "ratio": [1.0, 1.0, 1.0, 1.0, 1 / 3]})}
    c = judge("local", _gens(unreliable=False), COSTS, LOOP, rounds)
    (w,) = c.widths
    assert abs(w["measured"] / w["predicted"] - 1 - w["off"]) < 0.01


# fixed: ensure_calibration reads the record (exact: acceptance 1.0, noise 0), not only its key.
def test_the_check_never_reuses_a_target_recorded_as_inexact(model_pair, tmp_path):
    out = tmp_path / "cal"
    ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    _edit(out / CALIBRATION_FILE, expected_acceptance=0.9, **{"construction.noise_scale": 0.01})
    try:
        ensure_calibration(model_pair / "draft", out, 3, **QUIET)
    except ConfigError:
        return  # refused: held
    assert json.loads((out / CALIBRATION_FILE).read_text())["expected_acceptance"] == 1.0


# fixed: --rounds is 5 to 50.
def test_rounds_too_few_for_a_verdict_are_refused_up_front(model_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    inv = tmp_path / "closed.yml"  # fails fast if the option is accepted
    inv.write_text("all:\n  hosts:\n    dead:\n      ansible_host: 127.0.0.1\n"
                   f"      ansible_port: {_closed_port()}\n")
    r = _run("calibrate", "-i", inv, "--draft", model_pair / "draft", "--workdir",
             tmp_path / "w", "--layers", 3, "--rounds", 3, "--db",
             f"sqlite:///{tmp_path / 's.db'}", "--accept-new-host-keys")
    assert r.exit_code == 2 and "--rounds" in r.output


# fixed: docs/calibration.md says 12.
def test_the_calibration_doc_states_the_demos_repetitions():
    doc = (ROOT / "docs" / "calibration.md").read_text()
    assert f"repetitions: {CALIBRATION_REPETITIONS}" in doc and "repetitions: 8`" not in doc


# fixed: the folder is named once.
def test_a_folder_that_is_no_model_is_named_once(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _run("models", "calibrate", tmp_path / "empty", tmp_path / "o")
    assert r.exit_code == 1 and r.output.count(str(tmp_path / "empty")) == 1
