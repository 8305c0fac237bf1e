"""The one measuring loop: an http runtime gets the same warm-up, interleaving, resume,
quality tasks and soak as in-process mlx-lm (these were once missing from a separate http
loop). Runtimes are the planted OpenAI-API server, which knows nothing of specfleet."""

import json
import subprocess
import sys

import pytest

from orchestrator.sweep.jobspec import build_job, load_quality_tasks
from tests.ports import free_port, wait_served
from tests.test_agent import run_agent
from tests.test_planted_runtimes import PLANTED, variant


@pytest.fixture
def external():
    """Planted runtimes the test starts itself: to the agent they are already serving."""
    procs = []

    def start(name: str, mode: str = "correct", speculative: bool = False) -> dict:
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, str(PLANTED), "--port", str(port),
                                       "--mode", mode], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        wait_served(url)
        return {"name": name, "base_url": url,
                **({"speculative": True, "num_draft_tokens": 3} if speculative else {})}

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def job_with(model_pair, variants: list, *, knobs=None, repetitions=1, **engine) -> dict:
    job = build_job(model_pair, ["code"], max_tokens=10)
    job["workloads"] = job["workloads"][:1]
    job["engine"] = {"type": "http", "runtime": "planted", "ready_timeout_s": 30,
                     "variants": variants, **engine}
    job["knobs"] = knobs or {"temperature": [0.0]}
    job["repetitions"] = repetitions
    return job


def run(job: dict, folder, *extra: str):
    (folder / "job.json").write_text(json.dumps(job))
    proc = run_agent(folder / "job.json", folder / "j.jsonl", *extra, timeout=300)
    ev = [json.loads(x) for x in (folder / "j.jsonl").read_text().splitlines()]
    return proc, ev


def of(ev, kind):
    return [e for e in ev if e["type"] == kind]


def test_runtimes_already_serving_alternate_baseline_and_candidate(model_pair, tmp_path,
                                                                   external):
    job = job_with(model_pair, [external("plain"), external("d1", speculative=True),
                                external("d2", speculative=True)], repetitions=2)
    proc, ev = run(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (plan,) = of(ev, "plan")
    assert plan["order"] == "interleaved" and plan["total_generations"] == 8
    gens = of(ev, "generation")
    # A B A C per repetition: drift of the machine hits both sides of every comparison
    assert [g["variant"] for g in gens] == ["plain", "d1", "plain", "d2"] * 2
    assert [g["run_index"] for g in gens] == list(range(8))
    assert all(g["exact_match"] is True for g in gens if g["mode"] == "speculative")
    (done,) = of(ev, "job_finished")
    assert done["warmups"] == 3 and done["failed"] == 0  # each runtime warmed up once
    # the telemetry window and its reliability verdict, as for in-process runs
    assert all(g["telemetry_samples"] >= 2 and g["unreliable"] in (True, False) for g in gens)


def test_runtimes_the_agent_starts_run_in_blocks_unless_told_to_interleave(model_pair,
                                                                          tmp_path):
    tok = None
    variants = [variant("plain", "correct", tok), variant("draft", "correct", tok, True)]
    job = job_with(model_pair, variants, knobs={"temperature": [0.0, 0.5]}, repetitions=2)
    proc, ev = run(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert of(ev, "plan")[0]["order"] == "blocks"
    gens = of(ev, "generation")
    # per repetition, each variant's generations together, baseline first: one copy of the
    # weights in memory at a time
    assert [(g["repetition"], g["variant"], g["config"]["temperature"]) for g in gens] == [
        (r, v, t) for r in (0, 1) for v in ("plain", "draft") for t in (0.0, 0.5)]
    assert len(of(ev, "runtime_ready")) == 4 and of(ev, "job_finished")[0]["warmups"] == 4
    # the same plan with engine.interleave: both up at once, A B A C, each started once
    job["engine"]["interleave"] = True
    (tmp_path / "i").mkdir()
    proc, ev = run(job, tmp_path / "i")
    assert proc.returncode == 0, proc.stderr
    gens = of(ev, "generation")
    assert of(ev, "plan")[0]["order"] == "interleaved"
    assert [(g["variant"], g["config"]["temperature"]) for g in gens] == [
        ("plain", 0.0), ("draft", 0.0), ("plain", 0.5), ("draft", 0.5)] * 2
    assert len(of(ev, "runtime_ready")) == 2


def test_an_http_job_resumes_where_it_stopped(model_pair, tmp_path, external):
    job = job_with(model_pair, [external("plain"), external("draft", speculative=True)],
                   repetitions=3)
    proc, ev = run(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the node died after the third generation: cut the journal there
    lines = (tmp_path / "j.jsonl").read_text().splitlines()
    third = [i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "generation"][2]
    (tmp_path / "j.jsonl").write_text("\n".join(lines[:third + 1]) + "\n")
    proc, ev = run(job, tmp_path, "--resume")
    assert proc.returncode == 0, proc.stderr
    plans = of(ev, "plan")
    assert plans[-1]["already_done"] == 3
    gens = of(ev, "generation")
    assert sorted(g["run_index"] for g in gens) == list(range(6))  # none twice, none lost
    after = [g for g in gens if g["run_index"] >= 3]
    # the reference from before the crash still judges the speculative runs after it
    assert [g["exact_match"] for g in after if g["mode"] == "speculative"] == [True, True]
    assert of(ev, "job_finished")[-1]["generations"] == 6


def test_quality_tasks_run_for_every_http_variant(model_pair, tmp_path, external):
    job = job_with(model_pair, [external("plain"), external("draft", speculative=True)])
    job["quality_tasks"] = load_quality_tasks()[:2]
    proc, ev = run(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    quality = of(ev, "quality")
    assert [(q["variant"], q["mode"], q["num_draft_tokens"]) for q in quality] == [
        ("plain", "baseline", 0), ("draft", "speculative", 3)]
    for q in quality:
        assert q["tasks"] == 2 and q["config"]["temperature"] == 0.0
        # the planted runtime answers code, not JSON: every task fails, and says why
        assert q["passed"] == 0 and all(r["reason"] for r in q["results"])


def test_an_http_runtime_soaks_with_its_own_memory_watched(model_pair, tmp_path):
    draft = variant("draft", "correct", None, True)
    draft["command"] += ["--ballast-mb", "300"]  # a runtime holding weights, recognisably
    job = job_with(model_pair, [variant("plain", "correct", None), draft])
    job["mode"], job["soak"] = "soak", {"duration_s": 2, "sample_every_s": 0}
    proc, ev = run(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    (result,) = of(ev, "soak_result")
    assert result["variant"] == "draft" and result["status"] == "pass"
    assert result["memory_of"] == "runtime" and result["generations"] >= 2
    samples = of(ev, "soak_sample")
    # the runtime's memory (its 300 MB of ballast), not the agent's own (~30 MB here)
    assert samples and all(s["rss_bytes"] > 300 * 2**20 for s in samples)


def test_a_soak_the_agent_could_not_watch_is_refused(model_pair, tmp_path, external):
    job = job_with(model_pair, [external("plain"), external("draft", speculative=True)])
    job["mode"], job["soak"] = "soak", {"duration_s": 2}
    proc, _ = run(job, tmp_path)
    assert proc.returncode == 2
    assert "soak.variant: 'draft' has no command: a soak watches the runtime's memory" \
        in proc.stderr
