"""`specfleet init` scaffolds files that work as written: lock, then sweep the local node."""

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.fleet.inventory import load_inventory
from orchestrator.sweep.lock import load_lock
from orchestrator.sweep.plan import load_plan


def test_init_then_lock_then_sweep(tmp_path):
    d = tmp_path / "bench"
    r = CliRunner().invoke(main, ["init", str(d)])
    assert r.exit_code == 0, r.output
    assert (d / "plan.yml").read_text().startswith("# specfleet plan:")
    assert (d / "inventory" / "hosts.yml").read_text().startswith("# specfleet inventory")
    assert load_inventory(d / "inventory").hosts[0].is_local
    plan = load_plan(d / "plan.yml")
    assert plan.section("gates")["min_speedup"] == 1.16
    plan_file = d / "plan.yml"  # shrink the sweep so the test stays quick
    plan_file.write_text(plan_file.read_text().replace("[2, 3, 4, 6]", "[2]").replace(
        "repetitions: 3", "repetitions: 1"))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan_file)])
    assert r.exit_code == 0, r.output
    lock = d / "plan.lock.json"
    # no node limit: the plan sweeps whatever inventory it is given (lab/inventory/ or a
    # fleet's hosts.yml, without --limit)
    assert not (load_lock(lock).get("nodes") or {}).get("limit")
    assert {p.name for p in (d / "models").iterdir()} >= {"target", "draft", "draft-8bit",
                                                           "draft-4bit"}
    # a plan with platforms: [] manages no environments: the sweep does not provision, and
    # says so, without being told --no-provision; asking for --provision is refused
    args = [str(lock), "-i", str(d / "inventory"), "--db", f"sqlite:///{d / 's.db'}",
            "--failed-hosts-file", str(d / "retry")]
    r = CliRunner().invoke(main, ["sweep", "--provision", *args])
    assert r.exit_code == 2 and "--provision: this lock manages no environments" in r.output
    r = CliRunner().invoke(main, ["sweep", *args])
    assert r.exit_code == 0, r.output
    assert "this lock manages no environments (environment.platforms: []): nodes use " \
           "their own Python" in r.stderr
    again = CliRunner().invoke(main, ["init", str(d)])
    assert again.exit_code == 1 and "init does not overwrite files" in again.output
