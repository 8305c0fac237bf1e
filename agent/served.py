"""An open loop's served rate (issue 27, item 6): the pace at which a level's requests were
answered, judged three ways, the lowest reading taken, since each can only overstate:
- the lag's trend (first come, first served): a server that keeps up completes each
  request a time after its arrival that does not grow along the level; one falling behind
  in arrival order completes each later than the last by more;
- one at a time (any order: newest first, a mutex, a queue): a server whose replies never
  stream together serves at most its requests over their summed streaming time, whatever
  the order it took them in, where the lag's trend reads nothing (newest-first: the lag
  falls) or little (service times that scatter);
- a backlog held and then released: the lag surely falls while the first tokens come
  after the arrivals: the completions over the level's wall time.
Standard library only."""

from __future__ import annotations

import math

from .outcome import Outcome
from .stats import percentile, sen_slope

SERIAL_OVERLAP = 0.02  # streams overlapping by at most this share of their time: serial
HELD_FALL = 0.25       # a lag surely falling faster than this share of the arrivals' pace


def realised_rate(times: list[float]) -> float | None:
    """Events per second over a run of event times: (n − 1) gaps over their span."""
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    rate = (len(times) - 1) / span if span > 0 else None
    return rate if rate is not None and math.isfinite(rate) else None  # 2 events 5e-324 apart


def served_rates(outcomes: list[Outcome]) -> tuple[float | None, float | None]:
    """An open loop's served rate: the pace of its completions against the pace of its
    arrivals. A server that keeps up completes each request a time after its arrival that
    does not grow along the level, however long or varied that time (a long prefill, reply
    lengths that vary, every other reply slow, a batch answered on the next tick); one that
    falls behind in arrival order completes each later than the last by more. So the lag
    (completion less the scheduled time) is fitted against the schedule by Theil-Sen, and
    the completions span the arrivals' span times (1 + its slope): a serial server
    finishing one every 1/4.8 s offered 8 a second has a lag growing 2/3 s a second, served
    8 / (5/3) = 4.8. Two readings are given, (point, at most): the point takes the
    Theil-Sen median slope, the measurement; the bound takes Sen's lower 95% bound, the
    most the level can be said to have served, which the saturation verdict rests on:
    replies whose times scatter widely over a short level leave the trend unsure, and an
    unsure trend is no growth (16 requests at 8/s with 0.2-1.2 s replies: the ends'
    medians read 74 of 200 such levels saturated). The point is never above the bound
    (a FIFO server at 5/s offered 8 with scattered service, replies overlapping: the
    point is within 7% of its completions' pace and unbiased; the bound overstated it
    by 1.4-3.7% on average, bench in tests/test_load_served_bound.py). A failed request
    is not served: each reading is that pace times the share of requests that succeeded,
    whichever failed (the closed loop's reading), the trend fitted to the successful ones.

    The lag's trend assumes first come, first served. A server whose replies stream one at
    a time (``serial_rate``) served at most its requests over their summed streaming time,
    in any order: a measurement, not a bound's end (newest first at 4/s of 8 offered: the
    lag falls, the trend reads 8; exponential service at 4.6/s: the trend's bound reads 8).
    The lower of the two is the served rate, where every request succeeded (a failed
    one's time on the server is unseen).

    A lag surely falling (``_held``) while the first tokens came after the last arrival
    is a backlog held and then released (in one burst or one at a time: the later ones
    wait less), which shows no pace; there, and where the arrivals span no time, the
    served rate is vLLM's request throughput: completions over the level's wall time from
    its first send to its last completion, less the median time a reply streams after its
    first chunk (a reply that keeps up still streams after the last arrival); the wait for
    the first tokens stays
    in, so a held backlog is served over the hold."""
    ok = sorted((o for o in outcomes if o.ok), key=lambda o: o.scheduled)
    if not ok:
        return 0.0, 0.0
    if len(ok) < 2:  # one request has no rate (and one of several: the errors say it)
        return None, None
    trend = sen_slope([o.scheduled for o in ok], [o.end - o.scheduled for o in ok])
    offered = realised_rate([o.scheduled for o in outcomes])
    if trend is not None and offered and not _held(ok, max(o.scheduled for o in outcomes),
                                                    trend[2]):
        share = offered * len(ok) / len(outcomes)
        # a failed request's time on the server is unseen (it may have held it, or not):
        # the one-at-a-time reading is taken where every request succeeded
        serial = serial_rate(ok) if len(ok) == len(outcomes) else None
        point, most = (share / (1 + max(slope, 0.0)) for slope in (trend[0], trend[1]))
        if serial is not None:
            point, most = min(point, serial), min(most, serial)
        return point, most
    stream = percentile([o.chunk_times[-1] - o.chunk_times[0] for o in ok], 50) or 0.0
    span = max(o.end for o in ok) - min(o.sent for o in outcomes) - stream
    rate = len(ok) / span if span > 0 else None
    rate = rate if rate is not None and math.isfinite(rate) else None
    return rate, rate


def serial_rate(ok: list[Outcome]) -> float | None:
    """Requests per second of streaming, where the replies streamed one at a time (first
    chunk to last, overlapping by at most 2% of their summed time: a server answering one
    request at a time, in whatever order); None where they streamed together (a server
    that batches: its replies' times say nothing of its capacity) or took no time. Each
    reply's wait before its first chunk is left out (a prefill is not seen apart from a
    queue), so this can only overstate a serial server's rate."""
    spans = sorted((o.sent + o.chunk_times[0], o.last) for o in ok)
    busy = sum(b - a for a, b in spans)
    if busy <= 0:
        return None
    union, reach = 0.0, -float("inf")
    for a, b in spans:
        if b > reach:
            union += b - max(a, reach)
            reach = b
    return len(ok) / busy if busy - union <= SERIAL_OVERLAP * busy else None


def _held(ok: list[Outcome], last: float, most: float) -> bool:
    """A backlog held and released, the lag surely falling at over half the arrivals' pace
    while most first tokens came after the last arrival, all within half the arrivals'
    span of each other (one burst: replies that merely take far longer than the level
    scatter their first tokens); or at over a quarter of their pace while none came before
    it (released one at a time: a server that keeps up has a flat lag, however long, and
    one answering on a tick answers some of them before the last arrival)."""
    firsts = [o.sent + o.chunk_times[0] for o in ok]
    before = sum(f <= last for f in firsts)
    burst = (most < -0.5 and 2 * before < len(ok)
             and max(firsts) - min(firsts) < (ok[-1].scheduled - ok[0].scheduled) / 2)
    return burst or (most < -HELD_FALL and before == 0)
