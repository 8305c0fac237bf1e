"""Audit of issue 27 ("The answer is right"), second part: the robust spread that sets a
config aside, compare's unit of evidence, and what the policy switches on, against inputs
of the auditor's own (planted repetitions, planted nightly pairs, planted weeks through the
real ingest). A test marked xfail(strict) is a finding that fails today; a plain one is a
guard that held. The load and change-point part is tests/test_audit_27.py."""

from __future__ import annotations

import json
import random

import pytest

# -- the robust spread: is 1.48 × MAD / median ≥ cv_threshold a sound reliability gate? ----

def _summary(decode: list[float]) -> dict:
    from agent.summary import config_summary

    return config_summary([{"decode_tok_s": x} for x in decode], 0.10)


def test_two_of_five_repetitions_in_another_mode_set_the_config_aside():
    """Audit 27 finding (spread, high). Decode tok/s 100, 101, 99, 140, 142 at cv_threshold
    10%: two of five repetitions ran 40% faster (a second machine state, not a cold
    start). The median 101 would be 140 on a rerun whenever three of five land high
    (p = 0.4 each: 32% of reruns), so it is not reliable. Today: MAD = 2, spread 2.9%,
    reliable, the headline 101."""
    s = _summary([100.0, 101.0, 99.0, 140.0, 142.0])
    assert s["unreliable"], s["metrics"]["decode_tok_s"]


def test_a_bimodal_split_of_seven_sets_the_config_aside():
    """Audit 27 finding (spread, high). Four repetitions at 100 tok/s and three at 140 (a
    bimodal node): MAD is 0 whenever the larger mode holds over half the values, so the
    spread reads 0% and the config is reliable at 100 — a coin toss from reading 140."""
    s = _summary([100.0, 100.2, 99.8, 100.1, 140.0, 140.3, 139.9])
    assert s["unreliable"], s["metrics"]["decode_tok_s"]


def test_two_repetitions_fourteen_percent_apart_are_not_a_reliable_median():
    """Audit 27 finding (spread, medium). n = 2, 100 and 114 tok/s: the spread is
    1.48 × 7 / 107 = 9.7%, under 10%, so the median 107 is headline evidence. Two values
    give no confidence interval for a median at all (the widest order-statistic interval,
    min..max, covers it half the time); a statistician asks for n ≥ 3 (5 for a 94% min..max
    interval) before calling a median reliable. Now two values are read by their CV
    unbiased for normal noise, √π/2 × |a − b| / mean = 11.6% here (agent/stats.pair_cv):
    set aside beyond 11.3% apart at a 10% limit."""
    assert _summary([100.0, 114.0])["unreliable"]


def test_noise_twice_the_threshold_is_set_aside_at_small_n():
    """Audit 27 finding (spread, medium). Gaussian repetitions with a true CV of 20% (twice
    cv_threshold 10%), n = 3, 4, 5, 1,000 seeded draws each: such a config should be set
    aside nearly always (≥ 90%). Today 560, 656, 700 of 1,000: MAD of 3-5 values is a noisy
    and (without its small-sample factor, 1.5× at n = 3) low estimate of σ; a point
    estimate of the spread compared with the limit lets half the bad configs through.
    Now three values are judged by the classic CV (786 of 1,000: no robust reading of three
    values tells an outlier from a second state) and from four by the small-sample-corrected
    robust CV or how far a third of the runs lie from the median (790, 906). The classic CV
    would give 786, 843, 903: the robust reading trades a little power at n = 4 for not
    setting aside a steady config over one cold run."""
    for n, want in ((3, 750), (4, 750), (5, 880)):
        rng = random.Random(n)
        hit = sum(_summary([100 * (1 + rng.gauss(0, 0.20)) for _ in range(n)])["unreliable"]
                  for _ in range(1000))
        assert hit >= want, (n, hit)


