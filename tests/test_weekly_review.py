"""The weekly review against planted histories: each must produce the matching rows,
causes and classifications; the page opens in headless Chromium."""

import json
import random
import re
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.review.ranktest import mann_whitney
from orchestrator.review.rules import load_rules
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.store_templates import fresh_sqlite

W20 = datetime(2026, 5, 11, tzinfo=timezone.utc)  # Monday of 2026-W20
W19, W17 = W20 - timedelta(days=7), W20 - timedelta(days=21)
NOW = W20 + timedelta(days=6, hours=12)


def good_configs(rng, **over):
    """A series that meets every gate; ``over`` changes the k=4 config to miss one."""
    spec = dict(acceptance=0.70, ttft=51.5, itl_p95=20.0, swap=0)
    exact = over.pop("exact", True)
    spec.update(over)
    decode = spec.pop("decode", 130.0)
    return {("baseline", 0): V(100.0, rng=rng), ("speculative", 4): V(decode, rng=rng, **spec)
            }, exact


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    rng = random.Random(7)
    url = f"sqlite:///{tmp_path_factory.mktemp('weekly') / 's.db'}"
    store = open_store(url)
    common = dict(node="mac-01", chip="Apple M2 Max", bucket="short")
    for at in week_nights(W19):
        night(store, at, pair="llama-8b/llama-1b", workload="bump", **common,
              configs={("baseline", 0): V(400, rng=rng)})
        night(store, at, pair="qwen-7b/qwen-0.5b", workload="swap", **common,
              configs={("baseline", 0): V(200, rng=rng),
                       ("speculative", 3): V(500, acceptance=0.75, rng=rng)})
        night(store, at, pair="llama-8b/llama-1b", workload="hot", **common,
              configs={("baseline", 0): V(300, rng=rng)})
    for at in week_nights(W20):
        night(store, at, pair="llama-8b/llama-1b", workload="bump", **common,
              configs={("baseline", 0): V(300, rng=rng)},
              identity={"mlx_lm_version": "0.33.0"})
        night(store, at, pair="qwen-7b/qwen-0.5b", workload="swap", **common,
              configs={("baseline", 0): V(200, rng=rng),
                       ("speculative", 3): V(350, acceptance=0.50, rng=rng)},
              identity={"draft_fingerprint": "sha256:" + "e" * 64})
        throttled = at == week_nights(W20)[3]
        night(store, at, pair="llama-8b/llama-1b", workload="hot", **common,
              configs={("baseline", 0): V(150 if throttled else 300, rng=rng)},
              unreliable="thermal throttling (CPU speed limit 60%)" if throttled else None)
        for name, over in [("good", {}), ("miss-speedup", {"decode": 110.0}),
                           ("miss-itl", {"itl_p95": 60.0}), ("miss-acceptance",
                                                               {"acceptance": 0.50}),
                           ("miss-ttft", {"ttft": 56.5}), ("miss-swap", {"swap": 2e9}),
                           ("miss-exact", {"exact": False}), ("miss-tasks", {})]:
            cfgs, exact = good_configs(rng, **over)
            night(store, at, pair="gemma-9b/gemma-2b", workload=name, **common, configs=cfgs,
                  exact=exact, quality={0: 0.90, 4: 0.87 if name == "miss-tasks" else 0.90})
    night(store, W17 + timedelta(hours=2), pair="old/old", workload="forgotten", **common,
          configs={("baseline", 0): V(100, rng=rng)})
    return store, url


@pytest.fixture(scope="module")
def analysis(planted):
    store, _ = planted
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    return {s["series"]["workload"]: s for s in a["series"]}, a


def test_version_bump_regression_names_its_cause(analysis):
    s, _ = analysis
    (reg,) = [r for r in s["bump"]["regressions"] if r["period"] == "week over week"]
    assert reg["verdict"] == "regression" and reg["config"] == "baseline"
    assert reg["ratio"] == pytest.approx(0.75, abs=0.02) and reg["p"] < 0.002
    assert reg["cause"] == ["mlx-lm 0.32.2 → 0.33.0"]


