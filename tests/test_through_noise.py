"""Deciding through the noise (review.through_noise): a config set aside for its
decode-rate spread alone is judged on the gates that do not hang on timing, and on 95%
intervals for those that do; a decision reached so is decisive and marked. Planted with
lognormal trial noise of CV 20% and a known true ratio, through the real ingest."""

from __future__ import annotations

import math
import random
import re
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.rules import load_rules
from orchestrator.review.through_noise import decisive, ratio_interval
from orchestrator.review.verdict import policy
from orchestrator.review.weekly import analyse
from orchestrator.store import open_store
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.store_templates import fresh_sqlite
from tests.test_weekly_review import NOW, W20

SIGMA = math.sqrt(math.log(1 + 0.20 ** 2))  # the log-sd of a lognormal of CV 20%
FLOOR, MIN_SPEEDUP = 0.55, 1.16


def lognormal(rng: random.Random, mean: float, n: int) -> list[float]:
    return [mean * math.exp(rng.gauss(0, SIGMA)) for _ in range(n)]


def _reason(pct: int) -> str:
    return (f"decode tok/s spread {pct}% ≥ 10% over 4 repetitions (robust CV, or how far a "
            "third of them lie from the median): rerun with more repetitions or check the "
            "node for background load")


def plant(path, seed: int, *, ratios: dict[int, float], acceptance: float, nb: int, ns: int,
          scale: float = 1.0, busy: bool = False) -> dict:
    """One night of one series, every config set aside for its spread alone (36%): the
    baseline's ``nb`` trials at 100 tok/s × ``scale``, each width's ``ns`` at its true
    ratio; ``busy``: a second sweep that night set aside as contended. Its verdict."""
    rng = random.Random(seed)
    store = open_store(fresh_sqlite(path))
    at = week_nights(W20, 1)[0] + timedelta(hours=1)

    def cfg(rate: float, n: int, acc=None) -> dict:
        v = V(rate, reps=n, acceptance=acc, rng=rng)
        v["decode_tok_s"] = lognormal(rng, rate, n)
        return v

    common = dict(node="ci-01", chip="Apple M2 Max", pair="target / draft", workload="code")
    night(store, at, **common, unreliable=_reason(36), spread={"value": 0.36, "limit": 0.10},
          configs={("baseline", 0): cfg(100.0 * scale, nb),
                   **{("speculative", k): cfg(100.0 * scale * r, ns, acceptance)
                      for k, r in ratios.items()}})
    if busy:  # noise of another kind: never evidence, whatever its numbers say
        night(store, at + timedelta(hours=2), **common,
              unreliable="other processes took 60% of the CPU (limit 20%)",
              configs={("baseline", 0): cfg(300.0, nb),
                       ("speculative", min(ratios)): cfg(900.0, ns, 0.99)})
    a = analyse(store, "2026-W20", load_rules(), now=NOW)
    (s,) = a["series"]
    return {"verdict": s["verdict"], "configs": s["configs"], "policy": policy(a),
            "store": store}


