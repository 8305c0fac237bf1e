"""The ``http`` engine: measure a runtime through its OpenAI-compatible API.

Standard library only. Streams ``/v1/completions`` or ``/v1/chat/completions`` over SSE,
timing each chunk's arrival; sends the same request without streaming and compares the
two texts at temperature 0 (streaming parity: a runtime whose streaming path drops or
reorders content is flagged with the first differing offset). Acceptance is read where
the runtime reports it (llama-server's ``timings.draft_n`` / ``draft_n_accepted``) and is
otherwise recorded as not reported, never invented. Tool calls are assembled from their
streamed deltas (whole per chunk as Ollama and mlx_lm.server send them, or argument
fragments per ``index`` as llama-server sends them) and compared the same way.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from dataclasses import dataclass, field

from .stats import percentile
from .trace import Trace, metrics


class HTTPEngineError(Exception):
    """A request failed: endpoint down, HTTP error, broken stream."""


@dataclass
class Stream:
    chunks: list[tuple[float, str]] = field(default_factory=list)  # (seconds, text)
    usage: dict | None = None
    timings: dict | None = None
    finish_reason: str | None = None
    done: bool = False  # saw [DONE]
    comments: int = 0
    tool_calls: list[dict] = field(default_factory=list)  # assembled {name, arguments}
    tool_chunks: list[tuple[float, str]] = field(default_factory=list)  # timed fragments
    pending: str = ""  # a UTF-16 high surrogate waiting for its other half
    rejoined: int = 0  # surrogate pairs split across events, joined again
    replaced: int = 0  # lone surrogate halves, replaced by U+FFFD

    def add_tool_deltas(self, deltas: list) -> str:
        return fold_tool_deltas(self.tool_calls, deltas)

    def add_text(self, when: float, text: str) -> None:
        """A content chunk. JSON may carry a character as two ``\\uXXXX`` surrogate halves,
        and a runtime may split them across events: rejoin them here, so no chunk holds
        half a character (a tokenizer or a comparison would choke on it), and count each
        repair: the stream was not what the runtime should have sent."""
        if self.pending and text and "\udc00" <= text[0] <= "\udfff":
            self.rejoined += 1
        text = self.pending + text
        self.pending = ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self.pending = text[:-1], text[-1]
        cleaned = clean_text(text)
        self.replaced += cleaned.count("\ufffd") - text.count("\ufffd")
        if cleaned:
            self.chunks.append((when, cleaned))

    def close(self, when: float) -> None:
        if self.pending:  # a half that never got its partner
            self.pending = ""
            self.replaced += 1
            self.chunks.append((when, "\ufffd"))

    def repairs(self) -> str | None:
        """What was repaired in this stream, in words (None: nothing)."""
        parts = [f"{self.rejoined} surrogate pair(s) split across events rejoined"
                 if self.rejoined else "",
                 f"{self.replaced} lone surrogate half(s) replaced by U+FFFD"
                 if self.replaced else ""]
        return "; ".join(p for p in parts if p) or None


def clean_text(text: str) -> str:
    """Join surrogate pairs into characters and replace any lone half with U+FFFD."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def fold_tool_deltas(calls: list[dict], deltas: list) -> str:
    """Fold ``tool_calls`` deltas into whole ``{name, arguments}`` calls; returns the text
    they added (it counts as generated output). A delta with a new ``index`` (or, without
    one, with a name) starts a call; the rest append arguments."""
    added = ""
    for d in deltas or []:
        f = d.get("function") or {}
        i = d.get("index")
        if i is None:
            i = len(calls) if f.get("name") or not calls else len(calls) - 1
        while len(calls) <= i:
            calls.append({"name": "", "arguments": ""})
        call = calls[i]
        if f.get("name") and not call["name"]:
            call["name"] = f["name"]
            added += f["name"]
        args = f.get("arguments")
        # Ollama's native API sends an object; the OpenAI shape is a JSON string
        text = args if isinstance(args, str) else json.dumps(args) if args is not None else ""
        call["arguments"] += text
        added += text
    return added


