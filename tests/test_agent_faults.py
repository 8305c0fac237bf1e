"""Planted faults: each gives the documented event, exit code and message."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sweep.jobspec import build_job
from tests.test_agent import ROOT, run_agent


def write_job(tmp_path: Path, job: dict) -> Path:
    p = tmp_path / "job.json"
    p.write_text(json.dumps(job))
    return p


def events(journal: Path) -> list[dict]:
    return [json.loads(x) for x in journal.read_text().splitlines()]


def small_job(model_pair, **kw) -> dict:
    return build_job(model_pair, ["code"], max_tokens=24, draft_widths=[2], **kw)


def test_unknown_key_is_refused_with_the_allowed_ones(tmp_path, model_pair):
    job = small_job(model_pair)
    job["repetitons"] = 3
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "job: unknown key 'repetitons'; allowed: " in proc.stderr


def test_knob_value_mlx_lm_would_reject(tmp_path, model_pair):
    job = small_job(model_pair)
    job["knobs"] = {"top_p": [0.9, 1.5]}
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "knobs.top_p: top_p=1.5 is not valid; it must be a number in (0, 1]" in proc.stderr


def test_prompt_file_missing_or_with_a_wrong_hash(tmp_path, model_pair):
    job = small_job(model_pair)
    w = job["workloads"][0]
    del w["prompt"]
    w["prompt_file"] = str(tmp_path / "prompt.txt")
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert f"workloads[0] (code): prompt file {tmp_path / 'prompt.txt'}: No such file" \
        in proc.stderr
    (tmp_path / "prompt.txt").write_text("def edited():")
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "the job expects " + w["prompt_sha256"] + " (prompt file changed?)" in proc.stderr


def test_wrong_pin_refuses_before_loading(tmp_path, model_pair):
    job = small_job(model_pair, pins={"mlx-lm": "0.0.1"})
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 3
    ev = events(tmp_path / "j.jsonl")
    assert ev[-1]["error"] == "environment_mismatch"
    assert ev[-1]["message"].endswith("is installed but the job pins 0.0.1")
    assert not any(e["type"] == "generation" for e in ev)


def test_fingerprint_cache_skips_rehashing_until_a_file_changes(tmp_path, model_pair):
    pair = tmp_path / "pair"
    shutil.copytree(model_pair, pair)
    job = build_job(pair, ["code"], max_tokens=20, draft_widths=[2])
    path = write_job(tmp_path, job)

    def cache_stats():
        proc = run_agent(path, tmp_path / "j.jsonl")
        assert proc.returncode == 0, proc.stderr
        checked = [e for e in events(tmp_path / "j.jsonl") if e["type"] == "environment_checked"]
        return checked[-1]["fingerprint_cache"]["target"]

    assert cache_stats() == {"hashed_files": 4, "cached_files": 0}
    assert cache_stats() == {"hashed_files": 0, "cached_files": 4}
    cfg = pair / "target" / "config.json"
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 10**9))
    assert cache_stats() == {"hashed_files": 1, "cached_files": 3}


def test_draft_with_another_tokenizer_is_refused(tmp_path, model_pair):
    from orchestrator.demo_models.corpus import corpus_documents
    from orchestrator.demo_models.train import train_tokenizer

    draft = tmp_path / "draft"
    shutil.copytree(model_pair / "draft", draft)
    train_tokenizer(corpus_documents()[:2], 1024).save(str(draft / "tokenizer.json"))
    job = small_job(model_pair)
    job["models"]["draft"] = {"path": str(draft)}
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 6, proc.stderr
    assert "the draft's tokenizer differs from the target's: vocab " in proc.stderr
    assert events(tmp_path / "j.jsonl")[-1]["error"] == "speculation_unsupported"


def test_model_whose_cache_cannot_be_trimmed(tmp_path, model_pair):
    """A state-space (Mamba) target: mlx-lm cannot roll back rejected drafts."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.mamba import Model, ModelArgs

    cfg = {"model_type": "mamba", "vocab_size": 1906, "hidden_size": 32,
           "intermediate_size": 64, "state_size": 4, "num_hidden_layers": 1, "conv_kernel": 4,
           "use_bias": False, "use_conv_bias": True, "time_step_rank": 4,
           "tie_word_embeddings": True}
    d = tmp_path / "mamba"
    d.mkdir()
    model = Model(ModelArgs.from_dict(cfg))
    mx.save_safetensors(str(d / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_pair / "target" / f, d / f)
    job = small_job(model_pair)
    job["models"]["target"] = {"path": str(d)}
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 6, proc.stderr
    assert "the target model's KV cache cannot be trimmed (ArraysCache)" in proc.stderr \
        or "the target model's KV cache cannot be trimmed (MambaCache)" in proc.stderr


def _start_agent(job_path: Path, journal: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent", "run", str(job_path), "--journal",
                             str(journal), "--quiet", "--lock", str(journal.parent / "agent.lock"),
                             "--cache-dir", str(journal.parent / "cache")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for(journal: Path, pred, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if journal.exists():
            ev = [json.loads(x) for x in journal.read_text().splitlines() if x.endswith("}")]
            if pred(ev):
                return ev
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting on {journal}")


def test_second_agent_on_a_busy_node_names_the_holder(tmp_path, model_pair):
    job = small_job(model_pair)
    job.update(mode="soak", soak={"duration_s": 30, "max_tokens": 24})
    first = _start_agent(write_job(tmp_path, job), tmp_path / "a.jsonl")
    try:
        _wait_for(tmp_path / "a.jsonl", lambda ev: any(e["type"] == "soak_sample" for e in ev))
        # held (SIGSTOP), it keeps the node's lock without generating on for the rest of the
        # test (its soak burned a CPU while the second agent started and was refused)
        first.send_signal(signal.SIGSTOP)
        second = {**small_job(model_pair), "job_id": "second"}
        (tmp_path / "b.json").write_text(json.dumps(second))
        proc = run_agent(tmp_path / "b.json", tmp_path / "b.jsonl")
        assert proc.returncode == 5
        assert f"node is busy: job {job['job_id']} (pid {first.pid}, since " in proc.stderr
        assert events(tmp_path / "b.jsonl")[-1]["error"] == "node_busy"
    finally:
        first.kill()
        first.wait()
    # the kernel released the dead holder's lock
    assert run_agent(tmp_path / "b.json", tmp_path / "b.jsonl").returncode == 0


def test_killed_agent_resumes_without_losing_or_repeating_generations(tmp_path, model_pair):
    job = build_job(model_pair, ["code", "memo"], max_tokens=32, draft_widths=[2, 3, 4])
    path = write_job(tmp_path, job)
    journal = tmp_path / "j.jsonl"
    agent = _start_agent(path, journal)
    _wait_for(journal, lambda ev: sum(e["type"] == "generation" for e in ev) >= 5)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    before = events(journal)
    done_before = [e["run_index"] for e in before if e["type"] == "generation"]
    assert before[-1]["type"] != "job_finished"
    proc = run_agent(path, journal, "--resume")
    assert proc.returncode == 0, proc.stderr
    ev = events(journal)
    assert [e["seq"] for e in ev] == list(range(1, len(ev) + 1))
    assert ev[:len(before)] == before  # nothing already written was rewritten
    gens = [e for e in ev if e["type"] == "generation"]
    plan = [e for e in ev if e["type"] == "plan"][-1]
    assert plan["already_done"] == len(done_before)
    assert sorted(g["run_index"] for g in gens) == list(range(plan["total_generations"]))
    assert all(g["exact_match"] for g in gens if g["mode"] == "speculative")
    assert ev[-1]["type"] == "job_finished"
    summaries = [e for e in ev if e["type"] == "config_summary"]
    assert sum(s["trials"] for s in summaries) == plan["total_generations"]


def test_soak_reports_memory_and_swap(tmp_path, model_pair):
    job = small_job(model_pair)
    job.update(mode="soak", soak={"duration_s": 3, "max_tokens": 32, "num_draft_tokens": 3})
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    samples = [e for e in ev if e["type"] == "soak_sample"]
    result = [e for e in ev if e["type"] == "soak_result"][0]
    assert len(samples) >= 3 and result["generations"] == len(samples)
    assert result["status"] == "pass" and result["duration_s"] >= 3
    assert result["peak_rss_bytes"] == max(s["rss_bytes"] for s in samples)
    assert result["swap_in_bytes"] == 0
    assert all(s["generations_in_sample"] == 1 for s in samples)  # default: every one


def test_soak_journals_one_sample_per_interval(tmp_path, model_pair):
    job = small_job(model_pair)
    job.update(mode="soak", soak={"duration_s": 3, "max_tokens": 16, "num_draft_tokens": 3,
                                  "sample_every_s": 1.0})
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    samples = [e for e in ev if e["type"] == "soak_sample"]
    result = [e for e in ev if e["type"] == "soak_result"][0]
    assert 2 <= len(samples) <= 5 < result["generations"]
    assert sum(s["generations_in_sample"] for s in samples) <= result["generations"]
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(samples, samples[1:])]
    assert all(g >= 1.0 for g in gaps)


def test_replayed_battery_readings_mark_every_trial_unreliable(tmp_path, model_pair):
    data = ROOT / "tests" / "data" / "macos"
    replay = tmp_path / "replay"
    replay.mkdir()
    shutil.copy(data / "pmset_batt_on_battery.txt", replay / "batt.txt")
    shutil.copy(data / "pmset_therm_apple_silicon.txt", replay / "therm.txt")
    # an Apple silicon Mac: thermal state from notify (nominal), swap from vm_stat/sysctl
    (replay / "thermal_pressure.txt").write_text("com.apple.system.thermalpressurelevel 0\n")
    shutil.copy(data / "sysctl_swapusage.txt", replay / "swapusage.txt")
    shutil.copy(data / "vm_stat_intel.txt", replay / "vm_stat.txt")
    job = small_job(model_pair, repetitions=2)
    # only the battery is under test: a busy machine (tests run in parallel) is not
    job.update(cv_threshold=1.0, contention_threshold=1.0)
    env = {**os.environ, "SPECFLEET_TELEMETRY_REPLAY": str(replay)}
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl", env=env)
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    gens = [e for e in ev if e["type"] == "generation"]
    assert gens and all(g["unreliable_reasons"] == ["ran on battery"] for g in gens)
    assert all(g["power_source"] == "battery" and g["telemetry_source"] == "replay"
               for g in gens)
    for s in (e for e in ev if e["type"] == "config_summary"):
        assert s["unreliable"] and "2 of 2 trials unreliable (ran on battery)" in \
            s["unreliable_reasons"]


@pytest.mark.parametrize("temperature", [0.9])
def test_sampled_configs_get_a_distribution_test(tmp_path, model_pair, temperature):
    job = small_job(model_pair, repetitions=3)
    job["base"]["temperature"] = temperature
    job["knobs"] = {"num_draft_tokens": [3]}
    proc = run_agent(write_job(tmp_path, job), tmp_path / "j.jsonl")
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    gens = [e for e in ev if e["type"] == "generation"]
    assert all(g["exactness"] == "sampled" and g["exact_match"] is None for g in gens)
    spec = [e for e in ev if e["type"] == "config_summary" and e["mode"] == "speculative"][0]
    d = spec["distribution"]
    assert d["runs"] == [3, 3] and 0 < d["p_value"] <= 1
    assert d["min_attainable_p"] == pytest.approx(1 / 20, abs=1e-4)


def test_fingerprint_cache_sees_a_flipped_byte_with_its_mtime_restored(model_pair, tmp_path):
    """size + mtime alone would keep the old hash; inode + ctime do not survive the write."""
    import shutil

    from agent.fingerprint import cached_fingerprint

    d = tmp_path / "target"
    shutil.copytree(model_pair / "target", d)
    cache = tmp_path / "fp.json"
    fp, stats = cached_fingerprint(d, cache)
    assert stats["hashed_files"] >= 2
    assert cached_fingerprint(d, cache)[1]["hashed_files"] == 0  # all from the cache
    w = d / "model.safetensors"
    st = w.stat()
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 1
    with open(w, "r+b") as f:  # same inode, same size
        f.write(data)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    fp2, stats = cached_fingerprint(d, cache)
    assert stats["hashed_files"] == 1 and fp2 != fp
    # verify: always re-reads every file; never trusts an unchanged key whatever its age
    assert cached_fingerprint(d, cache, "always")[1]["cached_files"] == 0
    assert cached_fingerprint(d, cache, "never")[1]["hashed_files"] == 0
