"""The http engine against a real mlx_lm.server, a server replaying a captured SSE
transcript with planted protocol faults, and proxies that corrupt streaming."""

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agent import httpengine as h
from tests.ports import free_port, wait_served

SSE = Path(__file__).parent / "data" / "sse" / "mlx_lm_server_chat_stream.txt"
PROMPT = "def heappush(heap, item):"


def start_mlx_server(model_pair, draft: bool):
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_pair / "target"),
           "--port", str(port)]
    if draft:
        cmd += ["--draft-model", str(model_pair / "draft"), "--num-draft-tokens", "3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    if wait_served(url, 60):
        return proc, url
    proc.kill()
    raise RuntimeError("mlx_lm.server did not become ready")


@pytest.fixture(scope="module")
def servers(model_pair):
    plain, plain_url = start_mlx_server(model_pair, draft=False)
    spec, spec_url = start_mlx_server(model_pair, draft=True)
    yield plain_url, spec_url
    for p in (plain, spec):
        p.terminate()
        p.wait(10)


BODY = {"prompt": PROMPT, "max_tokens": 96, "temperature": 0}


@pytest.mark.parametrize("which", [0, 1])
def test_streaming_parity_and_measurements_on_mlx_lm_server(servers, which):
    url = servers[which]
    s, _ = h.stream(url, "completions", BODY)
    whole = h.complete(url, "completions", BODY)
    streamed = "".join(t for _, t in s.chunks)
    assert h.parity(streamed, whole["text"]) == {"parity": "ok", "first_difference": None}
    m = h.measure(s)
    assert m["ttft_ms"] > 0 and m["decode_tok_s"] > 0 and m["chunks"] == 96
    assert m["chunk_itl_p50_ms"] <= m["chunk_itl_p95_ms"] <= m["chunk_itl_p99_ms"]
    assert m["acceptance"] == "not reported" and m["acceptance_rate"] is None


def test_speculative_server_is_exact_against_its_own_baseline(servers):
    plain, spec = servers
    a = h.complete(plain, "completions", BODY)["text"]
    b = h.complete(spec, "completions", BODY)["text"]
    assert a == b and len(a) > 50


def test_chat_stream_counts_tokens_with_the_tokenizer(servers, model_pair):
    from mlx_lm import load

    _, tok = load(str(model_pair / "target"))
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
            "temperature": 0}
    s, _ = h.stream(servers[0], "chat", {**body, "stream_options": {"include_usage": True}})
    m = h.measure(s, count_tokens=tok.encode)
    assert 0 < m["usage_tokens"] <= 40  # the runtime's own count (EOS may stop early)
    # re-tokenising the streamed text agrees with it (a merge at a boundary may differ by 1)
    assert abs(m["generated_tokens"] - m["usage_tokens"]) <= 2


# -- a server replaying a captured transcript, with planted faults ------------------------

class Replay(http.server.BaseHTTPRequestHandler):
    body = b""     # the streamed reply
    whole = b""    # the non-streamed reply, when a test sends one
    status = 200
    delay = 0.0
    reset_after = None

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        time.sleep(self.delay)
        streamed = req.get("stream") or not self.whole
        self.send_response(self.status)
        self.send_header("Content-Type", "text/event-stream" if self.status == 200 and streamed
                         else "application/json")
        self.end_headers()
        data = self.body if streamed else self.whole
        if self.reset_after is not None:
            self.wfile.write(data[:self.reset_after])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture
def replay():
    servers = []

    def make(body: bytes, **attrs):
        handler = type("R", (Replay,), {"body": body, **attrs})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"
    yield make
    for s in servers:
        s.shutdown()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def test_captured_transcript_keepalives_usage_and_done(replay):
    s, _ = h.stream(replay(SSE.read_bytes()), "chat", CHAT)
    assert s.done and s.comments == 2 and s.usage["completion_tokens"] == 6
    assert s.finish_reason == "length"
    assert len(s.chunks) >= 2


def test_stream_without_done_is_an_error(replay):
    cut = SSE.read_bytes().replace(b"data: [DONE]\n\n", b"")
    with pytest.raises(h.HTTPEngineError, match="the stream ended without \\[DONE\\]"):
        h.stream(replay(cut), "chat", CHAT)


def test_invalid_json_chunk_is_an_error(replay):
    bad = SSE.read_bytes().replace(b'"object": "chat.completion.chunk"', b'"object": chunk', 1)
    with pytest.raises(h.HTTPEngineError, match="invalid JSON in a stream chunk"):
        h.stream(replay(bad), "chat", CHAT)


