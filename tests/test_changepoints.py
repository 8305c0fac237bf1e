"""Change points against planted truth (issue 27): a step in the window's last nights is a
possible step at its own night with the identity change named; a drift is one drift; a
two-night dip is no step; AR(1) noise makes none; on a planted bench precision and recall
within a night are at least 0.95 (bench/changepoints.py prints the full one)."""

from datetime import date, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.changepoints import analyse, change_points
from tests.history import planted_nightly, score_change_points

START = date(2026, 4, 13)


def words(a: dict, b: dict) -> list[str]:
    return [f"{k} {a.get(k)} → {b.get(k)}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def series(values: list[float], bump_at: int | None = None) -> list:
    return [(START + timedelta(days=i), v,
             {"mlx_lm_version": "0.33.0" if bump_at is not None and i >= bump_at else "0.32.2"})
            for i, v in enumerate(values)]


@pytest.mark.parametrize("seed", range(3))
def test_a_step_three_nights_before_the_end_is_a_possible_step_at_its_night(seed):
    """The case issue 27 planted: an mlx-lm bump 3 nights before the window's end moves the
    level 15% (before: dated a night early and the bump dropped, 3 of 3 seeds)."""
    values, _ = planted_nightly(seed, "none")
    values = [v * (0.85 if i >= 32 else 1.0) for i, v in enumerate(values)]
    (cp,) = change_points(series(values, bump_at=32), words)
    assert cp["kind"] == "possible step" and cp["note"] == "confirm on the next nights"
    assert cp["date"] == (START + timedelta(days=32)).isoformat()
    assert cp["changed"] == ["mlx_lm_version 0.32.2 → 0.33.0"]
    assert cp["size"] == pytest.approx(-0.15, abs=0.04)


def test_the_last_single_night_is_no_step_and_two_nights_at_the_end_may_be():
    flat = [100.0] * 30
    assert change_points(series([*flat, 80.0]), words) == []
    (cp,) = change_points(series([*flat, 80.0, 80.0]), words)
    assert cp["kind"] == "possible step" and cp["date"] == (START + timedelta(30)).isoformat()


@pytest.mark.parametrize("seed", range(15))
def test_a_drift_is_one_drift(seed):
    """Before: 0 of 15 labelled drift."""
    values, truth = planted_nightly(seed, "drift")
    found = analyse(values)
    assert [f["kind"] for f in found] == ["drift"], (truth, found)
    (f,) = found
    assert f["index"] <= truth["until"] and f["until"] >= truth["at"]
    assert (f["size"] > 0) == (truth["size"] > 0)


def test_a_step_then_a_drift_is_the_step_at_its_night_with_its_cause_and_the_drift():
    """An mlx-lm bump at night 10 moves the level 11%, then it drifts 1% a night (issue 27:
    before, one drift from the new level, the step and its cause dropped): the step at
    night 10 naming the bump, and the drift after it, naming nothing more."""
    import numpy as np

    rng = np.random.default_rng(1)
    t = np.arange(28)
    values = 100 * (1 + rng.normal(0, 0.01, 28) + np.where(t >= 10, 0.11 + (t - 10) * 0.01, 0))
    step, drift = change_points(series(list(values), bump_at=10), words)
    assert (step["kind"], step["date"]) == ("step", (START + timedelta(days=10)).isoformat())
    assert step["changed"] == ["mlx_lm_version 0.32.2 → 0.33.0"]
    assert step["size"] == pytest.approx(0.11, abs=0.02)
    assert (drift["kind"], drift["date"], drift["until"]) == (
        "drift", step["date"], (START + timedelta(days=27)).isoformat())
    assert drift["changed"] == [] and drift["size"] == pytest.approx(0.17 / 1.11, abs=0.03)


def _noisy(seed: int, level: list[float], sigma: float) -> list[float]:
    import numpy as np

    return list(100 * np.asarray(level) * (1 + np.random.default_rng(seed).normal(0, sigma,
                                                                                  len(level))))


@settings(max_examples=120, deadline=None)
@given(st.integers(16, 60), st.data(), st.floats(0.12, 0.30), st.sampled_from((-1, 1)),
       st.floats(0.0, 0.01), st.integers(0, 2**32 - 1))
def test_any_clear_step_is_found_at_its_night(n, data, size, sign, sigma, seed):
    """A step of 12-30% either way with white noise of σ ≤ 1% (≥ 12σ), at least 4 nights
    on each side: one finding, a step, within a night of it. (Below that it is not always
    so: at 10.9% and σ 1.2% on 16 nights, a step at night 4 is explained as the noise's
    memory; at 10% and σ 1.5%, 1-9% of steps near either end are missed.)"""
    at = data.draw(st.integers(4, n - 5))
    found = analyse(_noisy(seed, [1 + sign * size * (i >= at) for i in range(n)], sigma))
    assert [f["kind"] for f in found] == ["step"] and abs(found[0]["index"] - at) <= 1, found


@settings(max_examples=80, deadline=None)
@given(st.integers(24, 60), st.data(), st.floats(0.10, 0.30), st.floats(0.01, 0.02),
       st.sampled_from((-1, 1)), st.floats(0.0, 0.01), st.integers(0, 2**32 - 1))
def test_any_clear_step_then_drift_is_both(n, data, size, slope, sign, sigma, seed):
    """A step of 10-30% at an identity change, then a drift the same way of 1-2% a night
    over 10 nights or more, σ ≤ 1%: a step within a night of its night, and a drift.
    (Without the identity change the jump must also beat every continuous bend: 1 of 6,000
    such random series missed it, a drift cut short at the window's end, and Hypothesis
    found a step 4 nights from the start whose jump a bend explained. A drift of 0.5% a
    night after a 25% step may be taken into the step's new level: the fit does not always
    keep it.)"""
    at = data.draw(st.integers(4, n - 10))
    level = [1 + sign * (size + (i - at) * slope) * (i >= at) for i in range(n)]
    found = analyse(_noisy(seed, level, sigma), frozenset({at}))
    assert any(f["kind"] == "step" and abs(f["index"] - at) <= 1 for f in found), found
    assert any(f["kind"] == "drift" for f in found), found


def test_two_night_dips_and_ar1_noise_make_no_change_points():
    """Before: 7 of 60 AR(1) no-change series had one."""
    dips = [analyse(planted_nightly(seed, "dip")[0]) for seed in range(30)]
    flat = [analyse(planted_nightly(seed, "none")[0]) for seed in range(60)]
    assert sum(bool(f) for f in dips) <= 1 and sum(bool(f) for f in flat) == 0


def test_on_a_planted_bench_precision_and_recall_are_at_least_095():
    rows = [(analyse(values), truth) for kind in ("step", "drift", "late-drift", "dip", "steps",
                                                  "none", "weekly", "weekly-step")
            for values, truth in (planted_nightly(seed, kind) for seed in range(100, 130))]
    s = score_change_points(rows)
    assert s["precision"] >= 0.95 and s["recall"] >= 0.95, s["wrong"]


def test_the_scorer_counts_what_it_should():
    """The bench's own arithmetic, on findings written by hand."""
    step = {"kind": "step", "at": 10}
    drift = {"kind": "drift", "at": 5, "until": 20}
    s = score_change_points([
        ([{"kind": "step", "index": 11}], step),                       # hit within a night
        ([{"kind": "step", "index": 13}], step),                       # too far: false + miss
        ([{"kind": "drift", "index": 15, "until": 25}], drift),        # overlaps: hit
        ([{"kind": "step", "index": 9}], {"kind": "none"}),            # false
        ([], {"kind": "dip", "at": 3})])
    assert (s["found"], s["false"], s["events"]) == (2, 2, 3)
    assert s["precision"] == 0.5 and s["recall"] == pytest.approx(2 / 3)
    # two planted steps: each found within a night counts once; one drift over both is
    # false and finds neither; a second finding at one step is false
    steps = {"kind": "steps", "at": 10, "second": 16}
    s = score_change_points([
        ([{"kind": "step", "index": 10}, {"kind": "possible step", "index": 17}], steps),
        ([{"kind": "drift", "index": 10, "until": 16}], steps),
        ([{"kind": "step", "index": 10}, {"kind": "step", "index": 11}], steps)])
    assert (s["found"], s["false"], s["events"]) == (3, 2, 6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1.0, 1000.0), min_size=0, max_size=70), st.integers(0, 6))
