"""Load levels (issue 14): concurrency and request rate against planted runtimes (one that
serialises, one whose latency explodes, one that errors under load) and real
mlx_lm.server; the plan refuses what in-process mlx-lm cannot do; the controller's decode
boundary takes load_level events and sets bad ones aside."""

import json
import sys

import pytest

from agent.load import MIN_GAIN, arrival_times, check_load, closed_loop, open_loop, summarize
from orchestrator.sweep.jobspec import build_job
from tests.ports import free_port
from tests.test_agent import run_agent
from tests.test_planted_runtimes import PLANTED


def planted(name: str, mode: str, token_ms: float, speculative: bool = False,
            wait_ms: float = 0.0) -> dict:
    port = free_port()
    return {"name": name, "base_url": f"http://127.0.0.1:{port}",
            "command": [sys.executable, str(PLANTED), "--port", str(port), "--mode", mode,
                        "--token-ms", str(token_ms), "--wait-ms", str(wait_ms)],
            **({"speculative": True, "num_draft_tokens": 3} if speculative else {})}


def run_load(model_pair, tmp_path, variants: list[dict], load: dict, max_tokens: int = 12):
    job = build_job(model_pair, ["code"], max_tokens=max_tokens)
    job["workloads"] = job["workloads"][:1]
    job["engine"] = {"type": "http", "runtime": "planted", "ready_timeout_s": 30,
                     "variants": variants}
    job["knobs"], job["repetitions"] = {}, 1
    job["quality_tasks"] = []
    job["load"] = load
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=300)
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert proc.returncode == 0, proc.stderr
    return ev


def levels(ev, variant: str, load: str = "concurrency") -> dict:
    return {e["level"]: e for e in ev if e["type"] == "load_level"
            and e["variant"] == variant and e["load"] == load}


# judges a throughput gain (no gain: under 1.2x): the parallel part's load overlaps the
# client's own per-request cost with the server's (CI2 under load: 1.2-1.3x, no notice)
@pytest.mark.alone
def test_a_runtime_that_serialises_gains_nothing_from_concurrency_and_says_so(model_pair,
                                                                             tmp_path):
    ev = run_load(model_pair, tmp_path,
                  # 30 ms a token (360 ms a request): the client's own per-request cost
                  # on a loaded CPU (tens of ms) adds to one stream's time but overlaps
                  # the server's at 4 streams, so it must stay under a fifth of it or it
                  # reads as a gain (at 4 ms: 1.2x; at 15 ms once 1.2-1.3x)
                  [planted("plain", "serial", 30), planted("draft", "correct", 30, True)],
                  {"concurrency": [1, 2, 4], "requests": 8})
    serial, parallel = levels(ev, "plain"), levels(ev, "draft")
    assert sorted(serial) == sorted(parallel) == [1, 2, 4]
    # one at a time, 4 streams wait ~4× as long: that may also count as saturated
    assert all(e["status"] in ("ok", "saturated") and e["completed"] == 8 and e["errors"] == 0
               for e in [*serial.values(), *parallel.values()])
    # one at a time: 4 streams serve no more tokens/s than 1; a runtime that overlaps does
    assert serial[4]["output_tok_s_total"] < 1.3 * serial[1]["output_tok_s_total"]
    assert parallel[4]["output_tok_s_total"] > 2.0 * parallel[1]["output_tok_s_total"]
    # waiting behind the others shows in the time to first token
    assert serial[4]["ttft_ms_p50"] > 3 * serial[1]["ttft_ms_p50"]
    notices = [e["message"] for e in ev if e["type"] == "notice" and e.get("variant")]
    assert any(m.startswith("concurrency brought no throughput gain: 4 streams") for m in
               notices) and not any("draft" == e.get("variant") for e in ev
                                    if e["type"] == "notice" and "no throughput" in
                                    e.get("message", ""))
    (done,) = [e for e in ev if e["type"] == "job_finished"]
    assert done["load_levels"] == 6


