"""Render the weekly review as HTML (self-contained, charts inline), Markdown and JSON."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from ..errors import SpecfleetError
from ..store import Store
from . import otel
from .charts import all_charts, label
from .gatewords import speedup_text
from .page import collapse_reasons, metric_words, prepare, rule_words, short_chip, short_pair
from .rules import DEFAULT_RULES, load_rules
from .sweep_page import TEMPLATES, fmt_value, times
from .weekly import analyse

FORMATS = ("html", "md", "json")


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "–" if v is None else str(v)


def _md(text: str) -> str:
    """Table-safe Markdown that reads back literally: pipes and newlines would break the
    row; emphasis, code, links, HTML, entities (&), math ($) and strike-through (~) are
    escaped (CommonMark takes a backslash before any ASCII punctuation)."""
    out = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    for ch in "*_`[]<>$~&":
        out = out.replace(ch, "\\" + ch)
    # a node's text may hold terminal escapes: `cat review.md` must not run them
    return _CONTROL.sub("\ufffd", out)


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _runtime_verdict(group: dict) -> str:
    """'fastest without speculation: X (1.12× over Y); with speculation: Z (k=4)'. A
    runtime that measured speculation with no baseline to compare it with is named as
    such, never as not measured."""
    alone = [r for r in group["rows"] if r.get("unpaired_k") is not None]
    names = ", ".join(r["engine"] for r in alone)
    only = ", ".join(r["engine"] for r in alone if not r.get("baseline_decode_p50"))
    parts = []
    for what, key in (("without speculation", "fastest_baseline"),
                      ("with speculation", "fastest_speculative")):
        w = group[key]
        if not w:
            parts.append(f"{what}: " + ("; ".join(
                f"{r['engine']} at k={r['unpaired_k']} measured with no baseline to compare "
                "it with (no speedup: measure its baseline beside it)" for r in alone)
                if key == "fastest_speculative" and alone else "not measured"))
            continue
        k = next((r["best_k"] for r in group["rows"] if r["engine"] == w["engine"]), None)
        who = w["engine"] + (f" at k={k}" if key == "fastest_speculative" and k else "")
        noise = " (decided through the noise)" if w.get("through_noise") else ""
        if w.get("over"):
            parts.append(f"{what}: {who}, {w['ratio']:.2f}× {w['over']}{noise}")
        elif key == "fastest_baseline" and only:
            parts.append(f"{what}: {who} ({only} measured only with speculation){noise}")
        elif key == "fastest_speculative" and alone:
            parts.append(f"{what}: {who} (the only runtime with a baseline to compare it "
                         f"with; {names} measured speculation without one){noise}")
        else:
            parts.append(f"{what}: {who} (the only runtime measured){noise}")
    return "fastest " + "; ".join(parts)


def environment(html: bool) -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                      autoescape=select_autoescape(["html.j2"]) if html else False)
    from .load import chart

    env.filters.update(fmt=fmt_value, num=_num, series_label=label, md=_md, speedup=speedup_text,
                       runtime_verdict=_runtime_verdict, load_chart=chart, times=times,
                       rule_words=rule_words, metric_words=metric_words,
                       short_chip=short_chip, short_pair=short_pair,
                       reasons=collapse_reasons)
    return env


def repro_checks(store: Store, start: str, end: str) -> list[dict]:
    from ..store.repro_checks import repro_reports

    return repro_reports(store, datetime.fromisoformat(start), datetime.fromisoformat(end))


def review_analysis(store: Store, *, week: str | None = None,
                    rules_file: Path = DEFAULT_RULES, gates: dict | None = None,
                    now: datetime | None = None) -> dict:
    """The week's analysis, with its repro checks: what every format and the CI gate read."""
    if store.latest_sweep_id() is None:
        raise SpecfleetError("the store holds no sweeps yet; run `specfleet sweep` first")
    a = analyse(store, week, load_rules(rules_file), gates, now)
    a["repro"] = repro_checks(store, a["start"], a["end"])
    return a


def calibration_policy(a: dict) -> list[dict]:
    """What the policy would say for the week's calibration series if asked
    (``--policy-calibration``): they are never in it otherwise, so the page says it."""
    from .verdict import policy

    return [p for p in policy(a, calibration=True)["series"] if p.get("calibration")]


def write_review(store: Store, out: Path, *, week: str | None = None,
                 formats: tuple[str, ...] = FORMATS, rules_file: Path = DEFAULT_RULES,
                 gates: dict | None = None, now: datetime | None = None,
                 analysis: dict | None = None,
                 policy_calibration: bool = False) -> dict[str, Path]:
    """Analyse the week (unless ``analysis`` is given) and write each format; ``out`` is a
    folder or an .html path. ``policy_calibration``: the policy written beside it was asked
    to hold the calibration series (the page says what it holds, not what it would)."""
    a = analysis or review_analysis(store, week=week, rules_file=rules_file, gates=gates,
                                    now=now)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if out.suffix == ".html":
        folder, stem = out.parent, out.stem
    else:
        folder, stem = out, f"review-{a['week']}"
    folder.mkdir(parents=True, exist_ok=True)
    page = prepare(a)  # headline, short labels, what every series shares (said once)
    written = {}
    for fmt in formats:
        path = folder / f"{stem}.{fmt}"
        if fmt == "html":
            text = environment(True).get_template("weekly.html.j2").render(
                a=a, charts=all_charts(a["series"], a["gates"]), generated=generated,
                repro=a["repro"], calibration_policy=calibration_policy(a), page=page,
                policy_asked=policy_calibration)
        elif fmt == "md":
            text = environment(False).get_template("weekly.md.j2").render(a=a, page=page)
        elif fmt == "json":  # with OpenTelemetry GenAI names per config, for dashboards
            text = json.dumps(otel.annotate(a), indent=2, default=str)
        else:
            raise ValueError(fmt)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written[fmt] = path
    return written
