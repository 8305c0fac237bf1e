"""Each planted week of tests/truth/weeks.py through `specfleet review` (every format, the
policy, JUnit, --fail-on) on SQLite and PostgreSQL: every output gives the planted answer."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.review.report import _runtime_verdict
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.truth.weeks import POISON, WEEK, WEEKS, plant


def _review(url: str, out, *args: str):
    return CliRunner().invoke(main, ["review", "--week", WEEK, "--db", url, "--out", str(out),
                                     "--format", "html,md,json", *args])


def _ekey(s: dict) -> tuple:
    return (s["series"]["workload"], s["series"]["engine"])


@pytest.mark.parametrize("week", WEEKS, ids=[w.name for w in WEEKS])
def test_every_output_gives_the_planted_answer(week, any_url, tmp_path):
    store = open_store(any_url)
    plant(store, week)
    out = tmp_path / "out"
    policy, junit = tmp_path / "policy.json", tmp_path / "junit.xml"
    r = _review(any_url, out, "--policy", str(policy), "--junit", str(junit),
                "--fail-on", "gate-miss")
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    x = week.expect
    assert r.exit_code == x["fail_on_gate_miss"], r.output
    html, md = (out / f"review-{WEEK}.{f}" for f in ("html", "md"))
    a = json.loads((out / f"review-{WEEK}.json").read_text())
    assert html.exists() and md.exists() and policy.exists() and junit.exists()
    series = {_ekey(s): s for s in a["series"]}
    configs = {(*_ekey(s), c["label"]): c for s in a["series"] for c in s["configs"]}

    for key, speedup in x.get("speedups", {}).items():
        assert configs[key]["speedup"] == pytest.approx(speedup, rel=1e-6), key
    for key, runs in x.get("runs", {}).items():
        assert configs[key]["runs"] == runs, key
    for key, aside in x.get("set_aside", {}).items():
        assert configs[key]["set_aside"] is aside, key
        assert configs[key]["otel"]["specfleet.set_aside"] is aside
        assert configs[key]["classification"] == "set aside: every run unreliable"
    for key, text in x.get("verdicts", {}).items():
        assert series[key]["verdict"]["text"].startswith(text), series[key]["verdict"]
    for key, text in x.get("evidence", {}).items():
        assert text in series[key]["verdict"]["evidence"], series[key]["verdict"]
    for wl, (base, spec) in x.get("side_by_side", {}).items():
        (g,) = [g for g in a["side_by_side"] if g["workload"] == wl]
        for got, (engine, over, ratio) in ((g["fastest_baseline"], base),
                                           (g["fastest_speculative"], spec)):
            assert (got["engine"], got["over"]) == (engine, over), g
            assert got["ratio"] == (None if ratio is None else pytest.approx(ratio))
        if "runtime_verdict" in x:
            assert _runtime_verdict(g) == x["runtime_verdict"]
            assert x["runtime_verdict"] in md.read_text()
            if any_url.startswith("sqlite"):  # the page as a browser renders it, once
                dom = dump_dom(html)
                assert x["runtime_verdict"] in dom
                assert {e for e, *_ in (base, spec)} <= {
                    e for e in ("mlx-lm", "ollama") if f'data-runtime="{e}"' in dom}
    for key, curve in x.get("positions", {}).items():
        assert series[key]["acceptance_by_position"] == curve
    for key, n in x.get("trend_nights", {}).items():
        assert len(series[key]["trend"]) == n
    for key, rule in x.get("not_fired", {}).items():
        assert rule not in [f["rule"] for f in series[key]["signals"]]

    cases = {(c.get("classname").split(" · ")[2], c.get("name")): c
             for c in ET.parse(junit).getroot() if " · " in c.get("classname")}
    for key, failure in x.get("junit", {}).items():
        got = cases[key].find("failure")
        if failure is None:
            assert got is None, key
        else:
            assert got is not None and got.get("message").endswith(failure), key
    doc = json.loads(policy.read_text())
    entries = {(p["workload"], p["engine"]): p for p in doc["series"]}
    for key, (on, k) in x.get("policy", {}).items():
        assert (entries[key]["speculation"], entries[key]["num_draft_tokens"]) == (on, k), \
            entries[key]
    for key, sampling in x.get("policy_sampling", {}).items():
        assert {n: entries[key]["sampling"][n] for n in sampling} == sampling
    no_data = [line for line in r.stderr.splitlines() if line.startswith("no-data: ")]
    assert len(no_data) == x.get("no_data", 0), r.stderr
    text = md.read_text()
    if x.get("nothing_compared"):
        assert "Nothing regressed" not in text and "Nothing to compare" in text
    # no set-aside number without its marker: the poison appears only on set-aside rows
    for line in text.splitlines():
        if f"{POISON:.1f}" in line:
            assert "set aside" in line, line
    _no_poison_without_marker(a)


def _no_poison_without_marker(node, marked: bool = False) -> None:
    """Anywhere in the review's JSON, the poison (a set-aside run's decode rate) sits only
    inside a config marked set aside."""
    if isinstance(node, dict):
        marked = marked or node.get("set_aside") is True
        for v in node.values():
            _no_poison_without_marker(v, marked)
    elif isinstance(node, list):
        for v in node:
            _no_poison_without_marker(v, marked)
    elif isinstance(node, float) and node == POISON:
        assert marked, "a set-aside number without its marker"


def test_a_future_or_empty_week_is_no_data_and_says_nothing_regressed_nowhere(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    plant(store, WEEKS[0])
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = CliRunner().invoke(main, ["review", "--week", "2027-W10", "--db", url, "--out",
                                  str(tmp_path / "out"), "--format", "html,md,json",
                                  "--fail-on", "regression,gate-miss,stale,failed-sweep"])
    assert r.exit_code == 1, r.output
    assert "no-data: week 2027-W10: no runs at all" in r.stderr
    md = (tmp_path / "out" / "review-2027-W10.md").read_text()
    html = (tmp_path / "out" / "review-2027-W10.html").read_text()
    assert "Nothing regressed" not in md and "Nothing regressed" not in html
    assert "Nothing to compare" in md and 'id="nothing-compared"' in html