def test_a_ramp_stops_where_latency_explodes_with_the_reason(model_pair, tmp_path):
    ev = run_load(model_pair, tmp_path, [planted("plain", "explode", 1)],
                  {"concurrency": [1, 2, 4, 8, 16], "requests": 8}, max_tokens=8)
    ramp = levels(ev, "plain")
    stop = [e for e in ramp.values() if e["status"] == "saturated"]
    assert len(stop) == 1, ramp
    assert stop[0]["stop_reason"].startswith("latency growing without throughput: e2e p50")
    assert max(ramp) == stop[0]["level"] < 16  # nothing measured past the stop


def test_errors_under_load_are_counted_never_averaged_in(model_pair, tmp_path):
    # 25 ms a token (0.3 s a request): 4 streams overlap by three even when the machine is
    # loaded (at 3 ms, 36 ms a request, a loaded run's streams started too far apart and
    # no request ever found two others in flight)
    ev = run_load(model_pair, tmp_path, [planted("plain", "overload", 25)],
                  {"concurrency": [1, 4, 8], "requests": 8})
    ramp = levels(ev, "plain")
    assert ramp[1]["errors"] == 0 and ramp[1]["status"] == "ok"
    hit = ramp[4]
    assert hit["errors"] > 0 and hit["completed"] == 8 - hit["errors"]
    assert hit["status"] == "saturated" and hit["stop_reason"].startswith(
        f"errors under load: {hit['errors']} of 8 requests failed")
    assert any("503" in x or "server busy" in x for x in hit["error_examples"])
    # latencies come from the requests that were served: a failed one has none to give
    assert hit["e2e_ms_p50"] is not None and hit["output_tokens"] == 12 * hit["completed"]
    assert 8 not in ramp


def test_open_loop_rate_goodput_and_slo(model_pair, tmp_path):
    slo = {"ttft_ms": 2000, "itl_p95_ms": 2000, "e2e_ms": 5000}
    ev = run_load(model_pair, tmp_path, [planted("plain", "correct", 2)],
                  {"request_rate": [4.0, 8.0], "arrivals": "constant", "requests": 8,
                   "max_concurrency": 4, "slo": slo})
    ramp = levels(ev, "plain", "request_rate")
    assert sorted(ramp) == [4.0, 8.0]
    for rate, e in ramp.items():
        assert e["arrivals"] == "constant" and e["slo"] == slo and e["completed"] == 8
        # 8 requests over 7 gaps of 1/rate s: served at about the offered rate
        assert 0.7 * rate <= e["requests_per_s"] <= 1.3 * rate, e
        assert e["good_requests"] == 8 and e["goodput_rps"] == e["requests_per_s"]
    ev2 = run_load(model_pair, tmp_path / "tight" if (tmp_path / "tight").mkdir() is None
                   else tmp_path, [planted("plain", "correct", 2)],
                   {"request_rate": [8.0], "requests": 6, "slo": {"e2e_ms": 1}})
    (e,) = levels(ev2, "plain", "request_rate").values()
    assert e["good_requests"] == 0 and e["goodput_rps"] == 0 and e["completed"] == 6


