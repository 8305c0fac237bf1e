"""The sweep page reads a section's speedups against the baseline the weekly review chose at
each sampling (``sweep_baselines``; audit 42): with two autoregressive variants at one
sampling, the chosen one is the row compared with (named), the other a row of its own that
is compared with nothing and voids no speedup; the choice is the weekly review's, not run
or key order; a chosen baseline that is itself set aside still voids the speedups."""

from __future__ import annotations

import pytest

from orchestrator.review.sweep_page import render_review
from tests.test_audit_audit42 import _by, http_sweep

SPEC = ("speculative", 2, "spec", 200)


def _sweep(tmp_path, configs) -> tuple:
    """``configs`` as (mode, width, variant, rate, jitter of its six trials)."""
    return http_sweep(tmp_path, configs, seed=7)


def _row(section: dict, mode: str, name: str | None = None):
    return next(r for r in section["rows"] if r.mode == mode
                and (name is None or name in r.label))


def test_both_variants_are_rows_and_the_chosen_one_is_named(tmp_path):
    store, sid, s, section = _sweep(tmp_path, [("baseline", 0, "z-plain", 50, 0.01),
                                               ("baseline", 0, "a-plain", 100, 0.01),
                                               SPEC + (0.01,)])
    chosen, other = _row(section, "baseline", "a-plain"), _row(section, "baseline", "z-plain")
    assert chosen.label == "baseline (autoregressive), variant a-plain"
    assert chosen.runs == other.runs == 6
    assert chosen.decode_tok_s == pytest.approx(100, rel=0.02)
    assert other.decode_tok_s == pytest.approx(50, rel=0.02)
    assert other.speedup is None and "not the baseline compared with" in other.label
    speedup = _row(section, "speculative").speedup
    assert speedup == pytest.approx(2.0, rel=0.03)
    assert section["verdict"].startswith(f"Best: draft width 2 at {speedup:.2f}×")
    html = render_review(store, tmp_path / "r.html", sid).read_text()
    assert "variant a-plain" in html and "variant z-plain" in html
    assert f"{speedup:.2f}×" in html


def test_the_page_follows_the_weekly_reviews_choice_not_key_order(tmp_path):
    """'a-plain' (first in key order) set aside for its spread, 'z-plain' reliable: the
    weekly review reads width 2 against 'z-plain' (4.0×), and so does the page."""
    _, _, s, section = _sweep(tmp_path, [("baseline", 0, "z-plain", 50, 0.01),
                                         ("baseline", 0, "a-plain", 100, 0.30),
                                         SPEC + (0.01,)])
    weekly = _by(s, "speculative")["speedup"]
    assert weekly == pytest.approx(4.0, rel=0.03)
    spec = _row(section, "speculative")
    assert spec.speedup == pytest.approx(weekly, rel=0.01), section["verdict"]
    assert spec.set_aside is None
    other = _row(section, "baseline", "a-plain")
    assert other.set_aside and other.aside_spreads and other.speedup is None
    assert _row(section, "baseline", "z-plain").label.startswith("baseline (autoregressive)")


def test_a_chosen_baseline_set_aside_still_voids_the_speedups(tmp_path):
    """Every baseline variant set aside for its spread: no speedup is read from it."""
    _, _, _, section = _sweep(tmp_path, [("baseline", 0, "z-plain", 50, 0.30),
                                         ("baseline", 0, "a-plain", 100, 0.30),
                                         SPEC + (0.01,)])
    spec = _row(section, "speculative")
    assert spec.speedup is None and "baseline is unreliable" in (spec.set_aside or "")


def test_one_baseline_variant_reads_as_before(tmp_path):
    _, _, _, section = _sweep(tmp_path, [("baseline", 0, "a-plain", 100, 0.01),
                                         SPEC + (0.01,)])
    (base,) = [r for r in section["rows"] if r.mode == "baseline"]
    assert base.label == "baseline (autoregressive)" and base.config_key is None
    assert _row(section, "speculative").speedup == pytest.approx(2.0, rel=0.02)
