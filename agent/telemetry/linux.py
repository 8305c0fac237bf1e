"""The Linux equivalents, from /proc and /sys (no commands to run)."""

from __future__ import annotations

import glob
import os
import resource


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _kv(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_psi(text: str | None) -> dict:
    """``/proc/pressure/memory``: share of time some task stalled on memory (avg10, %)."""
    for line in (text or "").splitlines():
        if line.startswith("some"):
            avg10 = float(line.split("avg10=")[1].split()[0])
            level = "critical" if avg10 >= 40 else "warn" if avg10 >= 10 else "normal"
            return {"memory_pressure": level, "memory_stall_pct": avg10}
    return {"memory_pressure": None, "memory_stall_pct": None}


def _power(root: str = "/sys/class/power_supply") -> dict:
    source, pct = None, None
    supplies = glob.glob(f"{root}/*")
    if not supplies and os.access(root, os.R_OK | os.X_OK):
        source = "ac"  # the kernel lists no supply at all: no battery to run on (a server, a VM)
    for d in supplies:
        kind = (_read(f"{d}/type") or "").strip()
        if kind == "Mains" and (_read(f"{d}/online") or "").strip() == "1":
            source = "ac"
        elif kind == "Battery":
            status = (_read(f"{d}/status") or "").strip()
            cap = (_read(f"{d}/capacity") or "").strip()
            pct = int(cap) if cap.isdigit() else None
            if status == "Discharging":
                source = "battery"
    return {"power_source": source, "battery_percent": pct, "battery_state": None}


def _throttle_count() -> int | None:
    counts = [_read(p) for p in glob.glob(
        "/sys/devices/system/cpu/cpu*/thermal_throttle/core_throttle_count")]
    vals = [int(c) for c in counts if c and c.strip().isdigit()]
    return sum(vals) if vals else None


def read() -> dict:
    mem = _kv(_read("/proc/meminfo"))
    vm = _kv(_read("/proc/vmstat"))
    page = resource.getpagesize()
    profile = (_read("/sys/firmware/acpi/platform_profile") or "").strip()
    snap = {
        "swap_total_bytes": mem["SwapTotal"] * 1024 if "SwapTotal" in mem else None,
        "swap_used_bytes": (mem["SwapTotal"] - mem["SwapFree"]) * 1024
        if "SwapTotal" in mem and "SwapFree" in mem else None,
        "swap_in_bytes_total": vm["pswpin"] * page if "pswpin" in vm else None,
        "swap_out_bytes_total": vm["pswpout"] * page if "pswpout" in vm else None,
        "low_power_mode": (profile == "low-power") if profile else None,
        "throttle_events_total": _throttle_count(),
        "cpu_speed_limit_pct": None,
        "thermal_throttled": None,
        # the throttle counters are the one Linux thermal reading (Intel); without them (a
        # VM, AMD) there is nothing this agent reads: named, not a verdict on the run
        "thermal_source": "kernel" if glob.glob(
            "/sys/devices/system/cpu/cpu*/thermal_throttle") else "none",
    }
    snap.update(_power())
    snap.update(parse_psi(_read("/proc/pressure/memory")))
    return snap
