"""How faithfully the http engine times a stream: its chunk arrival times against the
moments a local server wrote each chunk, and its parse cost against a bare line loop.

A server in its own process (so it does not share our GIL) writes SSE chunks (the
llama-server shape from tests/data/sse) at a fixed interval and records the monotonic clock
just before each write; the client is ``agent.httpengine.stream``, whose ``perf_counter``
is the same system-wide clock. The difference is the engine's timing error (socket, HTTP
parsing, JSON, bookkeeping). Then, with no
interval, chunks/s through the engine vs a bare ``for line in response`` loop that does
no JSON work, interleaved, median of ``--reps``. Targets: timing error p99 ≤ 1 ms so ITL
percentiles are not ours; engine/bare throughput ≥ 0.5 so parsing never throttles a
runtime streaming hundreds of tokens per second.

    .venv/bin/python bench/http_timing.py [--chunks 400] [--interval-ms 5] [--reps 7]
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import httpengine as h  # noqa: E402
from agent.stats import percentile  # noqa: E402

CHUNK = {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": " tok"}}],
         "created": 1795700412, "id": "chatcmpl-bench", "model": "bench",
         "system_fingerprint": "b9251-e2b129e1b", "object": "chat.completion.chunk"}


def serve(n: int, interval: float, log: Path | None) -> tuple[subprocess.Popen, str]:
    """Start the chunk server in a child process; it appends each stream's write times
    (one JSON list per request) to ``log``."""
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(n), str(interval),
                             str(log or "")], stdout=subprocess.PIPE, text=True)
    return proc, f"http://127.0.0.1:{proc.stdout.readline().strip()}"


def _server(n: int, interval: float, log: str) -> None:
    line = b"data: " + json.dumps(CHUNK, separators=(",", ":")).encode() + b"\n\n"

    class S(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            sent = []
            t_next = time.perf_counter()
            for _ in range(n):
                if interval:
                    while time.perf_counter() < t_next:  # spin: sleep() overshoots
                        pass
                    t_next += interval
                sent.append(time.perf_counter())
                self.wfile.write(line)
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps(sent) + "\n")

        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), S)
    print(srv.server_address[1], flush=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    time.sleep(3600)  # killed by the parent


def bare(url: str) -> int:
    """Read the stream line by line and count data lines: no JSON, no timing."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    conn.request("POST", "/v1/chat/completions", json.dumps({"stream": True}),
                 {"Content-Type": "application/json"})
    n = sum(1 for raw in conn.getresponse() if raw.startswith(b"data: {"))
    conn.close()
    return n


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _server(int(sys.argv[2]), float(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=400)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": args.chunks}
    clock = time.get_clock_info("perf_counter").implementation

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "sent.jsonl"
        proc, url = serve(args.chunks, args.interval_ms / 1e3, log)
        try:
            arrivals = []
            for _ in range(args.reps):
                s, t0 = h.stream(url, "chat", body)
                arrivals.append([t0 + t for t, _ in s.chunks])
        finally:
            proc.kill()
        writes = [json.loads(x) for x in log.read_text().splitlines()]
    errors, itl_err = [], []
    for got, sent in zip(arrivals, writes, strict=True):
        assert len(got) == len(sent) == args.chunks
        errors += [(g - w) * 1e6 for g, w in zip(got, sent)]
        itl_err += [abs((g2 - g1) - (w2 - w1)) * 1e6
                    for g1, g2, w1, w2 in zip(got, got[1:], sent, sent[1:])]
    print(f"clock: {clock}; {args.reps}×{args.chunks} chunks written every "
          f"{args.interval_ms:g} ms")
    print(f"arrival − write: median {statistics.median(errors):.0f} µs, "
          f"p95 {percentile(errors, 95):.0f} µs, p99 {percentile(errors, 99):.0f} µs "
          f"(target p99 ≤ 1000 µs)")
    print(f"ITL error |measured − written gap|: median {statistics.median(itl_err):.0f} µs, "
          f"p99 {percentile(itl_err, 99):.0f} µs")

    proc, url = serve(args.chunks * 10, 0.0, None)
    eng, raw = [], []
    try:
        for _ in range(args.reps):  # interleaved so machine noise hits both
            t = time.perf_counter()
            n = bare(url)
            raw.append(n / (time.perf_counter() - t))
            t = time.perf_counter()
            s, _ = h.stream(url, "chat", body)
            eng.append(len(s.chunks) / (time.perf_counter() - t))
    finally:
        proc.kill()
    me, mr = statistics.median(eng), statistics.median(raw)
    print(f"throughput, {args.chunks * 10} chunks back to back, median of {args.reps}: "
          f"engine {me:,.0f} chunks/s, bare line loop {mr:,.0f} chunks/s, "
          f"engine/bare {me / mr:.2f} (target ≥ 0.5)")


if __name__ == "__main__":
    main()
