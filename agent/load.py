"""Load levels: many requests at once against a runtime, closed or open loop.

Closed loop (``concurrency: N``): N streams, each sending its next request as soon as its
last one finished, until the level's requests are used up. Open loop (``request_rate``):
arrivals on a schedule (Poisson or constant) fixed before the level starts, at most
``max_concurrency`` in flight; a request that finds every slot busy waits, and that wait
counts in its latency (``queued_ms``), as a user behind a gateway would feel it.

Metrics follow the serving benchmarks' names and definitions (vLLM ``bench serve``,
GuideLLM): TTFT (the first chunk), ITL (the gap between successive chunks, whatever tokens
each carries: tokens inside one chunk arrive together, spreading them over the gap would
invent a cadence), TPOT = (E2E − TTFT) / (tokens − 1), end-to-end latency, output tok/s
per stream and in total, requests/s and goodput: the rate of requests that met every SLO.
Failed requests are counted, never averaged in. A level is saturated when the rate it
served falls below 95% of the rate it was offered (realised: the schedule's own, not the
nominal one; an open loop's served rate judged by the most it can be said to have served at
95%, ``served_rps_at_most``, reported beside the point estimate ``served_rps``) or its
queue grows, open and closed loop alike. Poisson schedules are drawn
per level from the job's seed and the level, so no two levels share their draws.
Standard library only: one thread per stream. An open loop's dispatcher sleeps to each
arrival; while it runs, the interpreter switches threads every 0.2 ms instead of 5 ms, so a
request is sent within a millisecond of its time even while others are being read
(bench/load_accuracy.py measures it).
"""

from __future__ import annotations

import queue
import random
import sys
import threading
import time
from collections.abc import Callable

from .outcome import Outcome, Reply
from .served import realised_rate, served_rates
from .stats import kendall_z, percentile

LOADS = ("concurrency", "request_rate")
ARRIVALS = ("poisson", "constant")
# ours (e2e_ms from the scheduled send: client queueing counts), then vLLM goodput's names
# (bench serve --goodput ttft:… tpot:… e2el:…, in ms; e2el from the actual send)
SLO_KEYS = ("ttft_ms", "itl_p95_ms", "e2e_ms", "ttft", "tpot", "e2el")
SWITCH_S = 0.0002  # GIL switch interval during an open loop (Python's default: 5 ms)
ERROR_SHARE_STOP = 0.10     # a level where ≥10% of requests fail ends the ramp
LATENCY_GROWTH_STOP = 4.0   # e2e p50 ≥4× the first level's, with no throughput gained


MIN_OPEN_REQUESTS = 4       # the fewest an open loop's trend can bound
SATURATED_SHARE = 0.95      # served below this share of the offered rate: saturated
SURE_Z = 1.645              # a trend is sure past this (one-sided 5%, as Sen's bound)


# a request: given its index, send it and return a Reply (or just the chunk times, one
# token each, or (times, drafted, accepted)); raise to fail it
Send = Callable[[int], "Reply | list[float] | tuple[list[float], int | None, int | None]"]


def _one(send: Send, i: int, scheduled: float, t0: float) -> Outcome:
    sent = time.perf_counter() - t0
    o = Outcome(scheduled, sent)
    try:
        got = send(i)
        if isinstance(got, Reply):
            o.chunk_times, o.tokens = list(got.chunk_times), got.tokens
            o.drafted, o.accepted = got.drafted, got.accepted
        elif isinstance(got, tuple):
            times, o.drafted, o.accepted = got
            o.chunk_times = list(times)
        else:
            o.chunk_times = list(got)
        if not o.chunk_times:
            o.error = "no output"
    except Exception as e:  # noqa: BLE001 — a failed request is data, not a crash
        o.error = f"{type(e).__name__}: {e}"[:300]
    o.end = time.perf_counter() - t0
    return o


