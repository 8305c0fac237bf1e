"""Audit 44 of the last commits on main (8856dac, 5157a14, f6dbc9a, 8d6cab8), attacked as a
hostile node, a careless user and a statistician, with inputs written here:

1. ``series._paired_nights`` / ``_nights_with`` and ``through_noise.baseline_at``: through
   the noise, each speculative config paired with the baseline whose nights pair most with
   it (``through_noise["against"]``). Two widths measured beside two different
   autoregressive variants (one twice as fast as the other) in one series; the memory read
   back; the baseline chosen when two variants tie, in both run orders.
2. ``through_noise.baseline_of``'s reliable ranking (``paired_nights``: sweeps shared with a
   speculative run, then reliable nights): one variant in four sweeps of one night beside
   the config, another beside it on the two other nights.
3. ``through_noise._narrowed`` (three nights or more: t narrowed to the nights' hull; a
   pass where t passes or every night passes alone): seeded, bounded simulations of false
   passes on the gate (1.16) at 3, 4 and 6 nights, nightly wobble 0/10/30%, families of 1
   and 4 widths (a week counts once if any width passes), 6 v 6 and 20 v 20 trials, CV
   20%; the printed '95% interval''s coverage at 3+ nights.
4. ``weekly._say_failed`` and ``configs.knob_suffix``: a node's generation error with a
   newline, a Markdown heading and HTML beside a candidate width; variant names with
   quotes, backslashes, non-ASCII letters, 200 characters, and names that are numbers,
   in the review's md/html/json, JUnit and compare (real CLI via subprocess).

A strict xfail is a finding (severity, what was measured); a plain test is a guard that
held."""

from __future__ import annotations

import json
import random
from xml.etree import ElementTree as ET

import pytest

from orchestrator.review.rules import load_rules
from orchestrator.review.through_noise import nights_ratio_interval
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import C, config_values, ingest_lines, night, week_nights
from tests.store_templates import fresh_sqlite
from tests.test_audit_41 import SPREAD, _cfg
from tests.test_audit_audit27z import cli, review
from tests.test_audit_audit42 import HTTP, _base, _plant
from tests.test_audit_audit43 import _draw, _failed, _passed, _rate
from tests.test_through_noise import MIN_SPEEDUP
from tests.test_weekly_review import NOW
from tests.truth.weeks import W20, WEEK

# -- 1. through the noise, each width against the baseline it pairs with most -------------


def _spec(rng, rate: float, k: int) -> dict:
    return {C("speculative", k, variant="spec"): _cfg(rng, rate, 0.8, mem=3.0e9)}


def _noisy(sweep: dict) -> list:
    return [(0, {**HTTP, **SPREAD}, sweep)]


@pytest.fixture(scope="module")
def two_references(tmp_path_factory):
    """Six nights, every config set aside for its spread alone: nights 1-3 baseline variant
    'a' (100 tok/s) beside width 2 (200 tok/s); nights 4-6 variant 'b' (50 tok/s, 0.5 GB)
    beside width 3 (120 tok/s, 3 GB) (seed 2: every night's spread confirmed)."""
    rng = random.Random(2)
    nights = [_noisy({**_base("a", rng, 100.0), **_spec(rng, 200.0, 2)}) for _ in range(3)]
    nights += [_noisy({**_base("b", rng, 50.0, mem=0.5e9), **_spec(rng, 120.0, 3)})
               for _ in range(3)]
    return _plant(tmp_path_factory.mktemp("tworefs"), nights)


def _against(s: dict) -> dict:
    return {c["k"]: json.loads(c["through_noise"]["against"])["variant"]
            for c in s["configs"] if c.get("through_noise")}


def test_widths_of_one_verdict_are_judged_against_one_reference(two_references):
    """Was high: through the noise two widths of one series are judged against different
    baselines and the verdict compares their ratios: width 2 (200 tok/s) 2.01x against
    variant 'a' (100 tok/s, 3 nights), width 3 (120 tok/s) 2.44x against variant 'b' (50
    tok/s, 3 nights); the verdict is 'production candidate at draft width 3', the width that
    decodes 40% slower, and the policy serves it"""
    _, s = two_references
    against = _against(s)
    assert len(set(against.values())) == 1 or s["verdict"].get("k") == 2, \
        (against, s["verdict"]["text"])


