"""Audit 43 of today's changes on main (8b3570e..467a6c1), attacked as a hostile node, a
careless user and a statistician, with inputs written here:

1. ``through_noise.nights_ratio_interval`` / ``nights_level_interval`` / ``_hull``: two
   paired nights judged on the hull of each night's own interval, three or more on Student's
   t over nightly log ratios. Seeded, bounded simulations (lognormal trials, CV 20%, the
   nightly ratio wobbling by τ) of false passes on the gate, of verdicts as nights are added
   (1 → 2 → 3 → 4) at a family of 1 and 4 widths, of nights with very unequal trial counts,
   and of what the two-night "95% interval" covers (the ratio and the ITL level); one week
   through the real ingest and ``analyse``.
2. ``through_noise.baseline_of`` / ``series.base_key`` / ``series._config_table``: which
   autoregressive variant is the baseline where variants were measured on different nights
   and in different sweeps from the speculative config (tests/test_audit_audit42.py's
   planting helpers).
3. ``week_sweeps.failed_speculation``, the verdict "needs more data: the speculative
   generations failed this week" and ``ci.no_data``: a node's error text in the CLI's
   ``--fail-on`` lines, the JUnit report, a week where some widths failed, failures a node
   sends for a workload it never ran (real CLI via subprocess).
4. ``configs.knob_suffix`` with an http runtime's variant in every label: variant names
   holding ' · ', pipes, HTML and newlines in review md/html/json, compare, site, policy,
   JUnit.

A strict xfail is a finding (severity, what was measured); a plain test is a guard that
held."""

from __future__ import annotations

import json
import math
import random
from datetime import timedelta
from xml.etree import ElementTree as ET

import pytest

from orchestrator.review.rules import load_rules
from orchestrator.review.through_noise import (
    interval_gate,
    nights_level_interval,
    nights_ratio_interval,
    pass_level,
)
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import C, config_values, event_config, ingest_lines, night, week_nights
from tests.history import config_values as V
from tests.store_templates import fresh_sqlite
from tests.test_audit_41 import SPREAD
from tests.test_audit_audit27z import cli, h2s, review
from tests.test_audit_audit42 import HTTP, _base, _by, _on, _plant, _spec
from tests.test_through_noise import MIN_SPEEDUP, _reason, lognormal
from tests.test_weekly_review import NOW
from tests.truth.weeks import GOOD, W20, WEEK, Config, Series, Week, plant

# -- 1. two nights on the hull, three on t -------------------------------------------------


def _passed(nights: list, family: int):
    """The speedup gate over ``nights`` as the review reads it (a pass at the family's
    level, a fail at 95%): True, False or None (undecided)."""
    lv = pass_level(family)
    ivs = nights_ratio_interval(nights), nights_ratio_interval(nights, lv, passing=True)
    return interval_gate(ivs, MIN_SPEEDUP, True, level=lv)["passed"]


def _draw(rng, true: float, counts, tau: float = 0.0) -> list:
    return [(lognormal(rng, 100, nb), lognormal(rng, 100 * true * math.exp(rng.gauss(0, tau)),
                                                ns)) for nb, ns in counts]


def _rate(nights: int, true: float, *, family: int = 1, tau: float = 0.0,
          draws: int = 1000, seed: int = 7, counts=None) -> tuple[float, float]:
    """(decisive passes, decisive fails) over ``draws`` weeks of ``nights`` nights."""
    rng, p, f = random.Random(seed), 0, 0
    for _ in range(draws):
        got = _passed(_draw(rng, true, counts or [(6, 6)] * nights, tau), family)
        p, f = p + (got is True), f + (got is False)
    return p / draws, f / draws


THIRD_NIGHT = ("medium (left: the fix failed audit 44): at three "
    "nights Student's t on the nightly ratios (two df, t 8.9 at 98.75% for "
    "four widths) can be undecided where two nights passed and the third "
    "passes alone (25.7% of weeks); letting every night passing alone pass "
    "(_narrowed, 8856dac) made 4.65% false passes at the gate on long nights "
    "wobbling 30% (20 v 20 trials) and a 92% interval: reverted, t is the "
    "week's answer from three nights")