def test_a_trained_like_pair_is_kept_autoregressive_through_the_noise(tmp_path):
    """The demo's trained pair at one repetition: 0.5× and acceptance 0.40 at every width,
    one trial a width against four of the baseline's, the baseline set aside for its
    spread (a width's one trial has none: the agent never sets it aside for one)."""
    got = plant(tmp_path / "s.db", 1, ratios={2: 0.5, 3: 0.5, 4: 0.5}, acceptance=0.40,
                nb=4, ns=1)
    v = got["verdict"]
    assert v["decision"] == "keep autoregressive", v
    assert v["provisional"] == {"nights": 1, "needed": 3}
    # the spread shown is recomputed from the run's stored trials (the baseline's four: a
    # CV-20% draw, not the 36% planted as the node's claim)
    assert re.match(r"keep autoregressive: every draft width fails a gate, provisional: 1 "
                    r"of 3 nights; decided through the noise: decode tok/s varied \d+% "
                    r"\(the plan allows under 10%\), acceptance 0.40 < 0.55 at every width",
                    v["text"]), v["text"]
    spec = [c for c in got["configs"] if c["mode"] == "speculative"]
    # every number stays marked: no speedup in the table (its baseline was set aside),
    # classified as judged through the noise
    assert all(c["speedup"] is None for c in spec)
    assert all(c["classification"].startswith("decided through the noise") for c in spec)
    (entry,) = got["policy"]["series"]
    assert entry["speculation"] is False and entry["through_noise"]["outcome"] == "fail"
    from orchestrator.review.report import write_review

    md = write_review(got["store"], tmp_path / "r.html", week="2026-W20", now=NOW)["md"]
    text = md.read_text()
    assert "(1 decided through the noise: runs set aside for their spread)" in text, text
    assert "the verdict above was decided through the noise" in text


def test_a_calibration_like_pair_is_a_marked_candidate_never_silently_on(tmp_path):
    got = plant(tmp_path / "s.db", 2, ratios={1: 1.7, 2: 1.75, 4: 1.8}, acceptance=1.0,
                nb=8, ns=8)
    v = got["verdict"]
    assert v["decision"] == "production candidate" and v["k"] in (1, 2, 4), v
    assert "provisional: 1 of 3 nights; decided through the noise" in v["text"]
    assert "95% interval" in v["evidence"] and "set aside for the spread" in v["evidence"]
    (entry,) = got["policy"]["series"]
    # a real pair's one noisy night: named, off, and marked
    assert entry["speculation"] is False and entry["candidate"]["num_draft_tokens"] == v["k"]
    assert entry["through_noise"]["outcome"] == "pass" and entry["provisional"]


def test_undecided_stays_needs_more_data(tmp_path):
    """A ratio on the gate with one trial a side: no interval can settle it."""
    got = plant(tmp_path / "s.db", 3, ratios={3: 1.16}, acceptance=0.9, nb=4, ns=1)
    assert got["verdict"]["decision"] == "needs more data", got["verdict"]
    assert "through_noise" not in got["verdict"]


def test_a_gate_left_undecided_is_named_in_words(tmp_path):
    """Through the noise the timing gates stay undecided; the demo's evidence cells once
    read "itl_p95_ms undecided" and "ttft_change undecided" (identifiers, not words)."""
    import re

    from orchestrator.review.ci import gate_words
    from orchestrator.review.through_noise import GATE_WORDS
    from orchestrator.review.weekly import DEFAULT_GATES

    undecided = {"passed": None, "undecided": True, "value": None}
    assert gate_words("itl_p95_ms", undecided, DEFAULT_GATES) == "ITL p95 undecided"
    assert gate_words("ttft_change", {**undecided, "interval": [0.9, 1.3]}, DEFAULT_GATES) \
        == "time to first token undecided (95% interval 0.90–1.30)"
    for name in GATE_WORDS:
        assert "_" not in gate_words(name, undecided, DEFAULT_GATES), name
    # and through the review: one night gives the timing gates no interval (undecided)
    got = plant(tmp_path / "s.db", 1, ratios={2: 0.5, 3: 0.5, 4: 0.5}, acceptance=0.40,
                nb=4, ns=1)
    said = [got["verdict"]["text"], got["verdict"]["evidence"],
            *[c.get("classification") or "" for c in got["configs"]]]
    assert any("ITL p95 undecided" in t for t in said), said
    assert not [t for t in said if re.search(r"[a-z]+_[a-z0-9_]+ undecided", t)], said


# the simulation: the speedup gate's interval at CV 20%, true ratio on the gate / at 0.5×
def _rates(nb: int, ns: int, true: float, draws: int = 2000) -> tuple[float, float]:
    rng = random.Random(11)
    passed = failed = 0
    for _ in range(draws):
        iv = ratio_interval(lognormal(rng, 100, nb), lognormal(rng, 100 * true, ns))
        d = decisive(iv[1], iv[2], MIN_SPEEDUP, True) if iv else None
        passed += d is True
        failed += d is False
    return passed / draws, failed / draws


