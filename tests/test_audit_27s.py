"""Audit 27s: `compare`'s independent sides (compare._apart, night_ratio(apart=),
nightmemory.spread_df, LR_APART, ALPHA_APART) on layouts the authors did not plant, and
through_noise's pooled spread for a one- or two-trial side (night_ratio(few=)).

Every truth is planted here: nights of one node drawn as one AR(1) series of log levels
(σ 5%) and cut into sides as a calendar would (a missed Monday, a node away for months,
nights that alternate between two identities), stores planted through the real ingest
(tests.history.night) and trials drawn lognormal with the agent's own spread rule deciding
which configs were set aside. Issue 27's targets at a true ratio of 1.0: false claims ≤ 6%,
coverage ≥ 93%. A test marked xfail(strict) is a finding that fails today (its reason says
the severity and what was measured); a plain one is a guard that held.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.test_audit_27r import _ar1  # the same stationary AR(1) nights

Sides = tuple[list[float], list[float]]
W19 = datetime(2026, 5, 4, 2, tzinfo=timezone.utc)  # Monday of 2026-W19, 02:00 UTC


def _rates(xs: list[float]) -> list[float]:
    return [100 * math.exp(x) for x in xs]


def _score(draw: Callable[[random.Random], Sides], pairs: int, seed: int, apart: bool,
           ratio: float = 1.0) -> tuple[float, float]:
    """(claims, coverage of the true ``ratio``) of night_ratio read as compare reads the
    layout (``apart``); a claim as compare makes one (p < 0.01 and the interval off 1.0)."""
    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng = random.Random(seed)
    claims = covered = 0
    for _ in range(pairs):
        a, b = draw(rng)
        r = night_ratio(a, [ratio * x for x in b], apart=apart)
        claims += r["p"] < SIGNIFICANT_P and not r["ci"][0] <= 1.0 <= r["ci"][1]
        covered += r["ci"][0] <= ratio <= r["ci"][1]
    return claims / pairs, covered / pairs


# -- a store planted through the real ingest -------------------------------------------------

def _plant(store, node: str, days: list[int], level: float, *, chip: str = "Apple M2 Max",
           workload: str = "code", version: str | None = None, seed: int = 0,
           unreliable: str | None = None) -> None:
    """One nightly sweep of ``node`` on each of ``days`` (days after Monday of W19), decode
    at ``level`` × a 1% night wobble (seeded), three repetitions each."""
    from tests.history import config_values, night

    rng = random.Random(seed)
    for d in days:
        night(store, W19 + timedelta(days=d), node=node, chip=chip, pair="p",
              workload=workload, identity={"mlx_lm_version": version} if version else None,
              unreliable=unreliable,
              configs={("baseline", 0): config_values(level * (1 + rng.gauss(0, 0.01)), 3,
                                                      jitter=0.0)})


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """mac-01: W19 Mon-Fri for "code" and "chat"; W20 "code" Mon-Fri (Friday → Monday, 3
    days), W20 "chat" Tue-Fri (a missed Monday: 4 days). mac-02 (another chip, 60% of the
    speed) W19 and W20 "code" Mon-Fri. mac-03: nights alternating between two mlx-lm
    versions for ten days. mac-04: version 9.1 Monday to Friday of W19, version 9.2 on the
    Monday of W20 and then ten weeks later (W30) Monday to Friday. mac-05: W19 and W20
    Monday to Friday on mlx-lm 0.32.2, and on the Wednesday of W20 a second sweep on 0.33.0
    set aside (contended)."""
    from orchestrator.store import open_store
    from tests.store_templates import fresh_sqlite

    store = open_store(fresh_sqlite(tmp_path_factory.mktemp("a27s") / "s.db"))
    week, w20 = list(range(5)), list(range(7, 12))
    _plant(store, "mac-01", week + w20, 100.0, seed=1)
    _plant(store, "mac-01", week + w20[1:], 100.0, workload="chat", seed=2)
    _plant(store, "mac-02", week + w20, 60.0, chip="Apple M4 Max", seed=3)
    _plant(store, "mac-03", list(range(0, 10, 2)), 100.0, version="8.1.0", seed=4)
    _plant(store, "mac-03", list(range(1, 10, 2)), 100.0, version="8.2.0", seed=5)
    _plant(store, "mac-04", week, 100.0, version="9.1.0", seed=6)
    _plant(store, "mac-04", [7] + [77 + d for d in week], 100.0, version="9.2.0", seed=7)
    _plant(store, "mac-05", week + w20, 100.0, seed=8)
    _plant(store, "mac-05", [9], 70.0, version="0.33.0", seed=9,
           unreliable="contended: another process used 60% of the CPU")
    return store


def _rows(store, a: str, b: str, workload: str = "code") -> list[dict]:
    from orchestrator.review.compare import compare

    c = compare(store, a, b)
    return [r for r in c["rows"] if r["metric"] == "decode_tok_s" and r["workload"] == workload]


def test_the_calendar_decides_which_sides_are_apart(layouts):
    """Guard: each layout's `apart` is the calendar's answer: one node Friday → Monday (3
    days) joined, Friday → Tuesday (a missed Monday, 4 days) apart; sides holding several
    nodes compared node by node, each by its own calendar (mixed, they read apart before
    each node became its own row); one node's nights alternating day by day between two
    versions joined, which
    holds the targets there (φ 0.9, five nights a side, seed 11, 600 pairs: 0.0% false
    claims, 99.8% covered: the sides' means correlate, so the joined bound is
    conservative)."""
    got = {}
    for name, a, b, wl in (
            ("weekend", "node=mac-01,week=2026-W19", "node=mac-01,week=2026-W20", "code"),
            ("missed monday", "node=mac-01,week=2026-W19", "node=mac-01,week=2026-W20", "chat"),
            ("alternating", "node=mac-03,mlx_lm_version=8.1.0",
             "node=mac-03,mlx_lm_version=8.2.0", "code")):
        (got[name],) = _rows(layouts, a, b, wl)
    assert {k: r["apart"] for k, r in got.items()} == {
        "weekend": False, "missed monday": True, "alternating": False}
    fleet = {r["node"]: r for r in _rows(layouts, "2026-W19", "2026-W20")}
    assert fleet["mac-01"]["apart"] is False and fleet["mac-02"]["apart"] is False
    assert fleet["mac-01"] == {**got["weekend"], "node": "mac-01",
                               "series": got["weekend"]["series"] + " · mac-01"}
    assert got["missed monday"]["n"] == [5, 4] and got["alternating"]["n"] == [5, 5]
    for r in got.values():
        assert r["verdict"] != "B better" and r["verdict"] != "B worse", r

    def alternating(rng: random.Random) -> Sides:
        lv = _ar1(rng, 10, 0.9)
        return _rates(lv[0::2]), _rates(lv[1::2])

    claims, coverage = _score(alternating, 300, 11, got["alternating"]["apart"])
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


# audit 27s (low), fixed: only --json said which rows read their sides apart; the text
# and HTML rows now say "(sides apart: independent nights)"
def test_the_human_outputs_say_which_rows_read_their_sides_apart(layouts):
    from orchestrator.review.compare import as_text, compare
    from orchestrator.review.report import environment

    c = compare(layouts, "node=mac-01,week=2026-W19", "node=mac-01,week=2026-W20")
    assert sorted(r["apart"] for r in c["rows"] if r["metric"] == "decode_tok_s") == [False,
                                                                                       True]
    page = environment(True).get_template("compare.html.j2").render(c=c)
    for out in (as_text(c), page):
        chat = [ln for ln in out.splitlines() if "chat" in ln and "decode_tok_s" in ln]
        assert chat and any("apart" in ln or "independent" in ln for ln in chat), chat


# fixed: one node's sides are joined only as one unbroken run of nights (compare._apart).
# Found: severity low; sides joined by a single adjacent night were read as one series
# though the rest of a side was months away: 91.5% covered, 4.5% false claims (1,000
# pairs, seed 5); read apart 97.8%
def test_a_side_joined_by_one_night_but_months_away_meets_the_coverage_target(layouts):
    (row,) = _rows(layouts, "node=mac-04,mlx_lm_version=9.1.0", "node=mac-04,mlx_lm_version=9.2.0")
    assert row["n"] == [5, 6]
    apart = row["apart"]

    def near_far(rng: random.Random) -> Sides:
        lv = _ar1(rng, 12 + 2 + 1, 0.9)
        return _rates(lv[:12]), _rates(lv[14:] + _ar1(rng, 11, 0.9))

    claims, coverage = _score(near_far, 1000, 5, apart)
    assert claims <= 0.06 and coverage >= 0.93, (apart, claims, coverage)


def test_a_missed_monday_costs_power_not_coverage():
    """Guard, and the price of `apart` (JOINED_DAYS 3): the same node's weeks with one
    more night between them (a missed Monday) are read apart. Independent nights (φ 0),
    a true 20% difference, seed 99, 600 pairs: eight nights a side found in 82.0% read
    joined, 52.7% apart; five nights (a working week) 44.7% → 18.8%. Both readings cover
    the true 1.2 in ≥ 98.8%."""
    def weeks(n: int, gap: int) -> Callable[[random.Random], Sides]:
        def draw(rng: random.Random) -> Sides:
            lv = _ar1(rng, 2 * n + gap, 0.0)
            return _rates(lv[:n]), _rates(lv[n + gap:])
        return draw

    joined = _score(weeks(8, 2), 600, 99, False, ratio=1.2)
    apart = _score(weeks(8, 3), 600, 99, True, ratio=1.2)
    assert joined[0] >= 0.75 and apart[0] >= 0.45, (joined, apart)
    assert min(joined[1], apart[1]) >= 0.95, (joined, apart)


@pytest.mark.parametrize("offset", [0.05, 0.2])
def test_sides_mixing_two_nodes_unevenly_meet_the_targets(offset):
    """Guard: each side mixes two nodes whose levels differ by ``offset`` (log), unevenly (A:
    five nights of node 1 and two of node 2, B: two and five; each node's weeks back to
    back, φ 0.5), read apart as compare reads them: no node changed, so the true ratio is
    1.0 per node, and the interval holds it (seed 3, 600 pairs: 0.2% / 0.0% false claims,
    99.5% / 100% covered; 0.0% and ≥ 99.7% at φ 0): the node offset reads as memory and
    widens the interval, though its point estimate is the composition's
    (test_a_fleet_week_ratio_is_not_the_mix_of_its_nodes)."""
    def draw(rng: random.Random) -> Sides:
        a: list[float] = []
        b: list[float] = []
        for na, nb, off in ((5, 2, 0.0), (2, 5, offset)):
            lv = _ar1(rng, na + 2 + nb, 0.5)
            a += [x + off for x in lv[:na]]
            b += [x + off for x in lv[na + 2:]]
        return _rates(a), _rates(b)

    claims, coverage = _score(draw, 600, 3, True)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


# fixed: a value seen only in set-aside runs is listed marked "(set aside only)"
# (compare._identity). Found: severity low; W19 against W20 of one node on mlx-lm 0.32.2,
# plus one contended sweep on 0.33.0 set aside in W20, listed 'mlx_lm_version: 0.32.2 →
# 0.32.2, 0.33.0' above rows that hold no 0.33.0 run
def test_a_set_aside_run_is_no_identity_difference_unmarked(layouts):
    from orchestrator.review.compare import as_text, compare

    c = compare(layouts, "node=mac-05,week=2026-W19", "node=mac-05,week=2026-W20")
    assert c["runs"] == [5, 5] and len(c["set_aside"]) == 1
    (row,) = [r for r in c["rows"] if r["metric"] == "decode_tok_s"]
    assert row["n"] == [5, 5] and row["verdict"] == "same within noise", row
    text = as_text(c)
    listed = [ln for ln in text.splitlines() if ln.startswith("  mlx_lm_version")]
    assert not listed or all("set aside" in ln for ln in listed), listed


# fixed: where a side holds several nodes each node is its own row (compare._key). Found:
# severity low; a fleet's weeks compared whole (`compare 2026-W19 2026-W20`) pooled two
# chips' nodes in one row, so its ratio was the mix of nodes, not a change: no node changed
# (mac-01 60 tok/s on 7 W19 nights and 2 W20 nights, mac-02 100 tok/s on 2 and 7), yet B/A
# read 1.321 (the composition's (100/60)^(5/9) is 1.328)
def test_a_fleet_week_ratio_is_not_the_mix_of_its_nodes(tmp_path):
    from orchestrator.store import open_store
    from tests.store_templates import fresh_sqlite

    store = open_store(fresh_sqlite(tmp_path / "mix.db"))
    _plant(store, "mac-01", list(range(7)) + [7, 8], 60.0, seed=1)
    _plant(store, "mac-02", [0, 1] + list(range(7, 14)), 100.0, chip="Apple M4 Max", seed=2)
    rows = _rows(store, "2026-W19", "2026-W20")
    assert sorted(r["node"] for r in rows) == ["mac-01", "mac-02"], rows
    for row in rows:  # each node against itself: no change
        assert row["verdict"] == "same within noise", row
        assert row["ratio"] == pytest.approx(1.0, abs=0.05), row


@pytest.mark.xfail(strict=True, reason=(
    "severity: medium. Two nights three times as noisy (σ 15%) as the twenty they meet "
    "(σ 5%, iid, one node's weeks back to back): 9.9% false claims, 81.0% covered (1,000 "
    "pairs, seed 3; seeds 1-2: 8.8%, 8.2% / 83.6%, 83.8%; read apart 6.4% / 87.4%). The "
    "few-night rule keeps the two nights' own spread (the larger) but gives it the pooled "
    "df (1 + 19): audit 27r's guard stopped at twice as noisy (89.9%, no claim rate asserted). "
    "Not closable beside test_a_second_night_does_not_widen_the_interval (5 v 1 median "
    "log-width 0.469, 5 v 2 0.455), measured on seed 3 (cmp27): in 269 of 1,000 draws the two "
    "noisy nights spread no more than the twenty quiet ones (9·χ²₁ < 1); there the interval "
    "covers 56.5%, and even one night's (their mean read as one night, borrowing the quiet "
    "spread) 67.7%, so any rule no wider there than one night covers ≤ 91.3%. Tried: the "
    "pooled spread's Satterthwaite df (few_df 'spread') 81.6%, 9.5%, 5 v 2 0.524; Hsu's df "
    "where the few side's spread is the larger 89.6%, 6.6%, 5 v 2 0.850; Hsu throughout "
    "99.1%, 0%, 5 v 2 1.983 and no interval for one night"))
def test_two_noisy_nights_against_twenty_quiet_ones_meet_the_targets():
    def draw(rng: random.Random) -> Sides:
        return _rates(_ar1(rng, 20, 0.0)), _rates(_ar1(rng, 2, 0.0, sd=0.15))

    claims, coverage = _score(draw, 1000, 3, False)
    assert claims <= 0.06 and coverage >= 0.93, (claims, coverage)


# -- through the noise: a two-trial side set aside for its spread ----------------------------

def _lognormal(rng: random.Random, mean: float, cv: float, n: int) -> list[float]:
    s = math.sqrt(math.log(1 + cv * cv))
    return [mean * math.exp(rng.gauss(-s * s / 2, s)) for _ in range(n)]


def _through_noise(nb: int, ns: int, cv_spec: float, draws: int, seed: int,
                   gate: float = 1.16) -> tuple[float, float]:
    """(decisive passes, coverage of the true ratio) of through_noise.ratio_interval for a
    speculative config at a true ratio on the speedup gate, its ``ns`` trials at
    ``cv_spec`` beside ``nb`` quiet baseline trials (CV 2%), kept only where the agent's
    own spread rule (repetition_spread ≥ 10%) set it aside, as through_noise sees it."""
    from agent.stats import repetition_spread
    from orchestrator.review.through_noise import decisive, pass_interval, ratio_interval

    rng = random.Random(seed)
    passed = covered = n = 0
    while n < draws:
        base, spec = _lognormal(rng, 100, 0.02, nb), _lognormal(rng, 100 * gate, cv_spec, ns)
        if (repetition_spread(spec) or 0.0) < 0.10:
            continue
        n += 1
        iv, wide = ratio_interval(base, spec), pass_interval(base, spec, 0.95)
        assert iv is not None
        # a pass is read on the pass interval (night_timing_gates), a fail on the 95% one
        passed += wide is not None and decisive(wide[1], wide[2], gate, True) is True
        covered += iv[1] <= gate <= iv[2]
    return passed / draws, covered / draws


# fixed (compare._mean_variance, few_df "spread"). Found: severity: medium. A width set
# aside for its spread with two trials (CV 30%) beside twelve quiet baseline trials (CV
# 2%): its 95% interval covered the true ratio in 86.0% (2,000 set-aside draws, seed 1;
# seeds 2-3: 86.6%, 85.5%; eight baseline trials 87.8%, CV 40% 82.7%): the two trials'
# own spread (the larger: the spread set them aside) was credited with the summed df
# (1 + 11), Welch's old fault. The pooled spread's own df (~1 here): 98.0% (seeds 2-3:
# 97.9%, 97.7%; eight baseline trials 98.6%, CV 40% 96.55%)
def test_two_noisy_trials_beside_a_quiet_baseline_are_covered():
    _, coverage = _through_noise(12, 2, 0.30, 2000, 1)
    assert coverage >= 0.93, coverage


def test_two_noisy_trials_beside_a_quiet_baseline_never_pass_falsely():
    """The pass half of the finding above, fixed: a pass is read on the few-trial side's
    own df (through_noise.pass_interval, Hsu's rule), so two noisy trials at a true ratio
    on the gate pass in none of 2,000 set-aside draws (5.55% before, nominal 2.5%)."""
    passed, _ = _through_noise(12, 2, 0.30, 2000, 1)
    assert passed <= 0.025, passed


def test_three_noisy_trials_beside_a_quiet_baseline_are_covered():
    """Guard: the same with three trials (Welch on their own df): 97.7% covered, 0.6%
    decisive passes at a ratio on the gate (eight baseline trials, 4,000 draws, seed 11)."""
    passed, coverage = _through_noise(8, 3, 0.30, 1000, 11)
    assert coverage >= 0.93 and passed <= 0.025, (passed, coverage)


# -- properties --------------------------------------------------------------------------------

_night = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(a=st.lists(_night, min_size=1, max_size=10), b=st.lists(_night, min_size=1, max_size=10))
@example(a=[100.0, 101.0], b=[100.0, 130.0, 99.0])
@example(a=[100.0], b=[100.0, 150.0])
@example(a=[1.0], b=[1.0, 1.0])  # CI found it: one trial beside identical ones
def test_apart_is_never_narrower_and_sides_swap_exactly(a, b):
    """Property: for any positive nights, reading the sides apart never narrows the interval
    (φ at a wider bound, fewer df), and swapping A and B inverts the ratio and interval with
    the same p, apart or joined; through_noise's interval swaps the same way."""
    from orchestrator.review.compare import night_ratio
    from orchestrator.review.through_noise import ratio_interval

    joined, apart = night_ratio(a, b), night_ratio(a, b, apart=True)
    if joined["ci"] is None:
        assert apart["ci"] is None
        return
    assert apart["ci"][0] <= joined["ci"][0] * (1 + 1e-9)
    assert joined["ci"][1] <= apart["ci"][1] * (1 + 1e-9)
    for r, s in ((joined, night_ratio(b, a)), (apart, night_ratio(b, a, apart=True))):
        assert r["ci"][0] == pytest.approx(1 / s["ci"][1], rel=1e-6)
        assert r["p"] == pytest.approx(s["p"], rel=1e-6, abs=1e-12)
    x, y = ratio_interval(a, b), ratio_interval(b, a)
    if x is None:  # one trial beside identical ones: no spread measured, none either way
        assert y is None and min(len(a), len(b)) == 1
        assert len(set(a if len(a) > 1 else b)) == 1
        return
    assert y is not None
    assert x[1] == pytest.approx(1 / y[2], rel=1e-6)


# -- runtimes: a usage count believed without a tokenizer --------------------------------------

def _stream(chunks: list[str], usage: int, timings: dict | None = None):
    """A stream as the http engine records it: one chunk every 20 ms, the runtime's usage
    and timings."""
    from agent.httpengine import Stream

    s = Stream(timings=timings)
    for i, text in enumerate(chunks):
        s.add_text(0.02 * (i + 1), text)
    s.usage = {"completion_tokens": usage}
    s.done = True
    return s


# audit 27s (medium), fixed: a drafting runtime (llama-server's timings: draft_n 50,
# draft_n_accepted 40) streams 100 tokens as 60 chunks and reports usage 200 (double): it
# was believed; the bound now adds the accepted drafts the runtime reports (1.5 x 100)
def test_a_drafting_runtime_that_counts_usage_twice_is_flagged():
    from agent.httpengine import trace_of

    words = [f" w{i:03d}" for i in range(100)]
    chunks = [words[2 * i] + words[2 * i + 1] for i in range(40)] + words[80:]
    t = trace_of(_stream(chunks, 200, {"draft_n": 50, "draft_n_accepted": 40}))
    assert t.fields["chunks"] == 60 and len(t.output_text.split()) == 100
    assert len(t.token_times) in (100, 200)  # 200: the double count believed
    assert t.fields["token_source"] != "usage" or t.fields.get("usage_problem"), t.fields


# fixed: usage above 1.5 a chunk is taken only as unverified, its problem said
# (agent.httpengine.token_count). Found (low): a double count of 100 CJK characters, one a
# chunk, read as 200 tokens and was believed silently
def test_a_runtime_that_counts_cjk_usage_twice_is_flagged():
    from agent.httpengine import trace_of

    chunks = [chr(0x4E00 + i) for i in range(100)]
    t = trace_of(_stream(chunks, 200))
    assert t.fields["chunks"] == 100
    assert t.fields["token_source"] != "usage" or t.fields.get("usage_problem"), t.fields


def test_a_plain_runtime_that_counts_ascii_usage_twice_is_flagged():
    """Guard: the same double count on ASCII words, one a chunk, no drafting: 200 > 1.5 x
    100 chunks, so the chunks are counted and the disagreement said."""
    from agent.httpengine import trace_of

    t = trace_of(_stream([f" w{i:03d}" for i in range(100)], 200))
    assert t.fields["token_source"] == "chunks" and t.fields["usage_problem"], t.fields


# -- --fail-on: a node down all week, and the flag given twice ---------------------------------

@pytest.fixture(scope="module")
def down_week(tmp_path_factory) -> str:
    """W19: mac-01 (M2 Max) and mac-02 (M4 Max) each measure a good width (speculative k=4
    1.3× the baseline) five nights; W20: mac-01 alone, with a second series whose width
    misses the speedup gate (1.05×). mac-02 was down all of W20."""
    from orchestrator.store import open_store
    from tests.history import config_values, night, week_nights
    from tests.store_templates import fresh_sqlite

    url = fresh_sqlite(tmp_path_factory.mktemp("a27s-down") / "s.db")
    store, rng = open_store(url), random.Random(1)

    def configs(speedup: float) -> dict:
        return {("baseline", 0): config_values(100.0, rng=rng),
                ("speculative", 4): config_values(100.0 * speedup, acceptance=0.7, ttft=51.5,
                                                  rng=rng)}
    monday = W19.replace(hour=0)
    for at in week_nights(monday):
        for node, chip in (("mac-01", "Apple M2 Max"), ("mac-02", "Apple M4 Max")):
            night(store, at, node=node, chip=chip, pair="gemma", workload="good",
                  configs=configs(1.3))
    for at in week_nights(monday + timedelta(days=7)):
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="gemma", workload="good",
              configs=configs(1.3))
        night(store, at, node="mac-01", chip="Apple M2 Max", pair="gemma", workload="slow",
              configs=configs(1.05))
    store.engine.dispose()
    return url