def test_draft_swap_is_the_cause_and_stays_in_its_series(analysis):
    s, _ = analysis
    regs = [r for r in s["swap"]["regressions"] if r["config"] == "speculative k=3"
            and r["period"] == "week over week"]
    assert regs and regs[0]["verdict"] == "regression"
    assert regs[0]["cause"] == ["draft weights sha256:" + "d" * 64 + " → sha256:" + "e" * 64]
    assert not [r for r in s["swap"]["regressions"] if r["config"] == "baseline"]


def test_throttled_night_is_reported_not_averaged(analysis):
    s, _ = analysis
    (base,) = s["hot"]["configs"]
    assert base["unreliable"] == 1 and base["runs"] == 7
    assert base["unreliable_reasons"] == ["thermal throttling (CPU speed limit 60%)"]
    assert base["decode_p50"] == pytest.approx(300, rel=0.02)
    assert not s["hot"]["regressions"]  # one hot night is not a regression


def test_stale_series_is_marked(analysis):
    s, a = analysis
    assert s["forgotten"]["stale"] and not s["good"]["stale"]
    assert a["counts"]["stale"] == 1


@pytest.mark.parametrize("name,gate", [
    ("miss-speedup", "speedup"), ("miss-itl", "itl_p95_ms"),
    ("miss-acceptance", "acceptance"), ("miss-ttft", "ttft_change"),
    ("miss-swap", "swap_peak_bytes"), ("miss-exact", "exact"),
    ("miss-tasks", "task_pass_rate")])
def test_each_gate_just_missed(analysis, name, gate):
    s, _ = analysis
    spec = [c for c in s[name]["configs"] if c["mode"] == "speculative"][0]
    assert spec["classification"] == f"just misses: {gate}"


def test_series_meeting_every_gate_is_a_production_candidate(analysis):
    s, _ = analysis
    spec = [c for c in s["good"]["configs"] if c["mode"] == "speculative"][0]
    assert spec["classification"] == "production candidate"
    assert all(g["passed"] is not False for g in spec["gates"].values())
    assert spec["speedup"] == pytest.approx(1.3, rel=0.02)
    assert not [x for x in s["good"]["signals"] if x["rule"] != "fallback-order"]


def test_signals_fire_with_their_evidence(analysis):
    s, _ = analysis
    rules = {x["rule"]: x for x in s["miss-swap"]["signals"]}
    assert rules["swap-pressure"]["evidence"]["swap_peak_bytes"] == pytest.approx(2e9,
                                                                                  rel=0.02)
    assert rules["swap-pressure"]["action"].startswith("Reduce concurrency")
    acc = {x["rule"] for x in s["swap"]["signals"]}
    assert "stop-widening" not in acc  # 0.50 acceptance does not trip the 0.45 rule


def test_review_files_and_browser(planted, tmp_path):
    store, url = planted
    r = CliRunner().invoke(main, ["review", "--week", "2026-W20", "--db", url, "--out",
                                  str(tmp_path)])
    assert r.exit_code == 0, r.output
    html, md, js = (tmp_path / f"review-2026-W20.{x}" for x in ("html", "md", "json"))
    data = json.loads(js.read_text())
    assert {x["series"]["workload"] for x in data["series"]} >= {"bump", "good", "forgotten"}
    assert "| **regression** |" in md.read_text()
    dom = dump_dom(html)
    assert dom.count('class="results"') >= 10
    assert dom.count("<svg") >= 3 and 'id="chart-speedup_vs_width"' in dom
    assert "mlx-lm 0.32.2 → 0.33.0" in dom and "production candidate" in dom


def test_bad_rules_file_names_file_and_line(tmp_path):
    bad = tmp_path / "rules.yml"
    bad.write_text("- id: x\n  when: __import__('os').system('id')\n  action: no\n")
    with pytest.raises(ConfigError, match=r"rules.yml:2: rule x: only comparisons"):
        load_rules(bad)