@pytest.mark.xfail(strict=True, reason=THIRD_NIGHT)
def test_a_third_night_that_passes_alone_does_not_undo_two_nights_pass():
    """Medium, open: at a family of 4 widths a true 2x (6 v 6 trials a night, CV 20%, no wobble,
    1,000 weeks, seed 3) passes on nights 1 and 2 together and on night 3 alone, yet the
    three nights together are undecided in 25.7% of weeks (t on three nightly ratios at the
    98.75% level has 2 df, t 8.9, against each night's ~10 df): pass rates by nights 91.7%,
    83.6%, 60.7%, then 97.0% at four (seed 7); at a family of 1 the same flip is 1.8%"""
    rng, flips, both = random.Random(3), 0, 0
    for _ in range(1000):
        ns = _draw(rng, 2.0, [(6, 6)] * 3)
        if _passed(ns[:2], 4) is True and _passed(ns[2:], 4) is True:
            both += 1
            flips += _passed(ns, 4) is not True
    assert flips / 1000 <= 0.05, (flips, both)


def _noisy_week(tmp_path, nights: int, seed: int, ratios: dict[int, float]) -> dict:
    """``nights`` nights, every config set aside for its spread alone (6 trials a side)."""
    rng = random.Random(seed)
    store = open_store(fresh_sqlite(tmp_path / f"n{nights}-{seed}.db"))

    def cfg(rate: float, acc=None) -> dict:
        v = V(rate, reps=6, acceptance=acc, rng=rng)
        v["decode_tok_s"] = lognormal(rng, rate, 6)
        return v

    for at in week_nights(W20, nights):
        night(store, at + timedelta(hours=1), node="ci-01", chip="Apple M2 Max",
              pair="target / draft", workload="code", unreliable=_reason(36),
              spread={"value": 0.36, "limit": 0.10},
              configs={("baseline", 0): cfg(100.0),
                       **{("speculative", k): cfg(100.0 * r, 0.9) for k, r in ratios.items()}})
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    return s["verdict"]


@pytest.mark.xfail(strict=True, reason=THIRD_NIGHT)
def test_through_the_review_a_third_night_keeps_a_two_night_candidate(tmp_path):
    """Medium, open: through the real ingest, four widths at a true 2x, every config set aside
    for its spread (seed 0): two nights read 'production candidate at draft width 2,
    provisional: 2 of 3 nights' (1.98x, 95% interval 1.38-3.19), the same two nights and a
    third read 'needs more data: no reliable baseline this week'"""
    widths = {2: 2.0, 3: 2.0, 4: 2.0, 5: 2.0}
    two, three = _noisy_week(tmp_path, 2, 0, widths), _noisy_week(tmp_path, 3, 0, widths)
    assert two["decision"] == "production candidate", two["text"]
    assert three["decision"] == "production candidate", three["text"]


@pytest.mark.xfail(strict=True, reason="low: a true ratio on the gate (1.16) whose nights "
                   "wobble by 30% (6 v 6 trials, CV 20%, 2,000 weeks, seed 7): two nights "
                   "pass falsely in 5.3% of weeks (the level promises 2.5%; the hull's "
                   "intersection-union test holds per night, not for the week's ratio); over "
                   "1,000 weeks one night 23.0% (provisional), two 4.9%, three 2.4%; at 20% "
                   "wobble two nights 2.2%")
def test_two_wobbling_nights_on_the_gate_pass_at_most_at_the_level():
    passed, _ = _rate(2, MIN_SPEEDUP, tau=0.3, draws=2000)
    assert passed <= 0.03, passed


def test_guard_three_nights_on_the_gate_pass_at_the_level_whatever_the_wobble():
    """Guard: t on three nightly ratios at the gate: 2.3%, 3.0%, 2.4% false passes at 10%,
    20%, 30% wobble (1,000 weeks each)."""
    for tau in (0.1, 0.2, 0.3):
        passed, _ = _rate(3, MIN_SPEEDUP, tau=tau)
        assert passed <= 0.04, (tau, passed)


@pytest.mark.xfail(strict=True, reason="medium: a true 0.5x on one night of 10 v 10 trials "
                   "fails decisively in ~100% of weeks; add a second night of 2 v 2 trials "
                   "and the hull fails it in 28.9% (2,000 weeks, seed 9), a third night "
                   "(10 v 10) brings it back to 98.75%: a short night (two repetitions, or a "
                   "node that sends two) withdraws a decided answer; a true 2x passes 5.7% "
                   "of weeks with that short night (91.3% with three nights)")
def test_a_short_second_night_does_not_withdraw_a_decisive_fail():
    one = _rate(1, 0.5, counts=[(10, 10)], seed=9, draws=2000)[1]
    two = _rate(2, 0.5, counts=[(2, 2), (10, 10)], seed=9, draws=2000)[1]
    assert one >= 0.95 and two >= 0.9 * one, (one, two)


