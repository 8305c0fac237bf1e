"""Audit 27z: a final acceptance check of issue 27's "What must be true" (points 1-8) as a
user meets them: the real CLI (`specfleet review / compare / site / export otlp / runs`,
each a subprocess on this worktree's code) over SQLite stores planted through the real
ingest (tests/history.py, tests/truth/weeks.py) with weeks written here, and the load path
against the planted runtime (tests/planted_runtime.py).

Attacked: runtimes that measured only part of a series beside mlx-lm (point 1); two
configs apart in one knob (temperature, top_p, kv bits, max kv size, prefill step, engine,
background profile, an http variant) through review, policy, compare, site and export
(point 2); gates exactly at their limits, a fastest width failing one gate, a week whose
speculative generations all failed, an empty store, a past week, a missing store (point
4); a usage count doubled on a load level (points 6/7); and, at the CLI, two same-level
weeks, a doubling, and steps dated through review and site (points 3 and 5).

A test marked xfail(strict=True) is a finding that fails today (its reason: severity, what
was measured); a plain test is a guard that held."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from orchestrator.store import open_store
from tests.history import C, config_values, event_config, ingest_lines, night, week_nights
from tests.store_templates import fresh_sqlite
from tests.truth.weeks import BASE, GOOD, W20, WEEK, Config, Series, Week, plant

ROOT = Path(__file__).resolve().parents[1]
W19 = W20 - timedelta(days=7)
T7 = (("temperature", 0.7),)


def cli(*argv: str, db: str | None = None) -> subprocess.CompletedProcess:
    """`specfleet ARGV` as a user runs it, on this worktree's code."""
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()",
                           *argv, *(("--db", db) if db else ())], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def clean(r: subprocess.CompletedProcess) -> None:
    text = r.stdout + r.stderr
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]


def review(db: str, out: Path, *extra: str, week: str = WEEK):
    """`specfleet review` in every format: (process, json, md, html)."""
    r = cli("review", "--week", week, "--out", str(out), "--format", "html,md,json",
            *extra, db=db)
    clean(r)
    a = json.loads((out / f"review-{week}.json").read_text())
    return r, a, (out / f"review-{week}.md").read_text(), \
        (out / f"review-{week}.html").read_text()


def by_workload(a: dict) -> dict:
    return {(s["series"]["workload"], s["series"]["engine"]): s for s in a["series"]}


def h2s(site: Path) -> dict[str, list[str]]:
    """Each series page of a site: the config sections it names."""
    return {p.name: re.findall(r"<h2>([^<]+)</h2>", p.read_text())
            for p in (site / "series").glob("*.html")}


# -- point 1: runtimes that measured part of a series, beside mlx-lm -----------------------

@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    """Five nights, one sweep per runtime a night (one engine per job). Workload a: mlx-lm
    100 → 150 tok/s at k=3 beside ollama measured plain at 120. Workload b: mlx-lm measured
    plain at 100 beside llama-server measured only speculative (k=3, 140 tok/s, no plain
    variant)."""
    d = tmp_path_factory.mktemp("runtimes")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    def v(x: float, **k) -> dict:
        return config_values(x, jitter=0.0, **k)

    w = dict(node="mac-01", chip="Apple M2 Max", pair="gemma-9b / gemma-2b")
    for at in week_nights(W20, 5):
        night(store, at, **w, workload="a", configs={
            C("baseline", 0): v(100.0), C("speculative", 3): v(150.0, acceptance=0.7,
                                                               ttft=51.0)})
        night(store, at, **w, workload="a", engine="ollama",
              configs={C("baseline", 0): v(120.0)})
        night(store, at, **w, workload="b", configs={C("baseline", 0): v(100.0)})
        night(store, at, **w, workload="b", engine="llama-server",
              configs={C("speculative", 3): v(140.0, acceptance=0.7, ttft=51.0)})
    return d, url


