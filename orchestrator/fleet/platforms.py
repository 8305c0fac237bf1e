"""Node platforms a lock resolves wheels for ("macos-14-arm64", "linux-x86_64-glibc2.36"):
the controller's own, the probe each one stands for, and which locked platform a node
takes."""

from __future__ import annotations

import platform
import re
import sys

from ..errors import ConfigError


def controller_platform() -> str:
    if sys.platform == "darwin":
        return f"macos-{platform.mac_ver()[0].split('.')[0]}-{platform.machine()}"
    libc, version = platform.libc_ver()
    return f"linux-{platform.machine()}-{libc}{version}"


def platform_node(desc: str, python: str) -> dict:
    """``macos-14-arm64`` / ``linux-x86_64-glibc2.36`` → the probe dict the resolver takes."""
    parts = desc.split("-")
    if parts[0] == "macos" and len(parts) == 3:
        return {"sys_platform": "darwin", "machine": parts[2], "python": python,
                "python_full": python, "libc": ["", ""], "mac_ver": f"{parts[1]}.0",
                "implementation": "cpython"}
    if parts[0] == "linux" and len(parts) == 3 and parts[2].startswith("glibc"):
        return {"sys_platform": "linux", "machine": parts[1], "python": python,
                "python_full": python, "libc": ["glibc", parts[2][5:]], "mac_ver": "",
                "implementation": "cpython"}
    raise ConfigError(f"environment.platforms: {desc!r} is not macos-MAJOR-ARCH or "
                      "linux-ARCH-glibcX.Y")


def platform_matches(desc: str, node: dict) -> bool:
    """Can a node with this probe run the wheels locked for ``desc``?"""
    want = platform_node(desc, node["python"])
    if want["sys_platform"] != node["sys_platform"] or want["machine"] != node["machine"]:
        return False
    if node["sys_platform"] == "darwin":
        return int(node["mac_ver"].split(".")[0] or 0) >= int(want["mac_ver"].split(".")[0])
    if node["libc"][0] != "glibc" or not re.fullmatch(r"\d+(\.\d+)*", node["libc"][1]):
        return False  # musl, or no version read: no glibc lock is known to run there
    have = tuple(int(x) for x in node["libc"][1].split("."))
    need = tuple(int(x) for x in want["libc"][1].split("."))
    return have >= need


def _floor(desc: str) -> tuple[int, ...]:
    """The OS floor a platform names: macOS major, or glibc version."""
    part = desc.split("-")[1] if desc.startswith("macos-") else desc.split("-")[2][5:]
    return tuple(int(x) for x in part.split("."))


def closest_platform(platforms, node: dict) -> str | None:
    """The locked platform a node takes: of those it can run, the one built for the same
    macOS major (or glibc), else the highest below its own; never the first that fits
    (a macOS 15 node given macOS 14 wheels when 15's are locked too)."""
    fits = [d for d in platforms if platform_matches(d, node)]
    return max(fits, key=_floor) if fits else None