def test_findings_are_well_formed_and_do_not_depend_on_the_unit(values, power):
    """For any series: findings inside it, in night order, of known kinds, a possible step
    only in its last 3 nights; the same findings at any scale (tok/s or ms)."""
    found = analyse(values)
    n = len(values)
    assert all(0 <= f["index"] < n and f["kind"] in ("step", "possible step", "drift")
               for f in found)
    assert [f["index"] for f in found] == sorted(f["index"] for f in found)
    assert all(f["index"] >= n - 3 for f in found if f["kind"] == "possible step")
    scaled = analyse([v * 2 ** power for v in values])
    assert [(f["kind"], f["index"]) for f in scaled] == [(f["kind"], f["index"]) for f in found]


@settings(max_examples=150, deadline=None)
@given(st.integers(12, 60), st.floats(50.0, 500.0), st.data())
def test_a_flat_series_with_a_short_blip_inside_has_none(n, level, data):
    """For any flat series, one or two nights off by any amount inside the window (not its
    last two nights) make no change point."""
    at = data.draw(st.integers(2, n - 4))
    width = data.draw(st.integers(1, 2))
    factor = data.draw(st.floats(0.2, 3.0))
    values = [level * (factor if at <= i < at + width else 1.0) for i in range(n)]
    assert analyse(values) == []