def test_a_partly_measured_runtime_beside_mlx_lm_goes_through_every_command(runtimes):
    """Guard (point 1): review in every format with --policy, --junit and --fail-on
    gate-miss, site, compare --out, export otlp and runs list all answer for the store;
    every series is in every output; the only finding is llama-server's (no baseline)."""
    from tests.otlp_receiver import Receiver

    d, url = runtimes
    policy, junit = d / "policy.json", d / "junit.xml"
    r, a, md, html = review(url, d / "out", "--policy", str(policy), "--junit", str(junit),
                            "--fail-on", "gate-miss")
    assert r.returncode == 1, r.stderr
    assert [x for x in r.stderr.splitlines() if x.startswith(("no-data", "gate-miss"))] == [
        "no-data: Apple M2 Max · gemma-9b / gemma-2b · b · short · llama-server: needs more "
        "data: no reliable baseline this week (speculative k=3 measured on 5 reliable runs "
        "with no baseline to compare it with: measure the baseline (speculation off) beside "
        "it)"]
    series = by_workload(a)
    assert set(series) == {("a", "mlx-lm"), ("a", "ollama"), ("b", "mlx-lm"),
                           ("b", "llama-server")}
    assert series[("a", "mlx-lm")]["verdict"]["text"] == \
        "production candidate at draft width 3"
    (group,) = [g for g in a["side_by_side"] if g["workload"] == "a"]
    assert group["fastest_baseline"]["engine"] == "ollama"
    assert group["fastest_baseline"]["ratio"] == pytest.approx(1.2)
    assert "fastest without speculation: ollama, 1.20× mlx-lm" in md
    assert 'data-runtime="ollama"' in html
    entries = {(p["workload"], p["engine"]): p for p in json.loads(policy.read_text())["series"]}
    assert set(entries) == set(series)
    assert (entries[("a", "mlx-lm")]["speculation"], entries[("a", "mlx-lm")]["num_draft_tokens"]
            ) == (True, 3)
    assert not any(p["speculation"] for k, p in entries.items() if k != ("a", "mlx-lm"))
    classes = {c.get("classname") for c in ET.parse(junit).getroot()}
    assert {n.split(" · ")[2] + " " + n.split(" · ")[4] for n in classes if " · " in n} == \
        {"a mlx-lm", "a ollama", "b mlx-lm", "b llama-server"}

    s = cli("site", str(d / "site"), "--week", WEEK, db=url)
    clean(s)
    assert s.returncode == 0 and len(h2s(d / "site")) == 4, s.stderr
    c = cli("compare", "week=2026-W20", "week=2026-W20", "--out", str(d / "c.html"), db=url)
    clean(c)
    assert c.returncode == 0 and (d / "c.html").exists()
    assert "ollama" in c.stdout and "llama-server" in c.stdout
    with Receiver() as rec:
        e = cli("export", "otlp", "--endpoint", rec.url, "--week", WEEK, db=url)
        clean(e)
        assert e.returncode == 0, e.stderr
        providers = {p.attributes.get("gen_ai.provider.name") for p in rec.points}
    assert {"mlx-lm", "llama-server"} <= providers, providers
    runs = cli("runs", "list", "--workload", "b", db=url)
    assert runs.returncode == 0 and "llama-server" in runs.stdout


def test_a_runtime_measured_only_with_speculation_is_not_called_unmeasured(runtimes):
    """Was low: workload b, llama-server measured speculation every night (k=3, 140
    tok/s, 5 reliable runs) with no plain variant beside mlx-lm's plain 100 tok/s: the
    runtimes line reads 'fastest without speculation: mlx-lm (the only runtime
    measured); with speculation: not measured' (llama-server was measured, with
    speculation; it has no speedup, not no measurement). Now the line names llama-server
    at k=3 as measured with no baseline to compare it with."""
    d, url = runtimes
    out = d / "out-b"
    _, _, md, _ = review(url, out)
    (line,) = [x for x in md.splitlines() if "fastest without speculation: mlx-lm" in x]
    assert "with speculation: not measured" not in line, line
    assert "the only runtime measured" not in line, line
    assert "llama-server measured only with speculation" in line, line
    assert "with speculation: llama-server at k=3 measured with no baseline" in line, line


# -- point 2: one config identity, any single knob ------------------------------------------

KNOBS = {"temp": T7, "topp": (("temperature", 0.7), ("top_p", 0.9)),
         "topp8": (("temperature", 0.7), ("top_p", 0.8)), "kv": (("kv_bits", 4),),
         "mkv": (("max_kv_size", 1024),), "pf": (("prefill_step_size", 256),)}
BUSY = "busy: 512 MB + 1 CPU"


@pytest.fixture(scope="module")
def knobs(tmp_path_factory):
    """Per knob, a node of its own: baseline 100 and k=3 150 tok/s at the defaults; the
    knob's own baseline 60 and k=3 90 (1.5× its own baseline, 0.9× the default one: a
    pairing with the wrong baseline shows). On the temp node, also llama-server and a busy
    twin (a background profile) at 60 → 90: same knobs, another engine or profile."""
    d = tmp_path_factory.mktemp("knobs")
    url = fresh_sqlite(d / "s.db")
    series = [Series("code", (BASE, Config("baseline", knobs=kn, decode=60.0),
                              Config("speculative", 3, decode=150.0, **GOOD),
                              Config("speculative", 3, knobs=kn, decode=90.0, **GOOD)),
                     node=f"n-{name}", chip=f"chip-{name}") for name, kn in KNOBS.items()]
    twin = (Config("baseline", decode=60.0), Config("speculative", 3, decode=90.0, **GOOD))
    series += [Series("code", twin, node="n-temp", chip="chip-temp", engine="llama-server"),
               Series("code", twin, node="n-temp", chip="chip-temp", background=BUSY)]
    plant(open_store(url), Week("knobs", tuple(series)))
    return d, url


def _label(kn: tuple) -> str:
    return "speculative k=3" + "".join(f" · {k} {v:g}" if isinstance(v, float) else
                                       f" · {k} {v}" for k, v in kn)