def _connect(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    u = urllib.parse.urlsplit(base_url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname or "", u.port or (443 if u.scheme == "https" else 80),
               timeout=timeout), u.path.rstrip("/")


def _post(base_url: str, path: str, body: dict, timeout: float, headers: dict | None = None):
    conn, prefix = _connect(base_url, timeout)
    try:
        conn.request("POST", prefix + path, json.dumps(body),
                     {"Content-Type": "application/json", "Accept": "text/event-stream",
                      **(headers or {})})
        resp = conn.getresponse()
    except TimeoutError:
        conn.close()
        raise HTTPEngineError(f"{base_url}{path}: no response within {timeout:g}s (timed out; "
                              "a long prompt may need a larger engine.request_timeout_s)"
                              ) from None
    except OSError as e:
        conn.close()
        raise HTTPEngineError(f"{base_url}: cannot connect ({e})") from None
    if resp.status >= 400:
        text = resp.read().decode(errors="replace")
        conn.close()
        try:
            msg = _error_message(json.loads(text).get("error", text))
        except (ValueError, AttributeError):
            msg = text
        raise HTTPEngineError(f"{base_url}{path}: HTTP {resp.status}: {str(msg)[:300]}")
    return conn, resp


def _error_message(err) -> str:
    return str(err.get("message", err) if isinstance(err, dict) else err)


def _text_of(choice: dict, chat: bool, stream: bool) -> str:
    if chat:
        part = choice.get("delta" if stream else "message") or {}
        return part.get("content") or ""
    return choice.get("text") or ""


def parse_sse(lines, chat: bool, clock=time.perf_counter, t0: float | None = None) -> Stream:
    """Parse an SSE byte-line iterator into timed text chunks (keep-alive comments, multi-
    line data, usage in the last chunk, ``[DONE]``). Raises on JSON it cannot read."""
    t0 = clock() if t0 is None else t0
    s = Stream()
    data: list[str] = []

    def flush():
        if not data:
            return
        payload = "\n".join(data)
        data.clear()
        if payload.strip() == "[DONE]":
            s.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            raise HTTPEngineError(f"invalid JSON in a stream chunk: {payload[:120]!r}") from None
        if "error" in obj:
            raise HTTPEngineError(f"error mid-stream: {_error_message(obj['error'])}")
        for ch in obj.get("choices") or []:
            text = _text_of(ch, chat, True)
            if text:
                s.add_text(clock() - t0, text)
            if chat and (ch.get("delta") or {}).get("tool_calls"):
                # a call is generated output too: its arrival times count for TTFT and ITL
                s.tool_chunks.append((clock() - t0, s.add_tool_deltas(ch["delta"]["tool_calls"])))
            s.finish_reason = ch.get("finish_reason") or s.finish_reason
        s.usage = obj.get("usage") or s.usage
        s.timings = obj.get("timings") or s.timings

    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n") if isinstance(raw, bytes) else \
            raw.rstrip("\r\n")
        if line == "":
            flush()
        elif line.startswith(":"):
            s.comments += 1
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
    flush()
    s.close(clock() - t0)
    return s


def stream(base_url: str, api: str, body: dict, timeout: float = 120.0,
           headers: dict | None = None) -> tuple[Stream, float]:
    chat = api == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.perf_counter()
    conn, resp = _post(base_url, path, {**body, "stream": True}, timeout, headers)
    try:
        s = parse_sse(resp, chat, t0=t0)
    except (OSError, http.client.HTTPException) as e:
        raise HTTPEngineError(f"{base_url}{path}: stream broke ({e})") from None
    finally:
        conn.close()
    if not s.done:
        raise HTTPEngineError(f"{base_url}{path}: the stream ended without [DONE] after "
                              f"{len(s.chunks)} chunks")
    return s, t0


def complete(base_url: str, api: str, body: dict, timeout: float = 120.0,
             headers: dict | None = None) -> dict:
    chat = api == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    conn, resp = _post(base_url, path, {**body, "stream": False}, timeout, headers)
    try:
        obj = json.loads(resp.read())
    except ValueError:
        raise HTTPEngineError(f"{base_url}{path}: the response is not JSON") from None
    finally:
        conn.close()
    if "error" in obj:  # some llama-server builds answer an error with status 200
        raise HTTPEngineError(f"{base_url}{path}: {_error_message(obj['error'])[:300]}")
    choice = (obj.get("choices") or [{}])[0]
    calls: list[dict] = []  # whole calls, in order: no index, each starts a new call
    fold_tool_deltas(calls, [{k: v for k, v in tc.items() if k != "index"}
                             for tc in ((choice.get("message") or {}).get("tool_calls") or [])])
    return {"text": clean_text(_text_of(choice, chat, False)), "usage": obj.get("usage"),
            "timings": obj.get("timings"), "finish_reason": choice.get("finish_reason"),
            "tool_calls": calls}


def expand_headers(headers: dict, environ) -> dict:
    """``${NAME}`` in header values comes from the node's environment, so API keys stay
    out of plan files and locks; a name that is not set is an error, not an empty key."""
    out = {}
    for key, value in (headers or {}).items():
        text = str(value)
        for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text):
            if name not in environ:
                raise HTTPEngineError(f"engine.headers.{key}: environment variable {name} "
                                      "is not set on the node")
            text = text.replace("${" + name + "}", environ[name])
        out[key] = text
    return out


