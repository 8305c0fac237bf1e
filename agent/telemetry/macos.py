"""Parsers for macOS commands (pmset, sysctl, vm_stat) and a reader that runs them.

Parsers are pure functions tested against real captured output in tests/data/macos.
Thermal state on Apple silicon comes from the notify state (``darwin.py``): there
``pmset -g therm`` prints only notes, even while throttling, so it is read on Intel only.
"""

from __future__ import annotations

import platform
import re
import subprocess

from . import darwin

PRESSURE_LEVELS = {1: "normal", 2: "warn", 4: "critical"}
COMMANDS = {
    "therm": ["pmset", "-g", "therm"],
    "batt": ["pmset", "-g", "batt"],
    "pmset": ["pmset", "-g"],
    "swapusage": ["sysctl", "vm.swapusage"],
    "vm_stat": ["vm_stat"],
    "pressure": ["sysctl", "kern.memorystatus_vm_pressure_level"],
}


def parse_pmset_therm(text: str) -> dict:
    """CPU speed/scheduler limits (100 = unthrottled) and any recorded warning level."""
    values = {k: int(v) for k, v in re.findall(r"(CPU_\w+)\s*=\s*(\d+)", text)}
    warning = re.search(r"(thermal|performance) warning level\s*(?:set to|=)?\s*(\d+)", text,
                        re.I)
    speed = values.get("CPU_Speed_Limit")
    sched = values.get("CPU_Scheduler_Limit")
    level = int(warning.group(2)) if warning else 0
    known = speed is not None or "No thermal warning level" in text or warning is not None
    throttled = (speed is not None and speed < 100) or (sched is not None and sched < 100) \
        or level > 0
    return {"cpu_speed_limit_pct": speed, "cpu_scheduler_limit_pct": sched,
            "thermal_warning_level": level if known else None,
            "thermal_throttled": throttled if known else None}


def parse_pmset_batt(text: str) -> dict:
    source = re.search(r"Now drawing from '([^']+)'", text)
    pct = re.search(r"\t\s*(\d+)%;\s*([^;]+);", text) or re.search(r"(\d+)%;\s*([^;]+);", text)
    name = source.group(1) if source else None
    kinds = {"AC Power": "ac", "Battery Power": "battery", "UPS Power": "ups"}
    return {"power_source": None if name is None else kinds.get(name, name.lower()),
            "battery_percent": int(pct.group(1)) if pct else None,
            "battery_state": pct.group(2).strip() if pct else None}


def parse_pmset_g(text: str) -> dict:
    """Low-power mode: ``powermode 1`` (Apple silicon) or ``lowpowermode 1``; None if absent."""
    m = re.search(r"^\s*(?:low)?powermode\s+(\d+)", text, re.M)
    return {"low_power_mode": (m.group(1) == "1") if m else None}


def _megabytes(value: str) -> float:
    return float(value.replace(",", "."))  # sysctl follows the locale's decimal mark


def parse_swapusage(text: str) -> dict:
    m = re.search(r"total = ([\d.,]+)M\s+used = ([\d.,]+)M", text)
    if not m:
        return {"swap_total_bytes": None, "swap_used_bytes": None}
    return {"swap_total_bytes": int(_megabytes(m.group(1)) * 2**20),
            "swap_used_bytes": int(_megabytes(m.group(2)) * 2**20)}


def parse_vm_stat(text: str) -> dict:
    """Cumulative swap-in/out counters in bytes (page size read from the header)."""
    size = re.search(r"page size of (\d+) bytes", text)
    page = int(size.group(1)) if size else None
    counters = {k.strip().strip('"'): int(v)
                for k, v in re.findall(r"^([^:\n]+):\s+(\d+)\.", text, re.M)}

    def b(key):
        return counters[key] * page if page and key in counters else None

    return {"page_size": page, "swap_in_bytes_total": b("Swapins"),
            "swap_out_bytes_total": b("Swapouts"), "page_in_bytes_total": b("Pageins"),
            "compressed_bytes": b("Pages occupied by compressor")}


def parse_pressure_level(text: str) -> dict:
    m = re.search(r"(\d+)\s*$", text.strip())
    level = int(m.group(1)) if m else None
    return {"memory_pressure": None if level is None else PRESSURE_LEVELS.get(level),
            "memory_pressure_level": level}


PARSERS = {"therm": parse_pmset_therm, "batt": parse_pmset_batt, "pmset": parse_pmset_g,
           "swapusage": parse_swapusage, "vm_stat": parse_vm_stat,
           "pressure": parse_pressure_level}


def run(name: str) -> str:
    try:
        return subprocess.run(COMMANDS[name], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def parse_notify_state(text: str) -> int | None:
    """A captured notify state (``notifyutil -g NAME`` prints ``NAME VALUE``; a bare integer
    is accepted too)."""
    m = re.search(r"(-?\d+)\s*$", text.strip())
    return int(m.group(1)) if m else None


def read(outputs=run, apple_silicon: bool | None = None, thermal_state=None) -> dict:
    """One reading; ``outputs(name)`` gives each command's text (real or replayed) and
    ``thermal_state()`` the notify thermal pressure level (libSystem unless given)."""
    if apple_silicon is None:
        apple_silicon = platform.machine() == "arm64"
    snap: dict = {}
    for name, parse in PARSERS.items():
        if name == "therm" and apple_silicon:  # notes only there: never "not throttled"
            continue
        snap.update(parse(outputs(name)))
    snap.pop("page_size", None)
    level = (thermal_state or darwin.thermal_state)()
    notify = darwin.thermal_reading(level)
    snap["thermal_pressure"] = notify["thermal_pressure"]
    if apple_silicon:
        snap.update(thermal_throttled=notify["thermal_throttled"], cpu_speed_limit_pct=None,
                    thermal_warning_level=None, cpu_scheduler_limit_pct=None)
    elif snap.get("thermal_throttled") is None or notify["thermal_throttled"]:
        snap["thermal_throttled"] = notify["thermal_throttled"]  # Intel: pmset, else notify
    return snap