def test_one_knob_apart_is_two_configs_in_review_and_policy(knobs):
    """Guard (point 2): per knob, four configs of five nights each, each speculative one
    1.5× the baseline of its own settings; the engine and the background profile are
    series of their own; the policy's sampling is the production candidate's."""
    d, url = knobs
    policy = d / "policy.json"
    r, a, md, _ = review(url, d / "out", "--policy", str(policy))
    assert r.returncode == 0, r.stderr
    chips = {(s["series"]["chip"], s["series"]["engine"]): s for s in a["series"]}
    for name, kn in KNOBS.items():
        s = chips[(f"chip-{name}", "mlx-lm")]
        got = {c["label"]: (c["speedup"], c["runs"]) for c in s["configs"]}
        assert got == {"baseline": (1.0, 5), "baseline" + _label(kn)[len("speculative k=3"):]:
                       (1.0, 5), "speculative k=3": (pytest.approx(1.5), 5),
                       _label(kn): (pytest.approx(1.5), 5)}, (name, got)
    assert {e for c, e in chips if c == "chip-temp"} == {"mlx-lm", "llama-server",
                                                         "mlx-lm · " + BUSY}
    for p in json.loads(policy.read_text())["series"]:  # the settings of the config named
        assert p["speculation"] and p["num_draft_tokens"] == 3, p
        named = dict(x.split(" ") for x in p["because"].split(" · ")[1:])
        assert {n: str(p["sampling"][n]) for n in named} == named, p


def test_one_knob_apart_is_two_rows_in_compare_site_and_export(knobs):
    """Guard (point 2): compare shows each config its own row of five nights at its own
    level; the site names every config once; the export's speedup is 1.5 for every
    speculative config, each with attributes of its own."""
    from tests.otlp_receiver import Receiver

    d, url = knobs
    c = cli("compare", "week=2026-W20", "week=2026-W20", "--json", db=url)
    clean(c)
    rows = [r for r in json.loads(c.stdout)["rows"] if r["metric"] == "decode_tok_s"]
    keys = [(r["series"], r.get("node"), r["config"]) for r in rows]
    assert len(keys) == len(set(keys)) == 6 * 4 + 2 * 2, keys
    assert all(r["n"] == [5, 5] for r in rows)
    for r in rows:
        knobbed = "·" in r["config"] or r["engine"] != "mlx-lm"
        assert r["a"] == pytest.approx((60.0 if knobbed else 100.0) * (
            1.5 if r["config"].startswith("speculative") else 1.0)), r
    s = cli("site", str(d / "site"), "--week", WEEK, db=url)
    clean(s)
    pages = h2s(d / "site")
    assert len(pages) == 8 and all(len(h) == len(set(h)) for h in pages.values()), pages
    with Receiver() as rec:
        e = cli("export", "otlp", "--endpoint", rec.url, "--week", WEEK, db=url)
        clean(e)
        assert e.returncode == 0, e.stderr
        speedups = [p for p in rec.points if p.metric == "specfleet.speculative.speedup"]
    seen: dict[tuple, set] = {}
    for p in speedups:
        key = (p.resource["specfleet.node"], p.attributes["specfleet.config"],
               p.attributes.get("gen_ai.provider.name"), p.attributes.get("specfleet.background"))
        seen.setdefault(key, set()).add(round(p.value, 6))
    assert len(seen) == 6 * 2 + 2 and all(v == {1.5} for v in seen.values()), seen


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """One llama-server job a night with three variants, as the http engine records them
    (the variant's name in the config): plain (100 tok/s), draft-a and draft-b, both
    speculative at the draft width their server commands fix (3): 150 and 90 tok/s."""
    d = tmp_path_factory.mktemp("variants")
    url = fresh_sqlite(d / "s.db")
    plant(open_store(url), Week("variants", (Series("code", (
        Config("baseline", decode=100.0, knobs=(("variant", "plain"),)),
        Config("speculative", 3, knobs=(("variant", "draft-a"),), decode=150.0, **GOOD),
        Config("speculative", 3, knobs=(("variant", "draft-b"),), decode=90.0, **GOOD)),
        engine="llama-server"),)))
    return d, url


