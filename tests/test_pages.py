"""Pages a person reads in 30 seconds (issue 33): a headline per week, a busy node said once
at the top, what every series shares said once, short series labels with the full identity
on hover, words (never rule ids or gate names) in every cell, memory advice only with
memory evidence, no "-0.00" or "–×", and a one-night history drawn as a point with its
value. Planted stores, rendered in headless Chromium."""

import html
import random
import re
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.review.page import label_series
from orchestrator.review.report import write_review
from orchestrator.review.rules import fire, load_rules
from orchestrator.review.site import history_chart, write_site
from orchestrator.review.sweep_page import fmt_value, times
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.store_templates import fresh_sqlite
from tests.test_weekly_review import NOW, W20

CHIP = "Intel(R) Xeon(R) Processor"
PAIR = "models/target / draft-4bit"
BUSY = "1 of 1 trials unreliable (contended: other processes used 71% of the CPU (limit 25%))"
LINUX = {"chip": CHIP, "os_name": "Debian GNU/Linux", "os_build": "12 (bookworm)"}


def visible(dom: str) -> str:
    """The page's text as a reader sees it: no tags, attributes, styles or scripts."""
    dom = re.sub(r"<(style|script)\b.*?</\1>", "", dom, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def actions_table(dom: str) -> str:
    return dom.split('id="actions"', 1)[1].split("</table>", 1)[0]


def test_a_busy_week_says_so_once_at_the_top_and_rows_keep_what_differs(tmp_path):
    """Three series whose every run was set aside as contended on a Linux CPU node: the
    page says once, at the top, that the node was busy and what to do; the contention
    figures and the "may not transfer" text are no longer repeated in each row."""
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(4)
    for workload in ("code", "memo", "translation"):
        night(store, W20 + timedelta(hours=2), node="ci-01", chip=CHIP, pair=PAIR,
              workload=workload, unreliable=BUSY, configs={
                  ("baseline", 0): V(100.0, rng=rng),
                  ("speculative", 2): V(90.0, acceptance=0.4, rng=rng)})
    store.add_facts("ci-01", LINUX)
    out = write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)
    dom = dump_dom(out["html"])
    text = visible(dom)
    assert text.count("The node was busy:") == 1
    assert "6 of 6 runs were set aside because other processes competed for the CPU" in text
    assert "Run again when the machine is quiet" in text
    rows = actions_table(dom)
    assert rows.count("data-decision=") == 3
    assert "other processes used" not in rows  # the figures stay in each series' section
    assert visible(rows).count("2 of 2 runs set aside (busy node)") == 3
    # why the numbers may not transfer: said once, for every series, not per row
    assert text.count("not Apple Silicon") == 1
    assert "May not transfer, for every series:" in text
    assert "may not transfer because" not in rows  # no row has a caveat of its own
    assert text.count("This week:") == 1
    assert "run again when the node is quiet (3 series had no reliable runs" in text
    md = out["md"].read_text()
    assert md.count("**The node was busy:**") == 1 and md.count("not Apple Silicon") == 1
    assert md.count("2 of 2 runs set aside (busy node)") == 3


def test_a_partly_busy_week_says_the_busy_node_at_the_top_not_in_its_rows(tmp_path):
    """Two series set aside as contended and one measured quietly: the banner at the top
    says the node was busy; no row repeats "other processes competed for the CPU" as its
    own reason the numbers may not transfer (the demo's page on a busy machine did, 6×)."""
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(5)
    for workload in ("code", "memo", "translation"):
        night(store, W20 + timedelta(hours=2), node="ci-01", chip=CHIP, pair=PAIR,
              workload=workload, unreliable=BUSY if workload != "translation" else None,
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 2): V(90.0, acceptance=0.4, rng=rng)})
    store.add_facts("ci-01", LINUX)
    text = visible(dump_dom(write_review(store, tmp_path / "r.html", week="2026-W20",
                                         now=NOW)["html"]))
    assert text.count("The node was busy:") == 1
    assert "competed for the CPU in some runs" not in text
    assert text.count("2 of 2 runs set aside (busy node)") == 2