def closed_loop(send: Send, concurrency: int, requests: int,
                deadline_s: float = 600.0) -> tuple[list[Outcome], float]:
    """``concurrency`` streams share ``requests`` requests, each stream sending its next
    one when its last finished. Returns the outcomes (in send order) and the wall time."""
    counter = iter(range(requests))
    lock = threading.Lock()
    out: list[Outcome] = []
    t0 = time.perf_counter()

    def stream() -> None:
        while time.perf_counter() - t0 < deadline_s:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            o = _one(send, i, time.perf_counter() - t0, t0)
            with lock:
                out.append(o)

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 60)
    wall = time.perf_counter() - t0
    with lock:  # requests the deadline left unsent were asked for: failed, never dropped
        out += [_unsent(wall, deadline_s) for _ in counter]
    return sorted(out, key=lambda o: o.sent), wall


def _unsent(at: float, deadline_s: float) -> Outcome:
    return Outcome(at, at, end=at, error=f"not sent: past the level's {deadline_s:g} s "
                                          "deadline")


def arrival_times(rate: float, requests: int, arrivals: str, seed: int) -> list[float]:
    """Seconds since the level starts: Poisson (exponential gaps) or constant. The draws
    are seeded by the job's seed *and the rate*: each level has its own (the same for every
    variant at that level, so they meet the same schedule), never another level's draws
    rescaled, which would run every level at one realised share of its nominal rate."""
    if arrivals == "constant":
        return [i / rate for i in range(requests)]
    rng = random.Random(f"{seed}:{rate!r}")
    t, out = 0.0, []
    for _ in range(requests):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def sleep_until(when: float, clock=time.perf_counter) -> None:
    """Sleep until ``when``. Never spin: a spinning thread holds the GIL, and the threads
    that send and read would wait up to a switch interval for it."""
    while (left := when - clock()) > 0:
        time.sleep(left)


def open_loop(send: Send, rate: float, requests: int, arrivals: str = "poisson",
              max_concurrency: int = 64, seed: int = 0,
              deadline_s: float = 600.0) -> tuple[list[Outcome], float]:
    """Send ``requests`` requests at their scheduled times, at most ``max_concurrency`` at
    once. Returns the outcomes (in schedule order) and the wall time."""
    schedule = arrival_times(rate, requests, arrivals, seed)
    work: queue.Queue = queue.Queue()
    out: list[Outcome] = []
    lock = threading.Lock()
    clock = [0.0]  # the level's start: set once every worker is up and waiting

    def worker() -> None:
        while (item := work.get()) is not None:
            i, at = item
            o = _one(send, i, at, clock[0])
            with lock:
                out.append(o)

    workers = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(max_concurrency, requests))]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    try:
        for w in workers:
            w.start()
        # the first arrivals must not wait for threads being started
        t0 = clock[0] = time.perf_counter()
        for i, at in enumerate(schedule):
            if at > deadline_s:  # the rest were offered too: failed, never dropped
                with lock:
                    out += [_unsent(late, deadline_s) for late in schedule[i:]]
                break
            sleep_until(t0 + at)
            work.put((i, at))
        for _ in workers:
            work.put(None)
        for w in workers:
            w.join(deadline_s + 60)
    finally:
        sys.setswitchinterval(switch)
    return sorted(out, key=lambda o: o.scheduled), time.perf_counter() - t0


def _pcts(values: list[float], name: str) -> dict:
    return {f"{name}_p{p}": (round(v, 3) if (v := percentile(values, p)) is not None else None)
            for p in (50, 90, 95, 99)}


