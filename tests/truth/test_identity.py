"""One config identity: the ingest's config key is the unit of every reader, with one
label; runs that share a key but differ in a knob are refused, never pooled."""

from __future__ import annotations

import re

import pytest

from orchestrator.review.compare import compare
from orchestrator.review.configs import MixedConfigs, config_label, group_configs
from orchestrator.review.week_runs import RunRow
from orchestrator.store import open_store
from tests.truth.weeks import W20, WEEKS, plant


def test_compare_keeps_sampling_settings_apart(any_url, tmp_path):
    """Five nights at temperature 0.0 (1.5×) and 0.7 (0.9×) at width 3: compare shows each
    config's own row, five nights each, never one pooled "speculative k=3"."""
    store = open_store(any_url)
    (week,) = [w for w in WEEKS if w.name == "sampling settings apart"]
    plant(store, week)
    c = compare(store, "node=mac-01", "node=mac-01")
    rows = {r["config"]: r for r in c["rows"] if r["metric"] == "decode_tok_s"}
    assert set(rows) == {"baseline", "baseline · temperature 0.7", "speculative k=3",
                         "speculative k=3 · temperature 0.7"}
    assert rows["speculative k=3"]["a"] == pytest.approx(150.0)
    assert rows["speculative k=3 · temperature 0.7"]["a"] == pytest.approx(90.0)
    assert all(r["n"] == [5, 5] for r in rows.values())
    # the history site names the same four configs, each with its own nights
    from orchestrator.review.site import write_site

    write_site(store, tmp_path / "site", week="2026-W20", now=W20.replace(day=17))
    (page,) = (tmp_path / "site" / "series").glob("*.html")
    names = re.findall(r"<h2>([^<]+)</h2>", page.read_text())
    assert sorted(n for n in names if n.startswith(("baseline", "speculative"))) == sorted(rows)


def _run(config: dict, key: str) -> RunRow:
    return RunRow(1, "s", W20, "mac-01", ("chip",), "speculative", 3, {}, {}, None, False,
                  config, key)


def test_grouping_refuses_runs_that_share_a_key_but_differ_in_a_knob():
    # two long configs whose stored keys were cut to the same 255 characters
    key = '{"num_draft_tokens": 3, "temperature": 0.0, "variant": "' + "x" * 200
    a = _run({"num_draft_tokens": 3, "temperature": 0.0}, key)
    b = _run({"num_draft_tokens": 3, "temperature": 0.7}, key)
    assert len(group_configs([a, _run(a.config, key)], RunRow.whole.fget)) == 1
    with pytest.raises(MixedConfigs, match="speculative k=3: runs stored under one config key"):
        group_configs([a, b], RunRow.whole.fget)


def test_one_label_names_every_knob_away_from_its_default():
    assert config_label("baseline", 0, {"temperature": 0.0, "num_draft_tokens": 0}) == "baseline"
    assert config_label("speculative", 3, {"temperature": 0.7, "top_p": 0.9, "top_k": 0,
                                           "num_draft_tokens": 3}) == \
        "speculative k=3 · temperature 0.7 · top_p 0.9"


def test_repro_compares_each_knob_set_on_its_own(any_url, tmp_path):
    """Two nodes, one sweep, width 3 at temperature 0.0 (150 tok/s) and 0.7 (90 tok/s):
    four configs a node, each compared with its own on the other node (one key per width
    kept only the last of the two, and compared 150 with 90 or not at all)."""
    from orchestrator.review.repro import compare as repro_compare
    from orchestrator.review.repro import sweep_values
    from tests.history import C, config_values, night

    store = open_store(any_url)
    sid = None
    for node in ("mac-a", "mac-b"):
        sid = night(store, W20, node=node, chip="Apple M2 Max", pair="p", workload="code",
                    sweep_id=sid, configs={
                        C("baseline", 0): config_values(100.0, jitter=0.0),
                        C("baseline", 0, temperature=0.7): config_values(100.0, jitter=0.0),
                        C("speculative", 3): config_values(150.0, jitter=0.0),
                        C("speculative", 3, temperature=0.7): config_values(90.0, jitter=0.0)})
    per_node, idents, aside = sweep_values(store, sid)
    assert len(per_node["mac-a"]) == len(per_node["mac-b"]) == 4 and not aside
    report = repro_compare(per_node, idents, metrics=("decode_tok_s",))
    assert report["reproducible"] and report["checked"] == 4


def test_compare_keeps_each_pair_of_a_lineup_apart_and_names_it(any_url, tmp_path):
    """A lineup (one target, two drafts, one sweep a night) beside two plain pairs: the
    four baselines (100, 140, 120 and 90 tok/s planted) are four rows, each its own nights,
    named by pair (before: two plain pairs of one node were pooled into one row, and the
    lineup's rows read "baseline" alike). One pair a side stays an identity difference,
    compared."""
    from orchestrator.review.compare import as_text
    from tests.truth.weeks import Config, Series, Week

    store = open_store(any_url)
    draft = {0: "a", 1: "b"}
    plant(store, Week("lineup", (
        Series("code", (Config("baseline", decode=120.0),)),
        Series("code", (Config("baseline", decode=90.0),), pair="llama-8b / llama-1b"),
        *(Series("code", (Config("baseline", decode=100.0 + 40 * j),),
                 pair=f"gemma-9b / small-{j}", lineup="target+" + ("draft", "draft-2")[j],
                 identity=(("draft_fingerprint", "sha256:" + draft[j] * 64),))
          for j in (0, 1))), nights=3))
    c = compare(store, "node=mac-01", "node=mac-01")
    rows = {r["series"]: r for r in c["rows"] if r["metric"] == "decode_tok_s"}
    assert {s: (r["a"], r["n"]) for s, r in rows.items()} == {
        "mlx-lm · gemma-9b / gemma-2b": (pytest.approx(120.0), [3, 3]),
        "mlx-lm · llama-8b / llama-1b": (pytest.approx(90.0), [3, 3]),
        "mlx-lm · gemma-9b / small-0": (pytest.approx(100.0), [3, 3]),
        "mlx-lm · gemma-9b / small-1": (pytest.approx(140.0), [3, 3])}
    assert "runtime · pair" in as_text(c).splitlines()[5]
    one = compare(store, "model_pair=gemma-9b / gemma-2b", "model_pair=llama-8b / llama-1b")
    (row,) = [r for r in one["rows"] if r["metric"] == "decode_tok_s"]
    assert row["ratio"] == pytest.approx(0.75) and row["pair"] is None
    assert {"key": "model_pair", "a": ["gemma-9b / gemma-2b"], "b": ["llama-8b / llama-1b"]} \
        in one["identity_differences"]
