"""Keep the README, .ci/run and --help honest."""

import re
from pathlib import Path

from click.testing import CliRunner

from orchestrator.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_quick_start_has_the_two_commands_and_ci_runs_the_test_one():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^(make \w+)", quick, re.M)
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec make test" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_every_specfleet_command_in_the_readme_exists():
    runner = CliRunner()
    for line in re.findall(r"^specfleet ([a-z -]+?)(?= [A-Za-z./-]*[/.]| --|$)", README, re.M):
        words = [w for w in line.split() if not w.startswith("-")]
        result = runner.invoke(main, [*words, "--help"])
        assert result.exit_code == 0, (line, result.output)


def test_help_explains_each_command():
    runner = CliRunner()
    for cmd in (["sweep"], ["review"], ["demo"], ["demo-models", "build"], ["db", "upgrade"],
                ["inventory", "list"]):
        out = runner.invoke(main, [*cmd, "--help"]).output
        assert "Usage: " in out and len(out.splitlines()) > 4, cmd
    assert "SPECFLEET_DB" in runner.invoke(main, ["sweep", "--help"]).output


def test_the_demo_says_what_to_open_and_run_next_and_that_command_works(tmp_path):
    """`make demo` ends with the two pages and a command that reads the demo's store (it
    is not the default store); the printed command runs as printed."""
    import shlex

    from orchestrator.demo import next_steps
    from orchestrator.store import open_store

    work = tmp_path / ".specfleet-demo"
    work.mkdir()
    open_store(f"sqlite:///{work / 'specfleet.db'}").record_failed_start(
        "s1", "planted", trigger="manual")
    lines = next_steps(work)
    assert lines[0] == "next:" and str(work.resolve() / "sweep.html") in lines[1]
    assert str(work.resolve() / "review.html") in lines[2]
    args = shlex.split(lines[3].split(":", 1)[1])
    assert args[0] == "specfleet"
    r = CliRunner().invoke(main, args[1:])
    assert r.exit_code == 0 and "s1" in r.output, r.output  # the demo's store, not an empty one


def test_a_folder_declares_its_store_and_inventory_in_specfleet_toml(tmp_path, monkeypatch):
    """After the demo, commands run in the folder find its store without --db (the demo
    writes specfleet.toml, never over one the user wrote); flags and SPECFLEET_DB win; a
    broken file is one line naming it."""
    import shlex

    from orchestrator.demo import declare_store, next_steps
    from orchestrator.store import open_store

    monkeypatch.delenv("SPECFLEET_CONFIG")
    monkeypatch.delenv("SPECFLEET_DB", raising=False)
    project = tmp_path / "project"
    work = project / ".specfleet-demo"
    work.mkdir(parents=True)
    open_store(f"sqlite:///{work / 'specfleet.db'}").record_failed_start(
        "s1", "planted", trigger="manual")
    written = declare_store(work, project)
    assert written == project / "specfleet.toml"
    assert 'db = "sqlite:///.specfleet-demo/specfleet.db"' in written.read_text()
    assert declare_store(work, project) is None  # never over an existing file
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")  # a parent's file applies too
    lines = next_steps(work, declared=True)
    args = shlex.split(lines[3].split(":", 1)[1])
    assert args == ["specfleet", "sweeps", "list"]
    r = CliRunner().invoke(main, args[1:])
    assert r.exit_code == 0 and "s1" in r.output, r.output
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert "s1" not in CliRunner().invoke(main, ["sweeps", "list", "--db", other]).output
    assert "s1" not in CliRunner().invoke(main, ["sweeps", "list"],
                                          env={"SPECFLEET_DB": other}).output
    # inventory too: -i defaults to the file's list, relative to the file
    (project / "inv.yml").write_text("all:\n  hosts:\n    mac-a:\n      ansible_host: 10.0.0.9\n")
    written.write_text(written.read_text() + 'inventory = ["inv.yml"]\n')
    r = CliRunner().invoke(main, ["inventory", "list", "--json"])
    assert r.exit_code == 0 and "mac-a" in r.output, r.output
    written.write_text('db = 3\n')
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{written}: db: expected a string" in r.output
    written.write_text('db = "x\n')
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert r.exit_code == 1 and "not valid TOML" in r.output and str(written) in r.output
