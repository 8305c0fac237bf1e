"""Lint as a test: ruff and mypy run beside the other modules (each waits on sshd, agents
and servers) instead of before all of them. `make lint` runs the same two commands."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    r = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean():
    r = subprocess.run([str(BIN / "mypy")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
