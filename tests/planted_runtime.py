"""A planted OpenAI-compatible runtime with known faults, for testing the http engine.

Written against the public API shape (``/v1/models``, ``/v1/completions`` with and without
``stream``), not against specfleet: it imports nothing from the project. Run as
``python planted_runtime.py --port N --mode MODE [--tokenizer tokenizer.json]``.

Modes:
- ``correct``: greedy text is fixed; at temperature > 0 each request samples new words
  (streamed and non-streamed differ, as they should); one token per SSE chunk; usage true.
- ``fail``: every completion request answers HTTP 500 with an error body.
- ``surrogate``: the emoji U+1F600 is streamed as two JSON escapes of its UTF-16 halves in
  two separate events (``"\\ud83d"`` then ``"\\ude00"``); the non-streamed text is whole.
- ``double-usage``: correct text, but ``usage.completion_tokens`` is twice the truth.
- ``diverge``: like ``correct``, but its greedy text differs from it at character 12.
- ``serial``: like ``correct``, but one request at a time (a lock around each reply):
  more concurrency brings no more throughput.
- ``explode``: each token takes ``--token-ms`` × (requests in flight)³: latency grows
  much faster than the load past a few streams.
- ``overload``: answers HTTP 503 to a request that finds 2 or more already in flight.
- ``prefill``: like ``correct``, but every reply's first token comes ``--wait-ms`` after
  the request (a long prompt's prefill), whatever else is in flight: it keeps up with any
  rate, each answer a fixed time late.
- ``hold``: like ``correct``, but holds every request until none has come for
  ``--wait-ms``, then answers them all at once (a server that queues, then drains).

``--token-ms`` spaces the streamed tokens (default 0), as a model's decode would.
"""

from __future__ import annotations

import argparse
import http.server
import json
import random
import threading
import time

INFLIGHT = [0]
INFLIGHT_LOCK = threading.Lock()
LAST_ARRIVAL = [0.0]  # when the last request came (``hold``)
SERIAL = threading.Lock()

GREEDY = ("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"
          "\n\nprint(fib(10))\n")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
         "kappa", "lambda", "mu"]


class Tokens:
    def __init__(self, path: str | None):
        self.tok = None
        if path:
            from tokenizers import Tokenizer

            self.tok = Tokenizer.from_file(path)

    def split(self, text: str) -> list[str]:
        """The text as the runtime would emit it, one piece per token."""
        if self.tok is None:
            return [w + " " for w in text.split(" ")] if text else []
        ids = self.tok.encode(text).ids
        pieces, done = [], ""
        for i in range(len(ids)):
            upto = self.tok.decode(ids[: i + 1])
            pieces.append(upto[len(done):])
            done = upto
        return [p for p in pieces if p]


def answer(body: dict, tokens: Tokens) -> list[str]:
    n = int(body.get("max_tokens") or 16)
    if float(body.get("temperature") or 0) > 0:
        rng = random.Random()  # fresh entropy: sampling differs request to request
        text = " ".join(rng.choice(WORDS) for _ in range(n))
    else:
        text = GREEDY
    return tokens.split(text)[:n]


def make_handler(mode: str, tokens: Tokens, token_ms: float = 0.0, wait_ms: float = 0.0):
    global GREEDY
    if mode == "diverge":
        GREEDY = GREEDY[:12] + "X" + GREEDY[13:]
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _json(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "planted", "object": "model"}]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self):
            with INFLIGHT_LOCK:
                INFLIGHT[0] += 1
                busy = INFLIGHT[0]
                LAST_ARRIVAL[0] = time.monotonic()
            try:
                if mode == "prefill":
                    time.sleep(wait_ms / 1e3)
                while mode == "hold" and (quiet := time.monotonic() - LAST_ARRIVAL[0]) \
                        < wait_ms / 1e3:
                    time.sleep(wait_ms / 1e3 - quiet)
                if mode == "serial":
                    with SERIAL:
                        self.reply(busy)
                else:
                    self.reply(busy)
            finally:
                with INFLIGHT_LOCK:
                    INFLIGHT[0] -= 1

        def reply(self, busy: int):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            if mode == "overload" and busy > 2:
                self._json(503, {"error": {"message": "planted overload: server busy"}})
                return
            if mode == "fail":
                self._json(500, {"error": {"message": "planted failure: model exploded"}})
                return
            pieces = answer(body, tokens)
            n = len(pieces) * (2 if mode == "double-usage" else 1)
            usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
            if not body.get("stream"):
                text = "".join(pieces) + ("\U0001F600" if mode == "surrogate" else "")
                self._json(200, {"id": "c", "object": "text_completion", "choices": [
                    {"index": 0, "text": text, "finish_reason": "length"}], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()

            def event(raw: str) -> None:
                self.wfile.write(f"data: {raw}\n\n".encode())
                self.wfile.flush()

            for p in pieces:
                if token_ms:
                    scale = INFLIGHT[0] ** 3 if mode == "explode" else 1
                    time.sleep(token_ms * scale / 1e3)
                event(json.dumps({"choices": [{"index": 0, "text": p, "finish_reason": None}]}))
            if mode == "surrogate":  # the two UTF-16 halves, each its own event
                event('{"choices": [{"index": 0, "text": "\\ud83d", "finish_reason": null}]}')
                event('{"choices": [{"index": 0, "text": "\\ude00", "finish_reason": null}]}')
            event(json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                              "usage": usage}))
            event("[DONE]")
            self.close_connection = True

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="correct",
                    choices=["correct", "fail", "surrogate", "double-usage", "diverge",
                             "serial", "explode", "overload", "prefill", "hold"])
    ap.add_argument("--token-ms", type=float, default=0.0, help="milliseconds per token")
    ap.add_argument("--wait-ms", type=float, default=0.0,
                    help="prefill: before the first token; hold: the quiet that releases")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer.json to count tokens with")
    ap.add_argument("--ballast-mb", type=int, default=0,
                    help="hold this much memory, touched, as weights would be")
    args = ap.parse_args()
    ballast = bytearray(b"\x01" * (args.ballast_mb * 2**20))  # noqa: F841  # held, not read
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port),
                                             make_handler(args.mode, Tokens(args.tokenizer),
                                                          args.token_ms, args.wait_ms))
    server.serve_forever()


if __name__ == "__main__":
    main()
