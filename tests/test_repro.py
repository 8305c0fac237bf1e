"""`specfleet repro`: same lock, several nodes, agreement within each node's own spread."""

import json

from click.testing import CliRunner
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.review.report import write_review
from orchestrator.review.repro import compare
from orchestrator.store import open_store
from orchestrator.store.models import ReproCheck
from tests.locks import make_lock


def test_disagreement_lists_identity_differences_first():
    steady = {"decode_tok_s": [400, 402, 398], "acceptance_rate": [0.6, 0.6, 0.6]}
    slow = {"decode_tok_s": [300, 301, 299], "acceptance_rate": [0.6, 0.6, 0.6]}
    cfg = ("code", "speculative", 3)
    r = compare({"a": {cfg: steady}, "b": {cfg: steady}, "c": {cfg: slow}},
                {"a": {"os_build": "24A335"}, "b": {"os_build": "24A335"},
                 "c": {"os_build": "24B83"}}, ("decode_tok_s", "acceptance_rate"))
    assert not r["reproducible"] and r["checked"] == 6
    assert {tuple(d["nodes"]) for d in r["disagreements"]} == {("a", "c"), ("b", "c")}
    assert all(d["metric"] == "decode_tok_s" for d in r["disagreements"])
    assert r["disagreements"][0]["identity"] == ["OS build 24A335 → 24B83"]
    noisy = {"decode_tok_s": [300, 420, 380]}  # a wide spread widens the tolerance
    assert compare({"a": {cfg: steady}, "b": {cfg: noisy}}, {},
                   ("decode_tok_s",))["reproducible"]


def test_repro_on_two_sshd_nodes(fleet, model_pair, tmp_path, sqlite_url):
    # the two "machines" share this host's two cores: each node's agent is the other's
    # contention, and their decode speed spreads. Runs flagged for either would be set aside
    # (and rightly "inconclusive": tests/test_reliability.py); this test is about agreement,
    # so its plan declares loose thresholds
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2,
                     extra="  cv_threshold: 5.0\n  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    r = CliRunner().invoke(main, [
        "repro", str(lock), "-i", str(inv), "--limit", "node1,node2", "--known-hosts",
        str(fleet.known_hosts), "--db", sqlite_url, "--no-provision", "--metrics",
        "acceptance_rate", "--failed-hosts-file", str(tmp_path / "retry"), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["reproducible"] and report["nodes"] == ["node1", "node2"]
    assert report["checked"] == 2  # acceptance of k=2 and k=3 compared across the pair
    store = open_store(sqlite_url)
    with store.engine.connect() as c:
        assert c.execute(select(ReproCheck.reproducible)).scalars().all() == [True]
    html = write_review(store, tmp_path / "review.html", formats=("html",))["html"]
    assert 'id="repro"' in html.read_text()