def test_guard_unequal_nights_over_three_make_no_false_pass():
    """Guard: three nights of very unequal trial counts (1 v 1 beside 8 v 8 twice; 2 v 10,
    10 v 2, 6 v 6; 1 v 1 twice beside 10 v 10) at the gate: false passes 1.2-2.35%
    (2,000 weeks, seed 9); a two-night week with a one-trial night has no interval (never a
    pass, never a fail)."""
    for counts in ([(1, 1), (8, 8), (8, 8)], [(2, 10), (10, 2), (6, 6)],
                   [(1, 1), (1, 1), (10, 10)]):
        passed, _ = _rate(3, MIN_SPEEDUP, counts=counts, seed=9, draws=2000)
        assert passed <= 0.03, (counts, passed)
    assert _rate(2, 0.5, counts=[(1, 1), (10, 10)], draws=200) == (0.0, 0.0)


def _coverage(nights: int, tau: float, level: bool, draws: int = 2000) -> float:
    rng, hit = random.Random(5), 0
    for _ in range(draws):
        if level:  # an ITL p95 at 20 ms, each night's level wobbling by tau
            iv = nights_level_interval([lognormal(rng, 20 * math.exp(rng.gauss(0, tau)), 6)
                                        for _ in range(nights)])
            hit += iv[1] <= 20 <= iv[2]
        else:
            iv = nights_ratio_interval(_draw(rng, 1.5, [(6, 6)] * nights, tau))
            hit += iv[1] <= 1.5 <= iv[2]
    return hit / draws


def test_the_interval_printed_for_two_nights_says_what_it_is(tmp_path):
    """Was low: every page printed two nights' hull as a '95% interval' (evidence '1.98x the
    baseline (95% interval 1.38-3.19)', gate cells, CI lines); it covers the true ratio in
    99.95% of weeks with no wobble and 91.35% at a 30% nightly wobble, the ITL level's
    99.85% and 87.2% (2,000 weeks, 6 v 6 trials, CV 20%). It is what the gate reads (both
    nights must pass on their own), so it stays, named for what it is; one night's and
    three nights' intervals are 95% ones (the guard below)."""
    got = {(tau, lv): _coverage(2, tau, lv, draws=500) for tau in (0.0, 0.3)
           for lv in (False, True)}
    assert min(got.values()) < 0.93 or max(got.values()) > 0.97, got  # no 95% interval
    two = _noisy_week(tmp_path, 2, 0, {2: 2.0})
    assert "span of both nights' 95% intervals" in two["evidence"], two["evidence"]
    assert "95% interval 1" not in two["evidence"] + two["through_noise"]["text"], two
    one = _noisy_week(tmp_path, 1, 0, {2: 2.0})
    assert "(95% interval " in one["evidence"], one["evidence"]


def test_guard_three_nights_interval_covers_95_percent():
    got = [_coverage(3, tau, lv, draws=1000) for tau in (0.0, 0.3) for lv in (False, True)]
    assert all(0.925 <= c <= 0.975 for c in got), got


# -- 2. the baseline a sampling's speedups are read against -------------------------------


def test_a_baseline_never_in_the_speculative_configs_sweeps_is_not_its_baseline(tmp_path):
    """Was medium: baseline variant 'a' measured alone on nights 1-3 (a sweep without the
    speculative config), variant 'b' beside the speculative config on nights 4-5: 'a' has
    the most reliable nights and is the baseline, the speculative config (2x against 'b' in
    its own sweeps, 2 reliable nights) gets no speedup, and the verdict says 'needs more
    data: no reliable speculative config this week'"""
    rng = random.Random(1)
    alone = [(0, HTTP, _base("a", rng))]
    both = [(0, HTTP, {**_base("b", rng), **_spec(rng, 200.0)})]
    a, s = _plant(tmp_path, [alone, alone, alone, both, both])
    assert _by(s, "speculative")["speedup"] is not None, s["verdict"]["text"]
    assert s["verdict"]["decision"] == "production candidate", s["verdict"]["text"]


def _once_reliable(tmp_path, with_a: bool):
    """Three nights: baseline 'b' and the speculative config (3x) in one sweep a night, both
    set aside for their spread alone; ``with_a``: on night 1 a reliable baseline 'a' in a
    sweep of its own an hour before."""
    rng, noisy = random.Random(2), {**HTTP, **SPREAD}
    nights = [[(1, noisy, {**_base("b", rng), **_spec(rng, 300.0)})] for _ in range(3)]
    if with_a:
        nights[0].insert(0, (0, HTTP, _base("a", rng)))
    return _plant(tmp_path, nights)