def test_the_load_generator_alone():
    """Closed loop shares the requests among the streams; Poisson arrivals are seeded;
    failures are counted apart from the latencies."""
    import time

    def send(i):
        time.sleep(0.01)
        if i % 4 == 3:
            raise ConnectionResetError("reset by peer")
        return [0.005, 0.008, 0.01]

    out, wall = closed_loop(send, 2, 8)
    assert len(out) == 8 and sum(not o.ok for o in out) == 2
    m = summarize(out, wall, {"ttft_ms": 100})
    assert m["completed"] == 6 and m["errors"] == 2 and m["output_tokens"] == 18
    assert m["error_examples"] == ["ConnectionResetError: reset by peer"]
    assert m["good_requests"] == 6 and m["ttft_ms_p50"] == 5.0
    a, b = arrival_times(10, 50, "poisson", 7), arrival_times(10, 50, "poisson", 7)
    assert a == b and a != arrival_times(10, 50, "poisson", 8)
    assert 2.5 < a[-1] < 8  # about 49 gaps of 0.1 s
    # a runtime that reports its drafting (llama-server's timings): acceptance per level
    out, wall = closed_loop(lambda i: ([0.001, 0.002], 8, 6 if i % 2 else 2), 2, 4)
    assert summarize(out, wall)["acceptance_rate"] == round(16 / 32, 4)
    out, wall = open_loop(lambda i: [0.001], 50, 10, "constant", 4)
    assert [round(o.scheduled, 3) for o in out] == [i / 50 for i in range(10)]
    # never early, and on time as a rule: the median, because one send may wait behind a
    # preempted thread on a loaded CPU (precision is bench/load_accuracy.py's subject)
    lags = sorted(o.sent - o.scheduled for o in out)
    assert lags[0] > -0.001 and lags[len(lags) // 2] < 0.05, lags


@pytest.mark.parametrize("load, engine, message", [
    ({"concurrency": [1, 2]}, "mlx-lm", "load: in-process mlx-lm cannot speculate in a batch"),
    ({"concurrency": [1, 2], "variants": ["speculative"]}, "mlx-lm",
     "load: in-process mlx-lm cannot speculate in a batch"),
    ({"request_rate": [2.0], "variants": ["autoregressive"]}, "mlx-lm",
     "load: in process there is no server to queue at"),
    ({"concurrency": [2, 1]}, "http", "load.concurrency: list the levels once each, rising"),
    ({"concurrency": [0]}, "http", "load.concurrency: a list of integers from 1 to 256"),
    ({"request_rate": [2], "arrivals": "bursty"}, "http", "load.arrivals: one of poisson"),
    ({"concurrency": [1], "slo": {"ttfb": 5}}, "http", "load.slo: a mapping of ttft_ms"),
    ({"requests": 4}, "http", "load: set concurrency (streams) or request_rate"),
    ({"concurency": [1]}, "http", "load: unknown key(s) concurency"),
])
def test_a_load_the_engine_cannot_run_is_refused_with_the_reason(load, engine, message):
    assert check_load(load, engine).startswith(message)


def test_plan_lock_refuses_load_on_in_process_mlx_lm_with_file_and_line(model_pair,
                                                                         tmp_path):
    from orchestrator.errors import ConfigError
    from orchestrator.sweep.lock import write_lock
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair) + "load:\n  concurrency: [1, 2, 4]\n")
    line = plan.read_text().splitlines().index("load:") + 1
    with pytest.raises(ConfigError) as e:
        write_lock(load_plan(plan), log=lambda m: None)
    assert f"{plan}:{line}" in str(e.value)
    assert "cannot speculate in a batch" in str(e.value)


def test_the_decode_boundary_takes_load_levels_and_sets_bad_ones_aside():
    from orchestrator.sweep.decode import Decoder, Quarantined

    good = {"schema": 1, "seq": 3, "ts": 1.0, "type": "load_level", "workload": "code",
            "variant": "plain", "mode": "baseline", "load": "concurrency", "level": 4,
            "status": "ok", "output_tok_s_total": 120.5, "goodput_rps": 1.5}
    d = Decoder("n1")
    assert d.decode(json.dumps(good))["level"] == 4
    for bad, why in (({"level": "4"}, "field 'level' must be"),
                     ({"load": "burst"}, "load 'burst' is not one of"),
                     ({"output_tok_s_total": -3}, "output_tok_s_total -3"),
                     ({"errors": 1.5}, "errors 1.5")):
        q = d.decode(json.dumps({**good, **bad}))
        assert isinstance(q, Quarantined) and why in q.reason, (bad, q)


