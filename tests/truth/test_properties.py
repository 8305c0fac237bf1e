"""Properties over random planted stores (Hypothesis): for any week the ingest accepted,
the review renders in every format, no output shows a set-aside number without its
marker, and configs that differ in any knob are never pooled."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.review.compare import compare
from orchestrator.review.configs import config_label
from orchestrator.review.report import write_review
from orchestrator.review.verdict import policy
from orchestrator.store import open_store
from tests.history import event_config
from tests.truth.test_review_truth import _no_poison_without_marker
from tests.truth.weeks import POISON, W20, WEEK, Config, Series, Week, plant

NIGHTS = 3
KNOBS = st.sampled_from(((), (("temperature", 0.7),), (("top_p", 0.9),),
                         (("temperature", 0.7), ("top_p", 0.9))))
ASIDE = st.sets(st.integers(0, NIGHTS - 1), max_size=NIGHTS).map(lambda s: tuple(sorted(s)))


@st.composite
def configs(draw) -> tuple[Config, ...]:
    out: dict[tuple, Config] = {}
    for _ in range(draw(st.integers(1, 4))):
        spec = draw(st.booleans())
        c = Config("speculative" if spec else "baseline",
                   draw(st.sampled_from((2, 3, 4))) if spec else 0, draw(KNOBS),
                   decode=draw(st.floats(50, 200)),
                   acceptance=draw(st.floats(0.3, 0.9)) if spec else None,
                   swap=draw(st.sampled_from((0.0, 2e9))), aside=draw(ASIDE))
        out.setdefault(c.key, c)  # one config per knob set: the store keys runs so
    return tuple(out.values())


@st.composite
def weeks(draw) -> Week:
    series = []
    for i in range(draw(st.integers(1, 2))):
        series.append(Series("code", draw(configs()),
                             engine=("mlx-lm", "ollama")[i]))
    return Week("random", tuple(series), nights=NIGHTS)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(week=weeks())
def test_any_planted_week_renders_marks_set_asides_and_never_pools(week):
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/s.db")
        plant(store, week)
        out = write_review(store, Path(d) / "out", week=WEEK, now=W20)  # every format
        a = json.loads(out["json"].read_text())
        _no_poison_without_marker(a)
        _no_poison_without_marker(policy(a))
        for line in out["md"].read_text().splitlines():
            if f"{POISON:.1f}" in line:
                assert "set aside" in line, line
        for s, planted in zip(sorted(a["series"], key=lambda s: s["series"]["engine"]),
                              sorted(week.series, key=lambda s: s.engine)):
            labels = [c["label"] for c in s["configs"]]
            assert len(labels) == len(set(labels)), labels  # one row per knob set
            assert len(labels) == len(planted.configs)
            by_label = {x["label"]: x for x in s["configs"]}
            for c in planted.configs:  # every night of the config, none of another's
                row = by_label[config_label(c.mode, c.k, event_config(c.mode, c.k, c.knobs))]
                assert row["runs"] == NIGHTS
                assert row["set_aside"] is (len(c.aside) == NIGHTS)
        c = compare(store, "node=mac-01", "node=mac-01")
        keys = [(r["engine"], r["config"], r["metric"]) for r in c["rows"]]
        assert len(keys) == len(set(keys))
