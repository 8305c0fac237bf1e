"""Per-config summaries across repetitions, and the sampled-output distribution test."""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from typing import TYPE_CHECKING

from .engines import DEFAULT_ENGINE
from .protocol import (
    CONTENTION_CAUSES,
    baseline_key,
    summary_contention_text,
    trial_contention_text,
)
from .stats import cv, percentile, repetition_spread

if TYPE_CHECKING:
    from .job import Job
    from .journal import Journal

VALUE_METRICS = ("decode_tok_s", "acceptance_rate", "ttft_ms", "itl_p95_ms", "itl_p99_ms",
                 "itl_p50_ms", "peak_mlx_memory_bytes", "kv_cache_bytes", "swap_used_after_bytes",
                 "swap_in_bytes", "prompt_tokens", "generated_tokens", "e2e_ms")
SUMMARY_METRICS = ("decode_tok_s", "ttft_ms", "itl_p95_ms", "acceptance_rate",
                   "peak_mlx_memory_bytes", "kv_cache_bytes", "prefill_ms",
                   "bandwidth_utilisation",
                   # acceptance length two ways: accepted drafts per verify round (ours), and
                   # vLLM's / AIPerf's, which counts the target's bonus token (ours + 1)
                   "mean_accepted_len", "mean_acceptance_length_vllm")


def describe(values: list[float | None]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "median": None, "p95": None, "cv": None, "spread": None}
    c, r = cv(vals), repetition_spread(vals)
    return {"n": len(vals), "median": statistics.median(vals), "p95": percentile(vals, 95),
            "cv": round(c, 4) if c is not None else None,
            # events 1.9: what the reliability of the median is judged on
            "spread": round(r, 4) if r is not None else None}


def _contention(hit: list[dict]) -> dict | None:
    """The contended trials' readings as a summary's fields: ``shares`` (all taken from
    each) and the ``limit``; since events 1.10 per cause (other processes, the controller,
    the host's steal) each trial's own share, null where not read."""
    if not hit:
        return None
    out: dict = {"shares": [c["share"] for c in hit], "limit": hit[0]["limit"]}
    for k, _ in CONTENTION_CAUSES:
        if any(c.get(k) is not None for c in hit):
            out[k] = [c.get(k) for c in hit]
    return out


def config_summary(gens: list[dict], cv_threshold: float) -> dict:
    """Median / p95 / CV per metric; a config whose decode rate spreads ≥ threshold is
    unreliable. The spread judged is ``repetition_spread``: the headline is the median, and
    one cold or preempted repetition neither moves it nor should set the config aside,
    while a spread middle half, or a third of the runs in another state, still does."""
    out = {m: describe([g.get(m) for g in gens]) for m in SUMMARY_METRICS}
    reasons = []
    spread = out["decode_tok_s"]["spread"]
    over = spread is not None and spread >= cv_threshold
    if over:
        n = out["decode_tok_s"]["n"]
        reasons.append(f"decode tok/s spread {spread:.0%} ≥ {cv_threshold:.0%} over {n} "
                       "repetitions (robust CV, or how far a third of them lie from the "
                       "median): rerun with more repetitions or check the node for "
                       "background load")
    bad = [g for g in gens if g.get("unreliable")]
    hit = [g["contention"] for g in bad if g.get("contention")]
    # contention is said once, as the range of its readings (fields: ``contention``)
    said = {trial_contention_text(c) for c in hit}
    other = [g for g in bad if set(g["unreliable_reasons"]) - said]
    if other:
        own = sorted({r for g in other for r in g["unreliable_reasons"]} - said)
        reasons.append(f"{len(other)} of {len(gens)} trials unreliable ({'; '.join(own)})")
    contention = _contention(hit)
    if contention:
        reasons.append(summary_contention_text(contention))
    exact = [g.get("exact_match") for g in gens]
    # raw per-repetition values: the review's rank tests need them, not just the median
    values = {m: [g.get(m) for g in gens] for m in VALUE_METRICS}
    return {"metrics": out, "values": values, "trials": len(gens), "unreliable": bool(reasons),
            "unreliable_reasons": reasons,
            # the contended trials' shares of the CPU other processes took, and the limit
            "contention": contention,
            # events 1.9: the spread that set the config aside, as fields (the pages say it)
            "spread": {"value": spread, "limit": cv_threshold} if over else None,
            "exact": None if any(e is None for e in exact) else all(exact)}