def test_two_http_variants_of_one_width_are_told_apart(variants):
    """Was medium: two llama-server variants at one draft width (draft-a 150 tok/s, 1.50×;
    draft-b 90 tok/s, 0.90×; five nights each) are two configs in the store but one label
    everywhere a user reads them: review JSON/Markdown/HTML 'speculative k=3' twice (md rows
    '| k=3 | 150.0 |… production candidate' and '| k=3 | 90.0 |… just misses'), compare two
    'speculative k=3' rows, the site page h2 ['baseline', 'speculative k=3', 'speculative
    k=3']; the policy says speculation on at num_draft_tokens 3 without naming the variant,
    so which server setup to enable is a coin toss between 1.5× and 0.9× (the OTLP export
    alone adds specfleet.variant; configs.config_label leaves 'variant' out via
    NOT_SAMPLING)"""
    d, url = variants
    policy = d / "policy.json"
    r, a, md, _ = review(url, d / "out", "--policy", str(policy))
    (s,) = a["series"]
    labels = [c["label"] for c in s["configs"]]
    c = cli("compare", "week=2026-W20", "week=2026-W20", "--json", db=url)
    rows = [x["config"] for x in json.loads(c.stdout)["rows"] if x["metric"] == "decode_tok_s"]
    cli("site", str(d / "site"), "--week", WEEK, db=url)
    (names,) = h2s(d / "site").values()
    (entry,) = json.loads(policy.read_text())["series"]
    assert len(labels) == len(set(labels)), labels
    assert len(rows) == len(set(rows)), rows
    assert len(names) == len(set(names)), names
    assert "draft-a" in json.dumps(entry), entry


# -- point 4: the policy, gate evidence at the edges, --fail-on ---------------------------

@pytest.fixture(scope="module")
def edges(tmp_path_factory):
    """Gates exactly at their limits (speedup 116/100, TTFT 54/50, acceptance 0.55, ITL p95
    50 ms, swap 1.5 GB), a speedup just under (115.6/100); the fastest width (k=4, 1.5×)
    failing one gate each (task pass rate 0.80 vs 0.90, output inexact, acceptance 0.50,
    ITL 60 ms) beside k=2 at 1.3× passing all; a width measured reliably at temperature
    0.7 with no baseline at 0.7; and k=3 at 0.90× at the default sampling beside k=3 at
    1.50× at temperature 0.7, each against its own baseline."""
    d = tmp_path_factory.mktemp("edges")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    plant(store, Week("edges", (
        Series("speed-at", (BASE, Config("speculative", 3, decode=116.0, **GOOD))),
        Series("speed-under", (BASE, Config("speculative", 3, decode=115.6, **GOOD))),
        Series("ttft-at", (BASE, Config("speculative", 3, decode=140.0, acceptance=0.7,
                                        ttft=54.0))),
        Series("acc-at", (BASE, Config("speculative", 3, decode=140.0, acceptance=0.55,
                                       ttft=51.0))),
        Series("itl-at", (BASE, Config("speculative", 3, decode=140.0, itl_p95=50.0, **GOOD))),
        Series("swap-at", (BASE, Config("speculative", 3, decode=140.0, swap=1.5e9, **GOOD))),
        Series("no-base-0.7", (BASE, Config("speculative", 3, knobs=T7, decode=150.0,
                                            **GOOD))),
        Series("gain-at-0.7", (BASE, Config("baseline", knobs=T7, decode=100.0),
                               Config("speculative", 3, decode=90.0, **GOOD),
                               Config("speculative", 3, knobs=T7, decode=150.0, **GOOD))))))
    def v(x: float, **k) -> dict:
        return config_values(x, jitter=0.0, ttft=51.0, **k)

    w = dict(node="mac-01", chip="Apple M2 Max", pair="g / d")
    two = {C("baseline", 0): v(100.0), C("speculative", 2): v(130.0, acceptance=0.8)}
    for at in week_nights(W20, 5):
        night(store, at, **w, workload="quality", quality={0: 0.9, 2: 0.9, 4: 0.8},
              configs={**two, C("speculative", 4): v(150.0, acceptance=0.7)})
        sid = night(store, at, **w, workload="exact", configs=two)
        night(store, at, **w, workload="exact", sweep_id=sid, exact=False,
              configs={C("speculative", 4): v(150.0, acceptance=0.7)})
        night(store, at, **w, workload="acceptance",
              configs={**two, C("speculative", 4): v(150.0, acceptance=0.5)})
        night(store, at, **w, workload="itl",
              configs={**two, C("speculative", 4): v(150.0, acceptance=0.7, itl_p95=60.0)})
    policy, junit = d / "policy.json", d / "junit.xml"
    r, a, md, _ = review(url, d / "out", "--policy", str(policy), "--junit", str(junit),
                         "--fail-on", "gate-miss")
    return r, a, md, json.loads(policy.read_text()), ET.parse(junit).getroot()


def test_gates_exactly_at_their_limits_pass_and_are_switched_on(edges):
    """Guard (point 4): a number exactly at its gate passes it (production candidate,
    policy on at that width, every JUnit case of the series green)."""
    r, a, _, policy, junit = edges
    series = by_workload(a)
    entries = {p["workload"]: p for p in policy["series"]}
    for wl in ("speed-at", "ttft-at", "acc-at", "itl-at", "swap-at"):
        assert series[(wl, "mlx-lm")]["verdict"]["text"] == \
            "production candidate at draft width 3", wl
        assert (entries[wl]["speculation"], entries[wl]["num_draft_tokens"]) == (True, 3), wl
        assert not [c for c in junit if f" · {wl} · " in c.get("classname", "")
                    and c.find("failure") is not None], wl
    assert not [x for x in r.stderr.splitlines() if "-at " in x], r.stderr


