"""Every command's --help example, run as written, in a newcomer's scratch folder and home
(a module of its own, so that it runs beside the README test rather than after it)."""

from tests.test_docs import (
    NOT_RUN_HERE,
    help_examples,
    newcomer_with_a_mac,
    readme_blocks,
    your_mac,
)

# what a reader of --help has done first, as the README shows it: a lab, its lock, a Mac
BEFORE = ("specfleet init lab/", "specfleet plan lock lab/plan.yml")


def test_every_help_example_runs_as_written(tmp_path, fleet):
    """After the README's first steps (a lab and its lock, and the "first SSH node" block
    with the loopback node as the Mac), each example in --help order, except those that
    create sweeps, which go first so that the others have runs to show. An example that is
    a README command as well is run by the README test (same text), not twice."""
    s = newcomer_with_a_mac(tmp_path, fleet)
    init, lock = BEFORE
    s.run(init)
    # a reader's own plan: init's, lighter (the README test sweeps init's plan with only
    # its generations shortened; here `repro` and the Mac's sweep generate: 2 repetitions
    # of 16 tokens, not 3 of 160: what they print does not depend on the length)
    plan = s.cwd / "lab" / "plan.yml"
    text = plan.read_text()
    assert "  repetitions: 3\n" in text and "  context: [short]" in text
    plan.write_text(text.replace("  repetitions: 3\n", "  repetitions: 2\n").replace(
        "  context: [short]", "  max_tokens: 16\n  context: [short]"))
    s.run(lock)
    (mac_block,) = [b for b in readme_blocks() if b[0].startswith("NODE=")]
    for cmd in mac_block:
        s.run(your_mac(fleet) if cmd.startswith("NODE=") else cmd)
    in_readme = {cmd for block in readme_blocks() for cmd in block}
    examples = help_examples()
    assert {name for name, _ in examples} >= {"sweep", "review", "doctor", "repro"}
    todo = [(n, x) for n, x in examples
            if n not in NOT_RUN_HERE and x not in in_readme and x not in s.ran]
    todo.sort(key=lambda nx: nx[0] not in ("repro", "sweep", "nightly"))  # stable
    assert todo[0][0] == "repro"
    for _, example in todo:
        s.run(example)
    assert (s.cwd / "review" / "junit.xml").is_file()
    print("slowest commands:", sorted(s.took, reverse=True)[:8])


def test_examples_that_read_a_store_create_nothing_in_an_empty_folder(tmp_path):
    """`db current`, `db downgrade` and `schedule remove NAME`, as printed, in a folder with
    no store: each says what is missing and leaves the folder empty (the `db current`
    example once created an empty specfleet.db wherever it ran)."""
    import subprocess

    from tests.test_docs import Session

    s = Session(tmp_path)
    s.env["SPECFLEET_CONFIG"] = "none"  # no specfleet.toml steers it
    examples = {name: x for name, x in help_examples()}
    for name, why in (("db current", "no store at specfleet.db"),
                      ("db downgrade", "specfleet.db"),
                      ("schedule remove", "no nightly schedule named 'NAME'")):
        r = subprocess.run(["bash", "-c", examples[name]], cwd=s.cwd, env=s.env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and why in r.stdout + r.stderr, (name, r.stderr)
        assert "Traceback" not in r.stderr
        assert list(s.cwd.iterdir()) == [], (name, list(s.cwd.iterdir()))
