"""A whole job through the http engine: the agent starts mlx_lm.server variants itself,
measures streamed and non-streamed, checks parity and exactness, and notices a runtime
that ignores a knob."""

import http.server
import json
import sys
import threading
from pathlib import Path

from orchestrator.sweep.jobspec import build_job
from tests.ports import free_port
from tests.test_agent import run_agent
from tests.test_http_engine import ARGS, _arg


def events(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def http_job(model_pair, engine: dict, *, tools=None, first_only: bool = True) -> dict:
    """A short greedy job through the http engine (8 tokens of the code prompts)."""
    job = build_job(model_pair, ["code"], max_tokens=8)
    if first_only:
        job["workloads"] = job["workloads"][:1]
    if tools:
        job["workloads"][0]["tools"] = tools
    job["engine"], job["knobs"] = engine, {"temperature": [0.0]}
    return job


def run_job(job: dict, folder, env=None):
    (folder / "job.json").write_text(json.dumps(job))
    return run_agent(folder / "job.json", folder / "j.jsonl", env=env)


def test_agent_runs_mlx_lm_server_variants(model_pair, tmp_path):
    job = build_job(model_pair, ["code"], max_tokens=32)
    p1, p2 = free_port(), free_port()
    server = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_pair / "target")]
    job["engine"] = {"type": "http", "api": "completions", "runtime": "mlx_lm.server",
                     "tokenizer": str(model_pair / "target"), "ready_timeout_s": 60,
                     "variants": [
                         {"name": "plain", "base_url": f"http://127.0.0.1:{p1}",
                          "command": [*server, "--port", str(p1)]},
                         {"name": "draft-3", "speculative": True, "num_draft_tokens": 3,
                          "base_url": f"http://127.0.0.1:{p2}",
                          "command": [*server, "--port", str(p2), "--draft-model",
                                      str(model_pair / "draft"), "--num-draft-tokens", "3"]}]}
    job["knobs"] = {"temperature": [0.0]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    assert [e["variant"] for e in ev if e["type"] == "runtime_ready"] == ["plain", "draft-3"]
    (plan,) = [e for e in ev if e["type"] == "plan"]  # the controller shows "n/total"
    assert plan["total_generations"] == 2 and plan["variants"] == ["plain", "draft-3"]
    gens = [e for e in ev if e["type"] == "generation"]
    assert [(g["mode"], g["variant"]) for g in gens] == [("baseline", "plain"),
                                                         ("speculative", "draft-3")]
    plain, spec = gens
    for g in gens:
        assert g["ttft_ms"] > 0 and g["decode_tok_s"] > 0 and g["chunks"] > 0
        assert g["acceptance"] == "not reported" and g["acceptance_rate"] is None
        # the non-streamed request is timed end to end too; mlx_lm.server reports no speed
        assert g["nonstreamed_ms"] > 0 and g["nonstreamed_tokens"] == 32
        assert 0 < g["nonstreamed_tok_s"] and g["reported_decode_tok_s"] is None
    # the plain server agrees with in-process greedy mlx-lm, streamed and not
    from mlx_lm import generate, load

    model, tok = load(str(model_pair / "target"))
    expected = generate(model, tok, job["workloads"][0]["prompt"], max_tokens=32)
    assert plain["parity"] == "ok" and plain["output_text"] == expected
    # the speculative server is judged against it. (mlx_lm.server 0.32.2 with a draft
    # model answers a repeated prompt differently once its prompt cache is reused; the
    # engine must report that, not hide it.)
    assert spec["exact_match"] is (spec["output_text"] == plain["output_text"])
    if spec["parity"] == "mismatch":
        assert spec["first_difference"] is not None
    else:
        assert spec["first_difference"] is None
    assert {e["engine"] for e in ev if e["type"] == "config_summary"} == {"mlx_lm.server"}
    assert ev[-1]["type"] == "job_finished"
    # the store takes these events like any other: runs carry the runtime's name
    from orchestrator.store import open_store
    from orchestrator.store.models import Measurement, Run

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    store.create_sweep("http", {"models": {"target": {}, "draft": {}}}, None)
    assert store.ingest("http", "local", ev) == len(ev)
    with store.engine.connect() as c:
        assert c.execute(Run.__table__.select().with_only_columns(Run.engine)).scalars() \
            .all() == ["mlx_lm.server", "mlx_lm.server"]
        assert c.execute(Measurement.__table__.select().with_only_columns(
            Measurement.drafted_tokens)).scalars().all() == [None, None]


class Stubborn(http.server.BaseHTTPRequestHandler):
    """A runtime that ignores temperature: always the same text."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = "always the same answer"
        self.send_response(200)
        self.end_headers()
        if body.get("stream"):
            for part in ("always ", "the same ", "answer"):
                self.wfile.write(b"data: " + json.dumps({"choices": [{"text": part}]}).encode()
                                 + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            self.wfile.write(json.dumps({"choices": [{"text": text,
                                                      "finish_reason": "length"}]}).encode())

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *a):
        pass


def test_a_knob_the_runtime_ignores_is_reported(model_pair, tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stubborn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        job = build_job(model_pair, ["code"], max_tokens=8)
        job["engine"] = {"type": "http", "runtime": "stubborn", "variants": [
            {"name": "only", "base_url": f"http://127.0.0.1:{srv.server_address[1]}"}]}
        job["knobs"] = {"temperature": [0.0, 0.9]}
        (tmp_path / "job.json").write_text(json.dumps(job))
        proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    finally:
        srv.shutdown()
    assert proc.returncode == 0, proc.stderr
    (effect,) = [e for e in events(tmp_path / "j.jsonl") if e["type"] == "knob_effect"]
    assert effect["effect"] is False and effect["knob"] == "temperature"
    assert effect["message"] == "knob had no effect: temperature in [0.0, 0.9] gave identical " \
        "output"
    # and the sweep's review page says so
    from datetime import datetime, timezone

    from orchestrator.review.sweep_page import render_review
    from orchestrator.store import open_store
    from tests.browser import dump_dom
    from tests.history import new_sweep

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sid = new_sweep(store, datetime.now(timezone.utc))
    store.ingest(sid, "local", events(tmp_path / "j.jsonl"))
    dom = dump_dom(render_review(store, tmp_path / "review.html", sid))
    assert 'id="notices"' in dom
    assert "local · only · workload" in dom and effect["message"] in dom
    # the sweep page names the runtime and shows its streaming parity per config
    assert "short context · runtime stubborn</h2>" in dom
    assert "<th>streaming parity</th>" in dom and ">ok (" in dom


def test_endpoint_down_fails_that_variant_and_the_job_goes_on(model_pair, tmp_path):
    job = build_job(model_pair, ["code"], max_tokens=8)
    job["engine"] = {"type": "http", "ready_timeout_s": 1, "variants": [
        {"name": "gone", "base_url": f"http://127.0.0.1:{free_port()}"}]}
    job["knobs"] = {"temperature": [0.0]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 0
    (failed,) = [e for e in events(tmp_path / "j.jsonl") if e["type"] == "generation_failed"]
    assert failed["variant"] == "gone" and "not ready at" in failed["error"]


def test_plan_engine_reaches_the_node_with_its_model_paths(fleet, model_pair, tmp_path):
    """A plan's engine section goes through the lock to the node; {target}/{python} in a
    runtime command become the node's own paths, and the agent runs the runtime there."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.locks import make_lock

    port = free_port()
    extra = "\n".join([
        "engine:", "  type: http", "  runtime: mlx_lm.server", "  ready_timeout_s: 90",
        "  variants:", "    - name: plain", f"      base_url: http://127.0.0.1:{port}",
        f"      command: ['{{python}}', -m, mlx_lm, server, --model, '{{target}}', --port,"
        f" '{port}']"])
    lock = make_lock(tmp_path, model_pair, max_tokens=16, extra=extra, widths=None)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    r = CliRunner().invoke(main, [
        "sweep", str(lock), "-i", str(inv), "--limit", "node1", "--known-hosts",
        str(fleet.known_hosts), "--db", f"sqlite:///{tmp_path / 's.db'}", "--no-provision",
        "--failed-hosts-file", str(tmp_path / "retry"), "--json"])
    assert r.exit_code == 0, r.output
    from tests.controller import journal, json_from_log

    ev = journal(fleet.nodes[0], json_from_log(r.stdout)["sweep_id"])
    gens = [e for e in ev if e["type"] == "generation"]
    assert gens and all(g["engine"] == "http" and g["parity"] == "ok" for g in gens)
    # progress names the runtime and variant rather than a draft width
    assert f"[node1]   1/{len(gens)} code     baseline    mlx_lm.server/plain " in r.stderr


def _fixed_server(text: str):
    class Fixed(Stubborn):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()
            if body.get("stream"):
                self.wfile.write(b"data: " + json.dumps({"choices": [{"text": text}]}).encode()
                                 + b"\n\ndata: [DONE]\n\n")
            else:
                self.wfile.write(json.dumps({"choices": [{"text": text}]}).encode())
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Fixed)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_a_runtime_inexact_under_speculation_is_flagged(model_pair, tmp_path):
    a, a_url = _fixed_server("    return heap[0]")
    b, b_url = _fixed_server("    return heap[1]")  # same prompt, speculation changed it
    try:
        proc = run_job(http_job(model_pair, {"type": "http", "runtime": "planted", "variants": [
            {"name": "plain", "base_url": a_url},
            {"name": "draft", "speculative": True, "num_draft_tokens": 3, "base_url": b_url}]},
            first_only=False), tmp_path)
    finally:
        a.shutdown()
        b.shutdown()
    assert proc.returncode == 0, proc.stderr
    spec = [e for e in events(tmp_path / "j.jsonl") if e["type"] == "generation"
            and e["mode"] == "speculative"][0]
    assert spec["exact_match"] is False and spec["exactness"] == "diverged"
    assert spec["first_divergence"] == len("    return heap[")
    assert spec["parity"] == "ok"


