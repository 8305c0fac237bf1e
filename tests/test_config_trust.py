"""A specfleet.toml found by walking up folders is named on stderr, must be safe, stops at
the repository root and $HOME, and never chooses what runs (issue 30, item 1)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.store import open_store


def _project(tmp_path: Path, monkeypatch, toml: str) -> Path:
    monkeypatch.delenv("SPECFLEET_CONFIG")
    monkeypatch.delenv("SPECFLEET_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    open_store(f"sqlite:///{project / 'runs.db'}").record_failed_start(
        "planted-sweep", "planted", trigger="manual")
    (project / "specfleet.toml").write_text(toml)
    os.chmod(project / "specfleet.toml", 0o644)
    monkeypatch.chdir(project)
    return project


def test_the_file_in_use_is_named_on_stderr(tmp_path, monkeypatch):
    project = _project(tmp_path, monkeypatch, 'db = "sqlite:///runs.db"\n')
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert r.exit_code == 0, r.output
    assert f"specfleet: settings from {project / 'specfleet.toml'} (db)" in r.stderr
    assert "planted-sweep" in r.stdout and "settings from" not in r.stdout  # --json stays clean


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_file_others_could_write_is_refused_and_nothing_is_read(tmp_path, monkeypatch, where):
    project = _project(tmp_path, monkeypatch, 'db = "sqlite:///runs.db"\n')
    target = project / "specfleet.toml" if where == "file" else project
    os.chmod(target, stat.S_IMODE(target.stat().st_mode) | 0o002)
    try:
        r = CliRunner().invoke(main, ["sweeps", "list"])
    finally:
        os.chmod(target, stat.S_IMODE(target.stat().st_mode) & ~0o002)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "writable by group or others" in r.output and "chmod go-w" in r.output
    assert str(project / "specfleet.toml") in r.output
    assert "planted-sweep" not in r.output  # nothing was read from the store it named
    # the store it named is untouched and still readable with the file made safe
    assert CliRunner().invoke(main, ["sweeps", "list"]).stdout.count("planted-sweep") == 1


def test_a_file_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("needs root to chown")
    project = _project(tmp_path, monkeypatch, 'db = "sqlite:///runs.db"\n')
    os.chown(project / "specfleet.toml", 4242, 4242)
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert r.exit_code == 1 and "owned by uid 4242" in r.output, r.output


def test_discovery_stops_at_the_repository_root_and_at_home(tmp_path, monkeypatch):
    project = _project(tmp_path, monkeypatch, 'db = "sqlite:///runs.db"\n')
    repo = project / "checkout"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    r = CliRunner().invoke(main, ["sweeps", "list", "--json"])
    assert "settings from" not in r.stderr
    # the file above the checkout was not read: the built-in default store (none here)
    assert "planted-sweep" not in r.stdout and "no store at specfleet.db" in r.output
    # at home: a file above $HOME is not read either
    home = Path(os.environ["HOME"])
    inner = project / "inner-home"
    (inner / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(inner))
    monkeypatch.chdir(inner / "work")
    r = CliRunner().invoke(main, ["sweeps", "list", "--json"])
    assert "settings from" not in r.stderr and "planted-sweep" not in r.stdout
    assert home.exists()
    # inside the checkout, its own file is found
    (repo / "specfleet.toml").write_text(f'db = "sqlite:///{project / "runs.db"}"\n')
    monkeypatch.chdir(repo / "sub")
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert f"settings from {repo / 'specfleet.toml'}" in r.stderr and "planted-sweep" in r.stdout


def test_an_inventory_named_by_the_file_cannot_choose_an_interpreter(tmp_path, monkeypatch):
    """The attack: a local host's specfleet_python in an inventory a parent folder's
    specfleet.toml named ran an arbitrary command as the controller's user."""
    project = _project(tmp_path, monkeypatch,
                       'db = "sqlite:///runs.db"\ninventory = ["inv.yml"]\n')
    canary = tmp_path / "ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {canary}\nexec {sys.executable} \"$@\"\n")
    evil.chmod(0o755)
    (project / "inv.yml").write_text(
        "all:\n  hosts:\n    local:\n      ansible_connection: local\n"
        f"      specfleet_python: {evil}\n")
    r = CliRunner().invoke(main, ["fleet", "facts"])
    assert r.exit_code == 1 and not canary.exists()
    assert f"{project / 'inv.yml'}:5" in r.output
    assert "specfleet_python is refused in an inventory named by specfleet.toml" in r.output
    assert "-i on the command line" in r.output
    # named on the command line, the same inventory is the user's own choice
    r = subprocess.run([str(Path(sys.executable).parent / "specfleet"), "inventory", "list",
                        "-i", str(project / "inv.yml"), "--json"],
                       capture_output=True, text=True, cwd=project)
    assert r.returncode == 0 and str(evil) in r.stdout, r.stderr


