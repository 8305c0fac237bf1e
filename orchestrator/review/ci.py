"""The weekly review as a CI gate: causes to fail on, JUnit XML, a webhook summary.

Reads only the analysis (``weekly.analyse``), so the gate says exactly what the page says:
a set-aside config is never a gate miss or a regression, and a series with no speculative
config measured has no gates to miss.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from xml.etree import ElementTree as ET

from ..errors import ConfigError
from .otel import config_attributes
from .through_noise import NOISE_MARK, undecided_text
from .verdict import gate_text
from .week_sweeps import calibration_words

CAUSES = ("regression", "gate-miss", "no-data", "stale", "failed-sweep")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def parse_causes(text: str) -> tuple[str, ...]:
    """The causes asked for; ``gate-miss`` brings ``no-data`` and ``stale`` with it: a gate
    that could not be judged (every run set aside, too few runs, no run at all, or a series
    unmeasured this week: a node down all week passed, audit 27s) is no pass."""
    causes = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in causes if c not in CAUSES]
    if bad or not causes:
        raise ConfigError(f"--fail-on: {', '.join(bad) or repr(text)} is not a cause; "
                          f"choose from {','.join(CAUSES)}")
    if "gate-miss" in causes:
        causes += tuple(c for c in ("no-data", "stale") if c not in causes)
    return causes


def series_label(s: dict) -> str:
    d = s["series"]
    # a calibration pair is an instrument: its miss is never read as a model's
    return f"{d['chip']} · {d['model_pair']} · {d['workload']} · {d['context_bucket']} · " \
           f"{d['engine']}" + (f" · {cal}" if (cal := calibration_words(s.get("calibration")))
                               else "")


def candidate(c: dict) -> bool:
    """A production candidate, reliably or decided through the noise (the mark stays on
    its classification, and it is no gate miss)."""
    return c.get("classification", "").removeprefix(NOISE_MARK) == "production candidate"


def judged_config(s: dict) -> dict | None:
    """The config a series is judged by: its fastest production candidate, else its
    fastest speculative config with gates (set-aside configs have none). A config judged
    through the noise counts only where the series' verdict was decided so: an undecided
    series keeps the old reading (no speculative config measured reliably)."""
    decided = bool((s.get("verdict") or {}).get("through_noise"))
    judged = [c for c in s["configs"] if c["mode"] == "speculative" and c.get("gates")
              and (decided or not c.get("through_noise"))]
    if not judged:
        return None
    return max([c for c in judged if candidate(c)] or judged, key=_speed)


def _speed(c: dict) -> float:
    # a config judged through the noise has no reliable speedup, only its gate's point
    return c.get("speedup") or ((c.get("gates") or {}).get("speedup") or {}).get("value") \
        or 0.0


def gate_words(name: str, v: dict, gates: dict) -> str:
    """A gate as the comparison it made; through the noise, with its 95% interval (a
    point speedup from runs set aside for their spread is no reading on its own)."""
    undecided = v.get("undecided") and v.get("passed") is None
    text = undecided_text(name) if undecided else gate_text(name, v["value"], gates)
    if iv := v.get("interval"):
        text += f" ({v.get('interval_words', '95% interval')} {iv[0]:.2f}–{iv[1]:.2f})"
    return text


def gate_miss(s: dict, c: dict) -> str:
    """What the judged config misses, every gate named (a miss with no failed gate names
    its undecided ones), marked when it was decided through the noise."""
    g = c["gates"]
    missed = [gate_words(n, v, s["gates"]) for n, v in g.items() if v["passed"] is False] \
        or [gate_words(n, v, s["gates"]) for n, v in g.items() if v.get("undecided")] \
        or [c.get("classification") or "unclassified"]
    # the config's own spreads (the verdict's words name the missed gates again)
    tn = c.get("through_noise")
    mark = f" (decided through the noise: {tn['text']})" if tn else ""
    return (f"no production candidate{mark}; best {c.get('label') or 'k=' + str(c['k'])} "
            f"misses {'; '.join(missed)}")


def no_data(s: dict) -> str | None:
    """Why a series measured this week gave no reliable evidence to judge (its verdict's
    words), or None. A series measured without speculation on purpose (a baseline only,
    nothing set aside, no speculative generation failed) has nothing to judge and is no
    finding; one with no run this week is ``stale``'s."""
    v = s.get("verdict") or {}
    if not s.get("configs") or v.get("decision") != "needs more data":
        return None
    tried = any(c["mode"] == "speculative" or c["set_aside"] for c in s["configs"]) \
        or bool(s.get("speculation_failed"))
    return f"{v['text']} ({v['evidence']})" if tried else None


