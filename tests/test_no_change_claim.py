""""Every series held its level" is a claim: it is said only where some config had nights
enough to look at (``changepoints.MIN_HISTORY``). A busy demo's week, every run set aside,
once said it over nothing."""

from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.review.changepoints import MIN_HISTORY
from orchestrator.store import open_store
from tests.history import config_values, night

MONDAY = datetime(2026, 11, 23, 2, tzinfo=timezone.utc)
HELD = "No change point: every series held its level"
NOTHING = f"No change point to look for: no config has {MIN_HISTORY} nights of reliable runs"


def _review(url: str, out) -> tuple[str, str, dict]:
    import json

    r = CliRunner().invoke(main, ["review", "--week", "2026-W48", "--db", url, "--out",
                                  str(out), "--format", "html,md,json"])
    assert r.exit_code == 0, r.output
    return ((out / "review-2026-W48.md").read_text(),
            (out / "review-2026-W48.html").read_text(),
            json.loads((out / "review-2026-W48.json").read_text()))


def _level_nights(store, nights: int, busy: bool, configs: dict) -> None:
    """``nights`` nights at one level ending the review's week, all set aside as contended
    when ``busy``."""
    start = MONDAY + timedelta(days=7) - timedelta(days=nights)
    for i in range(nights):
        night(store, start + timedelta(days=i), node="n1", chip="Apple M2", pair="t / d",
              workload="code", configs=configs,
              unreliable="contended: other processes used 60% of the CPU (limit 25%)"
              if busy else None)


@pytest.mark.parametrize("nights, busy, said", [
    (MIN_HISTORY + 2, False, HELD),        # level nights, enough of them: held
    (MIN_HISTORY + 2, True, NOTHING),      # every night set aside: nothing looked at
    (MIN_HISTORY - 1, False, NOTHING),     # reliable, but too few nights to look at
])
def test_held_its_level_is_said_only_over_nights_looked_at(tmp_path, nights, busy, said):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _level_nights(open_store(url), nights, busy,
                  {("baseline", 0): config_values(100.0),
                   ("speculative", 3): config_values(130.0, acceptance=0.7)})
    md, html, doc = _review(url, tmp_path / "out")
    assert said in md and said in html
    other = NOTHING if said == HELD else HELD
    assert other not in md and other not in html
    assert doc["counts"]["cp_examined"] == (2 if said == HELD else 0)


@settings(max_examples=10, deadline=None)
@given(nights=st.integers(1, MIN_HISTORY + 3), busy=st.booleans())
def test_held_is_said_exactly_when_a_config_had_nights_enough(nights, busy):
    """Property: for any count of level nights, reliable or all set aside, the page says
    "held its level" exactly when a config had MIN_HISTORY reliable nights, and else that
    there was nothing to look for; never both."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 's.db'}"
        _level_nights(open_store(url), nights, busy, {("baseline", 0): config_values(100.0)})
        md, html, doc = _review(url, Path(d) / "out")
    looked = not busy and nights >= MIN_HISTORY
    assert (HELD in md, NOTHING in md) == (looked, not looked)
    assert (HELD in html, NOTHING in html) == (looked, not looked)
    assert doc["counts"]["cp_examined"] == int(looked)