def quiet_week(store, rng, *, swap_in: int = 0, workloads=("code", "memo")) -> None:
    for at in week_nights(W20, 3):
        for workload in workloads:
            night(store, at, node="ci-01", chip=CHIP, pair=PAIR, workload=workload, configs={
                ("baseline", 0): V(100.0, ttft=50.0, mem=10.0e6, jitter=0.0, rng=rng),
                # a net loss whose TTFT is a hair under the baseline's (−0.04%): "+0%"
                ("speculative", 2): V(90.0, acceptance=0.38, ttft=49.98, mem=12.7e6,
                                      swap_in=swap_in, jitter=0.0, rng=rng)})
    store.add_facts("ci-01", LINUX)


def test_a_quiet_week_reads_in_words_with_short_labels(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    quiet_week(store, random.Random(5))
    out = write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)
    dom = dump_dom(out["html"])
    text = visible(dom)
    # a headline: what changed, what to do
    assert "This week: 2 series: 2 keep autoregressive" in text
    assert "What to do: keep serving autoregressive" in text
    # short labels: only what tells the series apart; the full identity on hover
    labels = re.findall(r'<span class="label" title="([^"]+)">([^<]+)</span>',
                        actions_table(dom))
    assert labels == [(f"{CHIP} · {PAIR} · code · short · mlx-lm", "code"),
                      (f"{CHIP} · {PAIR} · memo · short · mlx-lm", "memo")]
    assert "Every series: node Intel Xeon · pair target / draft-4bit · short context" in text
    assert "Intel(R)" not in visible(actions_table(dom))
    # words, not identifiers: the rules that fired and the gates a config missed
    for name in ("net-loss", "fallback-order", "draft-mismatch", "ttft_change", "fails:",
                 "best_speedup", "mem_increase"):
        assert name not in text, name
    assert "speculation is slower than the baseline" in text
    assert "speedup 0.90 < 1.16" in text  # the classification, as the comparison it made
    # the draft adds 27% of a 10 MB pair and the node never swapped: no memory advice
    assert "bigger-memory" not in text
    # nothing reads as a loss of nothing, nothing missing reads as a ratio
    assert "-0%" not in text and "-0.00" not in text and "–×" not in text
    assert "+0%" in text  # the TTFT change that rounds to zero
    md = out["md"].read_text()
    for name in ("net-loss", "fallback-order", "ttft\\_change", "-0%", "–×"):
        assert name not in md, name


def test_memory_advice_needs_memory_evidence(tmp_path):
    """The draft-memory rule fires only when the node swapped during the runs, and its
    evidence reads in words and megabytes."""
    rules = load_rules()
    tiny = {"mem_increase": 0.27, "mem_added_bytes": 2.7e6, "swap_in_nights": 0}
    assert "draft-memory" not in [s["rule"] for s in fire(rules, tiny)]
    assert "draft-memory" in [s["rule"] for s in fire(rules, {**tiny, "swap_in_nights": 2})]
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    quiet_week(store, random.Random(6), swap_in=4096, workloads=("code",))
    out = write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)
    text = visible(dump_dom(out["html"]))
    assert "move this series to a bigger-memory node" in text
    assert "memory the draft adds +27%; that is 2.7 MB; nights with swap-ins 3" in text