def test_guard_the_picks_memory_is_read_against_its_own_baseline(two_references):
    """Guard: one reference for the series ('a', on as many nights as 'b', the first), so
    width 3, never beside it, is not judged; the pick, width 2, reads its memory against
    'a', as ``through_noise.against`` says (was: each width its own, {2: a, 3: b})."""
    _, s = two_references
    assert _against(s) == {2: "a"} and s["verdict"]["k"] == 2, s["verdict"]["text"]
    base = next(c for c in s["configs"] if c["mode"] == "baseline"
                and json.loads(c["config_id"])["variant"] == "a")
    pick = next(c for c in s["configs"] if c["k"] == 2)
    assert s["metrics"]["mem_increase"] == pytest.approx(
        pick["peak_memory"] / base["peak_memory"] - 1), s["metrics"]


@pytest.mark.parametrize("b_first", [False, True])
def test_guard_against_is_the_same_whichever_variant_ran_first(tmp_path, b_first):
    """Guard: three noisy nights, variants 'a' and 'b' and width 2 in one sweep, 'b' planted
    first or last: width 2 is paired with 'a' (base_key's first, key order) both ways."""
    rng = random.Random(2)
    nights = []
    for _ in range(3):
        a, b = _base("a", rng, 100.0), _base("b", rng, 100.0)
        nights.append(_noisy({**(b if b_first else a), **(a if b_first else b),
                              **_spec(rng, 200.0, 2)}))
    _, s = _plant(tmp_path, nights)
    assert _against(s) == {2: "a"}, s["verdict"]["text"]


# -- 2. the reliable baseline: sweeps beside the config, before nights ---------------------

def test_four_sweeps_of_one_night_do_not_outrank_two_nights(tmp_path):
    """Was high: variant 'a' beside width 2 in four sweeps of night 1 (2.0x there), variant 'b'
    beside it on nights 2 and 3 (1.05x): 'a' has more shared sweeps (4 v 2) and is the
    baseline; width 2's speedup, 2.11x, is read from night 1 alone, and the verdict is
    'production candidate at draft width 2 · spec' on '6 reliable runs', not provisional
    (its reliable nights are 3); the unit of evidence is the night"""
    rng = random.Random(1)
    one = [(h, HTTP, {**_base("a", rng, 100.0), **_spec(rng, 200.0, 2)}) for h in range(4)]
    two = [[(0, HTTP, {**_base("b", rng, 100.0), **_spec(rng, 105.0, 2)})] for _ in range(2)]
    _, s = _plant(tmp_path, [one, *two])
    v = s["verdict"]
    assert v["decision"] != "production candidate" or "provisional" in v, v["text"]


# -- 3. three nights or more: t narrowed to the nights' hull ------------------------------

def _family_rate(nights: int, tau: float, family: int, draws: int, seed: int,
                 trials: int = 6) -> float:
    """Weeks in which any of ``family`` widths at the gate (1.16) passes."""
    rng, hits = random.Random(seed), 0
    for _ in range(draws):
        hits += any(_passed(_draw(rng, MIN_SPEEDUP, [(trials, trials)] * nights, tau),
                            family) is True for _ in range(family))
    return hits / draws


def test_guard_false_passes_at_three_nights_or_more_stay_at_the_level():
    """Guard: 6 v 6 trials, CV 20%, a true ratio on the gate: weeks with a false pass at
    3/4/6 nights and 0/10/30% nightly wobble, one width: 1.8-3.2% at 1,000 weeks (seed 7),
    2.1-3.05% where re-drawn at 2,000; four widths (Bonferroni, a week counts once): 2.0-
    4.0% at 500 weeks, 2.0-2.75% re-drawn at 800 (target 2.5% + Monte Carlo error). Run
    here at 400 and 300 weeks."""
    for nights in (3, 4, 6):
        for tau in (0.0, 0.1, 0.3):
            got = _family_rate(nights, tau, 1, 400, 11)
            assert got <= 0.045, (nights, tau, got)
    for nights, tau in ((6, 0.0), (3, 0.3)):
        got = _family_rate(nights, tau, 4, 300, 12)
        assert got <= 0.045, (nights, tau, got)


