"""A busy desktop vs an idle one: the same config measured with and without a background
profile (a series whose runtime reads "mlx-lm · busy: …" beside its idle twin)."""

from __future__ import annotations

SEP = " · "


def _config(section: dict, mode: str, k: int | None) -> dict | None:
    return next((c for c in section.get("configs") or [] if c["mode"] == mode
                 and (k is None or c["k"] == k) and not c["set_aside"]), None)


def busy_vs_idle(sections: list[dict]) -> list[dict]:
    """Per busy series with an idle twin this week: baseline and the idle series' best
    draft width, side by side — decode rate, ITL p95/p99 (the tail a co-tenant hurts
    first), acceptance, peak memory and swap."""
    idle = {(d["chip"], d["model_pair"], d["workload"], d["context_bucket"], d["engine"]): s
            for s in sections if SEP not in (d := s["series"])["engine"]}
    out = []
    for s in sections:
        d = s["series"]
        if SEP not in d["engine"]:
            continue
        engine, profile = d["engine"].split(SEP, 1)
        twin = idle.get((d["chip"], d["model_pair"], d["workload"], d["context_bucket"], engine))
        if twin is None or not twin.get("configs") or not s.get("configs"):
            continue
        k = (twin.get("metrics") or {}).get("best_k")
        rows = []
        for mode, kk in (("baseline", 0), ("speculative", k)):
            if kk is None:
                continue
            a, b = _config(twin, mode, kk), _config(s, mode, kk)
            if a is None or b is None:
                continue
            rows.append({"config": "baseline" if mode == "baseline" else
                         f"speculative k={kk}", **{
                             f"{m}_{side}": c.get(m) for side, c in (("idle", a), ("busy", b))
                             for m in ("decode_p50", "itl_p95", "itl_p99", "acceptance_p50",
                                       "peak_memory", "swap_peak", "speedup")},
                         "itl_p99_ratio": b["itl_p99"] / a["itl_p99"]
                         if a.get("itl_p99") and b.get("itl_p99") else None})
        if rows:
            out.append({"series": d,  # the busy section's own series (not a rebuilt label)
                        "chip": d["chip"], "model_pair": d["model_pair"],
                        "workload": d["workload"], "context_bucket": d["context_bucket"],
                        "engine": engine, "profile": profile, "rows": rows})
    return out
