"""Audit of issue 27 ("The answer is right") with inputs of the auditor's own: real loopback
HTTP servers with behaviours of their own for the load levels, planted nightly series for
the change points, planted repetitions for the robust spread. A test marked xfail(strict)
is a finding that fails today; a plain one is a guard that held."""

from __future__ import annotations

import http.server
import json
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from agent.httpengine import stream
from agent.httpruntime import reply_of
from agent.load import Outcome, arrival_times, closed_loop, open_loop, saturation, summarize

# -- load: a real loopback OpenAI-style server whose reply time is ours to choose ---------


@contextmanager
def server(reply_s: Callable[[int], tuple[float, float, int]]) -> Iterator[str]:
    """A streaming ``/v1/completions`` on 127.0.0.1: the n-th request (0-based, in arrival
    order) gets ``reply_s(n)`` = (seconds to its first token, seconds between tokens,
    tokens), one token per SSE chunk. Each request on its own thread: nothing queues at
    the server unless ``reply_s`` says so."""
    count, lock = [0], threading.Lock()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            with lock:
                n = count[0]
                count[0] += 1
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            first, gap, tokens = reply_s(n)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            time.sleep(first)
            for i in range(tokens):
                if i:
                    time.sleep(gap)
                chunk = {"choices": [{"index": 0, "text": f"w{i} ", "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            done = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": tokens,
                              "total_tokens": tokens + 3}}
            self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def sender(url: str):
    body = {"prompt": "x", "max_tokens": 64, "temperature": 0.0}

    def send(i: int):
        s, _ = stream(url, "completions", body, 30.0)
        return reply_of(s)

    return send


def test_itl_is_the_chunk_gap_and_tpot_the_formula_against_a_real_server():
    """Guard. 30 ms to the first token, then a chunk every 25 ms, 9 tokens: ITL p50 25 ms
    (the chunk gap), TPOT = (E2E − TTFT)/(tokens − 1) = 8 × 25 / 8 = 25 ms."""
    with server(lambda n: (0.03, 0.025, 9)) as url:
        out, wall = closed_loop(sender(url), 2, 6)
    m = summarize(out, wall, closed=True)
    assert m["completed"] == 6 and m["output_tokens"] == 54
    assert 24 <= m["itl_ms_p50"] <= 32 and 24 <= m["tpot_ms_p50"] <= 32
    assert m["ttft_ms_p50"] >= 30
    for o in out:  # the formula, request by request
        assert o.tokens == 9


def test_a_server_that_serves_every_other_request_slowly_keeps_up():
    """Audit 27 finding (load, high). A real server that answers every request on its own
    thread: even requests in 0.1 s, odd ones in 0.7 s (two reply lengths: at temperature
    > 0 a reply stops at its EOS). Nothing queues: each request is answered the same time
    after it arrives as the one two before it. At 8 requests/s constant, 16 requests (the
    default ``requests``), the level must be ok. Today: the lag growth is read from the
    medians of the first and last three requests ([fast, slow, fast] vs [slow, fast,
    slow]): +0.6 s over a 1.875 s span, served ≈ 15/2.475 = 6.1 of 8, "cannot keep up"."""
    with server(lambda n: (0.02, 0.0, 1) if n % 2 == 0 else (0.02, 0.1, 7)) as url:
        out, wall = open_loop(sender(url), 8.0, 16, "constant", 64, seed=0)
    m = summarize(out, wall)
    assert m["completed"] == 16
    assert saturation([m], "request_rate", 8.0) is None, m


def test_random_reply_lengths_are_not_saturation():
    """Audit 27 finding (load, high). A server with unlimited parallelism (nothing ever
    queues) whose replies take 0.2-1.2 s, uniformly at random (stochastic EOS). Constant
    arrivals at 8 requests/s, the default 16 requests, 200 levels: a level that keeps up
    should read saturated rarely (say ≤ 5%, the share a 95% rule would concede). Today
    74 of 200 levels read "cannot keep up" (at 40 requests ~18% of 500; at 100, 0%): the
    served rate is the arrivals' span plus the difference of two medians of three noisy
    replies."""
    saturated = 0
    for seed in range(200):
        rng = random.Random(seed)
        sched = arrival_times(8.0, 16, "constant", seed)
        outs = []
        for t in sched:
            d = rng.uniform(0.2, 1.2)
            outs.append(Outcome(t, t, chunk_times=[0.05, d], end=t + d))
        m = summarize(outs, sched[-1] + 1.2)
        saturated += saturation([m], "request_rate", 8.0) is not None
    assert saturated <= 10, saturated


def test_where_a_failure_falls_does_not_change_the_verdict():
    """Audit 27 finding (load, low). 16 requests at 8/s constant, each answered in 50 ms,
    one failing (6%: under the 10% error stop). Failed as request 1, 8 or 14: served
    14/1.875 = 7.47 of 8, "cannot keep up"; failed as request 0 or 15: the successful
    requests' own span shrinks with them, served 8.0, ok. The closed loop counts any one
    failure in 16 against served; the open loop should too, wherever it falls."""
    verdicts = set()
    for fail in (0, 8, 15):
        outs = [Outcome(i / 8, i / 8, chunk_times=[] if i == fail else [0.02, 0.05],
                        end=i / 8 + 0.05, error="reset" if i == fail else None)
                for i in range(16)]
        verdicts.add(saturation([summarize(outs, 2.0)], "request_rate", 8.0) is None)
    assert len(verdicts) == 1, verdicts

def ticking(first_tick_s: float, period_s: float):
    """A server that answers in batches: every request waits for the scheduler's next tick
    (the first ``first_tick_s`` after the first request, then every ``period_s``) and is
    answered then. It keeps up with any rate: no request waits more than one period."""
    start: list[float] = []
    lock = threading.Lock()

    def reply(n: int) -> tuple[float, float, int]:
        now = time.monotonic()
        with lock:
            if not start:
                start.append(now)
        since = now - start[0] - first_tick_s
        return (max(first_tick_s + period_s * math.ceil(since / period_s) - (now - start[0]),
                    0.0), 0.01, 3)

    return reply


def test_a_server_that_answers_on_a_tick_keeps_up():
    """Audit 27 finding (load, medium). A real server that answers requests in batches on
    a 1 s tick (the first 0.45 s after the first request): every request is answered within
    a second of its arrival, whatever the rate. 16 requests at 8/s constant: the first
    three wait for the 0.45 s tick or the 1.45 s one, the last three for the 2.45 s one,
    so the ends' medians differ by a tick's phase, not by any growth: served 6.7 of 8,
    "cannot keep up". Synthetic over 100 phases: 63% of 16-request levels and 37% of
    40-request levels read saturated."""
    with server(ticking(0.45, 1.0)) as url:
        out, wall = open_loop(sender(url), 8.0, 16, "constant", 64, seed=0)
    m = summarize(out, wall)
    assert m["completed"] == 16
    assert saturation([m], "request_rate", 8.0) is None, m

def serial_after(first: int, service_s: float):
    """Each request answered at once (20 ms) until ``first`` have come, then one at a
    time, ``service_s`` each: a server that keeps up, then degrades mid-level."""
    lock = threading.Lock()

    def reply(n: int) -> tuple[float, float, int]:
        if n < first:
            return (0.02, 0.0, 1)
        with lock:
            time.sleep(service_s)
        return (0.0, 0.0, 1)

    return reply


def test_a_server_that_degrades_mid_level_is_saturated():
    """Guard. 8 requests/s constant, 32 requests; the first 16 answered at once, the rest
    one at a time at 4 a second: the second half's lag grows 0.125 s a request, ~2 s in
    all: served ≈ 31/(3.875 + 2) ≈ 5.3 of 8, saturated."""
    with server(serial_after(16, 0.25)) as url:
        out, wall = open_loop(sender(url), 8.0, 32, "constant", 64, seed=0)
    m = summarize(out, wall)
    why = saturation([m], "request_rate", 8.0)
    assert why is not None and why.startswith(("cannot keep up: ", "queue growing")), m
    assert m["served_rps"] < 0.95 * m["offered_rps"], m


def test_a_constant_2s_prefill_at_1_request_per_second_keeps_up():
    """Guard. Every reply's first token 2 s after its request, whatever else is in flight,
    at 1 request/s constant, 5 requests: each request is answered as late as the last, so
    the server keeps up: ok, served = offered (1.0), TTFT ≈ 2 s."""
    with server(lambda n: (2.0, 0.01, 3)) as url:
        out, wall = open_loop(sender(url), 1.0, 5, "constant", 64, seed=0)
    m = summarize(out, wall)
    assert m["offered_rps"] == pytest.approx(1.0, rel=0.01)
    assert m["served_rps"] >= 0.95 * m["offered_rps"], m
    assert 2000 <= m["ttft_ms_p50"] < 2300
    assert saturation([m], "request_rate", 1.0) is None, m


def test_poisson_levels_report_their_realised_rate_and_rules_use_it():
    """Guard. Poisson levels 2, 4, 8 requests/s, 12 requests each, seed 7, against a real
    server that answers in 20 ms: each level's offered rate is its own schedule's (n − 1)
    gaps over its span (known from the schedule alone), no two levels are the same share
    of their nominal rate, and a rule's message names the realised rate beside the
    nominal one."""
    shares = []
    with server(lambda n: (0.02, 0.0, 1)) as url:
        for rate in (2.0, 4.0, 8.0):
            sched = arrival_times(rate, 12, "poisson", 7)
            out, wall = open_loop(sender(url), rate, 12, "poisson", 64, seed=7)
            m = summarize(out, wall)
            realised = 11 / (sched[-1] - sched[0])
            assert m["offered_rps"] == pytest.approx(realised, abs=0.001)
            shares.append(round(realised / rate, 6))
            assert saturation([m], "request_rate", rate) is None, m
            # the same level served at half its realised rate: the message's number is
            # the realised one, not the nominal
            m2 = {**m, "served_rps": realised / 2, "served_rps_at_most": realised / 2}
            assert f"of {m['offered_rps']:.2f} offered (nominal {rate:g})" in \
                saturation([m2], "request_rate", rate)
    assert len(set(shares)) == 3, shares


@pytest.mark.alone  # judges throughput against wall time: other tests' load blurs it
def test_a_closed_loop_on_a_serial_server_stops_the_ramp():
    """Guard. A server that answers one request at a time (60 ms each), closed loop at 1,
    2, 4, 8 streams (a rising ramp, as the agent runs it), 16 requests a level: by 8
    streams the ramp stops ("latency growing without throughput": e2e ~8× the first
    level's, tokens/s no more than the level before), and the ramp says concurrency
    brought no gain. (Against 1 then 8 streams only, the rule compares 8 with 1, where the
    client's own per-request cost at one stream makes 8 streams read ~5% faster: it fired
    in one run of two under a loaded CPU.)"""
    from agent.load import no_gain

    lock = threading.Lock()

    def reply(n: int) -> tuple[float, float, int]:
        with lock:
            time.sleep(0.06)
        return (0.0, 0.0, 1)

    ramp: list[dict] = []
    why = None
    with server(reply) as url:
        for c in (1, 2, 4, 8):
            out, wall = closed_loop(sender(url), c, 16)
            ramp.append(summarize(out, wall, closed=True))
            if (why := saturation(ramp, "concurrency")) is not None:
                break
    assert why is not None and why.startswith("latency growing without throughput"), ramp
    assert no_gain(ramp, [1, 2, 4, 8]) is not None


# -- change points: nightly series of the auditor's own, through the real ingest ------------

def _my_series(seed: int, kind: str, n: int = 35) -> tuple[list[float], dict]:
    """Nightly levels around 100, white noise σ 1.5% (numpy, seeded by ``seed`` and a
    fixed number per kind), and one planted event: ``weekly-step`` (weekend nights 10%
    lower, every week, and a 15% drop at night 8..26), ``late-drift`` (+12% over the last
    8 nights, a straight ramp), ``weekly`` (the weekend pattern alone: no change)."""
    import numpy as np

    rng = np.random.default_rng([seed, {"weekly-step": 1, "late-drift": 2, "weekly": 3}[kind]])
    t = np.arange(n)
    e = rng.normal(0, 0.015, n)
    truth: dict = {"kind": "none"}
    level = np.ones(n)
    if kind.startswith("weekly"):
        level = np.where(t % 7 >= 5, 0.90, 1.0)
    if kind == "weekly-step":
        at = int(rng.integers(8, n - 8))
        level[at:] *= 0.85
        truth = {"kind": "step", "at": at}
    elif kind == "late-drift":
        at = n - 8
        level = 1 + 0.12 * np.clip((t - at) / 7, 0, 1)
        truth = {"kind": "drift", "at": at, "until": n - 1}
    return [float(v) for v in 100 * level * (1 + e)], truth


def _ingest_and_review(tmp_path, values: list[float], bump_at: int | None = None) -> list:
    from datetime import datetime, timedelta, timezone

    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse as weekly
    from orchestrator.store import open_store
    from tests.history import config_values, night

    w20 = datetime(2026, 5, 11, tzinfo=timezone.utc)
    store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    start = w20 - timedelta(days=len(values) - 7)
    nights = [start + timedelta(days=i, hours=2) for i in range(len(values))]
    for i, (at, v) in enumerate(zip(nights, values)):
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="p", workload="w",
              configs={("baseline", 0): config_values(v, jitter=0.0)},
              identity={"mlx_lm_version": "0.33.0" if bump_at is not None and i >= bump_at
                        else "0.32.2"})
    a = weekly(store, "2026-W20", load_rules(), now=w20 + timedelta(days=6, hours=12))
    (s,) = a["series"]
    return [(cp, nights) for cp in s["change_points"]] or [(None, nights)]