@pytest.mark.parametrize("nb,ns", [(4, 1), (8, 2), (4, 4), (8, 8)])
def test_a_ratio_on_the_gate_is_rarely_a_decisive_pass(nb, ns):
    passed, _ = _rates(nb, ns, MIN_SPEEDUP)
    assert passed <= 0.05, passed  # measured: 2.55%, 2.3%, 1.75%, 1.9%


# (8, 2): the demo trained pair's counts at two repetitions (a width's two trials pool
# their spread with the baseline's eight)
@pytest.mark.parametrize("nb,ns", [(8, 2), (4, 4), (8, 8)])
def test_half_the_baseline_is_nearly_always_a_decisive_fail(nb, ns):
    _, failed = _rates(nb, ns, 0.5)
    assert failed >= 0.90, failed  # measured: 94.55% (97.5% on the summed df), 99.65%, 100%


@pytest.mark.xfail(strict=True, reason="moderate: at one repetition a width (4 baseline "
                   "trials, 1 a width; the demo's counts before it went to two) a 95% "
                   "interval at CV 20% fails 0.5x "
                   "decisively in 72% of draws, not 90% (the acceptance gate, which no noise "
                   "touches, is what decides that pair)")
def test_half_the_baseline_at_the_demo_counts_is_a_decisive_fail():
    _, failed = _rates(4, 1, 0.5)
    assert failed >= 0.90, failed


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(0.3, 2.5),
       acceptance=st.floats(0.2, 1.0), scale=st.floats(0.05, 20.0))
def test_decisions_ignore_scale_and_busy_runs_and_never_pass_a_failed_acceptance(
        tmp_path_factory, seed, ratio, acceptance, scale):
    ratios = {2: ratio, 4: ratio * 0.9}
    d = tmp_path_factory.mktemp("tn")
    one = plant(d / "a.db", seed, ratios=ratios, acceptance=acceptance, nb=6, ns=6)
    scaled = plant(d / "b.db", seed, ratios=ratios, acceptance=acceptance, nb=6, ns=6,
                   scale=scale)
    busy = plant(d / "c.db", seed, ratios=ratios, acceptance=acceptance, nb=6, ns=6,
                 busy=True)
    decision = one["verdict"]["decision"]
    assert scaled["verdict"]["decision"] == decision == busy["verdict"]["decision"]
    assert scaled["verdict"]["k"] == one["verdict"]["k"] == busy["verdict"]["k"]
    if acceptance < FLOOR:
        assert decision != "production candidate"


# --- the night is the unit; a pass at the family's level; the spread from the trials -----

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), scales=st.lists(st.floats(0.05, 20.0), min_size=1,
                                                    max_size=5),
       counts=st.lists(st.tuples(st.integers(2, 9), st.integers(2, 9)), min_size=5,
                       max_size=5))
def test_a_machine_that_drifts_between_nights_moves_no_interval(seed, scales, counts):
    """Each night's both sides at its own speed (any drift between nights, any trial counts
    a night): the interval is the same as with no drift, since each night is compared
    within itself. Pooled trials (the rule before) moved with the drift."""
    from orchestrator.review.through_noise import nights_ratio_interval

    rng = random.Random(seed)
    nights = [(lognormal(rng, 100, nb), lognormal(rng, 120, ns))
              for _, (nb, ns) in zip(scales, counts)]
    drifted = [([x * f for x in b], [x * f for x in s]) for (b, s), f in zip(nights, scales)]
    one, two = nights_ratio_interval(nights), nights_ratio_interval(drifted)
    assert one is not None and two is not None
    assert all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(one, two))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), family=st.integers(1, 8), ratio=st.floats(0.3, 3.0))