def test_http_error_carries_the_body_message(replay):
    body = json.dumps({"error": {"message": "model 'x' not found", "type": "not_found"}})
    with pytest.raises(h.HTTPEngineError, match="HTTP 404: model 'x' not found"):
        h.stream(replay(body.encode(), status=404), "chat", CHAT)


def test_error_mid_stream(replay):
    body = SSE.read_bytes().split(b"data: ", 2)
    mid = body[0] + b"data: " + body[1] + b'data: {"error": {"message": "out of memory"}}\n\n'
    with pytest.raises(h.HTTPEngineError, match="error mid-stream: out of memory"):
        h.stream(replay(mid), "chat", CHAT)


def test_slow_first_byte_shows_in_ttft(replay):
    s, _ = h.stream(replay(SSE.read_bytes(), delay=0.3), "chat", CHAT)
    assert h.measure(s)["ttft_ms"] >= 300


def test_a_first_byte_slower_than_the_request_timeout_is_a_clear_error(replay):
    with pytest.raises(h.HTTPEngineError, match=r"/v1/chat/completions: no response within "
                                                r"0.3s \(timed out; a long prompt may need a "
                                                r"larger engine.request_timeout_s\)"):
        h.stream(replay(SSE.read_bytes(), delay=1.0), "chat", CHAT, timeout=0.3)


def test_connection_reset_mid_stream(replay):
    with pytest.raises(h.HTTPEngineError):
        h.stream(replay(SSE.read_bytes(), reset_after=400), "chat", CHAT)


# -- other runtimes' stream shapes (see tests/data/sse/SOURCES.md) --------------------------

DATA = SSE.parent
ARGS = '{"language":"python","code":"print(bytes([255]).hex())"}'
RUN_CODE = [{"name": "run_code", "arguments": ARGS}]


@pytest.mark.parametrize("name,text,usage,acceptance,finish,calls", [
    # fragmented tool call, separate usage chunk, drafting counters in timings
    ("llama_server_chat_tool_call_draft", "Running it now.", 31, (24, 19), "tool_calls", RUN_CODE),
    # reasoning deltas are not content; usage+timings ride on the finish chunk
    ("llama_server_chat_reasoning", "def heappush(heap, item):\n    heap.append(item)", 16, None,
     "stop", []),
    # role repeated in every delta, an empty finish delta, a choices:[] usage chunk
    ("ollama_chat_stream", "A heap keeps its smallest item first.", 8, None, "stop", []),
    # the whole call in one chunk; Ollama's timings carry no draft counters
    ("ollama_chat_tool_call", "", 29, None, "tool_calls", RUN_CODE),
    # no usage anywhere: tokens fall back to the tokenizer or the chunk count
    ("lmstudio_chat_stream", "\nUse heapq.heappush.", None, None, "stop", []),
])
def test_runtime_stream_shapes(replay, name, text, usage, acceptance, finish, calls):
    s, _ = h.stream(replay((DATA / f"{name}.txt").read_bytes()), "chat", CHAT)
    assert "".join(t for _, t in s.chunks) == text
    assert s.finish_reason == finish and s.tool_calls == calls
    m = h.measure(s)
    assert m["usage_tokens"] == usage
    # tool-call chunks are output too: a call-only answer still has a TTFT
    assert m["ttft_ms"] is not None and m["chunks"] == len(s.chunks) + len(s.tool_chunks)
    if usage is None:
        assert m["generated_tokens"] == len(s.chunks)  # one token per chunk, not invented
    if acceptance:
        assert (m["drafted_tokens"], m["accepted_tokens"]) == acceptance
        assert m["acceptance"] == "reported"
    else:
        assert m["acceptance"] == "not reported" and m["acceptance_rate"] is None


def test_llama_server_error_event_mid_stream(replay):
    body = (DATA / "llama_server_error_midstream.txt").read_bytes()
    with pytest.raises(h.HTTPEngineError, match=r"error mid-stream: request \(4130 tokens\) "
                                                r"exceeds the available context size"):
        h.stream(replay(body), "chat", CHAT)


def test_error_body_with_status_200_is_an_error(replay):
    body = json.dumps({"error": {"code": 500, "message": "Context size has been exceeded.",
                                 "type": "server_error"}}).encode()
    with pytest.raises(h.HTTPEngineError, match="Context size has been exceeded"):
        h.complete(replay(b"", whole=body), "chat", CHAT)


def _tool_replay(replay, name, mangle=lambda ev: ev):
    events = [e for e in (DATA / f"{name}.txt").read_bytes().split(b"\n\n") if e.strip()]
    return replay(b"\n\n".join(mangle(events)) + b"\n\n",
                  whole=(DATA / f"{name}.json").read_bytes())