def test_guard_without_the_one_reliable_variant_three_noisy_nights_switch_on(tmp_path):
    a, s = _once_reliable(tmp_path, with_a=False)
    assert _by(s, "speculative")["through_noise"]["nights"] == 3
    assert "provisional" not in s["verdict"] and _on(a), s["verdict"]["text"]


def test_one_reliable_night_of_another_variant_does_not_unpair_three_nights(tmp_path):
    """Was medium: a baseline variant reliable once (night 1, a sweep of its own) is chosen
    over the variant measured beside the speculative config in its sweep on all three nights
    (set aside for its spread alone, as is the config): the verdict rests on night 1's
    pairing, 'provisional: 1 of 3 nights' (2.78x, 95% 2.14-3.60) and the policy off; without
    that one sweep, 3 nights paired and the policy on"""
    a, s = _once_reliable(tmp_path, with_a=True)
    assert _by(s, "speculative")["through_noise"]["nights"] == 3, s["verdict"]["text"]
    assert "provisional" not in s["verdict"] and _on(a), s["verdict"]["text"]


# -- 3. speculative generations that failed ------------------------------------------------

def _failed(k: int, workload: str = "code", error: str = "draft model failed to load") -> dict:
    return {"type": "generation_failed", "workload": workload, "mode": "speculative",
            "num_draft_tokens": k, "config": event_config("speculative", k), "error": error}


FORGED = "weights missing\nregression: mac-01 · code: speculative k=9: 9.000× (p=0, n=9 vs 9)"


@pytest.fixture(scope="module")
def all_failed(tmp_path_factory):
    """Three nights of a baseline alone, width 2's generation failing each night with a
    node's error holding a newline and a line shaped as a regression."""
    d = tmp_path_factory.mktemp("allfailed")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    for at in week_nights(W20, 3):
        sid = night(store, at, node="mac-01", chip="Apple M2 Max", pair="g / d",
                    workload="code", configs={C("baseline", 0): config_values(100.0,
                                                                              jitter=0)})
        ingest_lines(store, sid, "mac-01", [_failed(2, error=FORGED)], at.timestamp())
    r, a, md, html = review(url, d / "o", "--fail-on", "no-data", "--junit",
                            str(d / "j.xml"))
    return r, a, md, html, ET.parse(d / "j.xml").getroot()


def test_guard_a_week_whose_speculation_failed_exits_1_and_says_so(all_failed):
    r, a, md, html, _ = all_failed
    assert r.returncode == 1
    v = a["series"][0]["verdict"]
    assert v["text"] == "needs more data: the speculative generations failed this week"
    # the node's text stays on its row in the Markdown and is escaped in the HTML
    (row,) = [x for x in md.splitlines() if "weights missing" in x]
    assert "regression: mac-01" in row


def test_a_nodes_error_cannot_forge_a_line_of_fail_on_output(all_failed):
    """Was medium: a node's generation_failed error with a newline forges a line of --fail-on
    output: stderr holds 'regression: mac-01 · code: speculative k=9: 9.000× (p=0, n=9 vs
    9); see the sweep page' as a line of its own under 'no-data: …' (ci.no_data quotes
    errors[0][:200] raw)"""
    r, *_ = all_failed
    assert not [x for x in r.stderr.splitlines() if x.startswith("regression:")], r.stderr


def test_junit_reports_a_week_whose_speculation_failed(all_failed):
    """Was medium: the week whose every speculative generation failed exits 1 on --fail-on
    no-data, but its JUnit report has failures=0: the series' 'gates' case is skipped, 'no
    speculative config measured reliably this week', with no word that the generations
    failed"""
    *_, junit = all_failed
    text = ET.tostring(junit, encoding="unicode")
    assert int(junit.get("failures")) >= 1 or "failed" in text, text


@pytest.fixture(scope="module")
def some_failed(tmp_path_factory):
    """Three nights: widths 2 and 3 fail every night, width 4 measured (1.30x, reliable);
    node mac-02 measures a plain 'chat' series and sends a failure for 'code', which it
    never ran."""
    d = tmp_path_factory.mktemp("somefailed")
    url = fresh_sqlite(d / "s.db")
    store = open_store(url)
    for at in week_nights(W20, 3):
        sid = night(store, at, node="mac-01", chip="Apple M2 Max", pair="g / d",
                    workload="code", configs={
                        C("baseline", 0): config_values(100.0, jitter=0),
                        C("speculative", 4): config_values(130.0, acceptance=0.8, jitter=0)})
        ingest_lines(store, sid, "mac-01", [_failed(2), _failed(3)], at.timestamp())
        sid = night(store, at, node="mac-02", chip="Apple M2 Max", pair="g / d",
                    workload="chat", configs={C("baseline", 0): config_values(100.0, jitter=0)})
        ingest_lines(store, sid, "mac-02", [_failed(2, "code")], at.timestamp())
    return review(url, d / "o", "--fail-on", "no-data")


