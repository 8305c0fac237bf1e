"""Inspect and export: sweeps list, runs list/show as table, JSON and CSV; db migrations
both ways through the CLI on SQLite and PostgreSQL."""

import csv
import io
import json
import sys

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.fleet.inventory import Host
from orchestrator.store import open_store
from orchestrator.sweep.dispatch import SweepOptions, start_sweep
from orchestrator.sweep.lock import load_lock
from tests.locks import make_lock
from tests.test_store import HEAD


@pytest.fixture(scope="module")
def swept(model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    url = f"sqlite:///{d / 's.db'}"
    # about listing, not reliability: a busy host's runs stay `ok`
    doc = load_lock(make_lock(d, model_pair, widths=(2, 3), repetitions=2, max_tokens=24,
                              extra="  cv_threshold: 1.0\n  contention_threshold: 1.0"))
    local = Host(name="local", address="localhost", connection="local", python=sys.executable,
                 root=str(d / "node"))
    r = start_sweep(doc, [local], open_store(url), opts=SweepOptions(provision=False))
    assert r.ok
    return url, r.sweep_id


def test_sweeps_and_runs_listing(swept):
    url, sid = swept
    out = CliRunner().invoke(main, ["sweeps", "list", "--db", url, "--json"])
    assert json.loads(out.output)[0] == {**json.loads(out.output)[0], "sweep_id": sid,
                                         "status": "ok", "trigger": "manual",
                                         "nodes": {"local": "ok"}}
    table = CliRunner().invoke(main, ["sweeps", "list", "--db", url]).output.splitlines()
    assert table[0].split() == ["sweep_id", "created_at", "status", "trigger", "nodes"]
    assert table[1].split()[0] == sid and table[1].split()[-1] == "local:ok"
    rows = json.loads(CliRunner().invoke(main, ["runs", "list", "--db", url, "--json"]).output)
    assert [(r["mode"], r["num_draft_tokens"]) for r in rows] == [
        ("baseline", 0), ("speculative", 2), ("speculative", 3)]
    assert all(r["trials"] == (4 if r["mode"] == "baseline" else 2) for r in rows)
    assert rows[1]["mlx_lm_version"] == "0.32.2" and rows[1]["chip"]
    table = CliRunner().invoke(main, ["runs", "list", "--db", url]).output.splitlines()
    assert table[0].split() == ["id", "sweep_id", "node", "engine", "workload", "mode",
                                "num_draft_tokens", "decode_tok_s_median",
                                "acceptance_median", "unreliable"]
    assert len(table) == 4 and table[2].split()[3:7] == ["mlx-lm", "code", "speculative", "2"]
    assert table[1].index("baseline") == table[2].index("speculative")  # aligned columns
    only = CliRunner().invoke(main, ["runs", "list", "--db", url, "--engine", "llama-server",
                                     "--json"]).output
    assert json.loads(only) == []
    parsed = list(csv.DictReader(io.StringIO(
        CliRunner().invoke(main, ["runs", "list", "--db", url, "--csv"]).output)))
    assert [p["num_draft_tokens"] for p in parsed] == ["0", "2", "3"]


def test_run_show_lists_every_generation(swept):
    url, sid = swept
    rid = json.loads(CliRunner().invoke(main, ["runs", "list", "--db", url, "--json"])
                     .output)[1]["id"]
    d = json.loads(CliRunner().invoke(main, ["runs", "show", str(rid), "--db", url,
                                             "--json"]).output)
    assert len(d["measurements"]) == 2 and d["summary"]["exact"] is True
    assert d["decode_tok_s_median"] == pytest.approx(
        sorted(m["decode_tok_s"] for m in d["measurements"])[0] / 2 +
        sorted(m["decode_tok_s"] for m in d["measurements"])[1] / 2)
    text = CliRunner().invoke(main, ["runs", "show", str(rid), "--db", url]).output
    assert "#1" in text and "tok/s" in text
    bad = CliRunner().invoke(main, ["runs", "show", "99999", "--db", url])
    assert bad.exit_code == 1 and "no run 99999" in bad.output


def test_db_downgrade_and_upgrade_through_the_cli(empty_any_url):
    r = CliRunner().invoke(main, ["db", "upgrade", "--db", empty_any_url])
    assert r.exit_code == 0 and f"store at revision {HEAD}" in r.output
    r = CliRunner().invoke(main, ["db", "downgrade", "0002", "--db", empty_any_url])
    assert r.exit_code == 0 and r.output.strip() == "store at revision 0002"
    r = CliRunner().invoke(main, ["db", "current", "--db", empty_any_url])
    assert r.output.strip() == "0002"
    r = CliRunner().invoke(main, ["db", "downgrade", "base", "--db", empty_any_url])
    assert r.output.strip() == "store at revision base (empty)"
    r = CliRunner().invoke(main, ["db", "upgrade", "--db", empty_any_url])
    assert f"store at revision {HEAD}" in r.output


def test_a_downgrade_that_deletes_data_says_what_and_needs_yes(any_url):
    """`db downgrade` that would drop stored rows lists them and refuses without --yes
    (CliRunner has no terminal); with --yes it goes ahead; the next command that opens the
    store says it upgraded it back rather than doing it silently."""
    from orchestrator.store import open_store
    from orchestrator.sweep.decode import Quarantined

    store = open_store(any_url)
    store.create_sweep("s1", {"models": {"target": {}, "draft": {}}}, None)
    store.quarantine("s1", "n1", [Quarantined(3, "not JSON", "{oops"),
                                  Quarantined(None, "not JSON", "}}")])
    r = CliRunner().invoke(main, ["db", "downgrade", "0007", "--db", any_url])
    assert r.exit_code == 1
    assert "downgrading to 0007 would delete:\n  table quarantined_events: 2 row(s)" in r.output
    assert "nothing was changed; add --yes to delete it" in r.output
    assert store.current_revision() == HEAD and store.quarantined_count("s1", "n1") == 2
    # a downgrade that deletes nothing needs no --yes (0009 → 0008 rebuilds a table)
    r = CliRunner().invoke(main, ["db", "downgrade", "0008", "--db", any_url])
    assert r.exit_code == 0 and r.output.strip() == "store at revision 0008", r.output
    r = CliRunner().invoke(main, ["db", "downgrade", "0007", "--yes", "--db", any_url])
    assert r.exit_code == 0 and r.output.strip() == "store at revision 0007"
    r = CliRunner().invoke(main, ["sweeps", "list", "--db", any_url])
    assert r.exit_code == 0
    assert f"upgraded from revision 0007 to {HEAD}" in r.stderr
    assert "upgraded" not in CliRunner().invoke(main, ["sweeps", "list", "--db", any_url]).stderr
