"""A busy desktop vs an idle one: the same config measured with and without a background
profile (a series whose runtime reads "mlx-lm · busy: …" beside its idle twin)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.protocol import CONTENTION_CAUSES, summary_contention_parts

SEP = " · "


def _config(section: dict, config_id: str | None) -> dict | None:
    """The section's reliable config with this ingest key (the same key in both twins:
    the background profile is the series', not the config's)."""
    return next((c for c in section.get("configs") or [] if c.get("config_id") == config_id
                 and not c["set_aside"]), None)


def busy_vs_idle(sections: list[dict]) -> list[dict]:
    """Per busy series with an idle twin this week: baseline and the idle series' best
    draft width, side by side — decode rate, ITL p95/p99 (the tail a co-tenant hurts
    first), acceptance, peak memory and swap."""
    # a calibration series' twin is a calibration series (``calibration`` in the key)
    idle = {(d["chip"], d["model_pair"], d["workload"], d["context_bucket"], d["engine"],
             bool(d.get("calibration"))): s
            for s in sections if SEP not in (d := s["series"])["engine"]}
    out = []
    for s in sections:
        d = s["series"]
        if SEP not in d["engine"]:
            continue
        engine, profile = d["engine"].split(SEP, 1)
        twin = idle.get((d["chip"], d["model_pair"], d["workload"], d["context_bucket"], engine,
                         bool(d.get("calibration"))))
        if twin is None or not twin.get("configs") or not s.get("configs"):
            continue
        best = _config(twin, (twin.get("metrics") or {}).get("best_config"))
        # the baseline of the best config's own sampling settings (else the first one)
        base = next((c for c in twin["configs"] if c["mode"] == "baseline"
                     and not c["set_aside"] and (best is None
                                                 or c.get("sampling") == best.get("sampling"))),
                    None)
        rows = []
        for mine in (base, best):
            if mine is None:
                continue
            a, b = mine, _config(s, mine.get("config_id"))
            if b is None:
                continue
            rows.append({"config": a.get("label") or a["mode"], **{
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


def contention_readings(runs) -> list[dict]:
    """Each run's contention readings from its summary's fields (events 1.8: the shares
    of the CPU taken in its contended trials, and the limit; since 1.10 ``parts``: per
    cause, other processes, the controller on the node, the host's steal, their range)."""
    out = []
    for r in runs:
        c = r.summary.get("contention")
        if c:
            out.append({"low": min(c["shares"]), "high": max(c["shares"]), "limit": c["limit"],
                        "parts": summary_contention_parts(c)})
    return out


_WHO = {"other": "other processes", "controller": "the controller on this node",
        "steal": "the host (hypervisor)"}


def busy_who(readings: Sequence[dict] = (), reasons: Sequence[str] = ()) -> str:
    """Who took the CPU from the runs set aside for it, in words ("other processes and the
    host (hypervisor)"): the causes with a visible share in the readings' fields (events
    1.10), else the causes the agent's own words name; before 1.10, other processes."""
    seen: set[str] = set()
    for c in readings:
        parts = c.get("parts") or {"other": (c["low"], c["high"])}
        seen |= {k for k, (_, hi) in parts.items() if f"{hi:.0%}" != "0%"} or {"other"}
    for r in reasons:
        seen |= {k for k, words in CONTENTION_CAUSES if f"{words} " in r} or {"other"}
    who = [_WHO[k] for k, _ in CONTENTION_CAUSES if k in seen] or [_WHO["other"]]
    return who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]