@pytest.mark.parametrize("rule, line, where", [
    ("- id: typo\n  when: best_acceptence < 0.42\n  action: no\n", 2, "when"),
    ("- id: typo\n  when: best_speedup < 1\n  action: no\n  evidence: [best_kk]\n", 4,
     "evidence"),
    ("- id: typo\n  when: best_speedup < 1\n  action: cap at {load_capp}\n", 3, "action"),
])
def test_a_rule_naming_an_unknown_metric_is_refused_with_its_line(tmp_path, rule, line, where):
    """A misspelt metric used to leave its rule silently never firing."""
    bad = tmp_path / "rules.yml"
    bad.write_text("- id: fine\n  when: best_speedup < 1.0\n  action: ok\n" + "\n".join(
        f"{x}" for x in rule.splitlines()) + "\n")
    with pytest.raises(ConfigError, match=rf"rules.yml:{line + 3}: rule typo: {where} names "
                                          r"unknown metric '\w+'; known: best_k, "):
        load_rules(bad)


def test_every_metric_the_review_computes_is_one_a_rule_may_name(analysis):
    """The registry rules are checked against is the set the review fills in."""
    from orchestrator.review.rules import METRICS

    _, a = analysis
    seen = {k for s in a["series"] for k in s.get("metrics") or {}}
    assert seen and seen <= set(METRICS)
    # the shipped rules name only registered metrics (they load), and fire on the planted week
    assert any(s.get("signals") for s in a["series"])


def test_the_rank_test_can_confirm_at_the_documented_minimum_even_with_a_tie():
    """7 runs a side is the documented minimum: fully separated samples must reach
    p < 0.002 whether or not a value repeats (the normal approximation gave 0.00214 with
    one tie, so such a regression could never be confirmed)."""
    from orchestrator.review.regression import MIN_REPS, REGRESSION_P, regression

    then = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 105.0]  # one tie
    now = [80.0, 81.0, 82.0, 83.0, 84.0, 85.0, 86.0]
    assert len(then) == len(now) == MIN_REPS
    mw = mann_whitney(then, now)
    assert mw["method"] == "exact permutation"
    assert mw["p"] == pytest.approx(2 / 3432)  # 2 of C(14, 7) splits are this extreme
    assert mw["p"] < REGRESSION_P
    rng = random.Random(1)
    for n1, n2, shift in [(7, 7, 1.0), (5, 9, 0.2), (30, 25, 0.5)]:  # scipy, as documented
        a = [rng.gauss(0, 1) for _ in range(n1)]
        b = [rng.gauss(shift, 1) for _ in range(n2)]
        assert 0 < mann_whitney(a, b)["p"] <= 1

    def runs(values):
        from orchestrator.review.week_runs import RunRow
        return [RunRow(i, "s", W20, "n", ("c",), "baseline", 0,
                       {"values": {"decode_tok_s": [v]}}, {}, None, False)
                for i, v in enumerate(values)]
    assert regression(runs(now), runs(then))["verdict"] == "regression"


def _low_acceptance_case(tmp_path, generations):
    from orchestrator.review.windows import failed_window_configs
    from tests.history import generation, ingest_lines, new_sweep

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    sid = new_sweep(store, W20)
    for ts, acc, k in generations:
        ingest_lines(store, sid, "n", [generation("speculative", k, acceptance_rate=acc)], ts)
    return {json.loads(key[4])["num_draft_tokens"]
            for key in failed_window_configs(store, [sid], 0.40, 300)}