def test_a_step_two_nights_before_the_end_with_a_bump_is_a_possible_step_at_its_night(
        tmp_path):
    """Guard. 35 nights, my own noise (σ 1.5%, seed 4); an mlx-lm bump on night 33 (two
    nights before the end) takes the level down 14%: through the ingest and the weekly
    review, one possible step dated night 33, "confirm on the next nights", naming the
    bump."""
    values, _ = _my_series(4, "weekly")
    values = [100.0 * (1 + (v / 100 - (0.9 if i % 7 >= 5 else 1.0))) *
              (0.86 if i >= 33 else 1.0) for i, v in enumerate(values)]
    ((cp, nights),) = _ingest_and_review(tmp_path, values, bump_at=33)
    assert cp is not None and cp["kind"] == "possible step", cp
    assert cp["note"] == "confirm on the next nights"
    assert cp["date"] == nights[33].date().isoformat()
    assert cp["changed"] == ["mlx-lm 0.32.2 → 0.33.0"]


def test_a_drift_over_the_last_eight_nights_is_reported_as_a_drift(tmp_path):
    """Audit 27 finding (change points, medium). Seed 1 of my late drift: flat at 100 for
    27 nights, then +12% in a straight ramp over the last 8 (σ 1.5%: the last two nights
    read 111 and 110). Issue 27 item 5: a drift is labelled drift. Today the weekly
    review reports no change point at all (over 60 seeds of this series, analyse() finds
    nothing on 15 and calls a step on 10). Closed by review/taildrift.py: a ramp up to the
    last night is tested directly (hinge against step, slope against the held nights'
    AR(1) noise); 57 of the 60 seeds are now one drift."""
    values, _ = _my_series(1, "late-drift")
    found = _ingest_and_review(tmp_path, values)
    assert [cp["kind"] for cp, _ in found if cp] == ["drift"], found


