"""Keep the README, .ci/run and --help honest."""

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from orchestrator.cli import main
from tests.blas import openblas

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
    assert str(work.resolve() / "calibration.html") in lines[2]  # the calibration pair's
    assert str(work.resolve() / "review.html") in lines[3]
    assert str(work.resolve() / "policy.json") in lines[5]  # the review's policy, asked
    args = shlex.split(lines[4].split(":", 1)[1])
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
    # the search stops at $HOME: a specfleet.toml a demo left in /tmp (above pytest's
    # folders) must not decide this one
    monkeypatch.setenv("HOME", str(tmp_path))
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
    args = shlex.split(lines[4].split(":", 1)[1])
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


def test_quick_start_is_short_and_development_notes_live_in_contributing():
    """The quick start says what a user runs and sees (under 40 lines); test internals
    (preloads, CPU-seconds, mypy caches) are in CONTRIBUTING.md, which the README names."""
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert len(quick.strip().splitlines()) < 40
    for dev in ("OpenBLAS", "CPU-s", "mypy's cache", "xdist", "SIGSTOP"):
        assert dev not in quick, dev
    # the suite's measured time, stated (CONTRIBUTING.md has the runs behind it)
    assert "CONTRIBUTING.md" in quick and re.search(r"it took \d+:\d\d \(", quick)
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert "OpenBLAS" in contributing and "## Benchmarks" in contributing
    heads = re.findall(r"^## (.+)$", README, re.M)
    order = ["Quick start", "Concepts", "Walkthrough: the first hour", "Fleet set-up",
             "Nightly", "The weekly review", "CI"]
    assert [h for h in heads if h in order] == order


def test_the_readme_lineup_is_one_init_prepares(tmp_path):
    """The README's lineup YAML, put into the plan `specfleet init` wrote, locks as it is:
    init built every draft tier it names."""
    import yaml

    from orchestrator.scaffold import init_project
    from orchestrator.sweep.lock import load_lock

    lineup = re.search(r"\*\*Lineups\.\*\*.*?```yaml\n(.*?)```", README, re.S).group(1)
    models = yaml.safe_load(lineup)["models"]
    assert len(models["draft"]) == 3
    lab = tmp_path / "lab"
    init_project(lab, log=lambda m: None)
    plan = lab / "plan.yml"
    text = plan.read_text()
    start = text.index("models:\n")
    end = text.index("workloads:")
    plan.write_text(text[:start] + lineup + text[end:])
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 0, r.output
    lock = load_lock(lab / "plan.lock.json")
    assert len(lock["models"]["lineup"]) == 3, lock["models"]


SKIP = "<!-- the tests skip this block: "


def readme_blocks() -> list[list[str]]:
    """Every ``sh`` block after the quick start (which CI runs as `make test`), in order, as
    commands: continuation lines joined, comments dropped. A block marked as skipped must
    say why."""
    text = README.split("## Quick start", 1)[1].split("\n## ", 1)[1]
    blocks = []
    for m in re.finditer(r"(<!--[^\n]*-->\n)?```sh\n(.*?)```", text, re.S):
        if m.group(1) and m.group(1).startswith(SKIP):
            assert len(m.group(1)) > len(SKIP) + 8, "a skipped block says why"
            continue
        joined = re.sub(r"\\\n\s*", "", m.group(2))
        blocks.append([re.split(r"\s+# ", line)[0].strip() for line in joined.splitlines()
                       if line.strip() and not line.startswith("#")])
    return blocks


def help_examples() -> list[tuple[str, str]]:
    """(command, example) for every command: the lines under "Example" in its --help."""
    import click

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    out = []
    for name, _ in walk(main, []):
        text = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=200).output
        assert re.search(r"^  Examples?\b", text, re.M), f"{name} --help has no example"
        body = re.split(r"^  Examples?\b[^\n]*\n", text, flags=re.M)[1]
        body = re.sub(r"\\\n\s*", "", body.split("\n\n", 1)[0])
        lines = [re.split(r"\s+# ", line)[0].strip() for line in body.splitlines()]
        assert lines and all(x.startswith(("specfleet ", "cp ")) for x in lines), (name, lines)
        out += [(name, x) for x in lines]
    return out


# examples the README test does not run, and why (each is run by the test named)
NOT_RUN_HERE = {
    "provision": "installs pinned wheels on nodes: tests/test_provision.py runs it where a "
                 "lock with platforms and provisioned nodes exist",
    "demo": "the whole demo (three drafts): tests/test_demo_example.py",
    "export otlp": "needs an OTLP collector: tests/test_otlp_export.py runs the example "
                   "against a real receiver on the published OTLP messages",
}