def ngram_counts(token_lists: list[list[int]], n: int, prefix: int) -> Counter:
    c: Counter = Counter()
    for toks in token_lists:
        toks = toks[:prefix]
        c.update(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
    return c


def _tv_distance(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()) or 1, sum(b.values()) or 1
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def distribution_test(baseline: list[list[int]], candidate: list[list[int]], *, n: int = 1,
                      prefix: int = 32, permutations: int = 2000, seed: int = 0) -> dict:
    """Two-sample permutation test on n-gram frequencies of sampled outputs.

    Statistic: total-variation distance between the pooled n-gram histograms of the
    first ``prefix`` tokens of each run. Runs (not tokens) are permuted between the two
    groups, so tokens within a run stay dependent as they are. With a handful of runs
    per side the test only catches gross changes (e.g. a sampler that ignores
    temperature); a small p-value is evidence of a different distribution, a large one
    is *not* proof of equality.
    """
    if len(baseline) < 2 or len(candidate) < 2:
        return {"p_value": None, "statistic": None, "runs": [len(baseline), len(candidate)],
                "note": "needs ≥ 2 sampled runs per side"}
    observed = _tv_distance(ngram_counts(baseline, n, prefix), ngram_counts(candidate, n, prefix))
    pooled = baseline + candidate
    rng = random.Random(seed)
    hits = 0
    for _ in range(permutations):
        rng.shuffle(pooled)
        a, b = pooled[:len(baseline)], pooled[len(baseline):]
        if _tv_distance(ngram_counts(a, n, prefix), ngram_counts(b, n, prefix)) >= observed:
            hits += 1
    # distinct splits bound the smallest attainable p-value
    splits = math.comb(len(pooled), len(baseline))
    return {"p_value": round((hits + 1) / (permutations + 1), 4), "statistic": round(observed, 4),
            "runs": [len(baseline), len(candidate)], "min_attainable_p": round(1 / splits, 4),
            "ngram": n, "prefix_tokens": prefix}


# -- exactness and the summaries of one job (both engines) ---------------------------------

def exactness(tokens: list, reference: list | None, cfg: dict) -> dict:
    """Greedy output against its baseline's; ``first_divergence`` indexes ``tokens``."""
    if cfg["temperature"] != 0:
        return {"exact_match": None, "exactness": "sampled", "first_divergence": None}
    if reference is None:
        return {"exact_match": None, "exactness": "reference", "first_divergence": None}
    if tokens == reference:
        return {"exact_match": True, "exactness": "identical", "first_divergence": None}
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b),
                 min(len(tokens), len(reference)))
    return {"exact_match": False, "exactness": "diverged", "first_divergence": first}


def _config_key(workload: str, mode: str, cfg: dict, g: dict) -> tuple:
    # a lineup's pairs (and a draft-free method) never pool: each has its own baseline
    return (workload, mode, json.dumps(cfg, sort_keys=True),
            json.dumps([g.get("models"), g.get("method")], sort_keys=True))


def _sampling_only(cfg: dict) -> str:
    """A config without what tells speculation apart (draft width, http variant): the key a
    speculative config shares with its baseline."""
    return baseline_key(cfg)


def _sampled_ids(g: dict) -> list:
    # an http runtime without a tokenizer gives text only: compare characters then
    return g.get("token_ids") or [ord(c) for c in g.get("output_text") or ""]


def emit_summaries(job: Job, journal: Journal, gens: list[dict]) -> None:
    """One summary per distinct (workload, mode, config): baselines pool across pairings."""
    groups: dict[tuple, list[dict]] = {}
    for g in gens:
        groups.setdefault(_config_key(g["workload"], g["mode"], g["config"], g), []).append(g)
    for (workload, mode, _, pair), gs in groups.items():
        cfg = gs[0]["config"]
        s = config_summary(gs, job.cv_threshold)
        checked = [g for g in gs if g.get("parity") in ("ok", "mismatch")]
        if checked:  # http engine: streamed vs non-streamed text
            bad = [g for g in checked if g["parity"] != "ok"]
            s["parity"] = {"checked": len(checked), "mismatches": len(bad),
                           "first_difference": min((g["first_difference"] for g in bad
                                                    if g["first_difference"] is not None),
                                                   default=None),
                           "tool_mismatches": sum(g.get("tool_parity") == "mismatch"
                                                  for g in bad)}
        if mode == "speculative" and cfg["temperature"] > 0:
            want = _sampling_only({**cfg, **job.baseline})
            base = next((bs for (bw, bm, _, bp), bs in groups.items() if bw == workload
                         and bm == "baseline" and bp == pair
                         and _sampling_only(bs[0]["config"]) == want), [])
            s["distribution"] = distribution_test([_sampled_ids(b) for b in base],
                                                  [_sampled_ids(g) for g in gs], seed=job.seed)
        journal.emit("config_summary", workload=workload, context_bucket=gs[0]["context_bucket"],
                     prompt_sha256=gs[0].get("prompt_sha256"),
                     engine=gs[0].get("runtime") or DEFAULT_ENGINE, mode=mode,
                     knob=None if mode == "baseline" else gs[0]["knob"],
                     knob_value=None if mode == "baseline" else gs[0]["knob_value"],
                     num_draft_tokens=gs[0]["num_draft_tokens"], config=cfg, **s,
                     **{k: gs[0][k] for k in ("models", "method") if gs[0].get(k)})
    by_bucket: dict[tuple, list[dict]] = {}
    for g in gens:
        if g["mode"] == "speculative" and g.get("acceptance_by_position"):
            by_bucket.setdefault((g["context_bucket"], g["num_draft_tokens"],
                                  json.dumps(g.get("models"), sort_keys=True)), []).append(g)
    rows = []
    for (bucket, k, _pair), gs in sorted(by_bucket.items()):
        d = sum(g["drafted_tokens"] for g in gs)
        a = sum(g["accepted_tokens"] for g in gs)
        pos = []
        for p in range(k):
            pd = sum(g["acceptance_by_position"][p]["drafted"] for g in gs)
            pa = sum(g["acceptance_by_position"][p]["accepted"] for g in gs)
            pos.append({"position": p + 1, "drafted": pd, "accepted": pa,
                        "rate": round(pa / pd, 4) if pd else None})
        rows.append({"context_bucket": bucket, "num_draft_tokens": k, "drafted_tokens": d,
                     "accepted_tokens": a, "acceptance_rate": round(a / d, 4) if d else None,
                     "acceptance_by_position": pos,
                     **({"models": gs[0]["models"]} if gs[0].get("models") else {})})
    journal.emit("acceptance_by_bucket", rows=rows)