def test_a_fastest_width_that_fails_one_gate_is_never_switched_on(edges):
    """Guard (point 4): k=4 is faster but fails the task pass rate, exactness, the
    acceptance floor or the ITL ceiling: the policy names k=2, which passes every gate."""
    _, a, _, policy, _ = edges
    series = by_workload(a)
    entries = {p["workload"]: p for p in policy["series"]}
    for wl, gate in (("quality", "task_pass_rate"), ("exact", "exact"),
                     ("acceptance", "acceptance"), ("itl", "itl_p95_ms")):
        assert series[(wl, "mlx-lm")]["verdict"]["text"] == \
            "production candidate at draft width 2", wl
        k4 = [c for c in series[(wl, "mlx-lm")]["configs"] if c["k"] == 4][0]
        assert k4["gates"][gate]["passed"] is False, (wl, k4["gates"])
        assert (entries[wl]["speculation"], entries[wl]["num_draft_tokens"]) == (True, 2), wl


def test_a_speedup_under_its_floor_is_not_switched_on_and_says_so(edges):
    """Guard (point 4): 1.156 against 1.16: autoregressive in the policy, the gate line
    '… speedup 1.156 < 1.16' on stderr and in the JUnit failure."""
    r, a, _, policy, junit = edges
    (entry,) = [p for p in policy["series"] if p["workload"] == "speed-under"]
    assert entry["speculation"] is False and entry["num_draft_tokens"] is None
    assert "speed-under · short · mlx-lm: no production candidate; best speculative k=3 " \
           "misses speedup 1.156 < 1.16" in r.stderr
    (case,) = [c for c in junit if " · speed-under · " in c.get("classname", "")
               and c.get("name") == "speedup"]
    assert case.find("failure").get("message").endswith("speedup 1.156 < 1.16")


def test_the_evidence_never_rounds_a_missed_speedup_up_to_its_floor(edges):
    """Was low: speedup 115.6/100 = 1.156 misses the 1.16 gate, yet the verdict's
    evidence reads 'speculation at draft width 3 is 1.16× the baseline on 5 reliable
    runs; speedup 1.156 < 1.16' and the Markdown row '| k=3 | 115.6 | 115.6 | 1.16× | …
    | just misses: speedup 1.156 \\< 1.16 |' — the same '1.16×' the passing series at
    exactly 116/100 shows beside 'production candidate' (the headline speedup is rounded
    to 2 places, the gate text was made truthful alone). Now every page prints a speedup
    through gatewords.ratio_text: 1.156×."""
    _, a, md, _, _ = edges
    ev = by_workload(a)[("speed-under", "mlx-lm")]["verdict"]["evidence"]
    assert "is 1.16× the baseline" not in ev, ev
    row = [x for x in md.splitlines() if x.startswith("| k=3 | 115.6")][0]
    assert "1.16×" not in row, row
    assert "is 1.156× the baseline" in ev and "| 1.156× |" in row, (ev, row)
    at = [x for x in md.splitlines() if x.startswith("| k=3 | 116.0")][0]
    assert "| 1.16× |" in at, at  # exactly at the gate: two places say it
    r = edges[0]
    html = (Path(r.args[r.args.index("--out") + 1]) / f"review-{WEEK}.html").read_text()
    table = re.search(r'<table class="results" data-workload="speed-under".*?</table>', html,
                      re.S).group(0)
    assert "1.156×" in table and "1.16×" not in table, table


def test_a_ratio_near_its_line_shows_the_digits_that_tell_them_apart():
    """Guard: the one helper every page prints a speedup through keeps two places unless
    they would put a value on the other side of (or onto) a line it is read against."""
    from orchestrator.review.gatewords import ratio_text, speedup_text

    assert [ratio_text(v, 1.0, 1.16) for v in (1.5, 1.16, 1.156, 1.1599999, 0.9996, 1.0)] \
        == ["1.50", "1.16", "1.156", "1.1599999", "0.9996", "1.00"]
    assert speedup_text(None) == "–" and speedup_text(1.1649, 1.165) == "1.16×"
    assert speedup_text(1.163, 1.162) == "1.163×"  # a pass never reads below its gate


def test_a_speculative_config_without_its_own_baseline_is_named_as_such(edges):
    """Was low: k=3 at temperature 0.7 was measured reliably on 5 nights (150 tok/s) but
    the series has a baseline only at temperature 0.0: the verdict reads 'needs more
    data: no reliable speculative config this week' with evidence 'nothing measured' —
    the missing piece is a baseline at temperature 0.7, which nothing names. Now: 'no
    reliable baseline at temperature 0.7', and the baseline to measure."""
    _, a, _, _, _ = edges
    v = by_workload(a)[("no-base-0.7", "mlx-lm")]["verdict"]
    assert v["evidence"] != "nothing measured", v
    assert "baseline" in v["text"] + v["evidence"], v
    assert v["text"] == "needs more data: no reliable baseline at temperature 0.7 this week"
    assert v["evidence"].startswith("speculative k=3 · temperature 0.7 measured on 5 "
                                    "reliable runs with no baseline at temperature 0.7"), v
    assert "measure the baseline at temperature 0.7" in v["evidence"], v