def parity(streamed: str, whole: str) -> dict:
    if streamed == whole:
        return {"parity": "ok", "first_difference": None}
    first = next((i for i, (a, b) in enumerate(zip(streamed, whole)) if a != b),
                 min(len(streamed), len(whole)))
    return {"parity": "mismatch", "first_difference": first, "streamed_chars": len(streamed),
            "nonstreamed_chars": len(whole)}


def tool_parity(streamed: list[dict], whole: list[dict]) -> dict:
    """Compare assembled tool calls by position: name, then arguments (as JSON values when
    both parse, so a runtime that re-serialises is not flagged; else as text). Call ids
    are per request and never compared."""
    if not streamed and not whole:
        return {"tool_parity": None}
    for i in range(max(len(streamed), len(whole))):
        if i >= len(streamed) or i >= len(whole):
            return {"tool_parity": "mismatch", "tool_first_difference":
                    {"call": i, "field": "missing", "streamed_calls": len(streamed),
                     "nonstreamed_calls": len(whole)}}
        a, b = streamed[i], whole[i]
        if a["name"] != b["name"]:
            return {"tool_parity": "mismatch",
                    "tool_first_difference": {"call": i, "field": "name",
                                              "streamed": a["name"], "nonstreamed": b["name"]}}
        try:
            same = json.loads(a["arguments"] or "null") == json.loads(b["arguments"] or "null")
        except ValueError:
            same = a["arguments"] == b["arguments"]
        if not same:
            off = parity(a["arguments"], b["arguments"])["first_difference"]
            return {"tool_parity": "mismatch", "tool_first_difference":
                    {"call": i, "field": "arguments", "offset": off}}
    return {"tool_parity": "ok", "tool_first_difference": None}


PER_CHUNK_SLACK = 1.5  # a stream carries about one token per chunk; this much more is odd