def test_a_step_on_a_weekly_pattern_is_found_within_a_night():
    """Audit 27 finding (change points, medium). Weekend nights 10% lower every week (a
    backup job, a shared machine's weekend load), σ 1.5%, and a 15% drop somewhere in
    nights 8-26: 40 series. Recall within a night should be ≥ 0.95 as item 5 asks of its
    bench; today 0.725 (steps missed outright, or a drift from night 0 reported instead):
    the model has no season, so the weekend nights inflate the noise and the step hides.
    Closed by review/season.py: a weekly pattern three weeks or more show is taken out
    first; recall 1.000 and precision 1.000 on these 40."""
    from orchestrator.review.changepoints import analyse
    from tests.history import score_change_points

    runs = [(analyse(v), truth) for v, truth in (_my_series(s, "weekly-step") for s in range(40))]
    assert score_change_points(runs)["recall"] >= 0.95


def _hostile(seed: int, kind: str, n: int = 35) -> tuple[list[float], dict]:
    """Series of mine the change points held against: σ 1.5% white noise unless said;
    ``outliers`` (three lone nights ±20%), ``t3`` (Student-t, 3 degrees of freedom),
    ``ar8`` (AR(1) φ 0.8), ``dip3`` (three nights 15% low), ``late-dip`` (two nights 20%
    low ending two nights before the end) — no change; ``step8`` (+8%, nights 5..n-5),
    ``end2``/``end3`` (−15% two/three nights before the end) — a step."""
    import math

    import numpy as np

    kinds = ("outliers", "t3", "ar8", "dip3", "late-dip", "step8", "end2", "end3")
    rng = np.random.default_rng([seed, 100 + kinds.index(kind)])
    e, level, truth = rng.normal(0, 0.015, n), np.ones(n), {"kind": "none"}
    if kind == "outliers":
        for i in rng.choice(np.arange(2, n - 2), 3, replace=False):
            level[i] *= 1 + rng.choice([-1, 1]) * 0.2
    elif kind == "t3":
        e = 0.015 * rng.standard_t(3, n) / math.sqrt(3)
    elif kind == "ar8":
        x, e = 0.0, np.zeros(n)
        for i in range(n):
            x = 0.8 * x + rng.normal(0, 0.015 * math.sqrt(1 - 0.64))
            e[i] = x
    elif kind == "dip3":
        at = int(rng.integers(5, n - 8))
        level[at:at + 3] = 0.85
    elif kind == "late-dip":
        level[n - 4:n - 2] = 0.8
    else:
        at = {"end2": n - 2, "end3": n - 3}.get(kind) or int(rng.integers(5, n - 5))
        level[at:] = 1.08 if kind == "step8" else 0.85
        truth = {"kind": "step", "at": at}
    return [float(v) for v in 100 * level * (1 + e)], truth


def test_hostile_series_keep_precision_and_recall():
    """Guard (item 5 on series not from the project's bench): 8 kinds × 15 seeds, 120
    series — lone outliers, heavy tails, AR(1) φ 0.8, a three-night dip, a two-night dip
    two nights before the end (none of these a change), a +8% step, a −15% step two or three
    nights before the end: precision and recall within a night ≥ 0.95 (measured: 1.00 and
    1.00 on 11 kinds × 30 seeds)."""
    from orchestrator.review.changepoints import analyse
    from tests.history import score_change_points

    runs = [(analyse(v), truth) for kind in ("outliers", "t3", "ar8", "dip3", "late-dip",
                                             "step8", "end2", "end3")
            for v, truth in (_hostile(s, kind) for s in range(15))]
    score = score_change_points(runs)
    assert score["precision"] >= 0.95 and score["recall"] >= 0.95, score["wrong"][:5]