def _fail_on(url: str, out, *args: str):
    from click.testing import CliRunner

    from orchestrator.cli import main

    return CliRunner().invoke(main, ["review", "--week", "2026-W20", "--db", url, "--out",
                                     str(out), "--format", "json", *args])


# audit 27s (medium), fixed: `--fail-on` given twice (as CI files often write flags) kept
# only the last, silently: `--fail-on gate-miss --fail-on stale` exited 1 with '1
# finding(s) for --fail-on stale', the gate miss and its no-data dropped. Now each adds.
def test_fail_on_given_twice_keeps_both(down_week, tmp_path):
    one = _fail_on(down_week, tmp_path / "a", "--fail-on", "gate-miss")
    assert one.exit_code == 1 and any(x.startswith("gate-miss:") for x in one.stderr.splitlines())
    both = _fail_on(down_week, tmp_path / "b", "--fail-on", "gate-miss", "--fail-on", "stale")
    assert both.exit_code in (1, 2), both.output
    lines = both.stderr.splitlines()
    assert both.exit_code == 2 or (any(x.startswith("gate-miss:") for x in lines)
                                   and any(x.startswith("stale:") for x in lines)), lines


# audit 27s (medium), fixed: a node down all week passed `--fail-on gate-miss` (which
# brought no-data only): its series measured in W19 has no run in W20 and no-data leaves
# that to `stale`. gate-miss now brings stale too.
def test_a_node_down_all_week_is_no_data_for_gate_miss(down_week, tmp_path):
    r = _fail_on(down_week, tmp_path / "c", "--fail-on", "gate-miss")
    lines = r.stderr.splitlines()
    assert any(x.startswith("gate-miss:") and "slow" in x for x in lines), lines
    assert any(x.startswith(("no-data:", "stale:")) and "M4 Max" in x for x in lines), lines