def test_a_one_night_history_is_a_point_with_its_value(tmp_path):
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    night(store, W20 + timedelta(hours=2), node="ci-01", chip=CHIP, pair=PAIR,
          workload="code", configs={("baseline", 0): V(484.5, jitter=0.0),
                                    ("speculative", 2): V(400.0, acceptance=0.5, jitter=0.0)})
    index = write_site(store, tmp_path / "site", week="2026-W20", now=NOW)
    page = next((tmp_path / "site" / "series").glob("*.html"))
    text = visible(dump_dom(page))
    assert "484.5 tok/s on 2026-05-11 (one night so far)" in text
    assert text.count("484.5") == 2  # the point's label and the nights table, no "484.5 … 484.5"
    row = visible(dump_dom(index))
    assert "484.5" in row and "Intel(R)" not in row.split("nightly decode", 1)[1]


def test_a_flat_history_names_its_level_once():
    from datetime import date

    nights = [(date(2026, 5, d), 484.5, {}) for d in (11, 12)]
    svg = history_chart(nights, [], [])
    assert svg.count(">484.5<") == 1 and "<polyline" in svg


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
       st.sampled_from([".2f", ".1f", ".0f", "+.2f", "+.0%", ".0%", ".2g", ".3f"]))
def test_no_value_reads_as_minus_zero(x, spec):
    text = fmt_value(x, spec)
    if text.startswith("-"):
        assert re.search(r"[1-9]", text), text  # a minus sign only on something
    assert float(text.rstrip("%")) == float(format(x, spec).rstrip("%"))  # same value
    assert times(None) == "–" and times(x, spec).endswith("×")


def test_minus_zero_cases():
    assert fmt_value(-0.001, ".2f") == "0.00"
    assert fmt_value(-0.0004, "+.0%") == "+0%"
    assert fmt_value(-0.02, ".2f") == "-0.02"
    assert fmt_value(None, ".2f") == "–" and times(1.234) == "1.23×"


PART = st.text("ab(R) /·", min_size=1, max_size=6)


@given(st.lists(st.tuples(PART, PART, PART, st.sampled_from(["short", "long"]),
                          st.sampled_from(["mlx-lm", "http"])), min_size=1, max_size=6,
                unique=True))
def test_short_labels_keep_series_apart(keys):
    """However the series differ, two series never share a short label, and each keeps
    its full identity."""
    sections = [{"series": dict(zip(("chip", "model_pair", "workload", "context_bucket",
                                     "engine"), k))} for k in keys]
    label_series(sections)
    assert len({s["short_label"] for s in sections}) == len(sections)
    assert [s["full_label"] for s in sections] == [" · ".join(k) for k in keys]


def test_a_busy_sweep_page_says_so_once_and_rows_keep_a_short_mark(tmp_path):
    """The sweep page of a busy node: one banner at the top, each row's "unreliable" cell
    a short mark with the figures on hover, the section's verdict in words; a row set aside
    for another reason (spread, throttling) keeps its reason in the cell."""
    from orchestrator.review.sweep_page import render_review
    from tests.history import generation, ingest_lines, new_sweep

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    sid = new_sweep(store, W20)
    busy = ["contended: other processes used 84% of the CPU (limit 25%)"]

    def knob(k: int) -> dict:  # the knob a speculative row is measured at
        return {"knob": "num_draft_tokens", "knob_value": k} if k else {}

    events = [generation(mode, k, unreliable=True, unreliable_reasons=busy, repetition=rep,
                         acceptance_rate=0.5 if k else None, **knob(k))
              for mode, k in (("baseline", 0), ("speculative", 2), ("speculative", 4))
              for rep in range(2)]
    events += [generation(mode, k, workload="memo", repetition=rep,
                          acceptance_rate=0.5 if k else None, **knob(k),
                          **({"unreliable": True, "unreliable_reasons": ["thermal throttling"]}
                             if k == 2 else {}))
               for mode, k in (("baseline", 0), ("speculative", 2)) for rep in range(2)]
    ingest_lines(store, sid, "local", events, W20.timestamp())
    dom = dump_dom(render_review(store, tmp_path / "sweep.html", sid))
    text = visible(dom)
    assert text.count("The node was busy:") == 1
    assert "3 of 5 rows were set aside because other processes competed for the CPU" in text
    assert "other processes used 84%" not in text  # on hover only
    assert 'title="contended: other processes used 84% of the CPU (limit 25%)' in dom
    assert text.count("busy node, set aside") == 3
    assert "No conclusion: every speculative row was set aside because the node was busy" \
        in text
    assert "thermal throttling" in text  # another reason is still said where it applies


