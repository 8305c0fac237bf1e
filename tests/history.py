"""Plant histories into a store through the real ingest: nights of runs with chosen numbers,
knobs and identity.

Used by the review tests (known regressions, draft swaps, throttled nights, stale series,
gate edges) and by bench/review_scale.py (a year of nightly sweeps for 100 nodes).
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from datetime import datetime, timedelta

from sqlalchemy import select

from agent.protocol import EVENT_SCHEMA_MAJOR, SAMPLING_DEFAULTS
from agent.summary import SUMMARY_METRICS, describe
from orchestrator.store import Store
from orchestrator.store.models import SweepNode
from orchestrator.sweep.decode import Decoder, Quarantined

BASE_IDENTITY = {"env_id": "env-a", "mlx_version": "0.32.4", "mlx_lm_version": "0.32.2",
                 "os_build": "24A335", "prompt_sha256": "p" * 64,
                 "target_fingerprint": "sha256:" + "t" * 64,
                 "draft_fingerprint": "sha256:" + "d" * 64}


def config_values(decode: float, reps: int = 3, *, acceptance=None, ttft=50.0, itl_p95=20.0,
                  itl_p99=30.0, mem=1.0e9, swap=0, swap_in=0, tokens=256, jitter=0.01,
                  rng=random, e2e=None) -> dict:
    """Planted repetitions, each within ``jitter`` of the given value (``rng``: the module
    random unless given, which tests/conftest.py seeds per test)."""
    def j(v):
        return None if v is None else v * (1 + rng.uniform(-jitter, jitter))
    return {"decode_tok_s": [j(decode) for _ in range(reps)],
            "acceptance_rate": [j(acceptance) for _ in range(reps)],
            "ttft_ms": [j(ttft) for _ in range(reps)], "itl_p95_ms": [j(itl_p95)] * reps,
            "itl_p99_ms": [j(itl_p99)] * reps, "itl_p50_ms": [itl_p95 / 4] * reps,
            "peak_mlx_memory_bytes": [mem] * reps, "swap_used_after_bytes": [swap] * reps,
            "swap_in_bytes": [swap_in] * reps, "generated_tokens": [tokens] * reps,
            "prompt_tokens": [32] * reps, "e2e_ms": [j(e2e) for _ in range(reps)]}


def C(mode: str, k: int, **knobs) -> tuple:
    """A ``configs`` key with sampling knobs beside the draft width:
    ``C("speculative", 3, temperature=0.7)``. A plain ``(mode, k)`` is every knob at its
    default."""
    return (mode, k, tuple(sorted(knobs.items())))


def event_config(mode: str, k: int, knobs=()) -> dict:
    """The config as the agent's events record it: every sampling knob, then the width."""
    return {**SAMPLING_DEFAULTS, **dict(knobs), "num_draft_tokens": k if mode != "baseline"
            else 0}


def _summary(values: dict, mode: str, k: int, knobs, *, workload: str, bucket: str,
             prompt: str, engine: str, unreliable: str | None, exact: bool,
             parity: dict | None, lineup: str | None, contention: dict | None = None,
             spread: dict | None = None) -> dict:
    return {"type": "config_summary", "workload": workload, "context_bucket": bucket,
            "prompt_sha256": prompt, "engine": engine, "mode": mode,
            "knob": None if mode == "baseline" else "num_draft_tokens",
            "knob_value": None if mode == "baseline" else k, "num_draft_tokens": k,
            "config": event_config(mode, k, knobs),
            "metrics": {m: describe(values.get(m) or []) for m in SUMMARY_METRICS},
            "values": values, "trials": len(values["decode_tok_s"]),
            "unreliable": unreliable is not None,
            "unreliable_reasons": [unreliable] if unreliable else [],
            "exact": exact if mode == "speculative" else None, "parity": parity,
            **({"contention": contention} if contention else {}),
            **({"spread": spread} if spread else {}),
            **({"models": dict(zip(("target", "draft"), lineup.split("+")))} if lineup
               else {})}