def test_low_acceptance_fails_a_run_by_how_long_it_lasts_not_where_the_clock_is(tmp_path):
    """Sliding windows over generation time: "below 0.40 for more than two consecutive
    five-minute windows" is judged the same wherever the clock's five-minute marks fall."""
    mark = 1_800_000_000.0 - 1_800_000_000.0 % 300  # a clock-aligned five-minute mark
    cases = {
        # two low generations 2 s apart across a mark: one window of time, never a failure
        2: [(mark - 1, 0.30, 2), (mark + 1, 0.35, 2)],
        # 297 s of low acceptance inside one clock window: under ten minutes, passes
        3: [(mark + 1 + 33 * i, 0.30, 3) for i in range(10)],
        # eleven minutes of low acceptance, every 30 s: fails, whatever the alignment
        4: [(mark + 137 + 30 * i, 0.30, 4) for i in range(23)],
        # eleven minutes where only one generation in three is low: the median is fine (a
        # width the planted sweep's job gives: another is set aside at the ledger)
        6: [(mark + 30 * i, 0.30 if i % 3 == 0 else 0.70, 6) for i in range(23)],
    }
    failed = _low_acceptance_case(tmp_path, [g for gens in cases.values() for g in gens])
    assert failed == {4}


def test_the_ttft_guard_passes_at_exactly_its_limit_and_acceptance_is_per_config(tmp_path):
    """+8% exactly meets "TTFT ≤ +8%" (54/50 − 1 is 0.08000000000000007 in floating
    point); the acceptance floor judges each config by its own acceptance, so a width-4
    config that misses does not sink a width-2 config that clears it, and a series without
    width 4 is judged at the widths it has."""
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(5)
    exact = dict(jitter=0.0, rng=rng, itl_p95=20.0, swap=0)
    for at in week_nights(W20):
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="p", workload="edge",
              configs={("baseline", 0): V(100.0, ttft=50.0, **exact),
                       ("speculative", 2): V(130.0, acceptance=0.62, ttft=54.0, **exact),
                       ("speculative", 4): V(135.0, acceptance=0.50, ttft=54.0, **exact)})
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="p", workload="no-four",
              configs={("baseline", 0): V(100.0, ttft=50.0, **exact),
                       ("speculative", 3): V(130.0, acceptance=0.60, ttft=54.01, **exact)})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    by = {(s["series"]["workload"], c["k"]): c for s in a["series"] for c in s["configs"]
          if c["mode"] == "speculative"}
    k2, k4, k3 = by[("edge", 2)], by[("edge", 4)], by[("no-four", 3)]
    assert k2["gates"]["ttft_change"] == {"value": pytest.approx(0.08), "passed": True}
    assert k2["classification"] == "production candidate"
    assert k4["gates"]["acceptance"] == {"value": pytest.approx(0.50), "passed": False}
    assert k4["classification"] == "just misses: acceptance"
    assert k3["gates"]["acceptance"]["passed"] is True
    assert k3["classification"] == "just misses: ttft_change"  # +8.02%: over the limit


def test_acceptance_by_position_is_per_series(tmp_path):
    """Two chips, one workload and width: each series gets its own curve."""
    from tests.history import generation, ingest_lines

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(2)
    for chip, node, accepted in (("Apple M2 Max", "mac-01", 9), ("Apple M4", "mac-02", 3)):
        for at in week_nights(W20)[:2]:
            sid = night(store, at, node=node, chip=chip, pair="p", workload="code",
                        configs={("baseline", 0): V(100.0, rng=rng),
                                 ("speculative", 2): V(130.0, acceptance=0.6, rng=rng)})
            ingest_lines(store, sid, node, [generation(
                "speculative", 2, acceptance_rate=0.6, acceptance_by_position=[
                    {"position": 1, "drafted": 10, "accepted": accepted},
                    {"position": 2, "drafted": 10, "accepted": accepted - 2}])], at.timestamp())
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    curves = {s["series"]["chip"]: s["acceptance_by_position"] for s in a["series"]}
    assert curves == {"Apple M2 Max": [0.9, 0.7], "Apple M4": [0.3, 0.1]}