def test_guard_failures_for_a_workload_never_run_touch_no_series(some_failed):
    r, a, *_ = some_failed
    chat = next(s for s in a["series"] if s["series"]["workload"] == "chat")
    assert "speculation_failed" not in chat and r.returncode == 0, r.stderr
    assert "failed" not in chat["verdict"]["text"]


def test_a_candidate_among_the_widths_that_ran_says_the_others_failed(some_failed):
    """Was low: widths 2 and 3 failed on every night (6 generation_failed), width 4 measured
    1.30x: the verdict is 'production candidate at draft width 4' and neither the Markdown
    nor the verdict's evidence says two of the three widths were never measured (the errors
    are in the JSON's speculation_failed only)"""
    r, a, md, _ = some_failed
    code = next(s for s in a["series"] if s["series"]["workload"] == "code")
    assert code["verdict"]["decision"] == "production candidate"
    assert "failed" in code["verdict"]["evidence"] or "draft model failed" in md


# -- 4. an http runtime's variant in every label -------------------------------------------

EVIL = "x | y\n<script>alert(1)</script>"


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """llama-server nights: baselines 'plain' at temperature 0 and 0.7; width 3 as variant
    'a · temperature 0.7' at temperature 0 (150 tok/s) and as variant 'a' at temperature
    0.7 (90 tok/s); width 4 as a variant named with a pipe, a newline and HTML."""
    d = tmp_path_factory.mktemp("variants43")
    url = fresh_sqlite(d / "s.db")
    plant(open_store(url), Week("v", (Series("code", (
        Config("baseline", decode=100.0, knobs=(("variant", "plain"),)),
        Config("baseline", decode=100.0, knobs=(("variant", "plain"), ("temperature", 0.7))),
        Config("speculative", 3, knobs=(("variant", "a · temperature 0.7"),), decode=150.0,
               **GOOD),
        Config("speculative", 3, knobs=(("variant", "a"), ("temperature", 0.7)),
               decode=90.0, **GOOD),
        Config("speculative", 4, knobs=(("variant", EVIL),), decode=95.0, **GOOD)),
        engine="llama-server"),)))
    pol = d / "policy.json"
    r, a, md, html = review(url, d / "out", "--policy", str(pol), "--junit", str(d / "j.xml"))
    c = cli("compare", "week=2026-W20", "week=2026-W20", "--json", db=url)
    site = cli("site", str(d / "site"), "--week", WEEK, db=url)
    assert c.returncode == 0 and site.returncode == 0, c.stderr + site.stderr
    return {"a": a, "md": md, "html": html, "policy": json.loads(pol.read_text()),
            "compare": json.loads(c.stdout), "site": h2s(d / "site"),
            "junit": (d / "j.xml").read_text()}


def test_guard_a_hostile_variant_name_breaks_no_page(variants):
    """Guard: the pipe/newline/HTML variant keeps its Markdown row whole, is escaped in the
    review and site HTML, the JUnit parses, and the policy names the picked variant and its
    sampling."""
    (row,) = [x for x in variants["md"].splitlines() if "alert(1)" in x]
    assert row.startswith("| k=4") and row.count(" | ") >= 7 and "\\|" in row, row
    assert "<script>" not in variants["html"]
    assert not any("<script>" in h for hs in variants["site"].values() for h in hs)
    ET.fromstring(variants["junit"])
    (entry,) = variants["policy"]["series"]
    assert entry["variant"] == "a · temperature 0.7"
    assert entry["sampling"]["temperature"] == 0.0


def test_a_variant_name_cannot_pass_for_a_sampling_knob(variants):
    """Was low: a variant named 'a · temperature 0.7' (at temperature 0, 1.50x) and variant 'a'
    at temperature 0.7 (0.90x) share one label, 'speculative k=3 · a · temperature 0.7', in
    the review JSON, compare's rows and the site's headings; the verdict 'production
    candidate at draft width 3 · a · temperature 0.7' reads as the 0.90x one (only the
    policy's variant and sampling fields tell them apart)"""
    (s,) = variants["a"]["series"]
    labels = [c["label"] for c in s["configs"]]
    rows = [x["config"] for x in variants["compare"]["rows"] if x["metric"] == "decode_tok_s"]
    (heads,) = variants["site"].values()
    assert len(set(labels)) == len(labels), labels
    assert len(set(rows)) == len(rows) and len(set(heads)) == len(heads), (rows, heads)
