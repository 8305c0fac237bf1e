"""Planted change points, declared as data: five weeks of nights (the review's window: its
week and the four before), one series each, with the answer the review must give.

Each series holds a baseline at 100 tok/s every night and a speculative config whose level
follows a planted shape (no jitter: every level is a planted number); the identity changes
where declared. ``plant`` puts them into a store through the real ingest (tests/history.py);
tests/truth/test_changes_truth.py checks the review's JSON, Markdown and HTML on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from orchestrator.store import Store
from tests.history import C, config_values, night, week_nights
from tests.truth.weeks import W20

START = W20 - timedelta(days=28)  # the window's first night: four weeks before the week
NIGHTS = 35
SPEC = "speculative k=3"


@dataclass(frozen=True)
class Case:
    workload: str
    levels: tuple[float, ...]          # the speculative config's level, night by night
    identity: dict = field(default_factory=dict)  # {night: identity fields from then on}
    expect: tuple[dict, ...] = ()      # the change points the review must report


def night_date(i: int) -> str:
    return (START.date() + timedelta(days=i)).isoformat()


def _shape(f) -> tuple[float, ...]:
    return tuple(150.0 * f(i) for i in range(NIGHTS))


CASES = (
    # issue 27: a step 3 nights before the window's end was dated a night early and its
    # cause (an mlx-lm bump that night) dropped
    Case("late-step", _shape(lambda i: 0.85 if i >= 32 else 1.0),
         identity={32: {"mlx_lm_version": "0.33.0"}},
         expect=({"kind": "possible step", "date": night_date(32), "size": -0.15,
                  "note": "confirm on the next nights",
                  "changed": ["mlx-lm 0.32.2 → 0.33.0"]},)),
    # a step inside the window, on the night the draft's weights changed: a step, named
    Case("mid-step", _shape(lambda i: 1.2 if i >= 15 else 1.0),
         identity={15: {"draft_fingerprint": "sha256:" + "e" * 64}},
         expect=({"kind": "step", "date": night_date(15), "size": 0.2, "note": None,
                  "changed": ["draft weights sha256:" + "d" * 64 + " → sha256:" + "e" * 64]},)),
    # issue 27: a drift was never labelled drift. 20% down in a straight line from night 9
    # (the last at the old level) to night 25 (the first at the new): its first and last
    # nights within one of those, its size within one night's move (1.25%) of the whole
    Case("drift", _shape(lambda i: 1.0 - 0.2 * min(max((i - 9) / 16, 0.0), 1.0)),
         expect=({"kind": "drift", "date": (night_date(9), night_date(10)),
                  "until": (night_date(24), night_date(25)), "size": -0.2,
                  "size_within": 0.0125},)),
    # issue 27: a two-night dip made a change point; it is none
    Case("dip", _shape(lambda i: 0.75 if i in (20, 21) else 1.0)),
    # and a level that holds is none
    Case("flat", _shape(lambda i: 1.0)),
)


def plant(store: Store, cases=CASES) -> None:
    """Night by night, one sweep holding every case's series on its own workload."""
    for i, at in enumerate(week_nights(START, NIGHTS)):
        sid = None
        for c in cases:
            ident: dict = {}
            for since, fields in sorted(c.identity.items()):
                if i >= since:
                    ident.update(fields)
            sid = night(store, at, node="mac-01", chip="Apple M2 Max",
                        pair="gemma-9b / gemma-2b", workload=c.workload, sweep_id=sid,
                        identity=ident, configs={
                            C("baseline", 0): config_values(100.0, jitter=0.0),
                            C("speculative", 3): config_values(c.levels[i], jitter=0.0,
                                                               acceptance=0.7)})