def test_runtimes_side_by_side_with_streaming_parity(tmp_path):
    rng = random.Random(5)
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    common = dict(node="mac-02", chip="Apple M4 Max", pair="llama-8b/llama-1b",
                  workload="code")
    for at in week_nights(W20):
        night(store, at, **common, configs={("baseline", 0): V(100, rng=rng),
                                            ("speculative", 4): V(130, acceptance=0.7,
                                                                  rng=rng)})
        sid = night(store, at, **common, engine="llama-server",
                    configs={("baseline", 0): V(110, rng=rng),
                             ("speculative", 4): V(150, acceptance=0.72, rng=rng)},
                    parity={("speculative", 4): {"checked": 3, "mismatches": 1,
                                                 "first_difference": 17, "tool_mismatches": 1}})
    # the night's next line (a seq far past its journal is set aside as forged)
    store.ingest(sid, "mac-02", [{"schema": 1, "seq": store.last_seq(sid, "mac-02") + 1,
                                  "type": "knob_effect",
                                  "ts": at.timestamp(),
                                  "variant": "draft-4", "workload": "code", "knob": "top_k",
                                  "values": [0, 40], "effect": False,
                                  "message": "knob had no effect: top_k in [0, 40] gave "
                                             "identical output"}])
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    (group,) = a["side_by_side"]
    rows = {r["engine"]: r for r in group["rows"]}
    assert set(rows) == {"mlx-lm", "llama-server"}
    assert rows["llama-server"]["parity_mismatches"] == 7
    assert rows["llama-server"]["tool_mismatches"] == 7
    # the merged table answers "which runtime is faster here, with and without speculation"
    fb, fs = group["fastest_baseline"], group["fastest_speculative"]
    assert (fb["engine"], fb["over"]) == ("llama-server", "mlx-lm")
    assert fb["ratio"] == pytest.approx(1.1, rel=0.03)
    assert (fs["engine"], fs["over"]) == ("llama-server", "mlx-lm")
    assert fs["ratio"] == pytest.approx(150 / 130, rel=0.03)
    assert rows["mlx-lm"]["best_speedup"] == pytest.approx(1.3, rel=0.03)
    llama = next(s for s in a["series"] if s["series"]["engine"] == "llama-server")
    spec = next(c for c in llama["configs"] if c["mode"] == "speculative")
    assert spec["classification"].endswith("streaming_parity")
    assert spec["parity_first_difference"] == 17
    from orchestrator.review.report import write_review

    out = write_review(store, tmp_path / "r.html", week="2026-W20", formats=("html", "md"),
                       now=NOW)
    dom = dump_dom(out["html"])
    assert dom.count('class="runtimes"') == 1 and "7 mismatches (7 in tool calls)" in dom
    assert dom.count('data-runtime="') == 2
    assert re.search(r"fastest without speculation: llama-server, 1\.[01]\d× mlx-lm; "
                     r"with speculation: llama-server at k=4, 1\.1\d× mlx-lm", dom)
    md = out["md"].read_text()
    assert "## Runtimes side by side" in md and "| llama-server | 1" in md
    # a runtime ignoring a knob is named in the review, not only in the journal
    assert "mac-02 · draft-4 · workload <code>code</code>: knob had no effect: top_k in " \
        "[0, 40]" in dom
    assert "## Notices from the agents" in md
    assert "streaming parity: 7 mismatches, first at offset 17" in dom