def test_long_wobbling_nights_pass_at_most_at_the_level():
    """Was medium: the narrowing's 'or every night passes alone' adds false passes where nights
    are long: 20 v 20 trials a night, CV 20%, nightly wobble 30%, a true ratio on the gate,
    three nights: 4.65% of weeks pass (2,000 weeks, seed 13) where t alone passes 2.6%; 30 v
    30: 4.55% v 2.2%; 12 v 12: 3.45% v 2.55% (the level promises 2.5%: each night's interval
    knows nothing of the wobble, and three tight nights above the gate happen one week in 8
    x P)"""
    passed, _ = _rate(3, MIN_SPEEDUP, tau=0.3, draws=2000, counts=[(20, 20)] * 3, seed=13)
    assert passed <= 0.035, passed


def _cover(nights: int, tau: float, trials: int, draws: int, seed: int = 5) -> float:
    rng, hit = random.Random(seed), 0
    for _ in range(draws):
        iv = nights_ratio_interval(_draw(rng, 1.5, [(trials, trials)] * nights, tau))
        hit += iv[1] <= 1.5 <= iv[2]
    return hit / draws


def test_guard_the_printed_interval_at_three_nights_or_more_covers_95_percent():
    """Guard: 6 v 6 trials, the printed '95% interval' (t narrowed) covers a true 1.5x in
    94.4-95.1% of weeks at 3/4/6 nights and 0/10/20/30% wobble (1,000 weeks each; the ITL
    level's 94.1-95.8%). Run here at 400 weeks on 3 and 6 nights."""
    for nights in (3, 6):
        for tau in (0.0, 0.3):
            got = _cover(nights, tau, 6, 400)
            assert 0.92 <= got <= 0.98, (nights, tau, got)


def test_the_narrowed_interval_of_long_wobbling_nights_covers_95_percent():
    """Was low: the printed '95% interval' at three nights of 20 v 20 trials with a 30% nightly
    wobble covers a true 1.5x in 92.1% and 90.1% of weeks (2,000 weeks, seeds 5 and 6; four
    nights 95.5%): where every night is tight and all three wobble one way, the hull of the
    nights' own intervals, which know nothing of the wobble, cuts t's interval short (6 v 6
    trials: 94.4-95.1%)"""
    got = _cover(3, 0.3, 20, 1000, seed=6)
    assert got >= 0.935, got


# -- 4. a node's words: failed generations and variant names -------------------------------

HOSTILE = ['say "hi" \\ there', "草稿-ß"]
ERROR = "weights missing\n## forged heading\n<img src=x onerror=alert(1)>|a|b"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Three nights. mac-01 (mlx-lm, code): widths 2 and 3 fail every night with ``ERROR``,
    width 4 measured at 1.30x. ci-01 (llama-server via http, code): a baseline and width 3
    under each ``HOSTILE`` variant name, and width 4 as variant 1 (a number) and as '1'."""
    d = tmp_path_factory.mktemp("hostile44")
    url = fresh_sqlite(d / "s.db")
    store, rng = open_store(url), random.Random(4)
    for at in week_nights(W20, 3):
        sid = night(store, at, node="mac-01", chip="Apple M2 Max", pair="g / d",
                    workload="code", configs={
                        C("baseline", 0): config_values(100.0, jitter=0),
                        C("speculative", 4): config_values(130.0, acceptance=0.8, jitter=0)})
        ingest_lines(store, sid, "mac-01", [_failed(2, error=ERROR), _failed(3, error=ERROR)],
                     at.timestamp())
        cfgs = {C("baseline", 0, variant="plain"): config_values(100.0, rng=rng)}
        for i, name in enumerate(HOSTILE):
            cfgs[C("speculative", 3, variant=name)] = config_values(
                140.0 + i, acceptance=0.8, rng=rng)
        cfgs[C("speculative", 4, variant=1)] = config_values(150.0, acceptance=0.8, rng=rng)
        cfgs[C("speculative", 4, variant="1")] = config_values(90.0, acceptance=0.8, rng=rng)
        night(store, at, node="ci-01", chip="Apple M2 Max", pair="g / d", workload="code",
              engine="http", configs=cfgs)
    r, a, md, html = review(url, d / "o", "--fail-on", "no-data", "--junit",
                            str(d / "j.xml"))
    c = cli("compare", "week=2026-W20", "week=2026-W20", "--json", db=url)
    assert c.returncode == 0, c.stderr
    return {"r": r, "a": a, "md": md, "html": html, "junit": (d / "j.xml").read_text(),
            "compare": json.loads(c.stdout)}


def _series(h: dict, engine: str) -> dict:
    return next(s for s in h["a"]["series"] if s["series"]["engine"] == engine)


def test_guard_a_failed_generations_note_forges_nothing(hostile):
    """Guard: the candidate at width 4 says the other widths' generations failed; the error's
    newline, heading and HTML forge no Markdown heading, no HTML element, no CLI line."""
    s = _series(hostile, "mlx-lm")
    assert s["verdict"]["decision"] == "production candidate", s["verdict"]["text"]
    assert "6 speculative generations failed" in s["verdict"]["evidence"]
    assert not [x for x in hostile["md"].splitlines() if x.startswith("## forged")]
    assert "<img" not in hostile["html"]
    assert not [x for x in hostile["r"].stderr.splitlines() if x.startswith("## forged")]
    ET.fromstring(hostile["junit"])


def test_guard_hostile_variant_names_keep_every_label_apart(hostile):
    """Guard: a name with quotes and a backslash and one in CJK letters each get a label of
    their own (JSON-quoted) in the review JSON and compare's rows; the JUnit parses; the
    quoted name's row in the Markdown stays one row."""
    s = _series(hostile, "http")
    labels = [c["label"] for c in s["configs"] if c["k"] != 4]
    assert len(set(labels)) == len(labels) == 3, labels
    assert 'speculative k=3 · "say \\"hi\\" \\\\ there"' in labels, labels
    rows = [x["config"] for x in hostile["compare"]["rows"] if x["metric"] == "decode_tok_s"
            and "k=4" not in x["config"]]
    assert len(set(rows)) == len(rows), rows
    assert [x for x in hostile["md"].splitlines() if "hi" in x and x.startswith("| k=3")]
    ET.fromstring(hostile["junit"])


