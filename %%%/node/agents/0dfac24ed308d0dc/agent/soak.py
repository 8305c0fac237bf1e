"""Soak mode: decode continuously for a while and watch memory and swap over time."""

from __future__ import annotations

import statistics
import time


def soak_verdict(samples: list[dict], rss_growth_limit: float = 0.10) -> dict:
    """Fail when the working set keeps growing or swap use grows monotonically.

    ``samples`` carry ``rss_bytes`` and ``swap_used_bytes`` in time order. Growth is
    judged on thirds of the run (median of each), so a single spike does not fail it.
    """
    reasons = []
    rss = [s["rss_bytes"] for s in samples if s.get("rss_bytes")]
    if len(rss) >= 6:
        k = len(rss) // 3
        first, mid, last = (statistics.median(rss[:k]), statistics.median(rss[k:-k]),
                            statistics.median(rss[-k:]))
        if first < mid < last and last > first * (1 + rss_growth_limit):
            reasons.append(f"working set grew {last / first - 1:.0%} over the run "
                           f"({first / 2**20:.0f} → {last / 2**20:.0f} MiB) without levelling off")
    swap = [s["swap_used_bytes"] for s in samples if s.get("swap_used_bytes") is not None]
    if len(swap) >= 5 and all(b > a for a, b in zip(swap, swap[1:])):
        reasons.append(f"swap use grew at every sample ({swap[0]} → {swap[-1]} bytes)")
    return {"status": "fail" if reasons else "pass", "reasons": reasons,
            "peak_rss_bytes": max(rss) if rss else None}


def run_soak(job, journal, sampler, generate_config) -> dict:
    """Back-to-back generations for ``duration_s``; one ``soak_sample`` event each."""
    from .telemetry import summarise_window

    duration = float(job.soak.get("duration_s", 600))
    # a long soak of short generations would journal thousands of samples: emit at most one
    # per sample_every_s (carrying the interval's peak RSS); the verdict still sees them all
    every = float(job.soak.get("sample_every_s", 0))
    t0 = time.monotonic()
    samples, swap_in, i = [], 0, 0
    last_emit, pending = None, []
    while time.monotonic() - t0 < duration:
        start = sampler.mark()
        m = generate_config()
        w = summarise_window(sampler.window(start, sampler.mark()))
        swap_in += w["swap_in_bytes"] or 0
        sample = {"index": i, "elapsed_s": round(time.monotonic() - t0, 3),
                  "decode_tok_s": m["decode_tok_s"], "acceptance_rate": m["acceptance_rate"],
                  "rss_bytes": w["rss_peak_bytes"], "swap_used_bytes": w["swap_used_after_bytes"],
                  "swap_in_bytes": w["swap_in_bytes"],
                  "peak_mlx_memory_bytes": m.get("peak_mlx_memory_bytes"),
                  "memory_pressure": w["memory_pressure"]}
        samples.append(sample)
        pending.append(sample)
        if last_emit is None or sample["elapsed_s"] - last_emit >= every:
            peak = max((p["rss_bytes"] or 0 for p in pending), default=0) or None
            journal.emit("soak_sample", **{**sample, "rss_bytes": peak},
                         generations_in_sample=len(pending))
            last_emit, pending = sample["elapsed_s"], []
        i += 1
    verdict = soak_verdict(samples, float(job.soak.get("rss_growth_limit", 0.10)))
    return {**verdict, "generations": i, "duration_s": round(time.monotonic() - t0, 3),
            "swap_in_bytes": swap_in}
