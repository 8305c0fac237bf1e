"""A sweep through a runtime's HTTP API instead of in-process mlx-lm.

Variants are server configurations (baseline without drafting first, then speculative
ones); the agent can start each from a command line, wait until ``/v1/models`` answers,
measure, and stop it. Every request is sent streamed (measured) and not streamed (for
parity); greedy output of a speculative variant must equal the baseline variant's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from . import httpengine as h
from .job import Job
from .journal import Journal
from .protocol import KNOBS, SAMPLING_DEFAULTS
from .summary import emit_summaries, exactness


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
        knob.engines["http"]: cfg[name] for name, knob in KNOBS.items()
        if "http" in knob.engines and name in cfg
        and (name == "temperature" or cfg[name] != knob.default)}, **fields}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["stream_options"] = {"include_usage": True}
        if tools:
            body["tools"] = list(tools)
    else:
        body["prompt"] = prompt
    return body


def _config(job: Job, eng: dict, variant: dict, knob, value, field_knobs: dict
            ) -> tuple[dict, dict]:
    """The sampling config and the extra request fields for one knob setting."""
    # Ollama and LM Studio pick the model by name; llama-server and mlx_lm.server serve
    # what they loaded
    model = variant.get("model", eng.get("model"))
    fields = {**({"model": model} if model else {}), **variant.get("fields", {})}
    if knob in field_knobs:
        return dict(job.base), {**fields, knob: value}
    return {**job.base, **({knob: value} if knob else {})}, fields


def _observe(url: str, api: str, body: dict, timeout: float, headers: dict, count,
             decode_skip: int) -> tuple[dict, dict]:
    """One request config streamed (measured) and not (end to end, and the reference for
    parity): the event fields, and the non-streamed reply."""
    s, _ = h.stream(url, api, body, timeout, headers=headers)
    t0 = time.perf_counter()
    whole = h.complete(url, api, body, timeout, headers=headers)
    wall = time.perf_counter() - t0
    if body.get("temperature", 0) == 0:
        par = h.parity("".join(t for _, t in s.chunks), whole["text"])
        tpar = h.tool_parity(s.tool_calls, whole["tool_calls"])
        if tpar["tool_parity"] == "mismatch":  # one verdict for the review
            par = {**par, "parity": "mismatch"}
    else:  # two samples of a sampled output differ by design: nothing to compare
        par = {"parity": "not compared (sampled)", "first_difference": None}
        tpar = {"tool_parity": None}
    return {**par, **tpar, **h.measure(s, count, decode_skip),
            **h.nonstreamed(whole, wall, count)}, whole


def run_http_job(job: Job, journal: Journal) -> int:
    eng = job.engine
    api = eng.get("api", "completions")
    timeout = float(eng.get("request_timeout_s", 300))  # per socket read: a slow first byte
    # the chat API wraps the prompt in the runtime's chat template, so its runs are not
    # comparable with raw-prompt ones (in-process mlx-lm, /v1/completions): its own series
    runtime = eng.get("runtime", "http") + (" (chat)" if api == "chat" else "")
    count = None
    if eng.get("tokenizer"):
        from mlx_lm import load

        count = load(eng["tokenizer"])[1].encode
    field_knobs = eng.get("knobs", {})
    knob_values = [(k, v) for k, vals in {**job.knobs, **field_knobs}.items()
                   if k != "num_draft_tokens" for v in vals] or [(None, None)]
    gens: list[dict] = []
    refs: dict[tuple, list] = {}
    outputs: dict[tuple, dict] = {}
    i = 0
    if api != "chat":
        for w in job.workloads:
            if w.tools:  # never silently: the reader must know the calls went unchecked
                journal.emit("notice", workload=w.name,
                             message="tools not sent: the completions API has none; "
                                     "use engine.api: chat to check tool calls")
    planned = len(eng["variants"]) * len(job.workloads) * job.repetitions * len(knob_values)
    journal.emit("plan", total_generations=planned, already_done=0, engine="http",
                 runtime=runtime, variants=[v["name"] for v in eng["variants"]],
                 repetitions=job.repetitions)
    for variant in eng["variants"]:
        mode = "speculative" if variant.get("speculative") else "baseline"
        try:
            log = journal.path.with_name(f"{journal.path.stem}.{variant['name']}.log")
            headers = h.expand_headers({**eng.get("headers", {}),
                                        **variant.get("headers", {})}, os.environ)
            rt = Runtime(variant, float(eng.get("ready_timeout_s", 60)), log,
                         headers).__enter__()
        except h.HTTPEngineError as e:
            journal.emit("generation_failed", variant=variant["name"], error=str(e))
            continue
        try:
            journal.emit("runtime_ready", runtime=runtime, variant=variant["name"],
                         base_url=variant["base_url"])
            for w in job.workloads:
                for rep in range(job.repetitions):
                    for knob, value in knob_values:
                        cfg, fields = _config(job, eng, variant, knob, value, field_knobs)
                        body = _body(api, w.prompt, w.max_tokens, cfg, fields, w.tools)
                        desc = {"run_index": i, "workload": w.name, "workload_kind": w.kind,
                                "context_bucket": w.context_bucket,
                                "prompt_sha256": w.prompt_sha256, "mode": mode,
                                "engine": "http", "runtime": runtime,
                                "variant": variant["name"], "knob": knob or "variant",
                                "knob_value": value if knob else variant["name"],
                                "num_draft_tokens": int(variant.get("num_draft_tokens", 0)),
                                "config": {**cfg, "variant": variant["name"],
                                           **({knob: value} if knob in field_knobs else {})},
                                "repetition": rep, "max_tokens": w.max_tokens, "seed": job.seed}
                        i += 1
                        try:
                            seen, whole = _observe(variant["base_url"], api, body, timeout,
                                                   headers, count, job.decode_skip_tokens)
                            ids = count(whole["text"]) if count else []
                        except h.HTTPEngineError as e:
                            why = rt.died()  # a crashed runtime says more than "refused"
                            journal.emit("generation_failed", **desc,
                                         error=f"{e}; {why}" if why else str(e))
                            continue
                        except Exception as e:  # odd input from one request: that request
                            journal.emit("generation_failed", **desc,
                                         error=f"{type(e).__name__}: {e}")
                            continue
                        key = (w.name, *(cfg.get(k) for k in SAMPLING_DEFAULTS))
                        # the output a speculative variant must reproduce: text, then calls
                        out = (ids or list(whole["text"])) + [
                            json.dumps([c["name"], c["arguments"]]) for c in whole["tool_calls"]]
                        exact = {**exactness(out, refs.get(key), cfg),
                                 "first_divergence_unit": "token" if ids else "character"}
                        if mode == "baseline":
                            refs.setdefault(key, out)
                        outputs.setdefault((variant["name"], w.name, knob), {}).setdefault(
                            value, []).append(whole["text"] + json.dumps(whole["tool_calls"]))
                        gens.append(journal.emit(
                            "generation", **desc, **exact, **seen, output_text=whole["text"],
                            tool_calls=whole["tool_calls"], token_ids=ids,
                            itl_p50_ms=seen["chunk_itl_p50_ms"],
                            itl_p95_ms=seen["chunk_itl_p95_ms"],
                            itl_p99_ms=seen["chunk_itl_p99_ms"], acceptance_by_position=[],
                            unreliable=False, unreliable_reasons=[], peak_mlx_memory_bytes=None))
        finally:
            rt.__exit__()
    for (variant, workload, knob), by_value in outputs.items():
        # sampling knobs must change output; a speculation field (n_max) rightly does not
        if knob and knob not in field_knobs and len(by_value) > 1:
            distinct = {t for texts in by_value.values() for t in texts}
            if len(distinct) == 1:  # e.g. temperature ignored: every setting, same text
                journal.emit("knob_effect", variant=variant, workload=workload, knob=knob,
                             values=sorted(by_value, key=str), effect=False,
                             message=f"knob had no effect: {knob} in {sorted(by_value, key=str)}"
                                     " gave identical output")
    emit_summaries(job, journal, gens)
    journal.emit("job_finished", status="ok", generations=len(gens), engine="http",
                 failed=planned - len(gens))
    return 0
