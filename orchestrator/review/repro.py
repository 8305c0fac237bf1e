"""Do several nodes give the same numbers for the same lock?

Per metric and config, two nodes agree when their medians differ by no more than a
tolerance built from their own repetition spread: 3·√(s_a² + s_b²), where s is the
standard error of each node's median, with a floor of ``floor`` × the larger median so
a perfectly steady pair is not held to zero. Disagreements list the identity
differences between the nodes first — they are usually the explanation.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from itertools import combinations

from ..store import Store
from ..store.runs import node_identities, sweep_runs
from .configs import config_label, knobs_of_key
from .week_runs import IDENTITY, identity_changes

METRICS = ("decode_tok_s", "acceptance_rate", "ttft_ms")
FACTS = (*(k for k in IDENTITY if k != "node"), "chip", "power_source")


def _name(cfg: tuple) -> str:
    """"code speculative k=3 · temperature 0.7": the workload and the config's one label."""
    if len(cfg) > 3:
        return f"{cfg[0]} {config_label(cfg[1], cfg[2], knobs_of_key(cfg[3]))}"
    return f"{cfg[0]} {cfg[1]} k={cfg[2]}"


def _spread(v: list[float]) -> float:
    """Standard error of the median (≈ 1.2533·σ/√n), 0 for fewer than two values."""
    return 1.2533 * statistics.stdev(v) / math.sqrt(len(v)) if len(v) >= 2 else 0.0


def compare(per_node: dict[str, dict[tuple, dict]], identities: dict[str, dict],
            metrics: tuple[str, ...] = METRICS, floor: float = 0.03) -> dict:
    """``per_node``: node → (workload, mode, k[, config key]) → {metric: [values]}."""
    disagreements = []
    checked = 0
    for a, b in combinations(sorted(per_node), 2):
        for cfg in sorted(set(per_node[a]) & set(per_node[b])):
            for m in metrics:
                va = [x for x in per_node[a][cfg].get(m) or [] if x is not None]
                vb = [x for x in per_node[b][cfg].get(m) or [] if x is not None]
                if not va or not vb:
                    continue
                checked += 1
                ma, mb = statistics.median(va), statistics.median(vb)
                tol = max(3 * math.hypot(_spread(va), _spread(vb)), floor * max(abs(ma), abs(mb)))
                if abs(ma - mb) > tol:
                    disagreements.append({
                        "metric": m, "config": _name(cfg), "nodes": [a, b],
                        "values": [ma, mb], "tolerance": tol,
                        "identity": identity_changes(identities.get(a, {}), identities.get(b, {}),
                                                     FACTS),
                        "detail": f"{a} {ma:.4g} vs {b} {mb:.4g} (tolerance ±{tol:.3g})"})
    disagreements.sort(key=lambda d: (not d["identity"], d["metric"]))
    return {"reproducible": not disagreements and checked > 0, "checked": checked,
            "disagreements": disagreements, "nodes": sorted(per_node)}


def sweep_values(store: Store, sweep_id: str) -> tuple[dict, dict, list[dict]]:
    """Per node, each reliable run's repetition values; the nodes' identities; and the runs
    set aside as unreliable (never compared: a contended node "agreeing" proves nothing)."""
    runs = sweep_runs(store, sweep_id)
    nodes = node_identities(store, sweep_id).items()
    per_node: dict[str, dict] = defaultdict(dict)
    idents = {}
    set_aside = []
    for r in runs:
        idents[r.node] = {k: getattr(r, k, None) for k in FACTS}
        if r.unreliable:
            set_aside.append({"node": r.node, "config": _name(_cfg(r)), "reasons": (
                                  r.summary or {}).get(
                                  "unreliable_reasons") or ["flagged unreliable"]})
            continue
        # every knob keys a config (two temperatures at one width are two configs)
        per_node[r.node][_cfg(r)] = (r.summary or {}).get("values") or {}
    for node, ident in nodes:
        idents.setdefault(node, {}).update({k: v for k, v in (ident or {}).items()
                                            if k in FACTS and v is not None})
    return dict(per_node), idents, set_aside


def _cfg(r) -> tuple:
    return (r.workload, r.mode, r.num_draft_tokens, r.config_key)


def verdict(report: dict) -> str:
    """One answer: reproducible only when every run could be compared and all agreed."""
    if report["disagreements"] or report.get("not_ok"):
        return "NOT reproducible"
    if report.get("set_aside"):
        return (f"inconclusive: {len(report['set_aside'])} runs set aside as unreliable "
                "(rerun on quiet nodes)")
    return "reproducible" if report["checked"] else "inconclusive: nothing to compare"
