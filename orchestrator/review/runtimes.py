"""Runtimes compared: the merged side-by-side table of the weekly review and the agents'
notices about runtimes (a knob ignored, tools that could not be sent)."""

from __future__ import annotations

from collections import defaultdict

from agent.events import Generation, KnobEffect, Notice

from ..store import Store, queries
from .adaptive_stops import is_stop
from .through_noise import baseline_of


def side_by_side(sections: list[dict]) -> list[dict]:
    """One merged table: a group per chip × pair × workload × bucket measured by two or more
    runtimes, a row per runtime, and which runtime is fastest without and with speculation
    (and by how much over the next one)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in sections:
        x = s["series"]
        if s.get("configs"):
            # a calibration series is never set beside a real pair's (``calibration``)
            groups[(x["chip"], x["model_pair"], x["workload"], x["context_bucket"],
                    bool(x.get("calibration")))].append(s)
    out = []
    for (chip, pair, workload, bucket, cal), ss in sorted(groups.items()):
        if len({s["series"]["engine"] for s in ss}) < 2:
            continue
        rows = []
        for s in ss:
            cs, m = s["configs"], s.get("metrics") or {}
            # a set-aside config (every run unreliable) is never a runtime's number here,
            # but the width a verdict switched on through the noise is, marked (audit 42)
            noisy = bool(m.get("best_through_noise"))
            best = next((c for c in cs if c["mode"] == "speculative"
                         and (not c["set_aside"] or noisy)
                         and c.get("config_id", c["k"]) == m.get("best_config",
                                                                 m.get("best_k"))), None)
            # the baseline the best was judged against (its sampling), else the first
            base = (baseline_of(cs, best.get("sampling"), noisy_too=noisy) if best else
                    next((c for c in cs if c["mode"] == "baseline" and not c["set_aside"]),
                         None))
            # speculation measured with no baseline to compare it with: no speedup, no
            # best, but measured (the runtimes line says so, never "not measured")
            alone = None if best else _unpaired(cs)
            rows.append({"engine": s["series"]["engine"],
                         **({"through_noise": True} if noisy and best else {}),
                         "baseline_decode_p50": base["decode_p50"] if base else None,
                         "baseline_ttft_p50": base["ttft_p50"] if base else None,
                         "best_k": m.get("best_k"), "best_decode_p50": best and best["decode_p50"],
                         "best_speedup": m.get("best_speedup"),
                         # the gate that speedup is read at (printed on its side of it)
                         "min_speedup": (s.get("gates") or {}).get("min_speedup"),
                         "best_acceptance": m.get("best_acceptance"),
                         "parity_mismatches": sum(c["parity_mismatches"] for c in cs),
                         "tool_mismatches": sum(c["parity_tool_mismatches"] for c in cs),
                         **({"unpaired_k": alone["k"], "unpaired_decode_p50": alone["decode_p50"]}
                            if alone else {})})
        rows.sort(key=lambda r: r["engine"])
        out.append({"chip": chip, "model_pair": pair, "workload": workload,
                    "context_bucket": bucket, **({"calibration": True} if cal else {}),
                    "rows": rows,
                    "fastest_baseline": _winner(rows, "baseline_decode_p50"),
                    "fastest_speculative": _winner(rows, "best_decode_p50")})
    return out


def _unpaired(cs: list[dict]) -> dict | None:
    """The fastest speculative config measured reliably with no reliable baseline at its
    own sampling settings (so no speedup), or None."""
    bases = {c.get("sampling") for c in cs if c["mode"] == "baseline" and not c["set_aside"]}
    alone = [c for c in cs if c["mode"] == "speculative" and not c["set_aside"]
             and c.get("speedup") is None and c.get("sampling") not in bases
             and c.get("decode_p50")]
    return max(alone, key=lambda c: c["decode_p50"]) if alone else None


def _winner(rows: list[dict], key: str) -> dict | None:
    ranked = sorted((r for r in rows if r.get(key)), key=lambda r: -r[key])
    if not ranked:
        return None
    # "over" and "ratio" are always there: None when this runtime was the only one measured
    lead = {"engine": ranked[0]["engine"], "decode_p50": ranked[0][key], "over": None,
            "ratio": None, **({"through_noise": True} if key == "best_decode_p50" and any(
                r.get("through_noise") for r in ranked[:2]) else {})}
    if len(ranked) > 1:
        lead.update(over=ranked[1]["engine"], ratio=ranked[0][key] / ranked[1][key])
    return lead


def agent_notices(store: Store, sweep_ids: list[str]) -> list[dict]:
    """What agents found worth a reader's attention: a knob a runtime ignored
    (``knob_effect``), a workload's tools that the chosen API cannot send (``notice``)."""
    if not sweep_ids:
        return []
    out = []
    for s in queries.typed(queries.events(store, sweep_ids, ("knob_effect", "notice"),
                                          order=("node", "seq"))):
        e = s.event
        if isinstance(e, Notice) and is_stop(e.adaptive, e.message):
            continue  # the adaptive stops' own list says it, in words
        if isinstance(e, (KnobEffect, Notice)):
            out.append({"sweep_id": s.sweep_id, "node": s.node, "variant": e.variant,
                        "workload": e.workload, "knob": getattr(e, "knob", None),
                        "message": e.message})
    return out + unreadable_notices(store, sweep_ids)


def unreadable_notices(store: Store, sweep_ids: list[str]) -> list[dict]:
    """Stored events that do not read as their type (an older boundary let them in): left
    out of every number, and said so here, where the review and the sweep page show it."""
    return [{"sweep_id": u.sweep_id, "node": u.node, "variant": None, "workload": None,
             "knob": None, "message": u.message(), "unreadable": True}
            for u in queries.unreadable(store, sweep_ids)]


def stream_checks(store: Store, sweep_id: str) -> list[dict]:
    """What the http engine found wrong in a runtime's streams, as notices: ``usage``
    counts implausible against the streamed text (not used for rates: the chunks were
    counted) and streams whose split surrogate pairs were repaired. One per node,
    variant and workload, with how many generations and the first one's words."""
    rows = [(s.node, s.event) for s in queries.typed(queries.events(
        store, [sweep_id], ("generation",), order=("node", "seq")))
        if isinstance(s.event, Generation)]
    found: dict[tuple, dict] = {}
    for node, p in rows:
        for flag, words, what in (
                ("usage_implausible", "usage_problem",
                 "usage implausible against the streamed text, not used for rates"),
                ("stream_repaired", "stream_repair", "stream repaired")):
            if not p.get(flag):
                continue
            key = (node, p.variant, p.workload, flag)
            f = found.setdefault(key, {"count": 0, "what": what, "first": p.get(words)})
            f["count"] += 1
    return [{"sweep_id": sweep_id, "node": node, "variant": variant, "workload": workload,
             "knob": None, "message": f"{f['what']} in {f['count']} generation(s): "
                                      f"{f['first']}"}
            for (node, variant, workload, _), f in found.items()]