def night(store: Store, at: datetime, *, node: str, chip: str, pair: str, workload: str,
          configs: dict, bucket: str = "short", identity: dict | None = None,
          unreliable: str | None = None, exact: bool = True, quality: dict | None = None,
          sweep_id: str | None = None, engine: str = "mlx-lm",
          parity: dict | None = None, lineup: str | None = None,
          background: str | None = None, contention: dict | None = None,
          lock: dict | None = None, spread: dict | None = None) -> str:
    """One nightly sweep on one node, planted through the real ingest: the journal lines an
    agent would write (environment, one ``config_summary`` per config, quality) pass the
    controller's decode boundary and ``Store.ingest``, as a sweep's do.

    ``configs`` maps (mode, k) — or ``C(mode, k, **knobs)`` — to config_values(...).
    ``lineup``: the pair's roles ("target+draft-2") when the sweep measured several.
    ``lock``: the plan lock the sweep ran (``lock_doc``), recorded as the controller does."""
    ident = {**BASE_IDENTITY, **(identity or {})}
    sid = sweep_id or new_sweep(store, at, lock)
    ts = at.timestamp()
    # the node as `fleet facts` saw it (the ingest takes chip and OS build from there)
    store.add_facts(node, {"chip": chip, "os_build": ident["os_build"]})
    # this node's row only: a sweep of 200 nodes read whole per night made planting quadratic
    with store.engine.connect() as c:
        known = c.execute(select(SweepNode.identity).where(
            SweepNode.sweep_id == sid, SweepNode.node == node)).scalar() or {}
    roles = dict(known.get("roles") or {})
    names = dict(known.get("role_names") or {})
    fingerprints = {"target": ident["target_fingerprint"], "draft": ident["draft_fingerprint"]}
    quant = {"target": ident.get("target_quant"), "draft": ident.get("draft_quant")}
    if lineup:  # each pair of a lineup names its roles; the sweep's identity keeps them all
        t, d = lineup.split("+")
        roles.update({t: {"fingerprint": ident["target_fingerprint"],
                          "quant": ident.get("target_quant")},
                      d: {"fingerprint": ident["draft_fingerprint"],
                          "quant": ident.get("draft_quant")}})
        names.update(zip((t, d), pair.split(" / ", 1)) if " / " in pair else {})
        for role, r in roles.items():
            fingerprints[role], quant[role] = r["fingerprint"], r["quant"]
    store.set_sweep_node(sid, node, state="running", identity={
        "env_id": ident["env_id"], "power_source": "ac", "model_pair": pair,
        "background": background, **({"role_names": names} if len(names) >= 2 else {})})
    lines = [{"type": "environment_checked",
              "versions": {"mlx": ident["mlx_version"], "mlx-lm": ident["mlx_lm_version"]},
              "fingerprints": fingerprints, "quantization": quant}]
    for key, values in configs.items():
        mode, k, knobs = (*key, ()) if len(key) == 2 else key
        # as the agent writes it: one trial has no spread, so no spread sets it aside
        single = spread is not None and len(
            [v for v in values.get("decode_tok_s") or [] if v is not None]) < 2
        lines.append(_summary(values, mode, k, knobs, workload=workload, bucket=bucket,
                              prompt=ident["prompt_sha256"], engine=engine,
                              unreliable=None if single else unreliable, exact=exact,
                              parity=(parity or {}).get(key), lineup=lineup,
                              contention=contention, spread=None if single else spread))
    for k, rate in (quality or {}).items():
        lines.append({"type": "quality", "mode": "baseline" if k == 0 else "speculative",
                      "num_draft_tokens": k, "tasks": 100, "passed": round(rate * 100),
                      "pass_rate": rate})
    ingest_lines(store, sid, node, lines, ts)
    store.finish_sweep(sid, {node: ("ok", None)})
    return sid


_RUN_INDEX = itertools.count()


