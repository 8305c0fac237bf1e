"""`specfleet compare A B`: two weeks, two nodes or two identities, like for like, with
identity differences first and unreliable runs set aside."""

import json
import random

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.store import open_store
from tests.browser import dump_dom
from tests.history import config_values as V
from tests.history import night, week_nights
from tests.test_weekly_review import W19, W20

MAC = dict(chip="Apple M2 Max", pair="gemma", workload="code")


def _store(tmp_path):
    rng = random.Random(4)
    url = f"sqlite:///{tmp_path / 's.db'}"
    store = open_store(url)
    for at in week_nights(W19):
        night(store, at, node="mac-01", **MAC, configs={
            ("baseline", 0): V(100.0, rng=rng), ("speculative", 3): V(130.0, acceptance=0.7,
                                                                      rng=rng)})
        night(store, at, node="mac-02", **MAC, configs={("baseline", 0): V(100.5, rng=rng)})
    for at in week_nights(W20):
        throttled = at == week_nights(W20)[2]
        night(store, at, node="mac-01", **MAC, identity={"mlx_lm_version": "0.33.0"},
              unreliable="thermal throttling" if throttled else None, configs={
                  ("baseline", 0): V(100.0, rng=rng),
                  ("speculative", 3): V(110.0, acceptance=0.6, rng=rng)})
    return url


def test_two_weeks_like_for_like_with_identity_differences_first(tmp_path):
    url = _store(tmp_path)
    r = CliRunner().invoke(main, ["compare", "node=mac-01,week=2026-W19",
                                  "node=mac-01,week=2026-W20", "--db", url, "--json"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    assert c["identity_differences"] == [{"key": "mlx_lm_version", "a": ["0.32.2"],
                                          "b": ["0.33.0"]}]
    rows = {(x["config"], x["metric"]): x for x in c["rows"]}
    spec = rows[("speculative k=3", "decode_tok_s")]
    assert spec["ratio"] == __import__("pytest").approx(110 / 130, rel=0.02)
    assert spec["ci"][0] < spec["ratio"] < spec["ci"][1] < 1.0
    assert spec["verdict"] == "B worse" and spec["p"] < 0.01
    assert spec["n"] == [7, 6]  # nights, not repetitions: the throttled night set aside
    assert rows[("speculative k=3", "acceptance_rate")]["verdict"] == "B worse"
    assert rows[("baseline", "decode_tok_s")]["verdict"] == "same within noise"
    (aside,) = [x for x in c["set_aside"] if x["config"] == "speculative k=3"]
    assert aside["side"] == "B" and aside["reasons"] == ["thermal throttling"]


def test_two_nodes_in_text_and_html(tmp_path):
    url = _store(tmp_path)
    page = tmp_path / "cmp.html"
    r = CliRunner().invoke(main, ["compare", "node=mac-01,week=2026-W19", "node=mac-02",
                                  "--db", url, "--out", str(page)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[3] == "identity differences (the likeliest causes of what follows):"
    assert lines[4] == "  node: mac-01 → mac-02"
    # two nodes: independent sides, said on the row
    assert any(x.startswith("code        baseline         decode_tok_s") and
               x.endswith("same within noise (sides apart: independent nights)")
               for x in lines)
    assert any("speculative k=3" in x and x.endswith("only in A") for x in lines)
    dom = dump_dom(page)
    assert 'id="identity"' in dom and "mac-02" in dom and 'data-verdict="only in A"' in dom


def test_a_selector_that_selects_nothing_or_is_malformed_is_one_line(tmp_path):
    url = _store(tmp_path)
    r = CliRunner().invoke(main, ["compare", "2026-W01", "2026-W20", "--db", url])
    assert r.exit_code == 1 and "Error: '2026-W01' selects no runs in the store" in r.output
    r = CliRunner().invoke(main, ["compare", "colour=blue", "2026-W20", "--db", url])
    assert r.exit_code == 1 and "'colour=blue' is not a filter" in r.output
    assert "Traceback" not in r.output