def test_the_headline_never_says_switch_on_a_calibration_pair():
    """A planted week: a real candidate, a calibration pair's win, a series kept
    autoregressive and one with no reliable runs on a busy node."""
    from orchestrator.review.page import headline

    def s(workload, decision, k=None, calibration=None, provisional=None):
        return {"series": {"chip": "Apple M4", "model_pair": "t / d", "workload": workload,
                           "context_bucket": "short", "engine": "mlx-lm"},
                "short_label": workload, "calibration": calibration, "regressions": [],
                "verdict": {"decision": decision, "k": k, "provisional": provisional}}

    series = [s("code", "production candidate", 4),
              s("calib", "production candidate", 6, calibration={"layers": 16}),
              s("memo", "keep autoregressive"), s("chat", "needs more data")]
    counts = {"failed_sweeps": 0, "compared": 0, "verdicts": {
        "production candidate": 2, "graded fallback": 0, "keep autoregressive": 1,
        "needs more data": 1}}
    h = headline({"series": series, "counts": counts}, busy=True)
    assert h["changed"] == ("4 series: 2 production candidate, 1 keep autoregressive, 1 needs "
                            "more data; the calibration pair measured its known win")
    assert h["todo"] == ("switch on speculation for code (draft width 4); keep the others "
                         "autoregressive; run again when the node is quiet (1 series had no "
                         "reliable runs: it was busy, see below)")
    # on a quiet node the count agrees with its verb (the demo once said "1 series have")
    assert headline({"series": series, "counts": counts})["todo"].endswith(
        "measure again (1 series has no reliable runs yet)")
    counts["verdicts"]["needs more data"] = 2
    assert headline({"series": series, "counts": counts})["todo"].endswith(
        "measure again (2 series have no reliable runs yet)")


def test_a_configs_contention_readings_read_as_one_range(tmp_path):
    """The agent sends each run's contention readings as fields (events 1.8); a config's
    cell says them once, as the range of the shares, beside any other reason (a demo on a
    busy machine listed 18). A run stored before 1.8 has no field: its line shows as is."""
    from orchestrator.review.page import collapse_reasons

    share = "contended: other processes used {}% of the CPU (limit 25%)".format

    def run(lo, hi, limit=0.25):
        return {"low": lo, "high": hi, "limit": limit}

    assert collapse_reasons([share("56–59"), "thermal throttling", share(66)],
                            [run(0.56, 0.59), run(0.66, 0.66)]) == [
        "thermal throttling", "contended: other processes used 56–66% of the CPU (limit 25%)"]
    assert collapse_reasons([share(40), share(50)]) == [share(40), share(50)]  # before 1.8
    assert collapse_reasons([share(40), "contended: other processes used 90% of the CPU "
                             "(limit 50%)"], [run(0.4, 0.4), run(0.9, 0.9, 0.5)]) == [
        share(40), "contended: other processes used 90% of the CPU (limit 50%)"]
    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(5)
    for at, pct in zip(week_nights(W20, 3), (56, 71, 63)):
        night(store, at, node="ci-01", chip=CHIP, pair=PAIR, workload="code",
              unreliable=share(pct), contention={"shares": [pct / 100], "limit": 0.25},
              configs={("baseline", 0): V(100.0, rng=rng),
                       ("speculative", 2): V(90.0, rng=rng)})
    store.add_facts("ci-01", LINUX)
    out = write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)
    text = visible(dump_dom(out["html"]))
    assert text.count("contended: other processes used 56–71% of the CPU (limit 25%)") >= 2
    assert share(63) not in text