def test_a_pass_at_the_familys_level_is_a_pass_at_95_percent(seed, family, ratio):
    """The pass level widens with the configs judged (Bonferroni), never narrows: whatever
    passes at it passes at 95%, and a fail is read at 95% whatever the family."""
    from orchestrator.review.through_noise import interval_gate, pass_level

    rng = random.Random(seed)
    b, s = lognormal(rng, 100, 6), lognormal(rng, 100 * ratio, 6)
    alone = interval_gate((ratio_interval(b, s),) * 2, MIN_SPEEDUP, True)
    lv = pass_level(family)
    wide = interval_gate((ratio_interval(b, s), ratio_interval(b, s, lv)), MIN_SPEEDUP, True,
                         level=lv)
    assert lv == 1 - 0.05 / family
    if wide["passed"] is True:
        assert alone["passed"] is True
    assert (wide["passed"] is False) == (alone["passed"] is False)


def test_the_spread_is_read_from_the_stored_trials_not_the_nodes_field():
    """The node's spread is a claim: four stored rates 100, 101, 99, 100 spread ~1% (under
    a 10% limit: nothing was set aside for it, so the run is not judged through the noise),
    and rates 60, 100, 140, 100 spread far over it (shown as computed, not as claimed)."""
    from agent.stats import repetition_spread
    from orchestrator.review.through_noise import spread_alone

    claim = {"value": 0.36, "limit": 0.10}

    def summary(rates: list[float]) -> dict:
        return {"unreliable_reasons": [_reason(36)], "spread": claim,
                "values": {"decode_tok_s": rates}}

    assert spread_alone(summary([100, 101, 99, 100])) is None
    noisy = [60, 100, 140, 100]
    assert spread_alone(summary(noisy)) == {"value": repetition_spread(noisy), "limit": 0.10}
    assert repetition_spread(noisy) >= 0.3  # planted: 40% off the median for half of them
    # one trial has no spread: a claim over one is false (audit 34q), nothing set aside for it
    assert spread_alone(summary([100])) is None


def _pass_rate_over_nights(nights: int, draws: int = 2000) -> float:
    """Share of decisive passes for a true 2× (6 v 6 trials a night, CV 20%), one config."""
    from orchestrator.review.through_noise import interval_gate, nights_ratio_interval

    rng = random.Random(5)
    hits = 0
    for _ in range(draws):
        ns = [(lognormal(rng, 100, 6), lognormal(rng, 200, 6)) for _ in range(nights)]
        iv = nights_ratio_interval(ns)
        hits += interval_gate((iv, iv), MIN_SPEEDUP, True)["passed"] is True
    return hits / draws


def test_a_second_night_keeps_a_clear_win_decisive():
    """Was moderate: a true 2x (6 v 6 trials a night, CV 20%) passed decisively on 98.9% of
    single nights but 41.1% of pairs of nights (Student's t on two nightly ratios, t 12.7);
    two nights now pass where both pass on their own (the hull of their intervals)."""
    assert _pass_rate_over_nights(1) >= 0.9
    assert _pass_rate_over_nights(2) >= 0.9


def test_a_second_repetition_narrows_the_interval_it_decides_on():
    """One repetition a width gives a width one trial beside its baseline's four (the demo's
    trained pair); a second gives two beside eight. Planted iid log-normal trials (σ 10%,
    true ratio 1.0, seed 2705, 1,000 pairs each): the median log-width of the 95% interval
    is 0.64 at 1 v 4 and 0.38 at 2 v 8, where Welch on two trials made it wider (its
    one-df spread), and both cover the truth at least 93% of the time."""
    import math
    import random
    import statistics

    from orchestrator.review.through_noise import ratio_interval

    def width_and_cover(n_spec: int, n_base: int) -> tuple[float, float]:
        rng, widths, covered = random.Random(2705), [], 0
        for _ in range(1000):
            b = [100 * math.exp(rng.gauss(0, 0.1)) for _ in range(n_base)]
            s = [100 * math.exp(rng.gauss(0, 0.1)) for _ in range(n_spec)]
            iv = ratio_interval(b, s)
            assert iv is not None
            widths.append(math.log(iv[2] / iv[1]))
            covered += iv[1] <= 1.0 <= iv[2]
        return statistics.median(widths), covered / 1000

    (one, c1), (two, c2) = width_and_cover(1, 4), width_and_cover(2, 8)
    assert two < 0.7 * one and min(c1, c2) >= 0.93, (one, two, c1, c2)