@pytest.mark.parametrize("seed", range(5))
def test_a_plateau_is_two_steps(seed):
    """A level that rises 15% for ten nights and comes back: two steps, at its first night
    and at the first night back (no single change explains it, so the first look that
    skips quiet series must not skip it)."""
    import random

    rng = random.Random(seed)
    values = [100 * (1.15 if 12 <= i < 22 else 1) * (1 + rng.gauss(0, 0.015))
              for i in range(35)]
    assert [(f["kind"], f["index"]) for f in analyse(values)] == [("step", 12), ("step", 22)]


@pytest.mark.parametrize("phi, most", [(0.7, 0), (0.9, 3)])
def test_strongly_remembering_noise_is_no_step(phi, most):
    """AR(1) noise at φ 0.7 and 0.9 (σ 1-2%), no change planted: before, 9 of 60 series at
    φ 0.9 had a finding (drifts below 3% or 4 standard errors were reported unchecked once
    the AR(1) selection had joined two flat segments into a line, and φ was capped at 0.7
    for standard errors); now 3 of 60, at most one of them a step."""
    found = [analyse(planted_nightly(seed, "none", phi=phi)[0]) for seed in range(60)]
    assert sum(bool(f) for f in found) <= most, [f for f in found if f]
    assert sum(f["kind"] != "drift" for fs in found for f in fs) <= 1


@pytest.mark.parametrize("m", [1, 2, 3, 7, 35])
@pytest.mark.parametrize("phi", [0.0, 0.5, 0.9])
def test_ar1_standard_errors_are_the_exact_variance_of_each_estimate(m, phi):
    """w'Rw computed here by brute force (R_ij = φ^|i−j|), and the white-noise textbook
    forms at φ 0: σ²/m for a mean, σ²(4m−2)/(m(m+1)) for a line's end, 12σ²/(m(m²−1))
    for its slope."""
    import numpy as np

    from orchestrator.review.arnoise import Noise, end_se, slope_z

    nz = Noise(0.02, phi)
    t = np.arange(m, dtype=float)
    r = phi ** np.abs(t[:, None] - t[None, :])
    mean = np.full(m, 1 / m)
    assert end_se(m, "flat", nz) == pytest.approx(0.02 * np.sqrt(mean @ r @ mean))
    if m >= 3:
        c = t - t.mean()
        end, slope = mean + c * c[-1] / (c @ c), c / (c @ c)
        assert end_se(m, "line", nz) == pytest.approx(0.02 * np.sqrt(end @ r @ end))
        assert slope_z(m, 0.01, nz) == pytest.approx(0.01 / (0.02 * np.sqrt(slope @ r @ slope)))
        if phi == 0.0:
            white_end = (4 * m - 2) / (m * (m + 1))
            assert end_se(m, "line", nz) == pytest.approx(0.02 * np.sqrt(white_end))
            assert slope_z(m, 0.01, nz) == pytest.approx(0.5 * np.sqrt(m * (m * m - 1) / 12))
    if phi == 0.0:
        assert end_se(m, "flat", nz) == pytest.approx(0.02 / np.sqrt(m))


