"""Load ramps in the review: throughput against latency per level, goodput, the knee, where
batched autoregressive serving overtakes speculation, and memory per added stream.

Read from the ``load_level`` events a sweep stored (events 1.5; 1.6 adds the offered and
served rates; 1.9 the most served at 95%, ``served_rps_at_most``, beside the point
estimate: the page shows the point, and the bound where it differs, since the saturation
rule judged by it). A level that saturated or
failed is shown with its reason but never chosen as the knee or as a cap; a level the agent
flagged unreliable (throttled, on battery, contended) is shown with its reasons and feeds
nothing: no knee, cap, crossover or rule; a level whose
requests failed counts them apart (the agent never averages a failure into a latency).
"""

from __future__ import annotations

from agent.events import LoadLevel

from ..store import Store, queries

LOAD_NAMES = {"concurrency": "concurrency (streams)", "request_rate": "request rate (req/s)"}
SHOWN = ("requests", "completed", "errors", "error_examples", "output_tok_s_total",
         "output_tok_s_per_stream_p50", "requests_per_s", "offered_rps", "served_rps",
         "served_rps_at_most",  # the most served at 95%: what 'saturated' was judged by
         "queue_growth_ms", "goodput_rps", "good_requests",
         "ttft_ms_p95", "itl_ms_p95", "tpot_ms_p50", "e2e_ms_p50", "e2e_ms_p95", "e2e_ms_p99",
         "e2el_ms_p50", "e2el_ms_p99",  # vLLM's E2EL: from the actual send, no client queueing
         "rss_peak_bytes", "swap_in_bytes", "stop_reason", "error", "slo", "acceptance_rate",
         "unreliable_reasons")


def load_ramps(store: Store, sweep_ids: list[str]) -> list[dict]:
    """One entry per node × workload × kind of load, every variant's levels side by side."""
    if not sweep_ids:
        return []
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for s in queries.typed(queries.events(store, sweep_ids, ("load_level",))):
        e = s.event
        if isinstance(e, LoadLevel):
            key = (s.sweep_id, s.node, e.workload, e.load)
            groups.setdefault(key, {}).setdefault(e.variant, []).append(e.to_json())
    return [_ramp(key, variants) for key, variants in sorted(groups.items())]


def _ramp(key: tuple, variants: dict[str, list[dict]]) -> dict:
    sweep_id, node, workload, load = key
    out = []
    for name, levels in variants.items():
        # a failed level carries no metrics: every field the page reads, present
        levels = sorted(({**dict.fromkeys(SHOWN), **e} for e in levels),
                        key=lambda e: e["level"])
        ok = [e for e in levels if e["status"] == "ok" and not e.get("unreliable")]
        first = ok[0] if ok else None
        for e in levels:  # per added stream: a closed loop's levels are streams
            e["mem_growth_per_stream_bytes"] = _growth(first, e) if load == "concurrency" \
                else None
        out.append({"variant": name, "mode": levels[0]["mode"], "levels": levels,
                    "knee": knee(levels), "cap": cap(levels),
                    "mem_growth": _share_growth(ok)})
    base = next((v for v in out if v["mode"] == "baseline"), None)
    at = {e["level"]: e for e in base["levels"]} if base else {}
    for v in out:  # speculation against the baseline at the same level, in total tok/s
        for e in v["levels"]:
            b = at.get(e["level"])
            both = b is not None and not (e.get("unreliable") or b.get("unreliable"))
            e["vs_baseline"] = (e["output_tok_s_total"] / b["output_tok_s_total"]
                                if v["mode"] == "speculative" and both and b
                                and e["output_tok_s_total"] and b["output_tok_s_total"]
                                else None)
    return {"sweep_id": sweep_id, "node": node, "workload": workload, "load": load,
            "load_name": LOAD_NAMES.get(load, load), "variants": out,
            "slo": next((e.get("slo") for v in out for e in v["levels"] if e.get("slo")), None),
            "crossover": crossover(out) if load == "concurrency" else None}


def _growth(first: dict | None, e: dict) -> float | None:
    """Runtime memory added per stream beyond the first level's (≈ KV bytes per stream)."""
    if not first or e is first or not first.get("rss_peak_bytes") or not e.get("rss_peak_bytes"):
        return None
    streams = e["level"] - first["level"]
    return (e["rss_peak_bytes"] - first["rss_peak_bytes"]) / streams if streams > 0 else None


def _share_growth(ok: list[dict]) -> float | None:
    if len(ok) < 2 or not ok[0].get("rss_peak_bytes") or not ok[-1].get("rss_peak_bytes"):
        return None
    return ok[-1]["rss_peak_bytes"] / ok[0]["rss_peak_bytes"] - 1


def _rate(e: dict) -> float:
    """What a level delivered: goodput when the plan set SLOs, else requests/s."""
    v = e.get("goodput_rps") if e.get("slo") else e.get("requests_per_s")
    return float(v or 0)


def knee(levels: list[dict]) -> float | None:
    """The last level (of a clean ramp prefix) that still raised what was delivered by 5%
    or more; None without two clean levels."""
    ok = []
    for e in levels:
        if e["status"] != "ok" or e.get("errors") or e.get("unreliable"):
            break
        ok.append(e)
    if len(ok) < 2:
        return None
    best = ok[0]
    for e in ok[1:]:
        if _rate(e) < 1.05 * _rate(best):
            break
        best = e
    return best["level"]


