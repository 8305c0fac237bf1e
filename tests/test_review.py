"""The review page: rendered from a real local sweep, opened in headless Chromium."""

from html.parser import HTMLParser

import pytest
from click.testing import CliRunner
from sqlalchemy import update

from orchestrator.cli import main
from orchestrator.fleet.inventory import Host
from orchestrator.review.sweep_page import review_data
from orchestrator.store import open_store
from orchestrator.store.models import Measurement
from orchestrator.sweep.dispatch import SweepOptions, start_sweep
from orchestrator.sweep.lock import load_lock
from tests.blas import preloaded
from tests.browser import dump_dom
from tests.locks import make_lock

HOSTILE = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>'


class Tables(HTMLParser):
    """Collects the cells of every table with class ``results``."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell, self.scripts, self.imgs = [], None, 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "results" in (a.get("class") or ""):
            self.tables.append({"workload": a.get("data-workload"), "rows": []})
        elif tag == "tr" and self.tables and a.get("data-mode"):
            self.tables[-1]["rows"].append([])
        elif tag == "td" and self.tables and self.tables[-1]["rows"]:
            self._cell = ""
        elif tag == "script":
            self.scripts += 1
        elif tag == "img":
            self.imgs += 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.tables[-1]["rows"][-1].append(self._cell.strip())
            self._cell = None


@pytest.fixture(scope="module")
def reviewed_store(model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("review")
    url = f"sqlite:///{d / 'store.db'}"
    store = open_store(url)
    local = Host(name="local", address="localhost", connection="local",
                 python=__import__("sys").executable, root=str(d / "node"))
    # the baseline runs before each width, so it has two trials whose spread on this shared
    # machine can pass 10%: a flagged config loses its speedup (tests/test_reliability.py).
    # This page's layout is the subject here, so the plan declares loose thresholds (a busy
    # CI machine would otherwise set its runs aside as contended; 1.0, a 100% spread, is
    # the loosest spread limit a plan may declare).
    doc = load_lock(make_lock(d, model_pair, use=("code", "memo"), widths=(2, 4),
                              max_tokens=40, quality=True,
                              extra="  cv_threshold: 5.0\n  contention_threshold: 1.0"))
    with preloaded():  # tests/blas.py: this page's layout is the subject, not timing
        result = start_sweep(doc, [local], store, opts=SweepOptions(provision=False))
    assert result.ok, result.outcomes
    with store.engine.begin() as c:  # model output is untrusted text
        c.execute(update(Measurement).where(Measurement.mode == "baseline")
                  .values(output_text=HOSTILE))
    return url, d, result.sweep_id


def test_review_table_in_headless_chromium(reviewed_store):
    url, d, sweep_id = reviewed_store
    out = d / "review.html"
    result = CliRunner().invoke(main, ["review", "--db", url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    parser = Tables()
    parser.feed(dump_dom(out))
    assert {t["workload"] for t in parser.tables} == {"code", "memo"}
    for t in parser.tables:
        labels = [r[0] for r in t["rows"]]
        assert labels == ["baseline (autoregressive)", "speculative, draft width 2",
                          "speculative, draft width 4"]
        base, k2 = t["rows"][0], t["rows"][1]
        assert base[3] == "1.00×" and k2[3].endswith("×")
        assert float(k2[4]) > 0  # acceptance
        # KV cache MB: the drafting row holds the draft's cache too
        assert 0 < float(base[8]) < float(k2[8])
        assert k2[9] == "identical"
        # the frozen task set ran per config; the tiny pair fails it the same way everywhere
        assert base[10] == k2[10] == "0%"
        assert t["rows"][2][11] == "0/1"  # no unreliable trials on this machine
    assert parser.scripts == 0 and parser.imgs == 0  # model output stayed text
    assert "pwned" not in dump_dom(out).split("<title>")[1].split("</title>")[0]


def test_review_numbers_match_the_store(reviewed_store):
    url, _, sweep_id = reviewed_store
    data = review_data(open_store(url), sweep_id)
    for section in data["sections"]:
        base = section["rows"][0]
        for row in section["rows"][1:]:
            assert row.speedup == pytest.approx(row.decode_tok_s / base.decode_tok_s)
            assert 0 < row.acceptance_rate <= 1


def test_review_of_an_empty_store_says_what_to_do(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    result = CliRunner().invoke(main, ["review", "--db", url, "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 1  # no file there: no store, and none is made
    assert f"no store at {tmp_path / 'e.db'}: nothing has been stored there" in result.output
    open_store(url)  # a store that exists but holds nothing
    result = CliRunner().invoke(main, ["review", "--db", url, "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    assert "Error: the store holds no sweeps yet; run `specfleet sweep` first" in result.output


def test_review_states_the_verdict(reviewed_store):
    url, _, sweep_id = reviewed_store
    for section in review_data(open_store(url), sweep_id)["sections"]:
        best = max(section["rows"][1:], key=lambda r: r.speedup)
        if best.speedup < 1:
            assert section["verdict"].startswith("Speculation is a net loss here")
        else:
            assert section["verdict"].startswith(f"Best: draft width {best.num_draft_tokens}")


def test_sweep_detail_page_escapes_model_output(reviewed_store):
    url, d, sweep_id = reviewed_store
    out = d / "sweep.html"
    r = CliRunner().invoke(main, ["review", "--sweep", sweep_id, "--db", url, "--out",
                                  str(out)])
    assert r.exit_code == 0, r.output
    parser = Tables()
    dom = dump_dom(out)
    parser.feed(dom)
    assert parser.scripts == 0 and parser.imgs == 0
    assert "&lt;script&gt;document.title" in out.read_text()  # shown as text, not run


def sweep_locally(plan, tmp_path):
    """Lock ``plan`` and sweep this machine with it into a fresh SQLite store."""
    from orchestrator.sweep.lock import write_lock
    from orchestrator.sweep.plan import load_plan

    doc = load_lock(write_lock(load_plan(plan), lambda m: None))
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    local = Host(name="local", address="localhost", connection="local",
                 python=__import__("sys").executable, root=str(tmp_path / "node"))
    result = start_sweep(doc, [local], store, opts=SweepOptions(provision=False))
    assert result.ok, result.outcomes
    return store, result


def test_a_sampling_knob_gets_rows_of_its_own(model_pair, tmp_path):
    """Declared = shown: runs at temperature 0.9 are neither pooled into a draft-width row
    nor compared with the greedy baseline; each value has its row and its own baseline."""
    from statistics import median

    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    # rows, not reliability, are under test: a busy CI machine must not set the one trial aside
    plan.write_text(plan_text(model_pair, widths=(2,), max_tokens=24,
                              extra="  contention_threshold: 1.0").replace(
        "knobs: {num_draft_tokens: [2]}", "knobs: {num_draft_tokens: [2], temperature: [0.9]}"))
    store, result = sweep_locally(plan, tmp_path)
    (section,) = review_data(store, result.sweep_id)["sections"]
    rows = {r.label: r for r in section["rows"]}
    assert list(rows) == ["baseline (autoregressive)", "baseline, temperature=0.9",
                          "speculative, draft width 2",
                          "speculative, temperature=0.9 (draft width 3)"]
    hot, hot_base = rows["speculative, temperature=0.9 (draft width 3)"], \
        rows["baseline, temperature=0.9"]
    assert hot.runs == 1 and hot_base.runs == 1 and rows["speculative, draft width 2"].runs == 1
    assert hot.speedup == pytest.approx(hot.decode_tok_s / median([hot_base.decode_tok_s]))
    assert hot.exactness == "not checked"  # sampled: no token-identity claim


def test_a_knob_added_to_the_registry_reaches_every_layer(model_pair, tmp_path):
    """xtc_probability is named only in agent/protocol.py: the plan accepts and checks it,
    mlx-lm's sampler gets it, the event and the store carry it, and the sweep page shows
    it in a row of its own; an out-of-range value stops at lock time with its line."""
    from sqlalchemy import select

    from orchestrator.errors import ConfigError
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    plan = tmp_path / "plan.yml"
    text = plan_text(model_pair, widths=(2,), max_tokens=24)
    plan.write_text(text.replace("knobs: {num_draft_tokens: [2]}",
                                 "knobs: {num_draft_tokens: [2], xtc_probability: [1.5]}"))
    with pytest.raises(ConfigError, match=r"sweep.knobs.xtc_probability: xtc_probability=1.5 "
                                          r"is not valid; it must be a number in \[0, 1\]"):
        load_plan(plan)
    plan.write_text(text.replace("knobs: {num_draft_tokens: [2]}",
                                 "knobs: {num_draft_tokens: [2], xtc_probability: [0.5]}\n"
                                 "  base: {temperature: 0.8}"))
    store, result = sweep_locally(plan, tmp_path)
    with store.engine.connect() as c:
        stored = c.execute(select(Measurement.mode, Measurement.knob, Measurement.knob_value)
                           .where(Measurement.knob == "xtc_probability")).all()
    assert sorted(stored) == [("baseline", "xtc_probability", "0.5"),
                              ("speculative", "xtc_probability", "0.5")]
    (section,) = review_data(store, result.sweep_id)["sections"]
    assert "speculative, xtc_probability=0.5 (draft width 3)" in [r.label for r in
                                                                   section["rows"]]


def test_the_weekly_page_and_the_sweep_page_count_the_same_trials(reviewed_store):
    """One vocabulary across pages: a run is a config on a node in a sweep, its trials are
    its generations; the weekly page's trials for a config equal the sweep page's."""
    from orchestrator.review.rules import load_rules
    from orchestrator.review.weekly import analyse

    url, _, sweep_id = reviewed_store
    store = open_store(url)
    page = {(s["workload"], r.label): r.runs for s in review_data(store, sweep_id)["sections"]
            for r in s["rows"]}
    weekly = analyse(store, None, load_rules())
    for s in weekly["series"]:
        for c in s["configs"]:
            label = ("baseline (autoregressive)" if c["mode"] == "baseline"
                     else f"speculative, draft width {c['k']}")
            assert c["runs"] == 1  # one sweep, one node
            assert c["trials"] == page[(s["series"]["workload"], label)], (label, c)