def _policy_words() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("`--policy FILE` writes"):][:600]


def test_a_pass_at_another_temperature_does_not_switch_on_the_series_as_documented(edges):
    """Was medium: a series measured at temperature 0.0 (k=3 0.90× its baseline: fails the
    speedup gate) and 0.7 (k=3 1.50× its own) gets one policy entry, 'speculation: true,
    num_draft_tokens: 3' (verdict 'production candidate at draft width 3 · temperature
    0.7'): the pick ranks configs of every sampling setting by speedup over their own
    baselines. Only an undocumented 'sampling' field ({temperature: 0.7}) says the pass was
    at another temperature; the README's description of the policy (speculation,
    num_draft_tokens, ladder) does not name it, so a gateway serving greedy requests as
    documented switches on a width measured 0.90× there"""
    _, _, _, policy, _ = edges
    (entry,) = [p for p in policy["series"] if p["workload"] == "gain-at-0.7"]
    assert entry["speculation"] and entry["sampling"]["temperature"] == 0.7, entry
    assert "sampling" in _policy_words(), _policy_words()


@pytest.fixture(scope="module")
def failed_speculation(tmp_path_factory):
    """Five nights on which the plan's speculative widths (2, 3, 4) all failed (the draft
    did not load): each night the baseline's summary, one generation_failed per width, and
    the node's outcome as the controller records a job with failed generations."""
    d = tmp_path_factory.mktemp("failed")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    for at in week_nights(W20, 5):
        sid = night(store, at, node="mac-01", chip="Apple M2 Max", pair="g / d",
                    workload="code", configs={C("baseline", 0): config_values(100.0, jitter=0)})
        ingest_lines(store, sid, "mac-01", [
            {"type": "generation_failed", "workload": "code", "mode": "speculative",
             "num_draft_tokens": k, "config": event_config("speculative", k),
             "error": "draft model failed to load: weights missing"} for k in (2, 3, 4)],
            at.timestamp())
        store.finish_sweep(sid, {"mac-01": ("failed", "3 planned generation(s) failed (1 "
                                                      "measured); the errors are on the sweep "
                                                      "page")})
    return d, url


def test_failed_sweeps_of_that_week_fail_on_failed_sweep(failed_speculation):
    """Guard: `--fail-on failed-sweep` exits 1 on it, one line per failed sweep."""
    d, url = failed_speculation
    r, *_ = review(url, d / "fs", "--fail-on", "failed-sweep")
    assert r.returncode == 1
    assert sum(x.startswith("failed-sweep: ") for x in r.stderr.splitlines()) == 5


def test_a_week_whose_speculation_all_failed_fails_gate_miss_and_no_data(failed_speculation):
    """Was high: every speculative generation of the week failed (widths 2, 3, 4 on 5 nights;
    only the baseline measured); the review says 'needs more data: no reliable speculative
    config this week' and 'measure again (1 series has no reliable runs yet)', yet
    `--fail-on gate-miss` (help: 'a series with no production candidate') exits 0 and
    `--fail-on no-data` (help: 'a series with no reliable evidence this week') exits 0:
    ci.no_data takes a series with a baseline only for one measured plain on purpose;
    JUnit's case is 'skipped', no failure"""
    d, url = failed_speculation
    codes = {}
    for cause in ("gate-miss", "no-data"):
        r, a, md, _ = review(url, d / cause, "--fail-on", cause)
        codes[cause] = r.returncode
    v = a["series"][0]["verdict"]
    assert v["text"] == "needs more data: the speculative generations failed this week", v
    assert v["evidence"].startswith("15 failed, e.g. draft model failed to load"), v
    assert codes == {"gate-miss": 1, "no-data": 1}, codes


def test_no_evidence_at_all_fails_gate_miss_with_a_clear_message(tmp_path):
    """Guard (point 4): --fail-on gate-miss on a store with no sweeps, a store path that
    holds nothing, and a week before the store's first run: exit 1, each saying why, and
    no 'Nothing regressed' where nothing was compared."""
    url = fresh_sqlite(tmp_path / "s.db")
    empty = fresh_sqlite(tmp_path / "e.db")
    plant(open_store(url), Week("one", (Series("code", (BASE, Config(
        "speculative", 3, decode=150.0, **GOOD))),)))
    r = cli("review", "--week", WEEK, "--out", str(tmp_path / "e"), "--fail-on", "gate-miss",
            db=empty)
    assert r.returncode == 1 and "the store holds no sweeps yet" in r.stderr, r.stderr
    r = cli("review", "--week", WEEK, "--out", str(tmp_path / "m"), "--fail-on", "gate-miss",
            db=f"sqlite:///{tmp_path / 'nothing-here.db'}")
    assert r.returncode == 1 and "no store at" in r.stderr, r.stderr
    assert not (tmp_path / "nothing-here.db").exists()
    r, a, md, html = review(url, tmp_path / "past", "--fail-on", "gate-miss", week="2026-W19")
    assert r.returncode == 1 and "no-data: week 2026-W19: no runs at all" in r.stderr
    assert "Nothing regressed" not in md + html and "Nothing to compare" in md
    # the week itself: one candidate, nothing before it to compare with
    r, a, md, html = review(url, tmp_path / "w20", "--fail-on", "gate-miss,regression")
    assert r.returncode == 0, r.stderr
    assert "Nothing regressed" not in md + html and 'id="nothing-compared"' in html