def findings(a: dict) -> dict[str, list[str]]:
    """Per cause, one line per finding (empty lists where nothing was found)."""
    out: dict[str, list[str]] = {c: [] for c in CAUSES}
    for s in a["series"]:
        name = series_label(s)
        for r in s.get("regressions", []):
            if r["verdict"] == "regression":
                why = f"; changed: {', '.join(r['cause'])}" if r.get("cause") else ""
                out["regression"].append(
                    f"{name}: {r['config']} {r['period']}: {r['ratio']:.3f}× (p={r['p']:.2g}, "
                    f"n={r['n'][0]} vs {r['n'][1]}){why}")
        c = judged_config(s)
        if c is not None and not candidate(c):
            out["gate-miss"].append(f"{name}: {gate_miss(s, c)}")
        nothing = no_data(s)
        if nothing:
            out["no-data"].append(f"{name}: {nothing}")
        if s["stale"]:
            out["stale"].append(f"{name}: no run since {s['latest_run'][:10]}")
    if not a["counts"]["runs_this_week"]:
        from datetime import datetime, timezone

        ahead = datetime.fromisoformat(a["start"]) > datetime.now(timezone.utc)
        out["no-data"].append(f"week {a['week']}: no runs at all"
                              + (" (the week has not begun)" if ahead else ""))
    for f in a["failures"]:
        nodes = "; ".join(f"{n['node']} {n['status']}: {n['reason'][:120]}" for n in f["nodes"])
        out["failed-sweep"].append(f"sweep {f['sweep_id']} ({f['trigger']}, {f['at']}) "
                                   f"{f['status']}" + (f": {nodes}" if nodes else ""))
    return out


def gated_causes(causes: tuple[str, ...], a: dict) -> tuple[str, ...]:
    """A week with no runs at all passes no gate: whatever --fail-on asked, it is no data
    (an empty or future week once said "nothing regressed" and every cause passed)."""
    if causes and not a["counts"]["runs_this_week"] and "no-data" not in causes:
        return causes + ("no-data",)
    return causes


def summary_lines(found: dict[str, list[str]], causes: tuple[str, ...]) -> list[str]:
    """One line a finding: a node's words in it (an error, a variant's name) keep their
    control characters escaped, so no text a node sent forges a line of its own (audit
    43: a newline in a generation error printed a 'regression:' line)."""
    return [_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", f"{cause}: {line}")
            for cause in causes for line in found[cause]]