@pytest.mark.parametrize("name", ["llama_server_chat_tool_call_draft", "ollama_chat_tool_call"])
def test_tool_call_parity_holds_for_fragmented_and_whole_calls(replay, name):
    url = _tool_replay(replay, name)
    s, _ = h.stream(url, "chat", CHAT)
    whole = h.complete(url, "chat", CHAT)
    assert whole["tool_calls"] == RUN_CODE  # call ids differ per request and are ignored
    assert h.tool_parity(s.tool_calls, whole["tool_calls"]) == {"tool_parity": "ok",
                                                                "tool_first_difference": None}
    assert h.parity("".join(t for _, t in s.chunks), whole["text"])["parity"] == "ok"


def _arg(e: bytes) -> str | None:
    try:
        return json.loads(e[6:])["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
    except (ValueError, IndexError, KeyError):
        return None


@pytest.mark.parametrize("fault,mangle,field", [
    # the bug seen in the wild: a heuristic dropped tool-call chunks shorter than 16 chars
    ("drops short chunks", lambda ev: [e for e in ev if _arg(e) is None or len(_arg(e)) >= 16
                                       or b'"name"' in e], "arguments"),
    ("reorders fragments", lambda ev: ev[:6] + [ev[7], ev[6]] + ev[8:], "arguments"),
    ("loses the call", lambda ev: [e for e in ev if _arg(e) is None], "missing"),
])
def test_tool_call_streaming_faults_are_flagged(replay, fault, mangle, field):
    url = _tool_replay(replay, "llama_server_chat_tool_call_draft", mangle)
    s, _ = h.stream(url, "chat", CHAT)
    p = h.tool_parity(s.tool_calls, h.complete(url, "chat", CHAT)["tool_calls"])
    assert p["tool_parity"] == "mismatch", fault
    assert p["tool_first_difference"]["field"] == field and p["tool_first_difference"]["call"] == 0
    if field == "arguments":
        assert 0 <= p["tool_first_difference"]["offset"] < len(ARGS)


def test_endpoint_down_is_a_clear_error():
    port = free_port()
    with pytest.raises(h.HTTPEngineError, match=f"http://127.0.0.1:{port}: cannot connect"):
        h.stream(f"http://127.0.0.1:{port}", "completions", BODY)


# -- planted faulty runtimes: a proxy in front of the real server --------------------------

def proxy(upstream: str, mangle):
    """Forwards to ``upstream``; ``mangle(list_of_sse_events) -> list`` on streamed replies."""
    class P(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            req = urllib.request.Request(upstream + self.path, raw,
                                         {"Content-Type": "application/json"})
            data = urllib.request.urlopen(req, timeout=60).read()
            if json.loads(raw).get("stream"):
                events = [e for e in data.split(b"\n\n") if e.strip()]
                data = b"\n\n".join(mangle(events)) + b"\n\n"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), P)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _text(e: bytes) -> str:
    try:
        return json.loads(e[6:])["choices"][0].get("text") or ""
    except (ValueError, IndexError, KeyError):
        return ""


@pytest.mark.parametrize("fault,mangle", [
    # the bug seen in the wild: a tool-call heuristic dropped chunks shorter than 16 chars
    ("drops short chunks", lambda ev: [e for e in ev if not e.startswith(b"data: {")
                                       or len(_text(e)) >= 16]),
    ("reorders chunks", lambda ev: ev[:3] + [ev[4], ev[3]] + ev[5:]),
])
def test_faulty_streaming_paths_are_flagged(servers, fault, mangle):
    srv, url = proxy(servers[0], mangle)
    try:
        s, _ = h.stream(url, "completions", BODY)
        whole = h.complete(url, "completions", BODY)
    finally:
        srv.shutdown()
    p = h.parity("".join(t for _, t in s.chunks), whole["text"])
    assert p["parity"] == "mismatch", fault
    assert 0 <= p["first_difference"] < len(whole["text"])


def test_reported_drafting_is_used_and_absence_is_not_invented():
    s = h.Stream(chunks=[(0.01, "a"), (0.02, "b")], timings={"draft_n": 10,
                                                             "draft_n_accepted": 7})
    m = h.measure(s)
    assert m["acceptance"] == "reported" and m["acceptance_rate"] == 0.7
    assert m["drafted_tokens"] == 10 and m["accepted_tokens"] == 7
    none = h.measure(h.Stream(chunks=[(0.01, "a")]))
    assert none["acceptance"] == "not reported" and none["drafted_tokens"] is None
