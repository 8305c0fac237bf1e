"""How faithfully the open-loop load generator keeps its schedule.

Against a local null SSE server (its own process: it answers every completion at once with
two chunks and [DONE]), at rising constant rates, side by side in one run:
- ours: ``agent.load.open_loop`` sending through the http engine's own ``stream``;
- a bare asyncio reference: one task per arrival, ``asyncio.sleep`` to its time, a raw
  HTTP/1.1 request on a fresh connection, the response read to the end.

Per rate: the achieved share of the target rate ((n-1) gaps over first→last send) and the
send lag (sent − scheduled) p50 / p99. The target: ≥ 99% of the rate and p99 ≤ 1 ms; the
last line names the highest rate where ours meets it on this machine. Run:
``.venv/bin/python bench/load_accuracy.py [--rates 10,50,100,200,400] [--seconds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent import httpengine  # noqa: E402
from agent.load import open_loop  # noqa: E402
from agent.stats import percentile  # noqa: E402

NULL_SERVER = r'''
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        body = b'{"data": []}'
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close"); self.end_headers()
        for t in ("a", "b"):
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": "' + t.encode()
                             + b'", "finish_reason": null}]}\n\n')
        self.wfile.write(b"data: [DONE]\n\n"); self.wfile.flush()
        self.close_connection = True
http.server.ThreadingHTTPServer.request_queue_size = 1024
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''
BODY = b'{"prompt": "x", "max_tokens": 2, "stream": true}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours(url: str, rate: float, n: int) -> list[tuple[float, float]]:
    def send(i: int) -> list[float]:
        s, _ = httpengine.stream(url, "completions", {"prompt": "x", "max_tokens": 2}, 10)
        return [t for t, _ in s.chunks]

    outcomes, _ = open_loop(send, rate, n, "constant", max_concurrency=64)
    bad = [o.error for o in outcomes if not o.ok]
    if bad:
        raise SystemExit(f"ours: {len(bad)} requests failed at {rate}/s: {bad[0]}")
    return [(o.scheduled, o.sent) for o in outcomes]


async def _reference(port: int, rate: float, n: int) -> list[tuple[float, float]]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    out: list[tuple[float, float]] = []

    async def one(at: float) -> None:
        sent = loop.time() - t0
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(BODY)).encode()
                     + b"\r\n\r\n" + BODY)
        await writer.drain()
        await reader.read()
        writer.close()
        out.append((at, sent))

    tasks = []
    for i in range(n):
        at = i / rate
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        tasks.append(asyncio.create_task(one(at)))
    await asyncio.gather(*tasks)
    return sorted(out)


def reference(port: int, rate: float, n: int) -> list[tuple[float, float]]:
    return asyncio.run(_reference(port, rate, n))


def judge(pairs: list[tuple[float, float]], rate: float) -> dict:
    sends = sorted(s for _, s in pairs)
    lags = [(s - at) * 1e3 for at, s in pairs]
    span = sends[-1] - sends[0]
    return {"achieved": (len(sends) - 1) / span / rate if span > 0 else 0.0,
            "p50": percentile(lags, 50) or 0.0, "p99": percentile(lags, 99) or 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="10,25,50,100,200,400,800,1600")
    ap.add_argument("--seconds", type=float, default=3.0, help="per rate and generator")
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", NULL_SERVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        ours(url, 20, 10)  # warm both paths up
        reference(port, 20, 10)
        print(f"{'rate/s':>7} {'n':>5} | {'ours achieved':>13} {'lag p50 ms':>10} "
              f"{'lag p99 ms':>10} | {'asyncio achieved':>16} {'lag p50 ms':>10} "
              f"{'lag p99 ms':>10} | target met")
        best = None
        for rate in (float(r) for r in args.rates.split(",")):
            n = max(10, int(rate * args.seconds))
            a, b = judge(ours(url, rate, n), rate), judge(reference(port, rate, n), rate)
            ok = a["achieved"] >= 0.99 and a["p99"] <= 1.0
            best = rate if ok else best
            print(f"{rate:7g} {n:5d} | {a['achieved']:12.1%} {a['p50']:10.3f} {a['p99']:10.3f} | "
                  f"{b['achieved']:15.1%} {b['p50']:10.3f} {b['p99']:10.3f} | "
                  f"{'yes' if ok else 'no'}")
        print(f"highest rate meeting ≥99% and p99 ≤ 1 ms (ours): "
              f"{f'{best:g}/s' if best else 'none'}")
    finally:
        server.terminate()
        server.wait(5)


if __name__ == "__main__":
    main()