TOOLS = [{"type": "function", "function": {
    "name": "run_code", "description": "Run a script and return its output",
    "parameters": {"type": "object", "properties": {"language": {"type": "string"},
                                                   "code": {"type": "string"}},
                   "required": ["language", "code"]}}}]


def _tool_runtime(drop_short: bool):
    """Replays llama-server's streamed tool call (tests/data/sse); the faulty one drops
    argument chunks shorter than 16 characters, as a streaming heuristic seen in the wild did."""
    data = Path(__file__).parent / "data" / "sse"
    events = [e for e in (data / "llama_server_chat_tool_call_draft.txt").read_bytes()
              .split(b"\n\n") if e.strip()]
    if drop_short:
        events = [e for e in events if _arg(e) is None or len(_arg(e)) >= 16 or b'"name"' in e]
    stream = b"\n\n".join(events) + b"\n\n"
    whole = (data / "llama_server_chat_tool_call_draft.json").read_bytes()
    seen = []

    class T(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # readiness probe
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(req)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(stream if req.get("stream") else whole)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), T)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}", seen


def test_tool_calls_are_sent_and_a_streaming_path_that_mangles_them_is_flagged(model_pair,
                                                                              tmp_path):
    a, a_url, seen = _tool_runtime(drop_short=False)
    b, b_url, _ = _tool_runtime(drop_short=True)
    try:
        proc = run_job(http_job(model_pair, {
            "type": "http", "api": "chat", "runtime": "llama-server", "variants": [
                {"name": "plain", "base_url": a_url},
                {"name": "draft", "speculative": True, "num_draft_tokens": 3,
                 "base_url": b_url}]}, tools=TOOLS), tmp_path)
    finally:
        a.shutdown()
        b.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert seen and all(r["tools"] == TOOLS for r in seen)
    ev = events(tmp_path / "j.jsonl")
    plain, spec = [e for e in ev if e["type"] == "generation"]
    assert plain["tool_parity"] == "ok" and plain["parity"] == "ok"
    assert plain["tool_calls"] == [{"name": "run_code", "arguments": ARGS}]
    assert plain["acceptance"] == "reported" and plain["acceptance_rate"] == 19 / 24
    assert plain["reported_decode_tok_s"] == 44.1 and plain["nonstreamed_tokens"] == 31
    # content streamed fine; only the tool call was mangled, and that is what is reported
    assert spec["first_difference"] is None and spec["parity"] == "mismatch"
    assert spec["tool_parity"] == "mismatch"
    assert spec["tool_first_difference"] == {"call": 0, "field": "arguments", "offset": 2}
    (summary,) = [e for e in ev if e["type"] == "config_summary" and e["mode"] == "speculative"]
    assert summary["parity"] == {"checked": 1, "mismatches": 1, "first_difference": None,
                                 "tool_mismatches": 1}
    # chat wraps the prompt in the runtime's template: its own series, never pooled with
    # raw-prompt runs of the same runtime
    assert summary["engine"] == "llama-server (chat)" == plain["runtime"]