@pytest.mark.alone  # judges a throughput gain: other tests' load would blur it
def test_real_mlx_lm_server_under_concurrency_and_a_request_rate(model_pair, tmp_path):
    """mlx_lm.server 0.32.2 batches requests only without a draft model: the speculative
    server serves the streams one at a time (a new request waits for another to finish).
    Every level is measured for both, with no errors, and the no-gain notice agrees with
    the stored numbers."""
    p1, p2 = free_port(), free_port()
    server = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_pair / "target")]
    variants = [{"name": "plain", "base_url": f"http://127.0.0.1:{p1}",
                 "command": [*server, "--port", str(p1)]},
                {"name": "draft-3", "speculative": True, "num_draft_tokens": 3,
                 "base_url": f"http://127.0.0.1:{p2}",
                 "command": [*server, "--port", str(p2), "--draft-model",
                             str(model_pair / "draft"), "--num-draft-tokens", "3"]}]
    # 96 tokens: with 48, each request's HTTP and prefill cost, overlapped at 4 streams,
    # gave even the unbatched draft server 1.14x (and plain 1.13x) in one run
    job = build_job(model_pair, ["code"], max_tokens=96)
    job["workloads"] = job["workloads"][:1]
    job["engine"] = {"type": "http", "runtime": "mlx_lm.server", "ready_timeout_s": 90,
                     "tokenizer": str(model_pair / "target"), "variants": variants}
    job["knobs"], job["repetitions"], job["quality_tasks"] = {}, 1, []
    job["load"] = {"concurrency": [1, 2, 4], "request_rate": [4.0], "requests": 8,
                   "slo": {"ttft_ms": 10_000, "e2e_ms": 30_000}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=600)
    assert proc.returncode == 0, proc.stderr
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    for name in ("plain", "draft-3"):
        ramp = levels(ev, name)
        assert {1, 2} <= set(ramp) <= {1, 2, 4}, ramp
        # a saturated level ends its ramp (serving one at a time, draft-3's may at 4)
        assert all(e["status"] == "ok" or level == max(ramp) for level, e in ramp.items())
        assert all(e["errors"] == 0 and e["completed"] == 8 for e in ramp.values())
        assert all(e["ttft_ms_p99"] and e["itl_ms_p95"] and e["tpot_ms_p50"]
                   and e["rss_peak_bytes"] for e in ramp.values())
        (rate,) = levels(ev, name, "request_rate").values()
        assert rate["completed"] == 8 and rate["goodput_rps"] is not None
    plain, spec = levels(ev, "plain"), levels(ev, "draft-3")
    # the plain server may stop at 2 streams: it admits new requests between 0.5 s decode
    # waves, so the last requests of a level can wait a wave longer for their first token,
    # which the queue-growth rule (vLLM-style saturation, issue 27) calls saturated; the
    # asserts above hold that a ramp ends only at a saturated level

    def grows(ramp, metric):  # the ramp's last level over one stream's
        return ramp[max(ramp)][metric] / ramp[1][metric]

    # the server that cannot batch serves the streams one after another: a new request
    # waits while another is served whole, so its TTFT p50 at the top level exceeds half of
    # one request's e2e at one stream (measured: 2.3-2.8x of it). The plain server is no
    # steady witness of batching: mlx_lm.server decodes a batch for up to 0.5 s
    # (TimeBudget) before it admits new requests, so it serves in waves, and its TTFT p50 at
    # 4 streams grew x2-27 over runs and x36 in one whose TPOT and tokens/s then grew like the
    # serial server's (1.17x); total tokens/s is too noisy on this shared 2-CPU machine
    # (plain gained 1.17-2.55x, draft-3 0.90-1.36x). So the no-gain notice must agree with
    # the numbers the ramp stored, whichever way they fell; the planted serial runtime above
    # checks that it fires.
    print("growth at the top level: ttft", grows(plain, "ttft_ms_p50"),
          grows(spec, "ttft_ms_p50"), "tok/s", grows(plain, "output_tok_s_total"),
          grows(spec, "output_tok_s_total"))
    assert spec[max(spec)]["ttft_ms_p50"] > 0.5 * spec[1]["e2e_ms_p50"], spec
    for name, ramp in (("plain", plain), ("draft-3", spec)):
        noticed = any(e["type"] == "notice" and e.get("variant") == name and e["message"]
                      .startswith("concurrency brought no throughput gain") for e in ev)
        assert noticed == (grows(ramp, "output_tok_s_total") < MIN_GAIN), (name, ramp)