def test_one_cold_repetition_of_five_does_not_set_a_steady_config_aside():
    """Guard (the design's intent, issue 27's example): 184, 667, 674, 688, 690 tok/s is
    one cold start among steady repetitions: reliable, median 674, spread ≈ 2%."""
    s = _summary([184.0, 667.0, 674.0, 688.0, 690.0])
    assert not s["unreliable"] and s["metrics"]["decode_tok_s"]["median"] == 674.0
    # the robust CV with its five-value factor (b_5 = 1.206) is the larger reading
    assert s["metrics"]["decode_tok_s"]["spread"] == pytest.approx(1.4826 * 1.206 * 14 / 674,
                                                                   abs=1e-3)


def test_a_spread_of_the_middle_half_sets_twelve_repetitions_aside():
    """Guard. Twelve repetitions evenly from 80 to 124 tok/s (middle half ±11%): spread
    1.48 × 12 / 102 ≈ 17% ≥ 10%: set aside, with the reason naming the 12 repetitions."""
    s = _summary([80.0 + 4 * i for i in range(12)])
    assert s["unreliable"] and "over 12 repetitions" in s["unreliable_reasons"][0]


# -- compare: the night is the unit, but are nights independent? ---------------------------

def _pairs_ar1(phi: float, pairs: int = 200, seed: int = 1) -> tuple[int, int]:
    """``pairs`` planted pairs at a true ratio of 1.0: two weeks of 5 nightly sweeps with
    a weekend between, each night's level log-normal (σ 5%) with AR(1) memory ``phi``
    from night to night (stationary), 3 repetitions a night (σ 1%), each night reduced to
    its median as compare does; verdicts as compare gives them (p < 0.01 and the 95%
    interval off 1.0). Returns (false claims, intervals covering 1.0)."""
    import math
    import statistics

    from orchestrator.review.compare import SIGNIFICANT_P, night_ratio

    rng = random.Random(seed)
    claims = covered = 0
    for _ in range(pairs):
        e, levels = rng.gauss(0, 0.05), []
        for _ in range(12):  # Mon-Fri, the weekend, Mon-Fri
            levels.append(e)
            e = phi * e + rng.gauss(0, 0.05 * math.sqrt(1 - phi * phi))
        a, b = ([statistics.median(100 * math.exp(x + rng.gauss(0, 0.01)) for _ in range(3))
                 for x in side] for side in (levels[:5], levels[7:]))
        r = night_ratio(a, b)
        inside = r["ci"][0] <= 1.0 <= r["ci"][1]
        claims += r["p"] < SIGNIFICANT_P and not inside
        covered += inside
    return claims, covered


def test_compare_with_independent_nights_meets_the_issue_targets():
    """Guard (item 3 as the issue planted it: nights independent). 200 pairs, φ = 0:
    false claims ≤ 12 (6%), coverage ≥ 186 (93%)."""
    claims, covered = _pairs_ar1(0.0)
    assert claims <= 12 and covered >= 186, (claims, covered)


def test_compare_with_nights_that_remember_meets_the_issue_targets():
    """Audit 27 finding (compare, high). The same 200 pairs with night-to-night memory
    φ = 0.5 — the noise the change-point module itself assumes (AR(1), "a machine's state
    carries over", φ up to 0.9 believed). Welch's t on five nightly medians a side treats
    the nights as independent, so the nights of one week agree with each other more than
    with the other week's and the interval is too narrow. Issue 27 item 3: ≤ 6% false
    claims and ≥ 93% coverage. Today (2,000 pairs): φ 0.3: 3.5% / 87.8%; φ 0.5: 8.2% /
    78.2%; φ 0.7: 16.9% / 67.4%; these 200 pairs at φ 0.5: 18 claims (9%), 146 covered
    (73%). Now each side's variance is taken under the AR(1) memory its nights allow
    (orchestrator/review/nightmemory.py): these 200 pairs 3 claims, 188 covered; 2,000 at
    φ 0.5: 1.6% / 95.6% (bench/compare_truth.py --direct)."""
    claims, covered = _pairs_ar1(0.5)
    assert claims <= 12 and covered >= 186, (claims, covered)


