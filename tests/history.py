"""Plant histories straight into a store: nights of runs with chosen numbers and identity.

Used by the review tests (known regressions, draft swaps, throttled nights, stale series,
gate edges) and by bench/review_scale.py (a year of nightly sweeps for 100 nodes).
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import datetime, timedelta

from orchestrator.store import Store
from orchestrator.store.models import Event, Run, Sweep

BASE_IDENTITY = {"env_id": "env-a", "mlx_version": "0.32.4", "mlx_lm_version": "0.32.2",
                 "os_build": "24A335", "prompt_sha256": "p" * 64,
                 "target_fingerprint": "sha256:" + "t" * 64,
                 "draft_fingerprint": "sha256:" + "d" * 64}


def config_values(decode: float, reps: int = 3, *, acceptance=None, ttft=50.0, itl_p95=20.0,
                  itl_p99=30.0, mem=1.0e9, swap=0, swap_in=0, tokens=256, jitter=0.01,
                  rng=random) -> dict:
    def j(v):
        return None if v is None else v * (1 + rng.uniform(-jitter, jitter))
    return {"decode_tok_s": [j(decode) for _ in range(reps)],
            "acceptance_rate": [j(acceptance) for _ in range(reps)],
            "ttft_ms": [j(ttft) for _ in range(reps)], "itl_p95_ms": [j(itl_p95)] * reps,
            "itl_p99_ms": [j(itl_p99)] * reps, "itl_p50_ms": [itl_p95 / 4] * reps,
            "peak_mlx_memory_bytes": [mem] * reps, "swap_used_after_bytes": [swap] * reps,
            "swap_in_bytes": [swap_in] * reps, "generated_tokens": [tokens] * reps,
            "prompt_tokens": [32] * reps}


def night(store: Store, at: datetime, *, node: str, chip: str, pair: str, workload: str,
          configs: dict, bucket: str = "short", identity: dict | None = None,
          unreliable: str | None = None, exact: bool = True, quality: dict | None = None,
          sweep_id: str | None = None, engine: str = "mlx-lm",
          parity: dict | None = None, lineup: str | None = None,
          background: str | None = None) -> str:
    """One nightly sweep on one node: ``configs`` maps (mode, k) to config_values(...).
    ``lineup``: the pair's roles ("target+draft-2") when the sweep measured several."""
    ident = {**BASE_IDENTITY, **(identity or {})}
    sid = sweep_id or new_sweep(store, at)
    with store.engine.begin() as c:
        rows = []
        for (mode, k), values in configs.items():
            rows.append({
                "sweep_id": sid, "node": node, "workload": workload, "context_bucket": bucket,
                "mode": mode, "knob": None if mode == "baseline" else "num_draft_tokens",
                "knob_value": None if mode == "baseline" else str(k), "num_draft_tokens": k,
                "config_key": (f"{lineup} " if lineup else "") + json.dumps({"k": k,
                                                                            "mode": mode}),
                "config": {"k": k}, "pair": lineup,
                "trials": len(values["decode_tok_s"]),
                "decode_tok_s_median": sorted(values["decode_tok_s"])[len(values[
                    "decode_tok_s"]) // 2], "decode_tok_s_p95": None, "decode_tok_s_cv": None,
                "acceptance_median": None, "unreliable": unreliable is not None,
                "summary": {"values": values, "exact": exact if mode == "speculative" else None,
                            "unreliable_reasons": [unreliable] if unreliable else [],
                            "parity": (parity or {}).get((mode, k)),
                            "models": dict(zip(("target", "draft"), lineup.split("+")))
                            if lineup else None},
                "env_id": ident["env_id"], "mlx_version": ident["mlx_version"],
                "mlx_lm_version": ident["mlx_lm_version"],
                "target_fingerprint": ident["target_fingerprint"],
                "draft_fingerprint": ident["draft_fingerprint"],
                "target_quant": ident.get("target_quant"), "draft_quant": ident.get("draft_quant"),
                "prompt_sha256": ident["prompt_sha256"], "os_build": ident["os_build"],
                "chip": chip, "power_source": "ac", "model_pair": pair, "engine": engine,
                "background": background})
        c.execute(Run.__table__.insert(), rows)
        if quality:
            c.execute(Event.__table__.insert(), [
                {"sweep_id": sid, "node": node, "seq": 1000 + i, "type": "quality",
                 "ts": at.timestamp(), "payload": {"type": "quality", "num_draft_tokens": k,
                                                   "pass_rate": rate}}
                for i, (k, rate) in enumerate(quality.items())])
    return sid


def new_sweep(store: Store, at: datetime) -> str:
    sid = uuid.uuid4().hex[:12]
    with store.engine.begin() as c:
        c.execute(Sweep.__table__.insert().values(id=sid, created_at=at, status="ok", job={},
                                                  trigger="nightly"))
    return sid


def week_nights(week_start: datetime, nights: int = 7) -> list[datetime]:
    return [week_start + timedelta(days=i, hours=2) for i in range(nights)]


# -- planted speedup curves for the adaptive sweep ---------------------------------------

SPEEDUP_CURVES = {  # draft width → true median speedup
    "knee at 3": {1: 1.10, 2: 1.22, 3: 1.30, 4: 1.24, 6: 1.12, 8: 1.02},
    "still rising": {1: 1.04, 2: 1.10, 3: 1.16, 4: 1.21, 6: 1.27, 8: 1.35},
    "net loss": {1: 0.98, 2: 0.93, 3: 0.88, 4: 0.84, 6: 0.79, 8: 0.74},
}


def planted_speedups(curve: dict[int, float], seed: int, noise: float = 0.03):
    """sample(width, repetition) → one paired speedup: the curve's value times log-normal
    noise, the same number for the same (seed, width, repetition) whoever asks."""
    import math

    def sample(width: int, rep: int) -> float:
        rng = random.Random(f"{seed}:{width}:{rep}")
        return curve[width] * math.exp(rng.gauss(0, noise))

    return sample


def pick(medians: dict[int, float]) -> int:
    """The config a sweep's answer names: the width with the best median paired speedup,
    or 0 (the baseline, whose speedup is 1 by definition) when no width beats it."""
    best = max(medians, key=lambda k: medians[k])
    return best if medians[best] > 1.0 else 0


def within_tolerance(curve: dict[int, float], a: int, b: int, tolerance: float) -> bool:
    """Whether two picks are one answer by the plan's terms: their true speedups (0: the
    baseline, at 1) differ by less than its tolerance, which it cannot tell apart."""
    truth = {0: 1.0, **curve}
    return abs(truth[a] / truth[b] - 1) < tolerance


def full_grid(widths: list[int], reps: int, sample) -> tuple[int, int]:
    """The config a full grid picks (``pick``) and the generations it ran (A+C each)."""
    import statistics

    return (pick({k: statistics.median(sample(k, r) for r in range(reps)) for k in widths}),
            2 * reps * len(widths))


def adaptive_grid(widths: list[int], reps: int, spec: dict, sample) -> tuple[int, int, dict]:
    """The same, stopping as the agent's adaptive sweep does (agent.adaptive.settle after
    every round): the config it picks, the generations it ran and why each stopped."""
    import statistics

    from agent.adaptive import resolved, settle

    spec = resolved(spec, reps)
    samples: dict[int, list[float]] = {k: [] for k in widths}
    why: dict[int, str] = {}
    runs = 0
    for rep in range(reps):
        for k in widths:
            if k not in why:
                samples[k].append(sample(k, rep))
                runs += 2
        live = {k: xs for k, xs in samples.items() if k not in why}
        why.update(settle(live, {k: k for k in live}, spec))
        if len(why) == len(widths):
            break
    return pick({k: statistics.median(samples[k]) for k in widths}), runs, why


# -- planted nightly series for change points ---------------------------------------------

def planted_nightly(seed: int, kind: str, n: int = 35) -> tuple[list[float], dict]:
    """One series of ``n`` nightly levels around 100 with AR(1) noise (φ 0-0.5, σ 1-2%) and
    one planted event: ``step`` (10-25% either way, anywhere from night 4 to 2 nights before
    the end), ``drift`` (10-30% over 12 nights or more, anywhere), ``dip`` (two nights
    10-30% off, inside the window, then back) or ``none``. Returns the values and the truth
    (``kind``, ``at``: the step's night or the drift's first, ``until``: a drift's last)."""
    import math

    rng = random.Random(f"changepoint:{kind}:{seed}:{n}")
    phi, sigma = rng.uniform(0.0, 0.5), rng.uniform(0.01, 0.02)
    e, noise = rng.gauss(0, sigma), []
    for _ in range(n):
        noise.append(e)
        e = phi * e + rng.gauss(0, sigma * math.sqrt(1 - phi * phi))
    level = [1.0] * n
    truth: dict = {"kind": kind}
    sign = rng.choice((-1, 1))
    if kind == "step":
        at = rng.randint(4, n - 2)
        size = sign * rng.uniform(0.10, 0.25)
        level = [1.0 if i < at else 1 + size for i in range(n)]
        truth.update(at=at, size=size)
    elif kind == "drift":
        span = rng.randint(12, n)
        at = rng.randint(0, n - span)
        total = sign * rng.uniform(0.10, 0.30)
        level = [1 + total * min(max((i - at) / (span - 1), 0.0), 1.0) for i in range(n)]
        truth.update(at=at, until=at + span - 1, size=total)
    elif kind == "dip":
        at = rng.randint(4, n - 6)
        size = sign * rng.uniform(0.10, 0.30)
        level = [1 + size if at <= i < at + 2 else 1.0 for i in range(n)]
        truth.update(at=at, size=size)
    return [100 * lv * (1 + x) for lv, x in zip(level, noise)], truth


def score_change_points(series: list[tuple[list[dict], dict]]) -> dict:
    """Precision and recall of change points found (``index``, ``kind``, a drift's
    ``until``) against planted truths: a step counts when a step or possible step is
    reported within a night of it, a drift when a drift is reported overlapping its span;
    anything else reported is a false finding (any at all on a dip or a flat series)."""
    tp = fp = events = 0
    wrong: list = []
    for found, truth in series:
        hit = False
        for f in found:
            ok = not hit and (
                truth["kind"] == "step" and f["kind"] in ("step", "possible step")
                and abs(f["index"] - truth["at"]) <= 1
                or truth["kind"] == "drift" and f["kind"] == "drift"
                and f["index"] <= truth["until"] + 1 and f["until"] >= truth["at"] - 1)
            tp, fp, hit = tp + ok, fp + (not ok), hit or ok
        if truth["kind"] in ("step", "drift"):
            events += 1
        if (truth["kind"] in ("step", "drift") and not hit) or len(found) > hit:
            wrong.append((truth, found))
    return {"precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / events if events else 1.0, "found": tp, "false": fp,
            "events": events, "wrong": wrong}