def test_a_load_sweep_is_stored_and_the_sweep_page_shows_the_ramps(model_pair, tmp_path):
    """Through the controller: plan → lock → sweep of this machine with two planted
    runtimes (one serialises, one overlaps) → the store → the sweep page in Chromium: a
    table row per variant and level, the knee, the crossover and the chart."""
    from dataclasses import replace
    from pathlib import Path

    from orchestrator.fleet.inventory import load_inventory
    from orchestrator.review.sweep_page import render_review
    from orchestrator.store import open_store
    from orchestrator.sweep.dispatch import SweepOptions, start_sweep
    from orchestrator.sweep.lock import load_lock, write_lock
    from orchestrator.sweep.plan import load_plan
    from tests.browser import dump_dom
    from tests.locks import plan_text

    root = Path(__file__).resolve().parents[1]
    # 5 ms a token (×8 at two streams): the ramp stops at 2 unless the CPU adds 140 ms to
    # every request (at 2 ms, 32 ms of load did: it went on to 4)
    plain, draft = planted("plain", "explode", 5), planted("draft", "correct", 3, True)
    engine = "\n".join([
        "engine:", "  type: http", "  runtime: planted", "  ready_timeout_s: 30",
        "  variants:", *(f"    - {json.dumps(v)}" for v in (plain, draft)),
        "load:", "  concurrency: [1, 2, 4]", "  requests: 8",
        "  slo: {ttft_ms: 5000, e2e_ms: 10000}"])
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, widths=(), max_tokens=12,
                              extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")
                    + "\n" + engine + "\n")
    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    assert doc["job"]["load"]["concurrency"] == [1, 2, 4]
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    hosts = [replace(h, root=str(tmp_path / "node"))
             for h in load_inventory(root / "orchestrator" / "inventory" / "local.yml").hosts]
    result = start_sweep(doc, hosts, store, opts=SweepOptions(provision=False))
    assert result.ok, result
    dom = dump_dom(render_review(store, tmp_path / "sweep.html", result.sweep_id))
    assert "Under load" in dom and "<svg" in dom and "goodput" in dom
    for level in (1, 2, 4):
        assert f'data-variant="draft" data-level="{level}"' in dom
    # the exploding runtime stops its ramp at 2 streams, with the reason on the page
    assert 'data-variant="plain" data-level="2"' in dom
    assert 'data-variant="plain" data-level="4"' not in dom
    assert "latency growing without throughput" in dom
    # speculation against the baseline at the same level, on the speculative rows only
    # (its value is timing: other tests' load moves it, so only its presence is checked)
    import re

    def row(variant: str) -> str:
        return re.search(rf'data-variant="{variant}" data-level="1">(.*?)</tr>', dom,
                         re.S).group(1)

    assert float(re.findall(r"<td>([0-9.]+)×</td>", row("draft"))[0]) > 0
    assert not re.findall(r"<td>([0-9.]+)×</td>", row("plain"))
    # which side wins is timing (the crossover's wording is pinned below, on planted ramps)
    assert re.search(r"draft: (ahead of autoregressive|slower than autoregressive|batched "
                     r"autoregressive overtakes)", dom)
    # the week's review: the same tables, and the cap rule fired from these measurements
    from orchestrator.review.report import write_review
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse

    a = analyse(store, None, load_rules())
    assert [g["load"] for g in a["loads"]] == ["concurrency"]
    fired = [x for s in a["series"] for x in s["signals"] if x["rule"] == "cap-concurrency"]
    assert fired and fired[0]["action"].startswith(
        "Cap concurrency at the gateway at 1 streams: at 2 the runtime saturated")
    assert fired[0]["evidence"] == {"load_saturated_at": 2, "load_cap": 1}
    files = write_review(store, tmp_path / "week")
    assert "Under load" in dump_dom(files["html"]) and "## Under load" in files["md"].read_text()


