"""The http engine against planted runtimes (tests/planted_runtime.py, written against the
public OpenAI API shape, not against specfleet): each fault the engine once got wrong is
caught or measured right, and a correct runtime raises no alarm at any temperature."""

import json
import sys
from pathlib import Path

from orchestrator.sweep.jobspec import build_job
from tests.ports import free_port
from tests.test_agent import run_agent

PLANTED = Path(__file__).with_name("planted_runtime.py")


def variant(name: str, mode: str, tokenizer: Path | None, speculative: bool = False) -> dict:
    port = free_port()
    cmd = [sys.executable, str(PLANTED), "--port", str(port), "--mode", mode]
    if tokenizer:
        cmd += ["--tokenizer", str(tokenizer / "tokenizer.json")]
    return {"name": name, "base_url": f"http://127.0.0.1:{port}", "command": cmd,
            **({"speculative": True, "num_draft_tokens": 3} if speculative else {})}


def run(model_pair, tmp_path, base_mode: str, spec_mode: str | None = None, *,
        tokenizer: bool = True, temperatures=(0.0,), repetitions: int = 1, max_tokens=12):
    tok = model_pair / "target" if tokenizer else None
    job = build_job(model_pair, ["code"], max_tokens=max_tokens)
    job["workloads"] = job["workloads"][:1]
    variants = [variant("plain", base_mode, tok)]
    if spec_mode:
        variants.append(variant("draft", spec_mode, tok, speculative=True))
    job["engine"] = {"type": "http", "runtime": "planted", "ready_timeout_s": 30,
                     "variants": variants,
                     **({"tokenizer": str(model_pair / "target")} if tokenizer else {})}
    job["knobs"] = {"temperature": list(temperatures)}
    job["repetitions"] = repetitions
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=300)
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    return proc, ev


def of(ev, kind):
    return [e for e in ev if e["type"] == kind]


def test_a_correct_runtime_raises_no_alarm_at_any_temperature(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "correct", "correct", temperatures=(0.0, 0.9),
                   repetitions=3)
    assert proc.returncode == 0, proc.stderr
    gens = of(ev, "generation")
    assert len(gens) == 12 and not of(ev, "generation_failed")
    for g in gens:
        assert "usage_problem" not in g and "nonstreamed_usage_problem" not in g
        if g["config"]["temperature"] == 0:
            assert g["parity"] == "ok"
        else:  # streamed and non-streamed are two samples: not compared
            assert g["parity"] == "not compared (sampled)"
    greedy_spec = [g for g in gens if g["mode"] == "speculative"
                   and g["config"]["temperature"] == 0]
    assert all(g["exact_match"] is True for g in greedy_spec)
    summaries = of(ev, "config_summary")
    assert all((s.get("parity") or {}).get("mismatches", 0) == 0 for s in summaries)
    # the distribution test now runs for http: the sampled speculative config found its
    # baseline (another variant, same sampling)
    (sampled,) = [s for s in summaries if s["mode"] == "speculative"
                  and s["config"]["temperature"] == 0.9]
    assert sampled["distribution"]["p_value"] is not None
    assert not of(ev, "knob_effect")
    (done,) = of(ev, "job_finished")
    assert done["failed"] == 0


def test_a_variant_whose_every_request_fails_is_counted_not_ok(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "correct", "fail", repetitions=2)
    failed = of(ev, "generation_failed")
    assert len(failed) == 2 and all("planted failure: model exploded" in f["error"]
                                    for f in failed)
    (done,) = of(ev, "job_finished")
    assert done["failed"] == 2 and done["generations"] == 2


def test_a_character_split_across_events_does_not_stop_the_job(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "surrogate")
    assert proc.returncode == 0, proc.stderr
    (g,) = of(ev, "generation")
    assert g["output_text"].endswith("\U0001F600") and g["parity"] == "ok"
    assert "\ufffd" not in g["output_text"]


def test_usage_is_cross_checked_and_the_tokenizer_wins(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "double-usage")
    assert proc.returncode == 0, proc.stderr
    (g,) = of(ev, "generation")
    from mlx_lm import load

    n = len(load(str(model_pair / "target"))[1].encode(g["output_text"]))
    assert g["token_source"] == "tokenizer" and g["generated_tokens"] == n
    assert g["usage_tokens"] == 2 * n and f"reports {2 * n} tokens" in g["usage_problem"]
    assert g["nonstreamed_tokens"] == n and g["nonstreamed_token_source"] == "tokenizer"
    assert "nonstreamed_usage_problem" in g


def test_without_a_tokenizer_divergence_is_named_in_characters(model_pair, tmp_path):
    proc, ev = run(model_pair, tmp_path, "correct", "diverge", tokenizer=False)
    assert proc.returncode == 0, proc.stderr
    spec = [g for g in of(ev, "generation") if g["mode"] == "speculative"]
    assert spec[0]["exact_match"] is False
    assert spec[0]["first_divergence"] == 12 and spec[0]["first_divergence_unit"] == "character"


def test_failed_generations_fail_the_node_print_and_show(model_pair, tmp_path):
    """Through the controller: a sweep whose speculative variant never answers is not
    "1 ok"; each failure is printed as it happens and listed on the sweep page."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.locks import make_lock

    port = free_port()
    extra = "\n".join([
        "engine:", "  type: http", "  runtime: planted", "  ready_timeout_s: 30",
        "  variants:", f"    - {{name: plain, base_url: 'http://127.0.0.1:{free_port()}',",
        "       command: ['{python}', " + f"'{PLANTED}', --port, PORT0]}}",
        "    - {name: draft, speculative: true, num_draft_tokens: 3,",
        f"       base_url: 'http://127.0.0.1:{port}',",
        "       command: ['{python}', " + f"'{PLANTED}', --port, '{port}', --mode, fail]}}"])
    base_port = extra.split("http://127.0.0.1:")[1].split("'")[0]
    extra = extra.replace("PORT0", f"'{base_port}'")
    lock = make_lock(tmp_path, model_pair, max_tokens=8, extra=extra, widths=None)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    here:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    db = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db", db,
                                  "--no-provision", "--failed-hosts-file",
                                  str(tmp_path / "retry"), "--json"])
    assert r.exit_code == 1, r.output
    assert "[here] generation FAILED (draft): " in r.stderr, r.stderr
    out = json.loads(r.stdout)
    (o,) = out["outcomes"]
    assert o["status"] == "failed" and "planned generation(s) failed" in o["detail"]
    page = tmp_path / "sweep.html"
    r = CliRunner().invoke(main, ["review", "--sweep", out["sweep_id"], "--db", db,
                                  "--out", str(page)])
    assert r.exit_code == 0, r.output
    html = page.read_text()
    assert "Generations that failed" in html and "planted failure: model exploded" in html
