"""The sweep page decides through the noise exactly where the weekly review does, on the same
sweep's runs planted through the real ingest (journal lines into ``Store.ingest``, each
config's summary from the agent's own ``config_summary``), and says the same decision."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.sweep_page import review_data
from orchestrator.store import open_store
from tests.store_templates import fresh_sqlite
from tests.test_audit_34n import AT, sweep_gens, trials, weekly

DECISIONS = ("production candidate", "keep autoregressive", "graded fallback")


def _pages(path, seed: int, ratio: float, acceptance: float, swap: bool, quality: float | None,
           throttled: bool, pre_1_9: bool) -> tuple[dict, str]:
    store = open_store(fresh_sqlite(path))
    rng = random.Random(seed)
    base = trials(rng, 100, 6)
    if throttled:  # one trial of the baseline set aside for the machine's state, not noise
        base[0].update(unreliable=True, unreliable_reasons=["thermal throttling (serious)"])
    spec = trials(rng, 100 * ratio, 6, acceptance,
                  **({"swap_used_after_bytes": 3e9} if swap else {}))
    sid = sweep_gens(store, AT, {("baseline", 0): base, ("speculative", 2): spec},
                     quality=None if quality is None else {0: 0.9, 2: quality},
                     pre_1_9=pre_1_9)
    _, s = weekly(store)
    (section,) = review_data(store, sid)["sections"]
    return s["verdict"], section["verdict"]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(0.4, 2.5), acceptance=st.floats(0.2, 1.0),
       swap=st.booleans(), quality=st.sampled_from([None, 0.9, 0.6]),
       throttled=st.booleans(), pre_1_9=st.booleans())
def test_both_pages_decide_through_the_noise_alike(tmp_path_factory, seed, ratio, acceptance,
                                                   swap, quality, throttled, pre_1_9):
    week, page = _pages(tmp_path_factory.mktemp("sn") / "s.db", seed, ratio, acceptance, swap,
                        quality, throttled, pre_1_9)
    decided = "through_noise" in week
    assert page.startswith("Decided through the noise") == decided, (week["text"], page)
    if decided:
        said = [d for d in DECISIONS if d in page.lower()]
        assert said == [week["decision"]], (week["text"], page)
    if throttled or pre_1_9:  # never decided through the noise: the old verdict on both
        assert not decided and not page.startswith("Decided"), page


def test_a_swapping_candidate_is_no_production_candidate_on_either_page(tmp_path):
    """Planted: 2x as fast, acceptance 1.0, every trial swapping 3 GB (the ceiling is
    1.5 GB): a gate that does not hang on timing fails whatever the noise."""
    week, page = _pages(tmp_path / "s.db", 2, 2.0, 1.0, True, None, False, False)
    assert week["decision"] == "graded fallback" and "through_noise" in week, week["text"]
    assert page.startswith("Decided through the noise") and "graded fallback" in page, page
    assert "peak swap 3000.0 MB > 1500 MB" in page, page