def test_a_plans_gates_decide_its_series_classification(tmp_path):
    """Declared = applied: the gates a plan writes into its lock are the ones its series
    are judged by (they were once locked and never read), and the page says so."""
    from tests.history import lock_doc

    def planted(name: str, lock: dict | None):
        rng = random.Random(7)  # the same nights in both stores: only the plan differs
        store = open_store(fresh_sqlite(tmp_path / name))
        for at in week_nights(W20):
            night(store, at, node="mac-07", chip="Apple M4", pair="a/b", workload="code",
                  lock=lock, configs={("baseline", 0): V(100, rng=rng, jitter=0.001),
                                      ("speculative", 4): V(110, acceptance=0.7, rng=rng,
                                                            jitter=0.001)})
        return store

    def classification(store) -> tuple[str, str]:
        (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
        (spec,) = [c for c in s["configs"] if c["mode"] == "speculative"]
        return spec["classification"], s["gates_from"]

    # 1.10× < 1.16× by default
    assert classification(planted("s.db", None)) == ("just misses: speedup", "defaults")
    store = planted("relaxed.db", lock_doc("relaxed", {}) | {"gates": {"min_speedup": 1.05}})
    assert classification(store) == ("production candidate", "plan relaxed")
    from orchestrator.review.report import write_review

    out = write_review(store, tmp_path / "r.html", week="2026-W20", formats=("html",),
                       now=NOW)
    assert "gates from plan relaxed: speedup ≥ 1.05×" in dump_dom(out["html"])


def test_one_verdict_per_series_with_evidence_in_words(tmp_path):
    """Each series gets exactly one decision by the documented precedence, its evidence
    in words and numbers, the draft-width rules that fired (not their contradicting
    actions side by side) and why a node's numbers may not transfer."""
    from orchestrator.review.report import write_review

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(9)
    mac = dict(node="mac-01", chip="Apple M2 Max", pair="p")
    ok = dict(itl_p95=20.0, swap=0, ttft=51.0, rng=rng)
    for at in week_nights(W20):
        night(store, at, workload="good", **mac, configs={
            ("baseline", 0): V(100.0, rng=rng), ("speculative", 2): V(125.0, acceptance=0.8, **ok),
            ("speculative", 4): V(130.0, acceptance=0.7, **ok)})
        night(store, at, workload="narrower", **mac, configs={
            ("baseline", 0): V(100.0, rng=rng), ("speculative", 2): V(112.0, acceptance=0.7, **ok),
            ("speculative", 4): V(104.0, acceptance=0.5, **ok)})
        night(store, at, workload="lighter", **mac, configs={
            ("baseline", 0): V(100.0, rng=rng), ("speculative", 2): V(103.0, acceptance=0.6, **ok),
            ("speculative", 3): V(108.0, acceptance=0.6, **ok)})
        night(store, at, workload="loss", node="ci-01", chip="Intel Xeon", pair="p", configs={
            ("baseline", 0): V(100.0, rng=rng), ("speculative", 3): V(94.0, acceptance=0.36, **ok)})
        night(store, at, workload="shaky", **mac, configs={("baseline", 0): V(100.0, rng=rng)})
        night(store, at, workload="shaky", **mac, sweep_id=None, unreliable="contended: 40%",
              configs={("speculative", 3): V(140.0, acceptance=0.7, **ok)})
    store.add_facts("ci-01", {"os_name": "Debian GNU/Linux", "os_build": "12 (bookworm)",
                              "chip": "Intel Xeon"})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    v = {s["series"]["workload"]: s["verdict"] for s in a["series"]}
    assert v["good"]["text"] == "production candidate at draft width 4"
    assert v["good"]["evidence"].startswith(
        "speculation at draft width 4 is 1.30× the baseline on 7 reliable runs")
    # nothing passes every gate: the fallback serves autoregressive, naming no failed width
    assert v["narrower"]["text"].startswith(
        "graded fallback step 1: serve autoregressive; no config passes every gate (the "
        "narrower draft width 2 is the fastest and still misses)")
    assert v["narrower"]["enable"] is None
    assert v["narrower"]["evidence"].endswith("; width 4 does worse")
    assert v["lighter"]["text"].startswith("graded fallback step 2: serve autoregressive")
    assert v["loss"]["text"] == "keep autoregressive: no draft width is faster than the baseline"
    assert v["loss"]["evidence"] == ("speculation at draft width 3 is 0.94× the baseline on 7 "
                                     "reliable runs; speedup 0.94 < 1.16; acceptance 0.36 < 0.55")
    assert {"net-loss", "draft-mismatch"} <= set(v["loss"]["rules"])
    assert v["loss"]["caveats"] == [
        "measured on Intel Xeon, not Apple Silicon: mlx ran on its CPU backend, so speedups "
        "need not transfer to a Mac's GPU", "the OS is Debian GNU/Linux 12 (bookworm), not macOS"]
    assert v["good"]["caveats"] == []
    assert v["shaky"]["text"] == "needs more data: no reliable speculative config this week"
    assert "contended: 40%" in v["shaky"]["evidence"]
    assert v["shaky"]["caveats"] == [
        "other processes competed for the CPU in some runs (set aside)"]
    assert a["counts"]["verdicts"] == {"production candidate": 1, "graded fallback": 2,
                                       "keep autoregressive": 1, "needs more data": 1}
    out = write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)
    dom = dump_dom(out["html"])
    assert dom.count("data-decision=") == len(a["series"]) == 5  # one row per series
    assert "Disable speculation" not in dom  # the verdict replaced the net-loss action
    assert "1 production candidate, 2 graded fallback, 1 keep autoregressive, 1 needs more " \
           "data" in dom
    md = out["md"].read_text()
    assert md.count("| keep autoregressive: no draft width is faster") == 1


