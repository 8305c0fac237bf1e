"""The http engine: runtimes behind an OpenAI-compatible API, one trace per request.

Variants are server configurations (the baseline without drafting first, then speculative
ones). The agent can start each from a command line and waits until ``/v1/models``
answers. Every request is sent streamed (the trace) and not streamed (the end-to-end time,
and the reference for streaming parity at temperature 0). What to run, in which order, how
to warm up, compare and summarise is the shared loop's (``agent/loop.py``).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import httpengine as h
from .engine_api import EngineUnavailable, Request, Slot, Variant
from .engines import ENGINES
from .job import Job, Workload
from .journal import Journal
from .load import Reply
from .protocol import DRAFT_FREE_METHODS, KNOBS
from .trace import Trace


class Runtime:
    """A server process the agent owns for the length of one variant. Its output goes to
    a log file beside the journal: a pipe nobody reads fills up and stalls a chatty
    server mid-sweep."""

    def __init__(self, variant: dict, ready_timeout_s: float, log: Path,
                 headers: dict | None = None):
        self.variant, self.timeout, self.log = variant, ready_timeout_s, log
        self.headers = headers or {}
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        cmd = self.variant.get("command")
        if cmd:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout
        url = self.variant["base_url"].rstrip("/") + "/v1/models"
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(url, headers=self.headers),
                                       timeout=2).read()
                return self
            except urllib.error.HTTPError as e:
                if e.code in (401, 403):  # up, but refuses us: waiting will not help
                    self.__exit__()
                    body = e.read().decode(errors="replace")[:200]
                    raise h.HTTPEngineError(f"runtime {self.variant['name']} refused {url}: "
                                            f"HTTP {e.code}: {body} (check engine.headers)"
                                            ) from None
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise h.HTTPEngineError(f"runtime {self.variant['name']} not ready at "
                                            f"{url} after {self.timeout:g}s (HTTP {e.code})"
                                            ) from None
                time.sleep(0.2)
            except OSError as e:
                if self.died():
                    raise h.HTTPEngineError(self.died()) from None
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise h.HTTPEngineError(f"runtime {self.variant['name']} not ready at "
                                            f"{url} after {self.timeout:g}s ({e}); its log: "
                                            f"{self.log}") from None
                time.sleep(0.2)

    def died(self) -> str | None:
        """Why the runtime is gone (exit status and the end of its log), if it is."""
        if not self.proc or self.proc.poll() is None:
            return None
        try:
            tail = self.log.read_bytes()[-300:].decode(errors="replace").strip()
        except OSError:
            tail = ""
        return (f"runtime {self.variant['name']} exited {self.proc.returncode}: {tail} "
                f"(log: {self.log})")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _body(api: str, prompt: str, max_tokens: int, cfg: dict, fields: dict,
          tools: tuple = ()) -> dict:
    # temperature always; other sampling knobs only when set away from their default
    # (runtimes differ in what they accept, and the default is what they do anyway)
    body = {"max_tokens": max_tokens, **{
        field: cfg[name] for name, field in ENGINES["http"].knobs.items()
        if name in cfg and (name == "temperature" or cfg[name] != KNOBS[name].default)},
        **fields}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = list(tools)
    else:
        body["prompt"] = prompt
    return body


class HttpEngine:
    name = "http"
    variants_are_configs = True  # each variant is a runtime set up its own way

    @classmethod
    def start(cls, job: Job, journal: Journal) -> HttpEngine:
        return cls(job, journal)

    def __init__(self, job: Job, journal: Journal):
        eng = self.eng = job.engine
        self.journal = journal
        self.api = eng.get("api", "completions")
        self.timeout = float(eng.get("request_timeout_s", 300))  # per socket read
        # the chat API wraps the prompt in the runtime's chat template, so its runs are not
        # comparable with raw-prompt ones (in-process mlx-lm, /v1/completions): its own series
        self.runtime = eng.get("runtime", "http") + (" (chat)" if self.api == "chat" else "")
        self.count = None
        if eng.get("tokenizer"):
            from mlx_lm import load

            self.count = load(eng["tokenizer"])[1].encode
        self.field_knobs = eng.get("knobs", {})
        self.specs = {v["name"]: v for v in eng["variants"]}
        self.variants = tuple(Variant(v["name"], bool(v.get("speculative")),
                                      int(v.get("num_draft_tokens", 0)),
                                      method=v.get("method") if v.get("method") in
                                      DRAFT_FREE_METHODS else None)
                              for v in eng["variants"])
        # runtimes already serving cost nothing to interleave; ones the agent starts would
        # each hold their weights at once, so they run in blocks unless the plan says so
        self.holds_all_variants = bool(eng.get("interleave", not any(
            v.get("command") for v in eng["variants"])))
        self.running: dict[str, Runtime] = {}
        self.headers: dict[str, dict] = {}

    def activate(self, variant: Variant) -> Variant | None:
        rt = self.running.get(variant.name)
        if rt and not rt.died():
            return None
        if not self.holds_all_variants:
            for name in list(self.running):
                self.running.pop(name).__exit__()
        spec = self.specs[variant.name]
        log = self.journal.path.with_name(f"{self.journal.path.stem}.{variant.name}.log")
        try:
            headers = h.expand_headers({**self.eng.get("headers", {}),
                                        **spec.get("headers", {})}, os.environ)
            self.running[variant.name] = Runtime(spec, float(self.eng.get("ready_timeout_s", 60)),
                                                 log, headers).__enter__()
        except h.HTTPEngineError as e:
            raise EngineUnavailable(str(e)) from None
        self.headers[variant.name] = headers
        self.journal.emit("runtime_ready", runtime=self.runtime, variant=variant.name,
                          base_url=spec["base_url"])
        return variant

    def runtime_pid(self, variant: Variant) -> int | None:
        rt = self.running.get(variant.name)
        return rt.proc.pid if rt and rt.proc else None

    def cpu_accounted(self, variant: Variant) -> bool:
        # a runtime someone else started (Ollama, LM Studio) works in a process we cannot
        # tell from any other: its CPU would read as contention
        return bool(self.specs[variant.name].get("command"))

    def prompt_tokens(self, w: Workload) -> int | None:
        return len(self.count(w.prompt)) if self.count else None

    def generate(self, req: Request) -> Trace:
        spec = self.specs[req.variant.name]
        # Ollama and LM Studio pick the model by name; llama-server and mlx_lm.server serve
        # what they loaded
        model = spec.get("model", self.eng.get("model"))
        fields = {**({"model": model} if model else {}), **spec.get("fields", {}), **req.fields}
        body = _body(self.api, req.prompt, req.max_tokens, req.config, fields, req.tools)
        url, headers = spec["base_url"], self.headers.get(req.variant.name, {})
        s, _ = h.stream(url, self.api, body, self.timeout, headers=headers)
        t0 = time.perf_counter()
        whole = h.complete(url, self.api, body, self.timeout, headers=headers)
        wall = time.perf_counter() - t0
        if req.config.get("temperature", 0) == 0:
            par = h.parity("".join(t for _, t in s.chunks), whole["text"])
            tpar = h.tool_parity(s.tool_calls, whole["tool_calls"])
            if tpar["tool_parity"] == "mismatch":  # one verdict for the review
                par = {**par, "parity": "mismatch"}
        else:  # two samples of a sampled output differ by design: nothing to compare
            par = {"parity": "not compared (sampled)", "first_difference": None}
            tpar = {"tool_parity": None}
        t = h.trace_of(s, self.count)
        # what the run produced, for exactness and the reader: the non-streamed reply (the
        # same text at temperature 0, which parity checks)
        t.output_text = whole["text"]
        t.token_ids = self.count(whole["text"]) if self.count else None
        t.fields.update(par, **tpar, **h.nonstreamed(
            whole, wall, self.count,
            t.fields.get("usage_problem") if t.fields.get("usage_implausible") else None),
                        tool_calls=whole["tool_calls"])
        return t

    def load_sender(self, variant: Variant, w: Workload, config: dict):
        """A request of a load level: stream one reply; its tokens' arrival times (seconds
        since sent). Thread-safe: each call opens its own connection."""
        spec = self.specs[variant.name]
        model = spec.get("model", self.eng.get("model"))
        fields = {**({"model": model} if model else {}), **spec.get("fields", {})}
        body = _body(self.api, w.prompt, w.max_tokens, config, fields, w.tools)
        url, headers = spec["base_url"], self.headers.get(variant.name, {})

        def send(i: int) -> Reply:
            s, _ = h.stream(url, self.api, body, self.timeout, headers=headers)
            return reply_of(s, self.count)

        return send

    def closed_loop(self, variant: Variant, w: Workload, config: dict, concurrency: int,
                    requests: int):
        from .load import closed_loop

        return closed_loop(self.load_sender(variant, w, config), concurrency, requests)

    def extras(self, m: dict, req: Request) -> dict:
        return {}

    def describe(self, slot: Slot) -> tuple[dict, dict]:
        names = {"engine": "http", "runtime": self.runtime, "variant": slot.variant.name}
        # a draft-free variant's results (and the baseline measured beside it) are a pair
        # of their own: no draft weights, never pooled with the draft model's
        method = (slot.partner or slot.variant).method
        if method:
            names["method"] = method
        return names, {**slot.config, "variant": slot.variant.name, **slot.fields}

    def explain(self, e: Exception, variant: Variant) -> str:
        if isinstance(e, h.HTTPEngineError):
            rt = self.running.get(variant.name)
            why = rt.died() if rt else None  # a crashed runtime says more than "refused"
            return f"{e}; {why}" if why else str(e)
        return f"{type(e).__name__}: {e}"  # odd input from one request: that request

    def notices(self, job: Job) -> list[dict]:
        if self.api == "chat":
            return []
        # never silently: the reader must know the calls went unchecked
        return [{"workload": w.name, "message": "tools not sent: the completions API has "
                 "none; use engine.api: chat to check tool calls"}
                for w in job.workloads if w.tools]

    def close(self) -> None:
        for rt in self.running.values():
            rt.__exit__()
        self.running.clear()


def reply_of(s: h.Stream, count_tokens=None) -> Reply:
    """A streamed request as a load level reads it: its chunks as they arrived (ITL is
    their gaps) and its tokens as counted (TPOT), usage only where plausible."""
    t = h.trace_of(s, count_tokens)
    return Reply(t.arrivals, len(t.token_times), t.drafted, t.accepted)