def write_junit(a: dict, path: Path) -> Path:
    """One test case per series × gate (the series' judged config), plus one for its
    regressions and one for staleness; failed sweeps are one case each."""
    suite = ET.Element("testsuite", name=f"specfleet review {a['week']}")
    counts = {"tests": 0, "failures": 0, "skipped": 0}

    def case(classname: str, name: str, failure: str | None = None,
             skipped: str | None = None) -> None:
        el = ET.SubElement(suite, "testcase", classname=classname, name=name)
        counts["tests"] += 1
        if failure is not None:
            ET.SubElement(el, "failure", message=failure).text = failure
            counts["failures"] += 1
        elif skipped is not None:
            ET.SubElement(el, "skipped", message=skipped)
            counts["skipped"] += 1

    for s in a["series"]:
        name = series_label(s)
        c = judged_config(s)
        if c is None and (errors := s.get("speculation_failed")):
            case(name, "gates", f"the speculative generations failed this week: "
                                f"{len(errors)}, e.g. {errors[0][:200]}")
        elif c is None:
            case(name, "gates", skipped="no speculative config measured reliably this week")
        else:
            mark = " (decided through the noise)" if c.get("through_noise") else ""
            for gate, v in c["gates"].items():
                if v["passed"] is None:
                    case(name, gate, skipped=f"k={c['k']}: " + (
                        gate_words(gate, v, s["gates"]) + mark if v.get("undecided")
                        else "not measured"))
                else:
                    case(name, gate, None if v["passed"] else
                         f"{c.get('label') or c['k']}: {gate_words(gate, v, s['gates'])}{mark}")
        regs = [r for r in s.get("regressions", []) if r["verdict"] == "regression"]
        case(name, "no regression", "; ".join(
            f"{r['config']} {r['period']} {r['ratio']:.3f}×" for r in regs) or None)
        case(name, "not stale", f"no run since {s['latest_run'][:10]}" if s["stale"] else None)
    for f in a["failures"]:
        case("sweeps", f"sweep {f['sweep_id']}", f"{f['status']} ({f['trigger']}, {f['at']})")
    for k, v in counts.items():
        suite.set(k, str(v))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
    return path


NOTIFY_DEADLINE_S = 30.0


def notify(url: str, a: dict, found: dict[str, list[str]], causes: tuple[str, ...], *,
           attempts: int = 3, timeout_s: float = 5.0, backoff_s: float = 1.0,
           deadline_s: float = NOTIFY_DEADLINE_S) -> str | None:
    """POST the summary to a webhook (Slack-style ``text`` plus structured fields).
    Retried within ``deadline_s`` in all; returns None when delivered, else why not. Never
    raises: a webhook that is down must not cost the review (its files are already
    written)."""
    failing = summary_lines(found, causes)
    head = (f"specfleet review {a['week']}: "
            + (f"{len(failing)} finding(s) to act on" if failing else "nothing to act on"))
    body = {"text": "\n".join([head, *failing[:20]]), "week": a["week"],
            "counts": a["counts"], "fail_on": list(causes),
            "findings": {c: found[c] for c in causes},
            "series": [{"series": s["series"], "stale": s["stale"],
                        "decision": s["verdict"]["text"],
                        "classification": (judged_config(s) or {}).get("classification"),
                        "otel": [config_attributes(s["series"], c, bool(s.get("calibration")))
                                 for c in s["configs"]]}
                       for s in a["series"]]}
    data = json.dumps(body, default=str).encode()
    return post_within(url, data, attempts=attempts, timeout_s=timeout_s, backoff_s=backoff_s,
                       deadline_s=deadline_s)


def _post(url: str, data: bytes, timeout_s: float, result: list[str | None]) -> None:
    """One POST; appends None when delivered, else why not."""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            result.append(None if 200 <= resp.status < 300 else f"HTTP {resp.status}")
    except urllib.error.HTTPError as e:
        result.append(f"HTTP {e.code}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        result.append(str(getattr(e, "reason", e)))


def post_within(url: str, data: bytes, *, attempts: int, timeout_s: float, backoff_s: float,
                deadline_s: float) -> str | None:
    """POST ``data``, retried, all within ``deadline_s``. urllib's timeout bounds each socket
    operation, not the request: a server that sends its headers a byte at a time never
    trips it. So each attempt runs in a daemon thread the deadline abandons."""
    import threading

    end = time.monotonic() + deadline_s
    why, tried = "not attempted", 0
    for attempt in range(attempts):
        left = end - time.monotonic()
        if left <= 0:
            break
        result: list[str | None] = []
        worker = threading.Thread(target=_post, args=(url, data, min(timeout_s, left), result),
                                  daemon=True)
        worker.start()
        worker.join(left)
        tried += 1
        if not result:
            return f"no complete answer within the {deadline_s:g} s deadline ({tried} attempt(s))"
        if result[0] is None:
            return None
        why = result[0]
        if attempt + 1 < attempts:
            time.sleep(max(0.0, min(backoff_s * 2 ** attempt, end - time.monotonic())))
    return f"{why} after {tried} attempt(s)"