def test_a_pick_through_the_noise_reads_its_memory_beside_the_baseline_it_was_judged_on(
        tmp_path):
    """Every config set aside for its spread alone; width 2 is a clear 2× win through the
    noise at three times the baseline's peak memory (3 GB against 1 GB), swapping in on its
    night. The rules read that width beside the baseline the verdict was judged against, as
    the ladder does: memory +200% (planted), and the draft-memory advice fires. They read
    no baseline there before (only a reliable one), so the memory went unread."""
    rng = random.Random(3)
    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    at = week_nights(W20, 1)[0] + timedelta(hours=1)

    def cfg(rate, acc=None, mem=1.0e9, swap_in=0):
        v = V(rate, reps=8, acceptance=acc, rng=rng, mem=mem, swap_in=swap_in)
        v["decode_tok_s"] = lognormal(rng, rate, 8)
        return v

    night(store, at, node="ci-01", chip="Apple M2 Max", pair="target / draft",
          workload="code", unreliable=_reason(36), spread={"value": 0.36, "limit": 0.10},
          configs={("baseline", 0): cfg(100.0),
                   ("speculative", 2): cfg(200.0, 0.8, mem=3.0e9, swap_in=64 << 20)})
    (s,) = analyse(store, "2026-W20", load_rules(), now=NOW)["series"]
    assert s["verdict"]["through_noise"] and s["verdict"]["k"] == 2
    m = s["metrics"]
    assert m["best_through_noise"] and m["mem_increase"] == pytest.approx(2.0)
    assert m["mem_added_bytes"] == pytest.approx(2.0e9)
    fired = {x["rule"] for x in s["signals"]}
    assert "draft-memory" in fired, s["signals"]


def test_two_nights_pass_falsely_no_more_often_than_one():
    """Guard for the hull: a true ratio at the gate (MIN_SPEEDUP), each night's ratio
    wobbling by τ (log-normal, 0 and 10%), 6 v 6 trials a night at CV 20%, 2,000 draws
    (seed 7): two nights pass no more often than one does, and without a wobble at most
    at the level's 2.5% (measured: τ 0 2.95% and 0.05%, τ 10% 6.5% and 0.35%: one night
    cannot see its own wobble, which is why it is provisional; two see it only as
    disagreeing nights)."""
    from orchestrator.review.through_noise import interval_gate, nights_ratio_interval

    def rate(nights: int, tau: float) -> float:
        rng, hits = random.Random(7), 0
        for _ in range(2000):
            ns = []
            for _ in range(nights):
                r = MIN_SPEEDUP * math.exp(rng.gauss(0, tau))
                ns.append((lognormal(rng, 100, 6), lognormal(rng, 100 * r, 6)))
            ivs = nights_ratio_interval(ns), nights_ratio_interval(ns, passing=True)
            hits += interval_gate(ivs, MIN_SPEEDUP, True)["passed"] is True
        return hits / 2000

    for tau in (0.0, 0.1):
        one, two = rate(1, tau), rate(2, tau)
        assert two <= one + 0.005, (tau, one, two)
        if tau == 0.0:  # 2.5% is the level; 2,000 draws read it within ±1.1% (3 SE)
            assert one <= 0.036 and two <= 0.025, (one, two)