# -- points 3 and 5 at the CLI: same weeks, a doubling, dated steps ------------------------

@pytest.fixture(scope="module")
def two_weeks(tmp_path_factory):
    """W19 and W20, seven nights each (night level × N(1, 3%), repetitions ± 1%): node
    'same' at one level both weeks (baseline 100, k=3 1.4×); node 'double' (its own chip)
    measured plain at 100 in W19 and 200 in W20."""
    d = tmp_path_factory.mktemp("weeks")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    rng = random.Random(7)
    for week in (W19, W20):
        for at in week_nights(week, 7):
            lvl = 100 * (1 + rng.gauss(0, 0.03))
            night(store, at, node="same", chip="Apple M2 Max", pair="g / d", workload="code",
                  configs={C("baseline", 0): config_values(lvl, rng=rng),
                           C("speculative", 3): config_values(1.4 * lvl, rng=rng,
                                                              acceptance=0.7)})
            night(store, at, node="double", chip="Apple M3 Max", pair="g / d",
                  workload="code", configs={C("baseline", 0): config_values(
                      lvl * (2 if week == W20 else 1), rng=rng)})
    return d, url


def _rows(url: str, node: str) -> dict:
    c = cli("compare", f"node={node},week=2026-W19", f"node={node},week=2026-W20", "--json",
            db=url)
    clean(c)
    return {(r["config"], r["metric"]): r for r in json.loads(c.stdout)["rows"]}


def test_compare_claims_nothing_between_same_weeks_and_finds_a_doubling(two_weeks):
    """Guard (point 3): seven same-level nights a side: every row 'same within noise', its
    interval covering 1; a doubling: 'B better', its interval covering 2; the weekly review
    finds no regression on the same weeks, the doubling an improvement of 2× both week
    over week and against the weeks before, and a step of +100% on its first night."""
    d, url = two_weeks
    same = _rows(url, "same")
    assert len(same) == 7 and all(r["verdict"] == "same within noise" and
                                  r["ci"][0] <= 1.0 <= r["ci"][1] for r in same.values()), same
    dbl = _rows(url, "double")[("baseline", "decode_tok_s")]
    assert dbl["verdict"] == "B better" and dbl["ci"][0] <= 2.0 <= dbl["ci"][1], dbl
    r, a, md, html = review(url, d / "out", "--fail-on", "regression")
    assert r.returncode == 0, r.stderr
    m2, m3 = sorted(a["series"], key=lambda s: s["series"]["chip"])
    assert (m2["regressions"], m2["compared"]) == ([], 4)
    assert {(x["verdict"], x["period"]) for x in m3["regressions"]} == {
        ("improvement", "week over week"), ("improvement", "vs last 4 weeks")}
    assert all(x["ratio"] == pytest.approx(2.0, abs=0.1) for x in m3["regressions"])
    (cp,) = m3["change_points"]
    assert (cp["date"], cp["kind"]) == ("2026-05-11", "step") and cp["size"] == \
        pytest.approx(1.0, abs=0.1), cp


def test_compare_prints_medians_in_the_order_its_ratio_says(two_weeks):
    """Was low: compare's A and B columns are each side's median night while B/A is the
    ratio of geometric means: on two same-level weeks (node 'same', seed 7) the baseline
    row reads A 100.3, B 101.8, B/A 0.990 — B's number higher, its ratio under 1. Over
    400 planted same-level pairs (7 nights a side, σ 5%, seed 11) the printed medians'
    order contradicts B/A in 18%, on no claimed difference (1 claim, 0 contradicted). Now
    A and B are each side's level, the geometric mean the ratio is built from
    (compare.level), so their order agrees with B/A by construction."""
    from orchestrator.review.compare import level, night_ratio

    _, url = two_weeks
    for key, r in _rows(url, "same").items():
        assert (r["b"] > r["a"]) == (r["ratio"] > 1) or r["a"] == r["b"], (key, r)
        assert r["b"] / r["a"] == pytest.approx(r["ratio"], rel=1e-12), (key, r)
    rng, flips, medians = random.Random(11), 0, 0
    for _ in range(400):  # the levels compare prints, beside the ratio it prints
        a, b = ([100 * math.exp(rng.gauss(0, 0.05)) for _ in range(7)] for _ in "ab")
        r = night_ratio(a, b)
        busy = r.get("busy") or [[], []]
        flips += (level(b, busy[1]) > level(a, busy[0])) != (r["ratio"] > 1)
        medians += (statistics.median(b) > statistics.median(a)) != (r["ratio"] > 1)
    assert flips == 0 and medians > 40, (flips, medians)  # the medians once printed: 18%
    c = cli("compare", "node=same,week=2026-W19", "node=same,week=2026-W20", db=url)
    assert "A gmean" in c.stdout and "geometric mean of its nights" in c.stdout, c.stdout


