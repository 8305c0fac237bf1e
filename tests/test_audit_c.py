"""Adversarial audit (audit-c) of issues 31 and 32: inputs the team's own tests did not try.

Each test plants an input with a known right answer; the ones still wrong are marked
``xfail(strict=True)`` with why."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.review.rules import fire, load_rules

# -- rules: a `when` that loads but cannot be evaluated ------------------------------------


@pytest.mark.parametrize("when, bad", [
    ("best_label > 3", "best_label"),           # a text metric compared with a number
    ('best_speedup < "1.0"', "'1.0'"),          # a quoted threshold
    ("best_config == 3", "best_config"),
])
def test_rule_comparing_text_is_refused_at_load(tmp_path, when, bad):
    """Before: these loaded, then `fire` raised TypeError inside the weekly review (or
    `best_k == "3"` silently never fired). A rule compares numbers: refused with its line."""
    path = tmp_path / "rules.yml"
    path.write_text(f"- id: odd\n  when: {when}\n  action: x\n")
    with pytest.raises(ConfigError, match=r"rules.yml:2: rule odd: when .*" + bad):
        load_rules(path)


def test_numeric_rules_still_load_and_fire(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text("- id: ok\n  when: best_speedup < 1.0 and not candidates\n  action: x\n"
                    "  evidence: [best_label, best_config]\n")
    (rule,) = load_rules(path)
    assert [f["rule"] for f in fire([rule], {"best_speedup": 0.9, "candidates": 0})] == ["ok"]
    assert fire([rule], {"best_speedup": 1.1, "candidates": 0}) == []
