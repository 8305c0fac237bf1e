"""Static SVG charts for the review (matplotlib, no network, inline in the page)."""

from __future__ import annotations

import functools
import io

from agent.engines import DEFAULT_ENGINE

from .week_sweeps import calibration_words


@functools.cache
def pyplot():
    """matplotlib's pyplot, set up for SVG: imported when the first chart is drawn (~0.7
    CPU-s), not by every command that imports the review (a failing one, a week without
    series, --format md,json)."""
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    # text.parse_math off: a name a user wrote ("$HOME bench", "cost $5-$10") is text, never
    # mathtext (a lone or odd '$' made matplotlib raise and the whole review fail)
    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "figure.dpi": 96,
                         "text.parse_math": False})
    return plt


SHOWN = 8  # series per chart: more lines than this are unreadable; the site has them all


def legend(ax) -> None:
    # beside the plot, never over its lines (bbox_inches="tight" keeps it in the figure)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              frameon=False)


def refline(ax, y: float, text: str, color: str, ls: str = "-") -> None:
    """A horizontal reference line that says what it is, at its right end."""
    ax.axhline(y, color=color, lw=0.8, ls=ls)
    ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-2, 2),
                textcoords="offset points", ha="right", va="bottom", fontsize=7, color=color)


def _title(ax, text: str, shown: int, total: int) -> None:
    ax.set_title(text + (f" ({shown} of {total} series; every series: `specfleet site`)"
                         if total > shown else ""))


def to_svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog: the SVG is inlined into HTML


def label(s: dict) -> str:
    """The series' name: the page's short one (``page.label_series``) when it has one."""
    if s.get("short_label"):
        return s["short_label"]
    x = s["series"]
    cal = calibration_words(s.get("calibration") or x.get("calibration"))
    return (f"{x['chip']} · {x['model_pair']} · {x['workload']} · {x['context_bucket']}"
            + (f" · {x['engine']}" if x.get("engine", DEFAULT_ENGINE) != DEFAULT_ENGINE else "")
            + (f" · {cal}" if cal else ""))


def acceptance_over_time(sections: list[dict], floor: float = 0.55) -> str | None:
    every = [s for s in sections if s.get("trend")]
    shown = every[:SHOWN]
    if not shown:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 2.8))
    for s in shown:
        pts = [p for p in s["trend"] if p["acceptance"] is not None]
        ax.plot([p["date"] for p in pts], [p["acceptance"] for p in pts], marker="o",
                label=f"{label(s)} (k={s['metrics']['best_k']})")
    refline(ax, floor, f"acceptance floor {floor}", "#888", "--")
    ax.set_ylabel("acceptance (P50)")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", rotation=45)
    legend(ax)
    _title(ax, "Acceptance over time, best draft width per series", len(shown), len(every))
    return to_svg(fig)


def knee(speedup_by_k: dict) -> int | None:
    """The smallest draft width within 5% of the best speedup: wider buys little more."""
    pts = {int(k): v for k, v in speedup_by_k.items() if v}
    if not pts:
        return None
    best = max(pts.values())
    return min(k for k, v in pts.items() if v >= best * 0.95)


def speedup_vs_width(sections: list[dict], gate: float = 1.16) -> str | None:
    every = [s for s in sections if s.get("speedup_by_k")]
    shown = every[:SHOWN]
    if not shown:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 2.8))
    for s in shown:
        pts = sorted((int(k), v) for k, v in s["speedup_by_k"].items() if v)
        line, = ax.plot([k for k, _ in pts], [v for _, v in pts], marker="o", label=label(s))
        kn = knee(s["speedup_by_k"])
        if kn is not None:
            ax.plot([kn], [dict(pts)[kn]], marker="*", ms=14, color=line.get_color())
    refline(ax, 1.0, "1.0× = the baseline", "#b00020")
    refline(ax, gate, f"{gate}× = the speedup gate", "#0a7a2f", "--")
    ax.set_xlabel("draft width (num_draft_tokens); ★ = knee")
    ax.set_ylabel("speedup vs baseline")
    legend(ax)
    _title(ax, "Speedup by draft width", len(shown), len(every))
    return to_svg(fig)


def itl_distribution(sections: list[dict]) -> str | None:
    every = [s for s in sections if (s.get("itl_p95_values") or {}).get("best")]
    shown = every[:6]
    if not shown:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 2.8))
    data, names = [], []
    for s in shown:
        data += [s["itl_p95_values"]["baseline"] or [0], s["itl_p95_values"]["best"]]
        names += [f"{s['series']['workload']}\nbaseline",
                  f"{s['series']['workload']}\nk={s['metrics']['best_k']}"]
    ax.boxplot(data)
    ax.set_xticks(range(1, len(names) + 1), names, fontsize=7)
    ax.set_ylabel("ITL p95 per trial (ms)")
    _title(ax, "Inter-token latency: baseline vs best config", len(shown), len(every))
    return to_svg(fig)


def acceptance_by_position(sections: list[dict]) -> str | None:
    every = [s for s in sections if s.get("acceptance_by_position")]
    shown = every[:6]
    if not shown:
        return None
    fig, ax = pyplot().subplots(figsize=(7, 2.8))
    for s in shown:
        ys = s["acceptance_by_position"]
        ax.plot(range(1, len(ys) + 1), ys, marker="o",
                label=f"{label(s)} (k={s['metrics']['best_k']})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted share")
    ax.set_ylim(0, 1)
    legend(ax)
    _title(ax, "Acceptance by draft position", len(shown), len(every))
    return to_svg(fig)


def all_charts(sections: list[dict], gates: dict | None = None) -> dict[str, str]:
    gates = gates or {}
    charts = {"acceptance_over_time": acceptance_over_time(
                  sections, gates.get("acceptance_floor", 0.55)),
              "speedup_vs_width": speedup_vs_width(sections, gates.get("min_speedup", 1.16)),
              "itl_distribution": itl_distribution(sections),
              "acceptance_by_position": acceptance_by_position(sections)}
    return {k: v for k, v in charts.items() if v}