def _count(x) -> int | None:
    """A runtime's count as a count (it is input: a bool, a float or a negative is none)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def token_count(text: str, usage: int | None, count_tokens=None, chunks: int | None = None,
                drafting: bool = False, accepted: int | None = None
                ) -> tuple[int | None, str, str | None]:
    """How many tokens ``text`` holds, where that number came from, and any disagreement.

    A runtime's ``usage.completion_tokens`` is input, not truth: with a tokenizer, the
    tokenizer wins and a different usage is flagged; without one, usage is checked against
    what was streamed and taken only if plausible, else the chunk count:

    - at most one token per byte of output (a token is at least one byte);
    - streamed (``chunks``: how many chunks carried text): runtimes stream a token per
      chunk, holding back only the byte tokens of a character not yet whole, so at most
      ``PER_CHUNK_SLACK`` × (chunks + bytes of non-ASCII characters); a runtime that
      reports drafting (``drafting``) may put accepted drafts in a chunk, so its bound adds
      the drafts it says it accepted (``accepted``), and without that count there is none
      (a double usage was believed at 60 chunks + 40 accepted: audit 27s);
    - and at least one token per chunk (a chunk of text came from a token)."""
    if count_tokens is not None:
        n = len(count_tokens(text))
        if usage is not None and abs(usage - n) > max(1, 0.02 * n):
            return n, "tokenizer", f"the runtime reports {usage} tokens, the tokenizer " \
                                   f"counts {n}"
        return n, "tokenizer", None
    if usage is None:
        return chunks, "chunks", None
    size = len(text.encode("utf-8", "replace"))
    if usage > size:
        return chunks, "chunks", f"the runtime reports {usage} tokens for {size} bytes " \
                                 "of output (impossible); counted chunks instead"
    if chunks:
        wide = sum(len(c.encode("utf-8", "replace")) for c in text if ord(c) > 127)
        known = not drafting or accepted is not None
        if known and usage > PER_CHUNK_SLACK * (chunks + wide + (accepted or 0)):
            if accepted:  # the runtime's own counts: a token a chunk plus its accepted drafts
                return chunks + accepted, "chunks+drafts", (
                    f"the runtime reports {usage} tokens for {chunks} streamed chunks and "
                    f"{accepted} accepted drafts (implausible); counted those instead")
            return chunks, "chunks", (
                f"the runtime reports {usage} tokens for {chunks} streamed chunks and "
                f"{len(text)} characters ({usage / chunks:.1f} a chunk, where a stream "
                "carries about one; implausible); counted chunks instead")
        if usage < chunks - max(1, chunks // 10):
            return chunks, "chunks", (
                f"the runtime reports {usage} tokens for {chunks} streamed chunks of text "
                "(each came from a token; implausible); counted chunks instead")
        if known and usage > PER_CHUNK_SLACK * (chunks + (accepted or 0)):
            # possible only where characters arrive as several byte tokens each (rare
            # ones): taken, but said to be unchecked (audit 27s: a double count of 100
            # CJK characters, one a chunk, read as 200 tokens and was believed silently)
            return usage, "usage", (
                f"unverified: the runtime reports {usage} tokens for {chunks} streamed "
                f"chunks ({usage / chunks:.1f} a chunk), possible only if most characters "
                "were several byte tokens each; set a tokenizer to check it")
    return usage, "usage", None


def nonstreamed(whole: dict, wall_s: float, count_tokens=None, distrust: str | None = None
                ) -> dict:
    """The non-streamed request end to end: wall time and, where the tokens can be counted,
    completion tokens over that time (prefill included, so below decode tok/s).
    ``distrust``: why the runtime's usage was found implausible on the streamed request of
    the same generation; then the count here is not taken either (no rate from it)."""
    usage = (whole.get("usage") or {}).get("completion_tokens")
    if distrust and count_tokens is None and usage is not None:
        return {"nonstreamed_ms": round(wall_s * 1e3, 3), "nonstreamed_tokens": None,
                "nonstreamed_tok_s": None, "nonstreamed_token_source": "unverified",
                "nonstreamed_usage_problem": f"usage not taken: {distrust}"}
    # tool calls are generated output too: their text bounds what usage may claim
    calls = "".join(c["name"] + (c["arguments"] or "") for c in whole.get("tool_calls") or [])
    if count_tokens is not None or not calls:
        n, source, problem = token_count(whole["text"], usage, count_tokens)
    else:
        n, source, problem = token_count(whole["text"] + calls, usage)
    return {"nonstreamed_ms": round(wall_s * 1e3, 3), "nonstreamed_tokens": n,
            "nonstreamed_tok_s": round(n / wall_s, 2) if n and wall_s > 0 else None,
            "nonstreamed_token_source": source,
            **({"nonstreamed_usage_problem": problem} if problem else {})}


def trace_of(s: Stream, count_tokens=None) -> Trace:
    """The streamed request as a trace: chunk arrivals (content and tool-call chunks alike)
    and one time per token. A chunk may hold several tokens: token positions come from the
    tokenizer when given, else from the usage count spread over characters, else one per
    chunk. Acceptance is the runtime's own report (llama-server's ``timings``), if any."""
    timeline = sorted(s.chunks + s.tool_chunks, key=lambda c: c[0])
    texts = [t for _, t in timeline]
    times = [t for t, _ in timeline]
    usage = (s.usage or {}).get("completion_tokens")
    text = "".join(t for _, t in s.chunks)
    timings = s.timings or {}
    total, source, problem = token_count(
        text if count_tokens is not None else "".join(texts), usage, count_tokens,
        len(texts), drafting=timings.get("draft_n") is not None,
        accepted=_count(timings.get("draft_n_accepted")))
    if source == "chunks":
        total = None  # one token per chunk, below
    cum: list[int] = []
    if count_tokens is not None:
        acc = ""
        for t in texts:
            acc += t
            cum.append(len(count_tokens(acc)))
    elif total:
        chars = sum(len(t) for t in texts) or 1
        run = 0
        for t in texts:
            run += len(t)
            cum.append(max(1, round(total * run / chars)))
    else:
        cum = list(range(1, len(texts) + 1))
    token_times: list[float] = []
    prev = 0
    for when, c in zip(times, cum):
        token_times += [when] * max(c - prev, 0)
        prev = max(prev, c)
    itl = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    reported = timings.get("predicted_per_second")
    repaired = s.repairs()
    return Trace(
        arrivals=times, token_times=token_times, output_text=text, finish_reason=s.finish_reason,
        drafted=timings.get("draft_n"), accepted=timings.get("draft_n_accepted"), fields={
            # the same numbers as itl_*, named for what they time over http
            "chunk_itl_p50_ms": percentile(itl, 50), "chunk_itl_p95_ms": percentile(itl, 95),
            "chunk_itl_p99_ms": percentile(itl, 99), "chunks": len(texts),
            "usage_tokens": usage, "token_source": source,
            **({"usage_problem": problem} if problem else {}),
            # usage disagreed with what was streamed: not the count the rates use (an
            # unverified usage is the count, its problem said beside it)
            **({"usage_implausible": True} if problem and usage is not None
               and source != "usage" else {}),
            **({"stream_repaired": s.rejoined + s.replaced, "stream_repair": repaired}
               if repaired else {}),
            "keepalive_comments": s.comments,
            # the runtime's own decode speed (llama-server, Ollama), beside ours
            "reported_decode_tok_s": round(reported, 2) if reported else None,
            "chunk_times_us": [round(t * 1e6) for t in times]})


def measure(s: Stream, count_tokens=None, decode_skip: int = 64) -> dict:
    """A streamed request's metrics, derived as for every engine (``trace.metrics``)."""
    t = trace_of(s, count_tokens)
    return metrics(t, speculative=t.drafted is not None, num_draft_tokens=0, max_tokens=0,
                   decode_skip=decode_skip)