def test_the_load_and_busy_rules_fire_from_planted_evidence_and_name_the_level(tmp_path):
    """Rules read measurements: a store planted with a concurrency ramp whose runtime
    memory grows 20% and swaps at 4 streams (shrink to 2), and a busy series whose ITL p99
    is twice its idle twin's (move to a dedicated node). Without that evidence, neither
    fires."""
    from datetime import datetime, timezone

    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse
    from orchestrator.store import open_store
    from tests.history import config_values, ingest_lines, night

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    at = datetime.now(timezone.utc).replace(microsecond=0)

    def ramp(sid: str, swap_at_4: int) -> None:
        # the ramp's events as the agent journals them, through the boundary and the ingest
        ingest_lines(store, sid, "mac-a", [{
            "type": "load_level", "workload": "code", "variant": "plain",
            "mode": "baseline", "load": "concurrency", "level": level,
            "status": "ok", "requests": 8, "completed": 8, "errors": 0,
            "output_tok_s_total": 100.0 * level ** 0.5,
            "requests_per_s": 2.0 * level ** 0.5, "e2e_ms_p95": 900.0,
            "rss_peak_bytes": rss, "swap_in_bytes": swap,
            # level 8 was contended: shown, never evidence
            "unreliable": level == 8, "unreliable_reasons": [
                "contended: other processes used 60% of the CPU (limit "
                "25%)"] if level == 8 else []}
            for level, rss, swap in ((1, 1.0e9, 0), (2, 1.1e9, 0), (4, 1.2e9, swap_at_4),
                                     (8, 2.0e9, 2**30))], at.timestamp())

    configs = {("baseline", 0): config_values(100), ("speculative", 3):
               config_values(130, acceptance=0.7)}
    for node, swap in (("mac-a", 64 * 2**20),):
        sid = night(store, at, node=node, chip="M2", pair="t / d", workload="code",
                    configs=configs, engine="mlx_lm.server")
        ramp(sid, swap)
    idle = {("baseline", 0): config_values(100, itl_p99=30.0),
            ("speculative", 3): config_values(130, acceptance=0.7, itl_p99=30.0)}
    busy = {("baseline", 0): config_values(90, itl_p99=60.0),
            ("speculative", 3): config_values(115, acceptance=0.7, itl_p99=66.0)}
    night(store, at, node="mac-b", chip="M2", pair="t / d", workload="code", configs=idle)
    night(store, at, node="mac-b", chip="M2", pair="t / d", workload="code", configs=busy,
          background="busy: 512 MB + 1 CPU")
    a = analyse(store, None, load_rules())
    fired = {(s["series"]["engine"], x["rule"]): x for s in a["series"] for x in s["signals"]}
    shrink = fired[("mlx_lm.server", "shrink-concurrency")]
    assert shrink["action"].startswith("Shrink concurrency to 2 streams")
    assert shrink["evidence"] == {"load_mem_growth": 0.2, "load_swap_levels": 1,
                                  "load_cap": 2}
    assert ("mlx_lm.server", "cap-concurrency") not in fired  # nothing saturated
    dedicated = fired[("mlx-lm · busy: 512 MB + 1 CPU", "dedicated-node")]
    assert dedicated["evidence"]["busy_itl_p99_ratio"] >= 1.9
    assert ("mlx-lm", "dedicated-node") not in fired  # the idle twin's tails are its own


