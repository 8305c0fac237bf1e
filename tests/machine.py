"""What this machine's CPU did meanwhile: for the test run's CPU line (tests/conftest.py)
and bench/adaptive.py's steal."""

from __future__ import annotations

from pathlib import Path


def cpu_ticks() -> list[int] | None:
    """The machine's CPU counters (USER_HZ ticks): user nice system idle iowait irq softirq
    steal; None where there is no /proc/stat (macOS)."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