def test_an_inventory_named_by_the_file_cannot_choose_where_code_comes_from(tmp_path,
                                                                          monkeypatch,
                                                                          model_pair):
    """The audit's attack: specfleet_root (in group_vars) pointed at a folder holding a
    ready-made agent, which the sweep then ran; specfleet_base_python ran at provision.
    Neither may come from an inventory a settings file named, nor may the schedule turn
    such an inventory into a trusted -i."""
    project = _project(tmp_path, monkeypatch,
                       'db = "sqlite:///runs.db"\ninventory = ["inv/"]\n')
    (project / "inv" / "group_vars").mkdir(parents=True)
    (project / "inv" / "hosts.yml").write_text(
        "all:\n  hosts:\n    local:\n      ansible_connection: local\n")
    for key in ("specfleet_root", "specfleet_base_python", "specfleet_machine_lock"):
        (project / "inv" / "group_vars" / "all.yml").write_text(f"{key}: /tmp/elsewhere\n")
        r = CliRunner().invoke(main, ["inventory", "list"])
        assert r.exit_code == 1, r.output
        assert f"{project / 'inv' / 'group_vars' / 'all.yml'}:1" in r.output
        assert f"{key} is refused in an inventory named by specfleet.toml" in r.output
    (project / "inv" / "group_vars" / "all.yml").write_text("specfleet_python: /tmp/evil\n")
    from tests.locks import make_lock

    (tmp_path / "plans").mkdir()
    lock = make_lock(tmp_path / "plans", model_pair)
    r = CliRunner().invoke(main, ["schedule", "install", str(lock), "--dest",
                                  str(tmp_path / "sched"), "--db", "sqlite:///x.db"])
    assert r.exit_code == 1 and not (tmp_path / "sched").exists(), r.output
    assert "specfleet_python is refused in an inventory named by specfleet.toml" in r.output


def test_what_the_file_names_must_be_as_safe_as_the_file(tmp_path, monkeypatch):
    project = _project(tmp_path, monkeypatch,
                       'db = "sqlite:///runs.db"\ninventory = ["inv/"]\n')
    (project / "inv" / "group_vars").mkdir(parents=True)
    (project / "inv" / "hosts.yml").write_text("all:\n  hosts:\n    a:\n")
    os.chmod(project / "inv" / "group_vars", 0o777)
    r = CliRunner().invoke(main, ["inventory", "list"])
    assert r.exit_code == 1 and "writable by group or others" in r.output, r.output
    assert str(project / "inv" / "group_vars") in r.output
    os.chmod(project / "inv" / "group_vars", 0o755)
    assert CliRunner().invoke(main, ["inventory", "list"]).exit_code == 0
    # a symlink to a safe file, sitting in a folder anyone can write (not sticky)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (open_dir / "specfleet.toml").symlink_to(project / "specfleet.toml")
    monkeypatch.chdir(open_dir)
    r = CliRunner().invoke(main, ["sweeps", "list"])
    assert r.exit_code == 1 and f"its folder {open_dir}" in r.output, r.output
