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
from tests.store_templates import fresh_sqlite
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


BUSY = "busy: 512 MB + 1 CPU"


@st.composite
def weeks(draw) -> Week:
    """One or two runtimes; beside mlx-lm, maybe a lineup (one target, two or three
    drafts of their own weights and tier, in one sweep a night) and maybe a co-tenant
    load (a background profile: the same pair measured busy, a series of its own)."""
    series = []
    for i in range(draw(st.integers(1, 2))):
        series.append(Series("code", draw(configs()),
                             engine=("mlx-lm", "ollama")[i]))
    for j in range(draw(st.sampled_from((0, 0, 2, 3)))):
        role = "draft" if j == 0 else f"draft-{j + 1}"  # as a job names a lineup's drafts
        series.append(Series("code", draw(configs()), pair=f"gemma-9b / small-{j}",
                             lineup=f"target+{role}", identity=(
                                 ("draft_fingerprint", "sha256:" + "abc"[j] * 64),
                                 ("draft_quant", ("unquantised", "8-bit", "4-bit g64")[j]))))
    if draw(st.booleans()):
        series.append(Series("code", draw(configs()), background=BUSY))
    return Week("random", tuple(series), nights=NIGHTS)


def _planted_key(s: Series) -> tuple:
    """A planted series as the review names it: its runtime (with its background profile)
    and its pair."""
    return (s.engine + (f" · {s.background}" if s.background else ""), s.pair)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(week=weeks())
def test_any_planted_week_renders_marks_set_asides_and_never_pools(week):
    with tempfile.TemporaryDirectory() as d:
        store = open_store(fresh_sqlite(Path(d) / "s.db"))
        plant(store, week)
        out = write_review(store, Path(d) / "out", week=WEEK, now=W20)  # every format
        a = json.loads(out["json"].read_text())
        _no_poison_without_marker(a)
        _no_poison_without_marker(policy(a))
        for line in out["md"].read_text().splitlines():
            if f"{POISON:.1f}" in line:
                assert "set aside" in line, line
        reviewed = {(s["series"]["engine"], s["series"]["model_pair"]): s for s in a["series"]}
        assert set(reviewed) == {_planted_key(s) for s in week.series}
        for planted in week.series:
            s = reviewed[_planted_key(planted)]
            labels = [c["label"] for c in s["configs"]]
            assert len(labels) == len(set(labels)), labels  # one row per knob set
            assert len(labels) == len(planted.configs)
            by_label = {x["label"]: x for x in s["configs"]}
            for c in planted.configs:  # every night of the config, none of another's
                row = by_label[config_label(c.mode, c.k, event_config(c.mode, c.k, c.knobs))]
                assert row["runs"] == NIGHTS
                assert row["set_aside"] is (len(c.aside) == NIGHTS)
        c = compare(store, "node=mac-01", "node=mac-01")
        keys = [(r["series"], r["config"], r["metric"]) for r in c["rows"]]
        assert len(keys) == len(set(keys)), keys  # no two rows a reader cannot tell apart
        # every planted config with a reliable night its own row, with only its own nights
        # (none pooled with another pair's or the busy twin's)
        decode = [r for r in c["rows"] if r["metric"] == "decode_tok_s"]
        planted = [cf for s in week.series for cf in s.configs if len(cf.aside) < NIGHTS]
        assert len(decode) == len(planted), sorted((r["series"], r["config"]) for r in decode)
        assert sorted(r["n"][0] for r in decode) == sorted(NIGHTS - len(cf.aside)
                                                           for cf in planted)