def test_a_workload_with_malformed_tools_is_refused(model_pair, tmp_path):
    job = build_job(model_pair, ["code"], max_tokens=8)
    job["workloads"][0]["tools"] = [{"type": "function", "function": {"description": "x"}}]
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode != 0
    assert "tools: must be a list of" in proc.stderr


def test_runtime_specific_fields_are_swept_one_at_a_time(model_pair, tmp_path):
    """engine.knobs sweeps request fields the runtime defines (llama-server reads the flat
    key "speculative.n_max"); identical greedy output across them is what lossless
    speculation should give, so it is not reported as a knob without effect."""
    a, a_url, seen_a = _tool_runtime(drop_short=False)
    b, b_url, seen_b = _tool_runtime(drop_short=False)
    try:
        proc = run_job(http_job(model_pair, {
            "type": "http", "api": "chat", "runtime": "llama-server",
            "model": "demo-target-Q8_0.gguf", "knobs": {"speculative.n_max": [2, 8]},
            "variants": [{"name": "plain", "base_url": a_url},
                         {"name": "draft", "speculative": True, "base_url": b_url,
                          "fields": {"speculative.n_min": 0}}]}), tmp_path)
    finally:
        a.shutdown()
        b.shutdown()
    assert proc.returncode == 0, proc.stderr
    sent = [(r.get("speculative.n_max"), r.get("speculative.n_min"), r["stream"])
            for r in seen_b]
    # a warm-up at the base config first (its output is not measured), then one knob
    # setting at a time
    assert sent == [(None, 0, True), (None, 0, False), (None, 0, True), (None, 0, False),
                    (2, 0, True), (2, 0, False), (8, 0, True), (8, 0, False)]
    assert {r["model"] for r in seen_a + seen_b} == {"demo-target-Q8_0.gguf"}
    ev = events(tmp_path / "j.jsonl")
    spec = [e for e in ev if e["type"] == "generation" and e["variant"] == "draft"]
    assert [(g["knob"], g["knob_value"]) for g in spec] == [
        ("temperature", 0.0), ("speculative.n_max", 2), ("speculative.n_max", 8)]
    assert spec[1]["config"]["speculative.n_max"] == 2 and spec[1]["exact_match"] is True
    assert not [e for e in ev if e["type"] == "knob_effect"]
    summaries = [e for e in ev if e["type"] == "config_summary" and e["mode"] == "speculative"]
    assert sorted(str(s["knob_value"]) for s in summaries) == ["0.0", "2", "8"]


