"""`specfleet site OUT/`: a static history site, like asv's.

``index.html`` lists every series (no cap) with its current verdict, its latest run and a
sparkline of its nightly level; a search box filters it and each column sorts (both also
from the URL: ``index.html?q=M4&sort=verdict``). One page per series shows its whole
history: per config the nightly median decode tok/s, change points marked, and every
night the identity changed, annotated with what changed. Plain files, inline SVG, no
server and nothing fetched: it can be published as it is.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from agent.engines import is_runtime

from ..errors import SpecfleetError
from ..store import Store
from .changepoints import change_points
from .configs import config_label, knobs_of_key
from .levels import nightly_levels
from .page import short_chip, short_pair
from .report import environment
from .rules import DEFAULT_RULES, load_rules
from .week_runs import identity_changes, identity_key
from .week_sweeps import calibration_words
from .weekly import analyse

EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)


def slug(key: tuple) -> str:
    text = "-".join(str(x) for x in key)
    short = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]
    return f"{short}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def sparkline(values: list[float], width: int = 120, height: int = 24) -> str:
    """An inline SVG polyline of the values (no axes: the shape is the point)."""
    if not values:
        return ""
    if len(values) == 1:  # one night: a dot with its value, not an empty line
        return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} '
                f'{height}" role="img"><circle cx="4" cy="{height / 2}" r="3" fill="#1f6feb"/>'
                f'<text x="12" y="{height / 2 + 4}" font-size="11">{values[0]:.1f}</text></svg>')
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = width / (len(values) - 1)
    pts = " ".join(f"{i * step:.1f},{height - 2 - (v - lo) / span * (height - 4):.1f}"
                   for i, v in enumerate(values))
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} '
            f'{height}" role="img"><polyline fill="none" stroke="#1f6feb" stroke-width="1.5" '
            f'points="{pts}"/></svg>')


def history_chart(nights: list, cps: list[dict], changes: list[dict], width: int = 900,
                  height: int = 220) -> str:
    """Nightly medians as a line, change points as red verticals, identity changes as
    grey ticks (their words are in the table below the chart)."""
    if not nights:
        return ""
    values = [v for _, v, _ in nights]
    if len(values) == 1:  # one night: its point and value (a line needs two)
        return (f'<svg class="history one-night" width="{width}" height="80" viewBox="0 0 '
                f'{width} 80" role="img"><circle cx="40" cy="40" r="5" fill="#1f6feb"/>'
                f'<text x="54" y="44" font-size="13">{values[0]:.1f} tok/s on '
                f'{nights[0][0].isoformat()} (one night so far)</text></svg>')
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    n = len(values)
    pad = 30

    def x(i: int) -> float:
        return pad + (i * (width - 2 * pad) / max(n - 1, 1))

    def y(v: float) -> float:
        return height - pad - (v - lo) / span * (height - 2 * pad)

    index = {d.isoformat(): i for i, (d, _, _) in enumerate(nights)}
    parts = [f'<svg class="history" width="{width}" height="{height}" viewBox="0 0 {width} '
             f'{height}" role="img">',
             f'<text x="4" y="{pad - 10}" font-size="11">{hi:.1f}</text>']
    if hi > lo:  # a flat history has one level: said once
        parts.append(f'<text x="4" y="{height - 8}" font-size="11">{lo:.1f}</text>')
    for ch in changes:
        i = index[ch["date"]]
        parts.append(f'<line class="identity-change" x1="{x(i):.1f}" x2="{x(i):.1f}" '
                     f'y1="{pad}" y2="{height - pad}" stroke="#999" stroke-dasharray="3,3"/>')
    for cp in cps:
        at = index.get(cp["date"])
        if at is not None:
            parts.append(f'<line class="change-point" x1="{x(at):.1f}" x2="{x(at):.1f}" '
                         f'y1="{pad}" y2="{height - pad}" stroke="#a4161a" stroke-width="2"/>')
    pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{pts}"/>')
    parts.append("</svg>")
    return "".join(parts)


def write_site(store: Store, out: Path, *, week: str | None = None,
               now: datetime | None = None) -> Path:
    """Write the site into ``out``; returns the index's path."""
    if store.latest_sweep_id() is None:
        raise SpecfleetError("the store holds no sweeps yet; run `specfleet sweep` first")
    now = now or datetime.now(timezone.utc)
    # The database aggregates the whole history (a million runs come back as one row per
    # series, config and night) while this thread analyses the week: the grouping runs in
    # SQLite's C code or the PostgreSQL server, outside the GIL, so the two overlap.
    totals: dict[tuple, list] = {}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(nightly_levels, store, EPOCH, now, totals)
        week_a = analyse(store, week, load_rules(DEFAULT_RULES), now=now,
                         change_points_too=False, regressions_too=False)
        current = {tuple(s["series"].values()): s for s in week_a["series"]}
        levels = pending.result()
    env = environment(True)
    (out / "series").mkdir(parents=True, exist_ok=True)
    rows = []
    for key, (count, latest_at) in sorted(totals.items(), key=lambda kv: tuple(map(str, kv[0]))):
        s = current.get(key)
        verdict = s["verdict"]["text"] if s else "not reviewed this week (stale)"
        decision = s["verdict"]["decision"] if s else "needs more data"
        configs = []
        for cid, nights in sorted(levels.get(key, {}).items(), key=lambda kv: kv[0].order()):
            cps = change_points(nights, identity_changes)
            changes = [{"date": nights[i][0].isoformat(),
                        "what": identity_changes(nights[i - 1][2], nights[i][2])}
                       for i in range(1, len(nights))
                       if identity_key(nights[i][2]) != identity_key(nights[i - 1][2])]
            configs.append({"name": config_label(cid.mode, cid.k, knobs_of_key(cid.key)),
                            "nights": [(d.isoformat(), v) for d, v, _ in nights],
                            "chart": history_chart(nights, cps, changes), "change_points": cps,
                            "identity_changes": changes})
        base: dict = next((c for c in configs if c["name"] == "baseline"),
                    configs[0] if configs else {"nights": []})
        # an instrument's series (its key says so, this week or not) is marked in its row,
        # and marked stale when this week's runs show its record no longer holds
        cal = calibration_words((s or {}).get("calibration") or len(key) > 5)
        label = " · ".join(str(x) for x in key[:5]) + (f" · {cal}" if cal else "")
        short = " · ".join(str(x) for x in (short_chip(key[0]), short_pair(key[1]),
                                            *key[2:4])) + (
            f" · {key[4]}" if is_runtime(key[4]) else "") + (f" · {cal}" if cal else "")
        page = f"series/{slug(key)}.html"
        (out / page).write_text(env.get_template("site_series.html.j2").render(
            label=label, short=short, verdict=verdict, s=s, configs=configs,
            latest=latest_at.isoformat()),
            encoding="utf-8")
        rows.append({"label": label, "short": short, "chip": key[0], "pair": key[1],
                     "workload": key[2], "bucket": key[3], "engine": key[4], "verdict": verdict,
                     "calibration": cal,
                     "decision": decision, "latest": latest_at.isoformat(),
                     "runs": count, "href": page,
                     "spark": sparkline([v for _, v in base["nights"]][-60:]),
                     "change_points": sum(len(c["change_points"]) for c in configs)})
    index = out / "index.html"
    index.write_text(env.get_template("site_index.html.j2").render(
        rows=rows, generated=now.strftime("%Y-%m-%d %H:%M UTC"),
        # stored events of the week that do not read as their type: left out, said here
        unreadable=[n for n in week_a["notices"] if n.get("unreadable")]), encoding="utf-8")
    return index