# -- the policy: what it switches on ------------------------------------------------------

def _policy_of(tmp_path, nights: int, configs: dict) -> tuple[dict, dict]:
    """``nights`` nights of one sweep each, ``configs`` {key: (decode, swap bytes)}; the
    week's review (JSON) and its policy entry for the one series."""
    from datetime import timedelta

    from orchestrator.review.report import write_review
    from orchestrator.review.verdict import policy
    from orchestrator.store import open_store
    from tests.history import config_values, night
    from tests.truth.weeks import W20, WEEK

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    for i in range(nights):
        night(store, W20 + timedelta(days=i, hours=2), node="mac-07", chip="Apple M3 Pro",
              pair="qwen-7b / qwen-0.5b", workload="chat", configs={
                  key: config_values(v, 4, jitter=0.0, swap=swap, acceptance=None
                                     if key[0] == "baseline" else 0.68, ttft=40.0)
                  for key, (v, swap) in configs.items()})
    out = write_review(store, tmp_path / "out", week=WEEK, now=W20 + timedelta(days=7))
    a = json.loads(out["json"].read_text())
    (entry,) = policy(a)["series"]
    (s,) = a["series"]
    return s, entry


def test_a_width_over_the_swap_ceiling_is_never_switched_on(tmp_path):
    """Guard (item 4). Five nights: baseline 100 tok/s; width 4 at 1.6× but 1.6 GB of swap
    (ceiling 1.5 GB); width 2 at 1.3×, no swap. The policy switches on width 2, never 4,
    and the evidence of width 4 (if named) states the comparison."""
    from tests.history import C

    s, p = _policy_of(tmp_path, 5, {C("baseline", 0): (100.0, 0),
                                    C("speculative", 4): (160.0, int(1.6e9)),
                                    C("speculative", 2): (130.0, 0)})
    assert p["speculation"] is True and p["num_draft_tokens"] == 2, p
    assert s["verdict"]["decision"] == "production candidate"


def test_no_width_passing_means_no_speculation_in_the_policy(tmp_path):
    """Guard (item 4). Five nights; both widths over the swap ceiling (1.6 GB): graded
    fallback or keep autoregressive, and the policy's speculation is off."""
    from tests.history import C

    s, p = _policy_of(tmp_path, 5, {C("baseline", 0): (100.0, 0),
                                    C("speculative", 4): (160.0, int(1.6e9)),
                                    C("speculative", 2): (130.0, int(1.6e9))})
    assert p["speculation"] is False and p["num_draft_tokens"] is None, p
    assert s["verdict"]["decision"] in ("graded fallback", "keep autoregressive"), s["verdict"]


def test_a_one_night_candidate_is_not_switched_on(tmp_path):
    """Audit 27 finding (policy, medium). One night (four repetitions): baseline 100, width 3
    at 1.45×, every gate passed. The verdict is "production candidate at draft width 3,
    provisional: 1 of 3 nights"; the policy writes speculation: true, width 3 (with a
    ``provisional`` note a gateway may not read), and ``--fail-on gate-miss`` (which brings
    no-data) passes, since no-data counts only "needs more data" verdicts. The same policy
    refuses to switch on a measured ladder rung that rests on one night
    (test_audit_b: a provisional ladder is not switched on): one night is either enough
    evidence to switch on, or not."""
    from tests.history import C

    s, p = _policy_of(tmp_path, 1, {C("baseline", 0): (100.0, 0),
                                    C("speculative", 3): (145.0, 0)})
    assert s["verdict"].get("provisional"), s["verdict"]
    assert p["speculation"] is False, p
    assert p["candidate"]["num_draft_tokens"] == 3 and p["num_draft_tokens"] is None