def cap(levels: list[dict]) -> float | None:
    """The highest level before anything went wrong: saturation, errors, swap-ins, or
    requests missing the SLOs."""
    good = None
    for e in levels:
        if e.get("unreliable"):  # no evidence either way: the cap stays below it
            break
        if e["status"] != "ok" or e.get("errors") or e.get("swap_in_bytes") or (
                e.get("slo") and e.get("good_requests") != e.get("completed")):
            break
        good = e["level"]
    return good


def crossover(variants: list[dict]) -> str | None:
    """Where batched autoregressive serving overtakes a speculative variant, in total
    output tokens/s at the same concurrency (mlx_lm.server batches only without a draft)."""
    base = [v for v in variants if v["mode"] == "baseline"]
    if not base:
        return None
    at = {e["level"]: e for e in base[0]["levels"]
          if e["status"] != "failed" and not e.get("unreliable")}
    lines = []
    for v in (v for v in variants if v["mode"] == "speculative"):
        pairs = [(e["level"], e["output_tok_s_total"], at[e["level"]]["output_tok_s_total"])
                 for e in v["levels"] if e["level"] in at and e["status"] != "failed"
                 and not e.get("unreliable")
                 and e.get("output_tok_s_total") and at[e["level"]].get("output_tok_s_total")]
        if not pairs:
            continue
        wins = [lv for lv, s, b in pairs if s > b]
        if not wins:
            lines.append(f"{v['variant']}: slower than autoregressive at every level")
            continue
        over = next(((lv, s, b) for lv, s, b in pairs if lv > wins[0] and b >= s), None)
        if over:
            lines.append(f"{v['variant']}: batched autoregressive overtakes it at "
                         f"{over[0]:g} streams ({over[2]:.0f} vs {over[1]:.0f} tok/s); "
                         f"speculation wins up to {max(lv for lv in wins if lv < over[0]):g}")
        else:
            lines.append(f"{v['variant']}: ahead of autoregressive at every level both measured "
                         f"(up to {pairs[-1][0]:g})")
    return "; ".join(lines) or None


def chart(ramp: dict) -> str | None:
    """Throughput against latency, one point per level, a line per variant; the SLO drawn,
    the knee ringed, a saturated level crossed."""
    from .charts import legend, pyplot, refline, to_svg

    if not any(len(v["levels"]) for v in ramp["variants"]):
        return None
    fig, ax = pyplot().subplots(figsize=(6, 2.8))
    for v in ramp["variants"]:
        pts = [e for e in v["levels"] if e.get("output_tok_s_total") and e.get("e2e_ms_p95")]
        if not pts:
            continue
        line, = ax.plot([e["output_tok_s_total"] for e in pts], [e["e2e_ms_p95"] for e in pts],
                        marker="o", label=f"{v['variant']} ({v['mode']})")
        for e in pts:
            ax.annotate(f"{e['level']:g}", (e["output_tok_s_total"], e["e2e_ms_p95"]),
                        xytext=(3, 3), textcoords="offset points", fontsize=7)
            if e["status"] != "ok":
                ax.plot([e["output_tok_s_total"]], [e["e2e_ms_p95"]], marker="x",
                        color="#b00", markersize=9)
            if e["level"] == v["knee"]:
                ax.plot([e["output_tok_s_total"]], [e["e2e_ms_p95"]], marker="o",
                        markersize=12, fillstyle="none", color=line.get_color())
    slo = ramp.get("slo") or {}
    top = max((e["e2e_ms_p95"] for v in ramp["variants"] for e in v["levels"]
               if e.get("e2e_ms_p95")), default=0)
    if slo.get("e2e_ms") and float(slo["e2e_ms"]) <= 3 * top:
        refline(ax, float(slo["e2e_ms"]), f"SLO e2e {slo['e2e_ms']:g} ms", "#b00", "--")
    elif slo.get("e2e_ms"):  # far above every point: a line there would flatten them all
        ax.set_ylim(0, top * 1.3)
        ax.annotate(f"SLO e2e {slo['e2e_ms']:g} ms: above the chart", xy=(1.0, 1.0),
                    xycoords="axes fraction", ha="right", va="top", fontsize=7, color="#b00")
    ax.set_xlabel("output tokens/s, all streams")
    ax.set_ylabel("e2e latency p95 (ms)")
    ax.set_title(f"{ramp['node']} · {ramp['workload']} · {ramp['load_name']} "
                 "(label: level; ring: knee; ×: saturated)")
    legend(ax)
    return to_svg(fig)


def load_signals(ramps: list[dict], sweep_ids: set[str], node: str, workload: str) -> dict:
    """A series' measured evidence under load, for the rules: memory growth from the first
    to the last clean level (share), levels with swap-ins, the level to cap concurrency at,
    and the lowest level where the runtime saturated or failed requests."""
    mine = [g for g in ramps if g["sweep_id"] in sweep_ids and g["node"] == node
            and g["workload"] == workload and g["load"] == "concurrency"]
    if not mine:
        return {}
    variants = [v for g in mine for v in g["variants"]]
    levels = [e for v in variants for e in v["levels"] if not e.get("unreliable")]
    caps = [v["cap"] for v in variants if v["cap"] is not None]
    growth = [v["mem_growth"] for v in variants if v["mem_growth"] is not None]
    bad = [e["level"] for e in levels if e["status"] != "ok" or e.get("errors")]
    return {"load_mem_growth": round(max(growth), 4) if growth else None,
            "load_swap_levels": sum(1 for e in levels if e.get("swap_in_bytes")),
            "load_cap": min(caps) if caps else None,
            "load_saturated_at": min(bad) if bad else None}