def test_variant_1_and_variant_one_get_two_labels(hostile):
    """Was low: a hostile node's config with variant 1 (a number) and another with variant '1'
    are two configs (150 and 90 tok/s) under one label, 'speculative k=4 · 1', in the review
    JSON (knob_suffix prints str(variant) unquoted as it matches the plain pattern);
    likewise True and 'True', and variant 0 or '' reads as no variant at all"""
    s = _series(hostile, "http")
    labels = [c["label"] for c in s["configs"] if c["k"] == 4]
    assert len(set(labels)) == len(labels) == 2, labels


@pytest.mark.xfail(strict=True, reason="medium: a variant name of 200 characters (plain "
                   "letters) loses its name and its speedup: width 3 under it measured 1.40x "
                   "(140 v 100 tok/s, 3 nights) is labelled 'speculative k=3', like the "
                   "variant-less width 3 beside it (0.90x), has speedup None, and the verdict "
                   "is 'keep autoregressive: no draft width is faster than the baseline'; at "
                   "129 characters it is a candidate (the break lies between 129 and 200). "
                   "Left for a node that sends one (runs.config_key holds 255 characters): "
                   "a plan now refuses a name over 64 at lock time, with its line")
def test_a_long_variant_name_keeps_its_label_and_speedup(tmp_path):
    store, rng = open_store(fresh_sqlite(tmp_path / "s.db")), random.Random(4)
    for at in week_nights(W20, 3):
        night(store, at, node="ci-01", chip="Apple M2 Max", pair="g / d", workload="code",
              engine="http", configs={
                  C("baseline", 0, variant="plain"): config_values(100.0, rng=rng),
                  C("speculative", 3, variant="v" * 200): config_values(140.0, acceptance=0.8,
                                                                        rng=rng),
                  C("speculative", 3): config_values(90.0, acceptance=0.8, rng=rng)})
    (s,) = analyse(store, WEEK, load_rules(), now=NOW)["series"]
    long = next(c for c in s["configs"] if "v" * 200 in c["config_id"])
    assert "v" * 200 in long["label"] and long["speedup"] is not None, long["label"]
    assert s["verdict"]["decision"] == "production candidate", s["verdict"]["text"]


def test_a_non_ascii_variant_name_is_printed_as_written(hostile):
    """Was low: a variant named in letters that are not ASCII ('草稿-ß') is printed as JSON
    escapes on every page: label 'speculative k=3 · "\u8349\u7a3f-\u00df"' in md, html and
    json (json.dumps' ensure_ascii); the name the operator gave is nowhere readable"""
    s = _series(hostile, "http")
    assert any("草稿-ß" in c["label"] for c in s["configs"]), [c["label"] for c in
                                                              s["configs"]]
    assert "草稿-ß" in hostile["md"]