def generation(mode: str, k: int, knobs=(), *, workload: str = "code",
               bucket: str = "short", lineup: str | None = None, **fields) -> dict:
    """A ``generation`` event as the agent writes one (fields beyond the protocol's own as
    given: acceptance_rate, acceptance_by_position …), for ``ingest_lines``."""
    return {"type": "generation", "workload": workload, "context_bucket": bucket,
            "mode": mode, "num_draft_tokens": k, "config": event_config(mode, k, knobs),
            "generated_tokens": 32, "decode_tok_s": 100.0, "ttft_ms": 50.0,
            # each generation its own run: the ledger sets a run measured twice aside
            "run_index": next(_RUN_INDEX),
            "repetition": 0, "prompt_sha256": "p" * 64, "output_text": "", "unreliable": False,
            **({"models": dict(zip(("target", "draft"), lineup.split("+")))} if lineup
               else {}), **fields}


def ingest_lines(store: Store, sweep_id: str, node: str, events: list[dict],
                 ts: float) -> None:
    """Number ``events`` after what the store holds, as journal lines, and take them through
    the decode boundary into the store; a line the boundary refuses fails the planting."""
    decoder = Decoder(node)
    seq = store.last_seq(sweep_id, node)
    kept = []
    for i, e in enumerate(events, start=seq + 1):
        line = json.dumps({"schema": EVENT_SCHEMA_MAJOR, "seq": i, "ts": ts, **e})
        got = decoder.decode(line)
        if isinstance(got, Quarantined):
            raise AssertionError(f"planted line refused by the decode boundary: {got.reason}")
        kept.append((got, line))
    refused: list = []
    store.ingest(sweep_id, node, [e for e, _ in kept], [x for _, x in kept], refused)
    if refused:  # the ledger's own checks (a run measured twice, a conflict) count too
        raise AssertionError(f"planted line set aside by the ledger: {refused[0].reason}")


def lock_doc(name: str, models: dict) -> dict:
    """A plan lock as ``Store.record_lock`` keeps one: ``models`` by role (a calibration
    target's record under its ``calibration``), no platforms of its own."""
    return {"lock_id": f"lock-{name}", "name": name, "plan": {}, "python": "3.12",
            "platforms": {}, "models": {role: {"manifest": {}, **m}
                                        for role, m in models.items()}}


def new_sweep(store: Store, at: datetime, lock: dict | None = None,
              knobs: dict | None = None) -> str:
    """A nightly sweep as the controller starts one (``Store.record_lock`` for its lock,
    ``Store.create_sweep``), dated ``at``; ``night`` finishes the sweep
    (``Store.finish_sweep``) once its node's lines are in."""
    sid = uuid.uuid4().hex[:12]
    if lock is not None:
        store.record_lock(lock)
    models = (lock or {}).get("models") or {}
    # ``knobs``: what the sweep's job sweeps (the ledger sets aside a generation at a value
    # the job never gave; without it, the agent's default sweep of draft widths)
    store.create_sweep(sid, {"models": {"target": dict(models.get("target") or {}),
                                        "draft": dict(models.get("draft") or {})},
                             **({"knobs": knobs} if knobs else {})}, None,
                       plan_id=lock["lock_id"] if lock else None, trigger="nightly",
                       created_at=at)
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