def test_in_process_batched_autoregressive_at_each_batch_width(model_pair, tmp_path):
    """In process, concurrency is mlx-lm's continuous batching (its BatchGenerator, as
    mlx_lm.server uses it) for the autoregressive variant only: every request completes
    with the tokens it asked for, and the speculative variant is not ramped (the plan
    had to say so: without load.variants the lock refuses it)."""
    job = build_job(model_pair, ["code"], max_tokens=24, draft_widths=[2])
    job["workloads"] = job["workloads"][:1]
    job.update(repetitions=1, quality_tasks=[], cv_threshold=1.0, contention_threshold=1.0,
               load={"concurrency": [1, 4], "requests": 8, "variants": ["autoregressive"],
                     "slo": {"e2e_ms": 60_000}})
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    ev = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    ramp = levels(ev, "autoregressive")
    assert sorted(ramp) == [1, 4] and not levels(ev, "speculative")
    for e in ramp.values():
        assert e["completed"] == 8 and e["errors"] == 0, e
        assert 8 <= e["output_tokens"] <= 8 * 24 and e["good_requests"] == 8
        assert e["ttft_ms_p50"] and e["tpot_ms_p50"] and e["rss_peak_bytes"]
    # four in flight at width 4, one at width 1, by Little's law (requests in flight =
    # request-seconds / wall seconds; greedy on one prompt, so every request is alike and
    # the median stands for the mean). Comparing the two widths' latencies raced a tiny
    # model's batch-of-4 step (about a batch-of-1's) against the other workers' load.
    def in_flight(e):
        return e["e2e_ms_p50"] / 1e3 * e["completed"] / e["wall_s"]

    assert in_flight(ramp[1]) < 1.3 and in_flight(ramp[4]) > 2.5, ramp
    job["load"] = {"concurrency": [1, 4], "variants": ["autoregressive@target-9"]}
    (tmp_path / "bad.json").write_text(json.dumps(job))
    bad = run_agent(tmp_path / "bad.json", tmp_path / "bad.jsonl")
    assert bad.returncode == 2 and ("load.variants: autoregressive@target-9 not among this "
                                    "job's variants (autoregressive)") in bad.stderr


def test_the_crossover_knee_and_cap_on_planted_ramps():
    """Where batched autoregressive serving overtakes speculation, the knee and the cap,
    on ramps with known numbers; an unreliable level is no evidence."""
    from orchestrator.review.load import cap, crossover, knee

    def lv(level, tok_s, rps, **kw):
        return {"level": level, "status": "ok", "output_tok_s_total": tok_s,
                "requests_per_s": rps, "errors": 0, **kw}

    base = [lv(1, 100, 1.0), lv(2, 180, 1.8), lv(4, 300, 3.0), lv(8, 310, 3.05)]
    spec = [lv(1, 150, 1.5), lv(2, 170, 1.7), lv(4, 160, 1.6)]
    variants = [{"variant": "plain", "mode": "baseline", "levels": base},
                {"variant": "draft-3", "mode": "speculative", "levels": spec}]
    assert crossover(variants) == ("draft-3: batched autoregressive overtakes it at 2 "
                                   "streams (180 vs 170 tok/s); speculation wins up to 1")
    assert knee(base) == 4 and cap(base) == 8  # 8 adds < 5%: the knee stays at 4
    swapped = [*base[:2], {**base[2], "swap_in_bytes": 1}, base[3]]
    assert cap(swapped) == 2
    noisy = [base[0], {**base[1], "unreliable": True}, *base[2:]]
    assert knee(noisy) is None and cap(noisy) == 1
    shaky = [{"variant": "plain", "mode": "baseline",
              "levels": [base[0], {**base[1], "unreliable": True}, *base[2:]]},
             variants[1]]
    assert crossover(shaky) == ("draft-3: batched autoregressive overtakes it at 4 "
                                "streams (300 vs 160 tok/s); speculation wins up to 1")
