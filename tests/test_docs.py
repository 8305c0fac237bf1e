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


def readme_block(marker: str = "<!-- the tests run this block -->") -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index(marker):].split("```sh\n", 1)[1].split("```", 1)[0]
    # a command, without its trailing comment
    return [re.split(r"\s+# ", line)[0].strip() for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    """The README's Commands block, in order, in a scratch folder, against this machine's
    node and SQLite: each must succeed. SWEEP_ID and RUN_ID become the ids the commands
    before printed, as a reader would copy them."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}"}
    env.pop("SPECFLEET_DB", None)
    ids: dict[str, str] = {}
    commands = readme_block()
    assert commands[0].startswith("specfleet init") and len(commands) >= 10
    for cmd in commands:
        for key, value in ids.items():
            cmd = cmd.replace(key, value)
        assert "_ID" not in cmd, f"{cmd}: an id the commands before did not print"
        r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (
            f"README command failed: {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        if m := re.search(r"sweep (\w{12}): ok", r.stderr):
            ids["SWEEP_ID"] = m.group(1)
        if cmd.startswith("specfleet runs list") and "runs.csv" in cmd:
            ids["RUN_ID"] = (tmp_path / "runs.csv").read_text().splitlines()[1].split(",")[0]
    assert (tmp_path / "review.html").is_file() and set(ids) == {"SWEEP_ID", "RUN_ID"}