def planted_nightly(seed: int, kind: str, n: int = 35,
                    phi: float | None = None) -> tuple[list[float], dict]:
    """One series of ``n`` nightly levels around 100 with AR(1) noise (φ 0-0.5, or ``phi``;
    σ 1-2%, the noise's own spread whatever its memory) and
    one planted event: ``step`` (10-25% either way, anywhere from night 4 to 2 nights before
    the end), ``drift`` (10-30% over 12 nights or more, anywhere), ``dip`` (two nights
    10-30% off, inside the window, then back), ``steps`` (two steps of 10-20% the same way,
    the level between them held 4-7 nights: not a drift), ``late-drift`` (10-25% over the
    last 8-12 nights: a drift to the end), ``weekly`` (a weekly pattern alone: one to three
    weekdays 8-15% off every week, the nights' weekdays ``i % 7``; no change),
    ``weekly-step`` (that pattern and a ``step``) or ``none``. Returns the values and the
    truth (``kind``: step, drift, steps, dip or none; ``at``: the step's night or the
    drift's first, ``until``: a drift's last, ``second``: the second step's night)."""
    import math

    rng = random.Random(f"changepoint:{kind}:{seed}:{n}" + ("" if phi is None else f":{phi}"))
    drawn, sigma = rng.uniform(0.0, 0.5), rng.uniform(0.01, 0.02)
    phi = drawn if phi is None else phi
    e, noise = rng.gauss(0, sigma), []
    for _ in range(n):
        noise.append(e)
        e = phi * e + rng.gauss(0, sigma * math.sqrt(1 - phi * phi))
    level = [1.0] * n
    truth: dict = {"kind": {"late-drift": "drift", "weekly": "none",
                            "weekly-step": "step"}.get(kind, kind)}
    sign = rng.choice((-1, 1))
    weekly = [1.0] * 7
    if kind.startswith("weekly"):
        off = rng.choice((-1, 1)) * rng.uniform(0.08, 0.15)
        for day in rng.sample(range(7), rng.randint(1, 3)):
            weekly[day] = 1 + off
        kind = kind.removeprefix("weekly").removeprefix("-") or "none"
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
    elif kind == "late-drift":
        span = rng.randint(8, 12)
        total = sign * rng.uniform(0.10, 0.25)
        level = [1 + total * max(i - (n - span), 0) / (span - 1) for i in range(n)]
        truth.update(at=n - span, until=n - 1, size=total)
    elif kind == "steps":
        held = rng.randint(4, 7)
        at = rng.randint(4, n - 2 - held)
        a, b = (sign * rng.uniform(0.10, 0.20) for _ in range(2))
        level = [1.0 if i < at else 1 + a if i < at + held else (1 + a) * (1 + b)
                 for i in range(n)]
        truth.update(at=at, second=at + held, size=a)
    elif kind == "dip":
        at = rng.randint(4, n - 6)
        size = sign * rng.uniform(0.10, 0.30)
        level = [1 + size if at <= i < at + 2 else 1.0 for i in range(n)]
        truth.update(at=at, size=size)
    return [100 * lv * weekly[i % 7] * (1 + x)
            for i, (lv, x) in enumerate(zip(level, noise))], truth


def score_change_points(series: list[tuple[list[dict], dict]]) -> dict:
    """Precision and recall of change points found (``index``, ``kind``, a drift's
    ``until``) against planted truths: a step counts when a step or possible step is
    reported within a night of it (each of two ``steps`` alike), a drift when a drift is
    reported overlapping its span; anything else reported is a false finding (any at all on
    a dip or a flat series, a second finding for one event, a drift over two steps)."""
    tp = fp = events = 0
    wrong: list = []
    for found, truth in series:
        kind = truth["kind"]
        planted = ([truth["at"], truth["second"]] if kind == "steps"
                   else [truth["at"]] if kind in ("step", "drift") else [])
        hit: set[int] = set()
        for f in found:
            match = [at for at in planted if at not in hit and (
                kind in ("step", "steps") and f["kind"] in ("step", "possible step")
                and abs(f["index"] - at) <= 1
                or kind == "drift" and f["kind"] == "drift"
                and f["index"] <= truth["until"] + 1 and f["until"] >= at - 1)]
            hit.update(match[:1])
            tp, fp = tp + bool(match), fp + (not match)
        events += len(planted)
        if len(hit) < len(planted) or len(found) > len(hit):
            wrong.append((truth, found))
    return {"precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / events if events else 1.0, "found": tp, "false": fp,
            "events": events, "wrong": wrong}
