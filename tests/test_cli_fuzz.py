"""Every command, every option, bad values: one clear line and exit 1 or 2, never a
traceback. Numbers out of range, malformed weeks, revisions, URLs, paths and patterns.

The arguments are bogus too (a file that does not exist), so nothing runs for real: what
is checked is that whatever a user types is answered, not crashed on."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import main

# commands that would do real work (or write the user's scheduler) once their arguments
# are valid; their options are still checked, with an argument that cannot be valid
BAD_NUMBERS = {"INTEGER": ["-5", "abc", "99999999999999999999"],
               "INTEGER RANGE": ["-5", "abc", "0", "99999999999999999999"],
               "FLOAT": ["abc", "nan"], "FLOAT RANGE": ["-1", "abc", "nan", "-inf"]}
BAD_TEXT = ["", "/nonexistent/x", "mysql://u@h/db", "2026-W60", "a:b:!", "@/nonexistent/retry",
            "sqlite:////nonexistent/dir/x.db"]


def _commands(group=main, path=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def _cases():
    runner = CliRunner()
    for path, cmd in _commands():
        if path in (("demo",), ("demo-models", "build"), ("init",), ("calibrate",)):
            # their only argument/option is a folder they create, or (calibrate) they check
            # this machine with no argument at all: checked below
            continue
        args = ["/nonexistent/arg"] * sum(1 for p in cmd.params
                                          if isinstance(p, click.Argument) and p.required)
        yield " ".join(path), [*path, *args], False
        # a command that runs without arguments (review, doctor, inventory list …) would do
        # its work for every text value: there, only values refused at parse time
        runs = not args and path[0] not in ("sweep", "nightly", "repro", "provision")
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.is_flag or p.hidden:
                continue
            numbers = BAD_NUMBERS.get(p.type.name.upper())
            if numbers is None and runs:
                continue
            for v in numbers or BAD_TEXT:
                yield f"{' '.join(path)} {p.opts[0]} {v!r}", [*path, *args, p.opts[0], v], \
                    numbers is not None
    del runner


CASES = list(_cases())


@pytest.mark.parametrize("chunk", range(4))
def test_every_option_answers_bad_values_with_one_line(chunk, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPECFLEET_DB", f"sqlite:///{tmp_path / 's.db'}")
    monkeypatch.chdir(tmp_path)
    bad = []
    for label, argv, number in CASES[chunk::4]:
        r = CliRunner().invoke(main, argv)
        crashed = r.exception is not None and not isinstance(r.exception, SystemExit)
        if crashed or r.exit_code not in (0, 1, 2) or "Traceback" in r.output:
            bad.append(f"{label}: exit {r.exit_code} {type(r.exception).__name__} "
                       f"{r.output.strip()[-200:]}")
        elif r.exit_code and "Error" not in r.output:
            bad.append(f"{label}: exit {r.exit_code} without an error line: {r.output[-200:]}")
        elif number and r.exit_code == 0:
            bad.append(f"{label}: a number out of range was accepted")
        elif number and r.exit_code == 2 and argv[-2] not in r.output and not any(
                x in r.output for x in ("Missing argument", "Invalid value for '",
                                        "give a LOCK")):
            # a value refused at parse time is named with its option (unless another
            # parameter, checked first, was the problem)
            bad.append(f"{label}: the message does not name {argv[-2]}: {r.output[-200:]}")
    assert not bad, "\n".join(bad)
    assert len(CASES) > 300


def test_folder_commands_refuse_what_is_not_a_folder_they_can_write(tmp_path):
    (tmp_path / "file").write_text("x")
    for argv in (["demo", "--workdir", str(tmp_path / "file")],
                 ["demo", "--workdir", ""],
                 ["demo", "--max-tokens", "0"],
                 ["init", str(tmp_path / "file")],
                 ["demo-models", "build", str(tmp_path / "file")],
                 ["calibrate", "--workdir", str(tmp_path / "file")],
                 ["calibrate", "--workdir", ""], ["calibrate", "--layers", "2"],
                 ["calibrate", "--draft", "/nonexistent/x"], ["calibrate", "--max-tokens", "0"],
                 ["calibrate", "--repetitions", "abc"], ["calibrate", "--limit", "a:b:!"]):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code in (1, 2) and "Traceback" not in r.output, (argv, r.output)
        assert "Error" in r.output, (argv, r.output)