def test_engine_knobs_must_be_lists_of_values(model_pair, tmp_path):
    job = build_job(model_pair, ["code"], max_tokens=8)
    job["engine"] = {"type": "http", "knobs": {"speculative.n_max": 4},
                     "variants": [{"name": "plain", "base_url": "http://127.0.0.1:9"}]}
    job["knobs"] = {"temperature": [0.0]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "engine.knobs: a map of request field → non-empty list of values" in proc.stderr


def test_tools_with_the_completions_api_are_a_notice_not_a_silent_drop(model_pair, tmp_path):
    srv, url, seen = _tool_runtime(drop_short=False)
    try:
        job = http_job(model_pair, {"type": "http", "api": "completions",
                                    "runtime": "llama-server",
                                    "variants": [{"name": "plain", "base_url": url}]},
                       tools=TOOLS)
        proc = run_job(job, tmp_path)
    finally:
        srv.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert seen and not any("tools" in r for r in seen)
    (notice,) = [e for e in events(tmp_path / "j.jsonl") if e["type"] == "notice"]
    assert notice["workload"] == job["workloads"][0]["name"]
    assert notice["message"].startswith("tools not sent: the completions API has none")


CHATTY = """
import http.server, json, sys
port = int(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"data": []}')
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sys.stderr.write("request log line " * 8000 + "\\n")  # ~140 kB per request
        self.send_response(200); self.end_headers()
        if body.get("stream"):
            self.wfile.write(b'data: {"choices": [{"text": "ok"}]}\\n\\ndata: [DONE]\\n\\n')
        else:
            self.wfile.write(b'{"choices": [{"text": "ok"}]}')
sys.stderr.write("starting " * 20000 + "\\n")  # more than a pipe holds, before serving
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_chatty_runtime_does_not_stall_and_a_dead_one_says_why(model_pair, tmp_path):
    port = free_port()
    job = http_job(model_pair, {
        "type": "http", "runtime": "chatty", "ready_timeout_s": 20, "variants": [
            {"name": "chatty", "base_url": f"http://127.0.0.1:{port}",
             "command": [sys.executable, "-c", CHATTY, str(port)]},
            {"name": "broken", "base_url": f"http://127.0.0.1:{free_port()}",
             "command": [sys.executable, "-c", "import sys; print('loading weights...'); "
                         "sys.exit('error: no such model: /models/missing')"]}]})
    job["repetitions"] = 3
    proc = run_job(job, tmp_path)
    assert proc.returncode == 0, proc.stderr
    ev = events(tmp_path / "j.jsonl")
    assert len([e for e in ev if e["type"] == "generation"]) == 3
    log = tmp_path / "j.chatty.log"
    assert log.stat().st_size > 500_000  # all of it went to the log, none blocked a pipe
    # every planned generation of the broken variant is counted as failed, with why; it
    # is started once, not once per repetition
    failed = [e for e in ev if e["type"] == "generation_failed"]
    assert len(failed) == 3 and {f["repetition"] for f in failed} == {0, 1, 2}
    for f in failed:
        assert f["variant"] == "broken"
        assert f["error"].startswith("runtime broken exited 1: loading weights...")
        assert "error: no such model: /models/missing" in f["error"]
        assert f"(log: {tmp_path / 'j.broken.log'})" in f["error"]
    assert [e for e in ev if e["type"] == "job_finished"][0]["failed"] == 3


class Guarded(Stubborn):
    """A runtime started with an API key (llama-server --api-key): 401 without it."""

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == "Bearer s3cret":
            return True
        self.send_response(401)
        self.end_headers()
        self.wfile.write(b'{"error": {"code": 401, "message": "Invalid API Key", '
                         b'"type": "authentication_error"}}')
        return False

    def do_GET(self):
        if self._allowed():
            super().do_GET()

    def do_POST(self):
        if self._allowed():
            super().do_POST()


def test_api_key_headers_come_from_the_node_environment(model_pair, tmp_path):
    import os

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Guarded)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    job = http_job(model_pair, {"type": "http", "runtime": "llama-server", "ready_timeout_s": 2,
                                "headers": {"Authorization": "Bearer ${SPECFLEET_TEST_KEY}"},
                                "variants": [{"name": "plain", "base_url": url}]})
    (tmp_path / "job.json").write_text(json.dumps(job))
    try:
        runs = {}
        for label, key in (("right", "s3cret"), ("missing", None), ("wrong", "guess")):
            env = {k: v for k, v in os.environ.items() if k != "SPECFLEET_TEST_KEY"}
            if key:
                env["SPECFLEET_TEST_KEY"] = key
            d = tmp_path / label
            d.mkdir()
            proc = run_agent(tmp_path / "job.json", d / "j.jsonl", env=env)
            assert proc.returncode == 0, proc.stderr
            runs[label] = events(d / "j.jsonl")
    finally:
        srv.shutdown()
    assert [e["type"] for e in runs["right"]].count("generation") == 1
    assert "s3cret" not in (tmp_path / "job.json").read_text()  # the key is not in the job
    (failed,) = [e for e in runs["missing"] if e["type"] == "generation_failed"]
    assert failed["error"] == ("engine.headers.Authorization: environment variable "
                               "SPECFLEET_TEST_KEY is not set on the node")
    (failed,) = [e for e in runs["wrong"] if e["type"] == "generation_failed"]
    assert failed["error"].startswith(f"runtime plain refused {url}/v1/models: HTTP 401: ")
    assert "Invalid API Key" in failed["error"] and "check engine.headers" in failed["error"]


def test_a_draft_width_knob_for_an_http_job_is_refused(model_pair, tmp_path):
    """The draft width of an http variant is fixed by its server command: a job sweeping it
    was once run and the knob silently dropped."""
    job = build_job(model_pair, ["code"], max_tokens=8)  # default knobs: draft widths
    job["engine"] = {"type": "http", "variants": [{"name": "plain",
                                                   "base_url": "http://127.0.0.1:9"}]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl")
    assert proc.returncode == 2
    assert "knobs.num_draft_tokens: the http engine cannot honour num_draft_tokens" \
        in proc.stderr