def _cv_reason(cv: int, limit: int = 10) -> str:
    # the agent's words (agent/summary.py config_summary)
    return (f"decode tok/s CV {cv}% ≥ {limit}%: rerun with more repetitions or check the node "
            "for background load")


def _needs_data(aside: list[dict]) -> dict:
    return {"verdict": {"decision": "needs more data", "evidence": "the long text",
                        "caveats": []}, "set_aside": aside, "configs": []}


def test_a_series_set_aside_for_its_spread_says_the_range_once_and_the_advice_at_the_top():
    from orchestrator.review.page import shared_once

    noisy = _needs_data([
        {"config": "baseline", "runs": 1, "of": 1, "reasons": [_cv_reason(20)]},
        {"config": "speculative k=2", "runs": 2, "of": 3, "reasons": [_cv_reason(15)]}])
    one = _needs_data([{"config": "baseline", "runs": 1, "of": 1, "reasons": [_cv_reason(13)]}])
    # another reason beside the spread: the row keeps its own evidence, whole
    mixed = _needs_data([{"config": "baseline", "runs": 1, "of": 1,
                          "reasons": [_cv_reason(12), "thermal throttling"]}])
    decided = {**_needs_data([{"config": "baseline", "runs": 1, "of": 2,
                               "reasons": [_cv_reason(30)]}])}
    decided["verdict"] = {**decided["verdict"], "decision": "keep autoregressive"}
    shared = shared_once([noisy, one, mixed, decided])
    assert shared["noisy"] == 2
    assert noisy["verdict"]["short_evidence"] == (
        "3 of 4 runs set aside (decode tok/s varied 15–20% across repetitions; the plan "
        "allows under 10%)")
    assert one["verdict"]["short_evidence"].startswith("1 of 1 runs set aside (decode tok/s "
                                                       "varied 13% across")
    for s in (mixed, decided):
        assert s["verdict"]["short_evidence"] == "the long text"
    assert "rerun with more repetitions" not in noisy["verdict"]["short_evidence"]


def test_a_busy_weeks_row_with_runs_also_set_aside_for_their_spread_stays_short(tmp_path):
    """A busy node's series whose baseline was contended and whose width's runs were set
    aside for their spread alone (a demo beside another job printed each run's reasons in
    full in such rows): the row says so in one line, the spread's figure kept, and the
    figures stay in the series' section."""
    import re

    from agent.stats import repetition_spread
    from tests.test_through_noise import _reason

    store = open_store(fresh_sqlite(tmp_path / 's.db'))
    rng = random.Random(6)
    night(store, W20 + timedelta(hours=2), node="ci-01", chip=CHIP, pair=PAIR,
          workload="code", unreliable=BUSY, configs={("baseline", 0): V(100.0, rng=rng)})
    noisy = V(90.0, acceptance=0.4, reps=4, rng=rng)
    noisy["decode_tok_s"] = [70.0, 90.0, 95.0, 120.0]  # the review recomputes the spread
    spread = round(100 * repetition_spread(noisy["decode_tok_s"]))
    night(store, W20 + timedelta(hours=3), node="ci-01", chip=CHIP, pair=PAIR,
          workload="code", unreliable=_reason(spread),
          spread={"value": spread / 100, "limit": 0.10}, configs={("speculative", 2): noisy})
    store.add_facts("ci-01", LINUX)
    dom = dump_dom(write_review(store, tmp_path / "r.html", week="2026-W20", now=NOW)["html"])
    rows = visible(actions_table(dom))
    assert "1 of 1 runs set aside" not in rows and "other processes used" not in rows
    assert re.search(r"2 of 2 runs set aside \(busy node; 1 of them for their decode-rate "
                     rf"spread alone, {spread}%\)", rows), rows
    assert f"decode tok/s spread {spread}%" in visible(dom)  # in the series' section
