"""Headless Chromium (Debian's package) for checking rendered pages."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise RuntimeError("chromium is not installed (make test installs it)")
    return exe


def _run(args: list[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)


def dump_dom(page: Path, query: str = "") -> str:
    """The DOM after Chromium parsed (and ran) the page, serialised; ``query`` (e.g.
    ``?q=M4``) is appended to the page's URL, for pages that read it."""
    proc = _run(["--dump-dom", page.resolve().as_uri() + query])
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed: {proc.stderr[-2000:]}")
    return proc.stdout


def screenshot(page: Path, png: Path, size: str = "1280,2000") -> Path:
    proc = _run([f"--screenshot={png}", f"--window-size={size}", page.resolve().as_uri()])
    if proc.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium screenshot failed: {proc.stderr[-2000:]}")
    return png