class Session:
    """A newcomer's shell: a scratch folder and HOME, the venv on PATH; ids the commands
    print are remembered so that SWEEP_ID, RUN_ID and NAME read as a reader copies them."""

    def __init__(self, tmp_path: Path):
        import os
        import sys

        self.cwd = tmp_path / "work"
        self.home = tmp_path / "home"
        self.cwd.mkdir()
        self.home.mkdir()
        self.env = {**os.environ, "HOME": str(self.home),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.env.update(openblas())  # tests/blas.py: faster, same commands
        self.env.pop("SPECFLEET_DB", None)
        self.ids: dict[str, str] = {}
        self.ran: set[str] = set()
        self.took: list[tuple[float, str]] = []  # seconds per command: where the time goes

    def run(self, cmd: str, timeout: float = 600) -> subprocess.CompletedProcess | None:
        import shlex

        if re.fullmatch(r"(\w+=\S+\s*)+", cmd):  # NAME=value …: the shell's variables
            self.env.update(dict(a.split("=", 1) for a in shlex.split(cmd)))
            return None
        self.ran.add(cmd)
        for key, value in self.ids.items():
            cmd = cmd.replace(key, value)
        assert not re.search(r"\b(SWEEP_ID|RUN_ID|NAME)\b", cmd), (
            f"{cmd}: an id the commands before did not print")
        import time

        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", cmd], cwd=self.cwd, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        self.took.append((round(time.monotonic() - t0, 1), cmd))
        # repro answers with its exit status: 0 reproducible, 1 not, 3 inconclusive (two
        # "nodes" on one 2-core machine contend, so here it is honestly inconclusive)
        answered = cmd.startswith("specfleet repro ") and r.returncode in (1, 3) and re.search(
            r"repro sweep \w+: .*(reproducible|inconclusive)", r.stdout + r.stderr)
        # so does the instrument check: 1 off, 3 unverified (a contended node), one line each
        answered = answered or cmd.startswith("specfleet calibrate ") and r.returncode in (
            1, 3) and re.search(r"^\S+: instrument (OFF|unverified)", r.stdout, re.M)
        assert (r.returncode == 0 or answered) and "Traceback" not in r.stderr + r.stdout, (
            f"command failed ({r.returncode}): {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        if m := re.search(r"sweep (\w{12}): (ok|no reliable result)", r.stderr):
            self.ids["SWEEP_ID"] = m.group(1)
        if m := re.search(r"specfleet-nightly-\w{12}", r.stdout):
            self.ids["NAME"] = m.group(0)
        if "runs.csv" in cmd and (self.cwd / "runs.csv").is_file():
            self.ids["RUN_ID"] = (self.cwd / "runs.csv").read_text().splitlines()[1].split(",")[0]
        return r


def newcomer_with_a_mac(tmp_path, fleet) -> "Session":
    """A Session whose home holds the key the loopback sshd node ("your Mac") accepts."""
    import shutil

    s = Session(tmp_path)
    (s.home / ".ssh").mkdir(mode=0o700)
    shutil.copy(fleet.client_key, s.home / ".ssh" / "id_ed25519")  # your key, on the node
    (s.home / ".ssh" / "id_ed25519").chmod(0o600)
    return s


def your_mac(fleet) -> str:
    """The values the README's ``# your Mac`` line gets here: the loopback sshd node."""
    node = fleet.nodes[0]
    return (f"NODE={node.address} PORT={node.port} NODE_USER={node.user} "
            f"NODE_PYTHON={fleet.python}")


def shorter_generations(plan: Path, max_tokens: int = 16) -> None:
    """init's plan with shorter generations, as a reader may edit it: the README sweeps its
    lock three times (this machine, the Mac, the nightly), 24 generations each, and the code
    workload's 160 tokens made each sweep ~30 CPU-s on a 2-core host, a quarter of the
    suite's longest test (an agent's 24 generations: 4.6 CPU-s at 40 tokens, 2.8 at 16).
    Widths, repetitions and workloads stay as written; what the commands print and store
    does not depend on the length."""
    text = plan.read_text()
    assert "max_tokens" not in text and "  context: [short]" in text
    plan.write_text(text.replace("  context: [short]",
                                 f"  max_tokens: {max_tokens}\n  context: [short]", 1))


def test_every_readme_command_block_runs_as_written(tmp_path, fleet):
    """Every command block of the README after the quick start, in order, in a newcomer's
    scratch folder and HOME: this machine as the local node, a loopback sshd node as "your
    Mac" (only the values on the line marked ``# your Mac`` change; init's plan gets
    shorter generations), SQLite. Each must succeed, without a traceback."""
    blocks = readme_blocks()
    assert len(blocks) >= 5 and blocks[0][0].startswith("specfleet init")
    # a fleet sweep as written: init's plan names no node, so no --limit is needed
    assert "specfleet sweep lab/plan.lock.json -i ~/fleet/hosts.yml" in [
        line for block in blocks for line in block]
    s = newcomer_with_a_mac(tmp_path, fleet)
    marked = [line for block in blocks for line in block if line.startswith("NODE=")]
    assert len(marked) == 1 and "# your Mac" in README
    for block in blocks:
        for cmd in block:
            s.run(your_mac(fleet) if cmd.startswith("NODE=") else cmd)
            if cmd == "specfleet init lab/":
                shorter_generations(s.cwd / "lab" / "plan.yml")
    assert (s.cwd / "review.html").is_file() and {"SWEEP_ID", "RUN_ID"} <= set(s.ids)
    assert "mac-a" in (s.home / "fleet" / "hosts.yml").read_text()
    print("slowest commands:", sorted(s.took, reverse=True)[:8])