def test_change_points_on_planted_nightly_histories(any_url, tmp_path):
    """Five weeks of nights per series: a step after a version bump (one change point, at
    the bump, naming it), a slow drift (one drift, no identity change), a one-night
    outlier and a noisy-but-flat series (none), and a bump 3 nights before the window's
    end (a possible step at its night, naming it). The database groups the nights: SQLite
    and PostgreSQL alike."""
    store = open_store(any_url)
    rng = random.Random(12)
    start = W20 - timedelta(days=28)
    nights = [start + timedelta(days=i, hours=2) for i in range(35)]
    bump_at = nights[20]
    for i, at in enumerate(nights):
        common = dict(node="mac-01", chip="Apple M2 Max", pair="p")
        night(store, at, workload="step", **common,
              configs={("baseline", 0): V(100.0 if at < bump_at else 80.0, rng=rng)},
              identity={"mlx_lm_version": "0.32.2" if at < bump_at else "0.33.0"})
        night(store, at, workload="drift", **common,
              configs={("baseline", 0): V(100.0 * (1 - 0.01 * i), rng=rng)})
        night(store, at, workload="outlier", **common,
              configs={("baseline", 0): V(60.0 if i == 17 else 100.0, rng=rng)})
        night(store, at, workload="noisy", **common,
              configs={("baseline", 0): V(100.0, rng=rng, jitter=0.06)})
        night(store, at, workload="late", **common,
              configs={("baseline", 0): V(100.0 if i < 32 else 85.0, rng=rng)},
              identity={"mlx_lm_version": "0.32.2" if i < 32 else "0.33.0"})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    cps = {s["series"]["workload"]: s["change_points"] for s in a["series"]}
    (step,) = cps["step"]
    assert step["date"] == bump_at.date().isoformat()
    assert step["size"] == pytest.approx(-0.2, abs=0.02) and step["p"] < 0.05
    assert step["changed"] == ["mlx-lm 0.32.2 → 0.33.0"] and step["config"] == "baseline"
    (drift,) = cps["drift"]  # one finding over its span, not steps along it
    assert drift["kind"] == "drift" and drift["size"] < -0.2 and drift["changed"] == []
    assert drift["date"] <= nights[2].date().isoformat() and \
        drift["until"] >= nights[32].date().isoformat()
    assert step["kind"] == "step"
    assert cps["outlier"] == [] and cps["noisy"] == []
    (late,) = cps["late"]  # at its night (not one early), the bump named
    assert late["kind"] == "possible step" and late["note"] == "confirm on the next nights"
    assert late["date"] == nights[32].date().isoformat()
    assert late["changed"] == ["mlx-lm 0.32.2 → 0.33.0"]
    from orchestrator.review.report import write_review

    dom = dump_dom(write_review(store, tmp_path / "r.html", week="2026-W20", formats=("html",),
                                now=NOW)["html"])
    table = dom.split('id="change-points"', 1)[1].split("</table>", 1)[0]
    assert table.count('data-kind="step"') == 1 and 'data-kind="drift"' in table
    assert "mlx-lm 0.32.2 → 0.33.0" in table and "outlier" not in table
    assert "possible step (confirm on the next nights)" in table