# -- a weekly pattern, and a drift up to the window's last night ------------------------------

WEEKDAY_OFFSET = st.floats(-0.15, 0.15)


@settings(max_examples=100, deadline=None)
@given(st.integers(28, 70), st.lists(WEEKDAY_OFFSET, min_size=7, max_size=7), st.data())
def test_a_flat_series_with_any_weekday_pattern_and_bounded_noise_has_none(n, week, data):
    """Four weeks or more, each weekday up to 15% off every week (any pattern: a backup job
    on Sundays, a shared machine's weekends), each night's noise within ±0.5%: nothing moved,
    so no change point (before: the weekend nights were dips, steps or a drift)."""
    noise = data.draw(st.lists(st.floats(-0.005, 0.005), min_size=n, max_size=n))
    values = [100 * (1 + week[i % 7]) * (1 + e) for i, e in enumerate(noise)]
    assert analyse(values) == []


@settings(max_examples=100, deadline=None)
@given(st.integers(28, 70), st.lists(WEEKDAY_OFFSET, min_size=7, max_size=7), st.data(),
       st.floats(0.10, 0.30), st.sampled_from((-1, 1)))
def test_a_step_on_any_weekday_pattern_is_found_within_a_night(n, week, data, size, sign):
    """The same, and a step of 10-30% (≥ 20× the noise's bound) at least 4 nights from
    either end: one finding, a step, within a night of it."""
    at = data.draw(st.integers(4, n - 5))
    noise = data.draw(st.lists(st.floats(-0.005, 0.005), min_size=n, max_size=n))
    values = [100 * (1 + week[i % 7]) * (1 + sign * size * (i >= at)) * (1 + e)
              for i, e in enumerate(noise)]
    found = analyse(values)
    assert [f["kind"] for f in found] == ["step"] and abs(found[0]["index"] - at) <= 1, found


def test_a_weekly_pattern_is_taken_out_at_its_size_and_only_when_there():
    """Weekend nights 10% lower over five weeks, σ 1%: the offsets are the planted ones
    centred on the week (−10% + 20/7% on the weekend, +20/7% on weekdays, within 1%); on
    white noise alone, and on fewer than three weeks, there is no pattern."""
    import numpy as np

    from orchestrator.review.season import weekday_offsets

    rng = np.random.default_rng(7)
    days = [i % 7 for i in range(35)]
    planted = np.array([-0.1 if d >= 5 else 0.0 for d in days])
    off = weekday_offsets(1 + planted + rng.normal(0, 0.01, 35), days)
    assert off is not None
    assert np.abs(off - (planted + 0.2 / 7)).max() < 0.01
    assert weekday_offsets(1 + rng.normal(0, 0.01, 35), days) is None
    assert weekday_offsets(1 + planted[:20] + rng.normal(0, 0.01, 20), days[:20]) is None


@pytest.mark.parametrize("seed", range(10))
def test_a_drift_over_the_last_nights_is_a_drift_to_the_last_night(seed):
    """+12% in a straight ramp over the last 8 of 35 nights, σ 1.5% (8σ): one drift, over
    the ramp to the last night or the one before (a ramp's first night, 1.7% up at σ 1.5%,
    is no step's edge: measured on 30 seeds it was dated 5 nights early to 2 late), and
    upwards by more than half the ramp (before: nothing on 2 of these 10 seeds, a step on
    1)."""
    import numpy as np

    t = np.arange(35)
    level = 1 + 0.12 * np.clip((t - 27) / 7, 0, 1)
    values = list(100 * level * (1 + np.random.default_rng([seed, 27]).normal(0, 0.015, 35)))
    (cp,) = change_points(series(values), words)
    assert cp["kind"] == "drift", cp
    assert 22 <= (date.fromisoformat(cp["date"]) - START).days <= 29
    assert (date.fromisoformat(cp["until"]) - START).days >= 33
    assert 0.06 < cp["size"] < 0.18
