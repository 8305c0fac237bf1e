"""An open loop's served rate where the server answers one request at a time in any order
(issue 27, item 6): replies that never stream together are read by their summed streaming
time, whatever order the server took them in (newest first, a mutex, a queue), and a
backlog answered one at a time after the arrivals reads as held. The lag's trend alone
assumed first come, first served."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.load import Outcome, arrival_times, saturation, summarize
from agent.served import serial_rate


def test_serial_rate_by_hand():
    """Three replies streaming 0.1, 0.2 and 0.3 s one after another (gaps between): 3 in
    0.6 s of streaming, 5.0 a second. Two of them streaming together: None (a server that
    batches: its replies' times say nothing of its capacity). Touching ends are not an
    overlap. Replies that take no time: None."""
    def o(first: float, last: float) -> Outcome:
        return Outcome(0.0, 0.0, chunk_times=[first, last], end=last)

    assert serial_rate([o(0.0, 0.1), o(0.5, 0.7), o(1.0, 1.3)]) == pytest.approx(5.0)
    assert serial_rate([o(0.0, 0.1), o(0.1, 0.3), o(0.3, 0.6)]) == pytest.approx(5.0)
    assert serial_rate([o(0.0, 0.2), o(0.1, 0.3), o(1.0, 1.3)]) is None
    assert serial_rate([o(0.0, 0.0), o(1.0, 1.0)]) is None


def _one_at_a_time(sched: list[float], services: list[float], pick) -> list[Outcome]:
    """One request at a time, the k-th served taking services[k]; when free the server
    takes ``pick(waiting)`` (an index into the waiting requests, in arrival order)."""
    done: dict[int, tuple[float, float]] = {}
    t, waiting, i = 0.0, [], 0
    while len(done) < len(sched):
        while i < len(sched) and sched[i] <= t:
            waiting.append(i)
            i += 1
        if not waiting:
            t = sched[i]
            continue
        k = waiting.pop(pick(waiting))
        done[k] = (t, t + services[len(done)])
        t = done[k][1]
    return [Outcome(at, at, chunk_times=[done[k][0] - at + 0.001, done[k][1] - at],
                    end=done[k][1]) for k, at in enumerate(sched)]


def test_a_newest_first_server_at_half_the_rate_is_served_at_its_capacity():
    """8/s constant, 16 requests, newest first, 0.25 s each: it served 4 a second (16
    replies streaming 0.249 s each, one at a time: 16 / 3.984 = 4.016), not 8."""
    outs = _one_at_a_time(arrival_times(8.0, 16, "constant", 0), [0.25] * 16,
                          lambda w: len(w) - 1)
    m = summarize(outs, max(o.end for o in outs))
    assert m["served_rps"] == pytest.approx(16 / (16 * 0.249), abs=0.001)
    assert saturation([m], "request_rate", 8.0).startswith("cannot keep up: ")


def test_a_tick_that_answers_a_request_before_the_last_arrival_is_not_a_held_backlog():
    """16 requests at 16/s constant (0.94 s), a server answering all waiting requests on a
    1 s tick at 0.05 s, 1.05 s, ...: request 0 at the first tick, the other 15 at the
    second, just after the last arrival. The lag falls (slope -1 along the tick) but the
    server answered while requests came: it keeps up (served = offered, 16/s), where a
    server that answered none until after the last arrival would be holding them."""
    sched = arrival_times(16.0, 16, "constant", 0)
    outs = []
    for t in sched:
        tick = 0.05 if t <= 0.05 else 1.05
        outs.append(Outcome(t, t, chunk_times=[tick - t + 0.01, tick - t + 0.02],
                            end=tick + 0.02))
    m = summarize(outs, 1.07)
    assert m["served_rps"] == pytest.approx(16.0)
    assert saturation([m], "request_rate", 16.0) is None


ORDERS = {"oldest": lambda w, r: 0, "newest": lambda w, r: len(w) - 1,
          "random": lambda w, r: r.randrange(len(w))}


@settings(max_examples=150, deadline=None)
@given(st.floats(0.5, 50.0), st.integers(4, 80), st.sampled_from(["constant", "poisson"]),
       st.sampled_from(sorted(ORDERS)), st.floats(0.0, 0.9), st.booleans(),
       st.integers(0, 2**31))
def test_a_one_at_a_time_server_over_its_capacity_is_saturated_in_any_order(
        rate, n, arrivals, order, jitter, exponential, seed):
    """Any schedule, a server answering one request at a time in any order (oldest,
    newest or a random waiting one first), service times uniform ±jitter or exponential,
    whose own capacity over the level (requests over its summed service time, known
    without the code under test) is under 90% of the realised offered rate: served_rps is
    at most that capacity (to the 1 ms each reply's first chunk takes, and 3 decimals) and
    the level reads 'cannot keep up'."""
    rng = random.Random(seed)
    sched = arrival_times(rate, n, arrivals, seed)
    offered = (n - 1) / (sched[-1] - sched[0])
    mean = 1.0 / (offered * rng.uniform(0.1, 0.85))
    services = [mean * (rng.expovariate(1.0) if exponential
                        else rng.uniform(1 - jitter, 1 + jitter)) + 0.002 for _ in range(n)]
    capacity = n / sum(services)
    # what the streams show: each reply's first 1 ms (before its first chunk) is busy time
    # the one-at-a-time reading cannot see (it sums first-to-last chunk), so the server's
    # capacity as its streams show it must be under 90% too (Hypothesis: 4 replies of 3-12
    # ms at 177/s offered, capacity 158/s, streams 187/s)
    if n / (sum(services) - 0.001 * n) >= 0.9 * offered:
        return
    outs = _one_at_a_time(sched, services, lambda w: ORDERS[order](w, rng))
    m = summarize(outs, max(o.end for o in outs))
    assert m["served_rps"] <= n / (sum(services) - 0.001 * n) + 0.001, (m, capacity)
    assert saturation([m], "request_rate", rate).startswith("cannot keep up: "), m


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.001, 5.0)), min_size=2,
                max_size=60), st.randoms(use_true_random=False))
def test_one_at_a_time_streaming_reads_the_same_in_any_order(steps, rnd):
    """Replies streaming one after another (each a gap, then a streaming time, after the
    last one ended), listed in any order: the reading is their count over their summed
    streaming time, whichever order the server took them in (the order is what the lag's
    trend depended on)."""
    outs, t = [], 0.0
    for gap, dur in steps:
        t += gap
        outs.append(Outcome(0.0, 0.0, chunk_times=[t, t + dur], end=t + dur))
        t += dur
    want = len(steps) / sum(o.chunk_times[1] - o.chunk_times[0] for o in outs)
    rnd.shuffle(outs)
    assert serial_rate(outs) == pytest.approx(want, rel=1e-9)