def test_steps_are_dated_at_their_night_through_review_and_site(tmp_path):
    """Guard (point 5): 35 nights (σ 1.5%): +15% on night 20 with an mlx-lm bump that
    night, -15% on night 33 (two before the end) with the bump, a two-night dip of 20% on
    nights 26-27, and a flat series: the review and the site date each step at its night
    and name the bump, the late one a possible step to confirm; no change point for the dip
    or the flat series."""
    url = fresh_sqlite(tmp_path / "s.db")
    store = open_store(url)
    rng = random.Random(5)
    start = W20 - timedelta(days=28)
    plans = {"mid": (20, 1.15), "late": (33, 0.85), "dip": (None, 1.0), "flat": (None, 1.0)}
    for i in range(35):
        for wl, (step, size) in plans.items():
            lvl = 100 * (1 + rng.gauss(0, 0.015)) * (size if step and i >= step else 1.0)
            lvl *= 0.8 if wl == "dip" and i in (26, 27) else 1.0
            night(store, start + timedelta(days=i, hours=2), node="mac-01", chip="M2",
                  pair="g / d", workload=wl, configs={C("baseline", 0): config_values(
                      lvl, rng=rng, jitter=0.005)},
                  identity={"mlx_lm_version": "0.33.0"} if step and i >= step else {})
    _, a, _, _ = review(url, tmp_path / "out")
    got = {s["series"]["workload"]: [(c["date"], c["kind"], c["note"], c["changed"])
                                     for c in s["change_points"]] for s in a["series"]}
    bump = ["mlx-lm 0.32.2 → 0.33.0"]
    assert got == {"mid": [(str((start + timedelta(days=20)).date()), "step", None, bump)],
                   "late": [(str((start + timedelta(days=33)).date()), "possible step",
                             "confirm on the next nights", bump)],
                   "dip": [], "flat": []}, got
    s = cli("site", str(tmp_path / "site"), "--week", WEEK, db=url)
    clean(s)
    tables = {p.name.split("-d-")[1].split("-")[0]: re.sub(r"<[^>]+>", " ", m.group(0))
              if (m := re.search(r'<table class="change-points">.*?</table>', p.read_text(),
                                 re.S)) else None
              for p in (tmp_path / "site" / "series").glob("*.html")}
    assert tables["dip"] is None and tables["flat"] is None, tables
    assert "2026-05-03" in tables["mid"] and "2026-05-16" in tables["late"], tables
    assert "confirm on the next nights" in tables["late"] and bump[0] in tables["mid"]


# -- points 6/7: a load level against a runtime that counts usage twice --------------------

def test_a_load_level_counts_the_chunks_not_a_doubled_usage(tmp_path):
    """Guard (points 6/7): the planted runtime streams 12 one-token chunks and reports 24
    (no tokenizer): a load level's reply counts 12 tokens, and a closed loop of 4 requests
    over 2 streams sums 48, never 96."""
    from agent.httpengine import stream
    from agent.httpruntime import reply_of
    from agent.load import closed_loop, summarize
    from tests.ports import free_port, wait_served

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "planted_runtime.py"),
                             "--port", str(port), "--mode", "double-usage", "--token-ms", "1"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_served(url)
        body = {"prompt": "x", "max_tokens": 12, "temperature": 0.0}

        def send(i: int):
            return reply_of(stream(url, "completions", body, 10)[0])

        assert send(0).tokens == 12
        outcomes, wall = closed_loop(send, 2, 4)
        level = summarize(outcomes, wall, closed=True)
    finally:
        proc.terminate()
        proc.wait(10)
    assert [o.output_tokens for o in outcomes] == [12] * 4
    assert level["completed"] == 4
    assert level.get("output_tokens", level.get("tokens", 48)) == 48, level


def test_a_runtime_measured_plain_says_so_and_is_no_finding(runtimes):
    """ollama measured plain beside mlx-lm (workload a): its verdict says it was measured
    without speculation, with its runs (it said 'no reliable speculative config this week
    (nothing measured)'), and `--fail-on no-data` does not name it."""
    d, url = runtimes
    r, a, md, _ = review(url, d / "plain", "--fail-on", "no-data")
    v = by_workload(a)[("a", "ollama")]["verdict"]
    assert (v["text"], v["evidence"]) == ("needs more data: measured without speculation "
                                          "this week", "the baseline alone, 5 runs"), v
    assert "ollama" not in r.stderr, r.stderr