def queue_growth_ms(outcomes: list[Outcome]) -> float | None:
    """How much longer a request waited for its first token at the end of the level than
    at its start (in schedule order: the median of the last third less that of the first
    third), or None below 3 successful requests. A queue that grows shows here, whether
    the requests wait at the client (no free slot) or at the server. The ends alone do not
    show it: the waits must also surely rise along the schedule (Kendall's test, one-sided
    5%: z above 1.645), else 0. A server that answers some requests at once and others
    after a long prefill, whatever came before, has no trend, though its ends' medians
    may differ by the whole prefill (two-point waits: 5 of 40 levels read 'queue growing')."""
    ok = sorted((o for o in outcomes if o.ok), key=lambda o: o.scheduled)
    waits = [(o.sent - o.scheduled + o.chunk_times[0]) * 1e3 for o in ok]
    if len(waits) < 3:
        return None
    if (kendall_z([o.scheduled for o in ok], waits) or 0.0) <= SURE_Z:
        return 0.0  # it did not surely grow
    third = max(len(waits) // 3, 1)
    growth = (percentile(waits[-third:], 50) or 0.0) - (percentile(waits[:third], 50) or 0.0)
    return round(max(growth, 0.0), 3)  # 0: it did not grow


def summarize(outcomes: list[Outcome], wall_s: float, slo: dict | None = None,
              closed: bool = False) -> dict:
    """A level's metrics, from its successful requests; failures are counted apart.
    ``closed``: a closed loop, whose streams offer a request as the last one ends: its
    offered rate is what they sent over the level, its served rate what succeeded."""
    ok = [o for o in outcomes if o.ok]
    ttft = [o.chunk_times[0] * 1e3 for o in ok]
    # vLLM's ITL: each chunk's gap after the one before, whatever tokens it carries
    itl = [(b - a) * 1e3 for o in ok for a, b in zip(o.chunk_times, o.chunk_times[1:])]
    # to its last chunk (vLLM's end), from its scheduled time: waits count
    e2e = [(o.last - o.scheduled) * 1e3 for o in ok]
    # vLLM's E2EL: from the moment it was sent, without the wait for a free client slot
    e2el = [o.chunk_times[-1] * 1e3 for o in ok]
    # vLLM's TPOT: (E2E − TTFT) / (tokens − 1), E2E to the last chunk
    tpot = [request_tpot_ms(o) for o in ok if o.output_tokens > 1]
    per_stream = [o.output_tokens / o.chunk_times[-1] for o in ok if o.chunk_times[-1] > 0]
    queued = [(o.sent - o.scheduled) * 1e3 for o in outcomes]
    tokens = sum(o.output_tokens for o in ok)
    drafted = sum(o.drafted or 0 for o in ok if o.drafted is not None)
    accepted = sum(o.accepted or 0 for o in ok if o.drafted is not None)
    if closed:
        offered = len(outcomes) / wall_s if wall_s > 0 else None
        served, most = len(ok) / wall_s if wall_s > 0 else None, None  # a count: no bound
    else:  # the schedule's own rate; the completions over the level's wall time
        offered = realised_rate([o.scheduled for o in outcomes])
        served, most = served_rates(outcomes)
        if offered:  # a lag that shrank (a backlog drained) is no more served than offered
            served, most = (min(v, offered) if v is not None else None
                            for v in (served, most))
    m: dict = {
        "requests": len(outcomes), "completed": len(ok),
        "errors": len(outcomes) - len(ok),
        "error_examples": sorted({o.error or "no output" for o in outcomes if not o.ok})[:3],
        "wall_s": round(wall_s, 3),
        "output_tokens": tokens,
        "output_tok_s_total": round(tokens / wall_s, 2) if wall_s > 0 else None,
        "output_tok_s_per_stream_p50": (round(v, 2) if (v := percentile(per_stream, 50))
                                        is not None else None),
        "requests_per_s": round(len(ok) / wall_s, 3) if wall_s > 0 else None,
        # the rate the level was offered (its schedule, realised; a closed loop's: its
        # sends) and the rate it served (successful completions over the level's wall)
        "offered_rps": _rate(offered) if offered else None,
        "served_rps": _rate(served) if served is not None else None,
        # the most it can be said to have served (Sen's 95% bound): the verdict's reading
        "served_rps_at_most": _rate(most) if most is not None else None,
        "queue_growth_ms": queue_growth_ms(outcomes),
        **_pcts(ttft, "ttft_ms"), **_pcts(itl, "itl_ms"), **_pcts(tpot, "tpot_ms"),
        **_pcts(e2e, "e2e_ms"), **_pcts(e2el, "e2el_ms"),
        "queued_ms_p99": _pcts(queued, "q")["q_p99"],
        # where the runtime reports it (llama-server's timings); None: not reported
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
    }
    if slo:
        good = [o for o in ok if meets(o, slo)]
        m["slo"] = dict(slo)
        m["good_requests"] = len(good)
        m["goodput_rps"] = round(len(good) / wall_s, 3) if wall_s > 0 else None
    return m


def _rate(v: float) -> float:
    """Requests/s as stored and judged: 3 decimals (at most 1% of a rate from 0.1 a
    second), 4 significant digits below (three decimals would read 0.0046 of 0.005
    offered as 0.005: 'keeps up')."""
    return round(v, 3) if v >= 0.1 else float(f"{v:.4g}")


def request_tpot_ms(o: Outcome) -> float:
    """vLLM's per-request TPOT: (E2E − TTFT) / (tokens − 1), E2E to the last chunk; 0 for a
    one-token reply (vLLM's goodput counts it as meeting any TPOT)."""
    if o.output_tokens < 2:
        return 0.0
    return (o.chunk_times[-1] - o.chunk_times[0]) * 1e3 / (o.output_tokens - 1)


def meets(o: Outcome, slo: dict) -> bool:
    """Whether one request met every SLO the plan set: ours (its own ITL p95 for
    itl_p95_ms; e2e_ms from its scheduled time) or vLLM goodput's (ttft, tpot, e2el: E2E
    from when it was sent)."""
    itl = [(b - a) * 1e3 for a, b in zip(o.chunk_times, o.chunk_times[1:])]
    ttft = o.chunk_times[0] * 1e3
    checks = {"ttft_ms": ttft, "ttft": ttft,
              "itl_p95_ms": (percentile(itl, 95) or 0.0) if itl else 0.0,
              "e2e_ms": (o.last - o.scheduled) * 1e3, "e2el": o.chunk_times[-1] * 1e3,
              "tpot": request_tpot_ms(o)}
    return all(checks[k] <= float(limit) for k, limit in slo.items())


def saturation(levels: list[dict], load: str, target: float | None = None) -> str | None:
    """Why the ramp should stop after the last level, or None. ``levels`` are this ramp's
    summaries so far (the last one just measured); ``target``, a request rate's nominal
    level, is named beside the realised rate the rules use."""
    cur = levels[-1]
    if cur["requests"] and cur["errors"] / cur["requests"] >= ERROR_SHARE_STOP:
        return (f"errors under load: {cur['errors']} of {cur['requests']} requests failed "
                f"({', '.join(cur['error_examples'])})")
    offered, served = cur.get("offered_rps"), cur.get("served_rps")
    # judged by the most it can be said to have served (an open loop's 95% bound): an
    # unsure trend is no false 'cannot keep up'; the point is what it reads as served
    most = cur.get("served_rps_at_most")
    most = served if most is None else most
    served = most if served is None else served
    nominal = f" (nominal {target:g})" if target else ""
    if offered and most is not None and most < SATURATED_SHARE * offered:
        bound = f" (served at most {most:.2f} at 95%)" if most > served else ""
        return (f"cannot keep up: {served:.2f} requests/s served of {offered:.2f} offered"
                f"{nominal}, below {SATURATED_SHARE:.0%}{bound}")
    if offered and (growth := cur.get("queue_growth_ms")) is not None \
            and growth > max(1e3 / offered, 2 * (cur.get("ttft_ms_p50") or 0.0)):
        return (f"queue growing: the last requests waited {growth:.0f} ms longer for their "
                f"first token than the first ones, at {offered:.2f} requests/s offered"
                f"{nominal}")
    first = levels[0]
    if len(levels) >= 2 and first["e2e_ms_p50"] and cur["e2e_ms_p50"] \
            and cur["e2e_ms_p50"] >= LATENCY_GROWTH_STOP * first["e2e_ms_p50"] \
            and (cur["output_tok_s_total"] or 0) <= 1.05 * (levels[-2]["output_tok_s_total"]
                                                            or 0):
        return (f"latency growing without throughput: e2e p50 {cur['e2e_ms_p50']:.0f} ms "
                f"(×{cur['e2e_ms_p50'] / first['e2e_ms_p50']:.1f} the first level's) at "
                f"{cur['output_tok_s_total']} tok/s, no more than the level before")
    return None


def check_load(load, engine_type: str) -> str | None:
    """Why a job's ``load`` section is refused (None: fine)."""
    if not isinstance(load, dict) or not load:
        return "load: a mapping of concurrency, request_rate, arrivals, max_concurrency, " \
               "requests, workload, slo"
    allowed = {*LOADS, "arrivals", "max_concurrency", "requests", "workload", "slo",
               "variants"}
    unknown = sorted(set(load) - allowed)
    if unknown:
        return f"load: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
    names = load.get("variants")
    if names is not None and (not isinstance(names, list) or not names or not all(
            isinstance(x, str) and x for x in names)):
        return f"load.variants: a list of variant names, got {names!r}"
    from .engines import engine_named

    if engine_named(engine_type).in_process:
        # mlx-lm 0.32.2's BatchGenerator takes no draft model, so a batch cannot speculate;
        # running the speculative side single-stream would answer another question
        if names is None or not all(x.startswith("autoregressive") for x in names):
            return ("load: in-process mlx-lm cannot speculate in a batch (mlx-lm's "
                    "BatchGenerator has no draft model): set load.variants: [autoregressive] "
                    "to measure batched autoregressive generation at each batch width, or "
                    "measure speculation under load through engine: http (mlx_lm.server "
                    "batches requests when no draft model is loaded)")
        if load.get("request_rate") or "arrivals" in load or "max_concurrency" in load:
            return ("load: in process there is no server to queue at, so no open loop: "
                    "use concurrency (the batch width), or engine: http for request_rate")
    if not any(load.get(k) for k in LOADS):
        return "load: set concurrency (streams) or request_rate (requests/s), or both"
    for key, kind in (("concurrency", int), ("request_rate", float)):
        values = load.get(key, [])
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 256
                and (kind is float or isinstance(v, int)) for v in values):
            return (f"load.{key}: a list of {'integers' if kind is int else 'numbers'} "
                    f"from 1 to 256, got {values!r}")
        if values != sorted(values) or len(set(values)) != len(values):
            return f"load.{key}: list the levels once each, rising (a ramp), got {values!r}"
    if load.get("arrivals", "poisson") not in ARRIVALS:
        return f"load.arrivals: one of {', '.join(ARRIVALS)}, got {load['arrivals']!r}"
    for key, top in (("max_concurrency", 256), ("requests", 10_000)):
        v = load.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or not 1 <= v <= top):
            return f"load.{key}: an integer from 1 to {top}, got {v!r}"
    if load.get("request_rate") and load.get("requests", 16) < MIN_OPEN_REQUESTS:
        # Sen's bound on 3 lags is unbounded and Kendall's z on 3 waits stays under 1.645:
        # no server could read saturated
        return (f"load.requests: at least {MIN_OPEN_REQUESTS} with request_rate (fewer "
                f"cannot show a server falling behind), got {load['requests']!r}")
    slo = load.get("slo") or {}
    if not isinstance(slo, dict) or set(slo) - set(SLO_KEYS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for v in slo.values()):
        return f"load.slo: a mapping of {', '.join(SLO_KEYS)} to positive milliseconds, " \
               f"got {slo!r}"
    return None


MIN_GAIN = 1.2  # total tokens/s at the ramp's end over its start, below which: no gain


def no_gain(ramp: list[dict], levels: list) -> str | None:
    """A closed-loop ramp whose total throughput did not grow with the streams: the
    runtime serialises requests (or is already at its limit with one)."""
    if len(ramp) < 2 or not ramp[0]["output_tok_s_total"] or levels[len(ramp) - 1] < 2 * levels[0]:
        return None
    gain = (ramp[-1]["output_tok_s_total"] or 0) / ramp[0]["output_tok_s_total"]
    if gain >= MIN_GAIN:
        return None
    return (f"concurrency brought no throughput gain: {levels[len(ramp) - 1]} streams gave "
            f"{gain:.2f}× the tokens/s of {levels[0]} (requests are served one at a time, "
            "or one stream already saturates the runtime); cap concurrency at the gateway")
