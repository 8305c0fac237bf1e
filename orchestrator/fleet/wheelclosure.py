"""Check that a set of wheels is closed under the dependencies a node will ask for.

pip evaluates environment markers for the machine it runs on, not the node (pip issues
11664 and 13442), so a wheelhouse fetched on Linux for a Mac can silently lack
``mlx-metal``. This check reads every wheel's ``Requires-Dist`` and evaluates each marker
against the *node's* environment, so an offline ``--require-hashes`` install cannot fail
later on a Mac for a package nobody sent.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from ..errors import SpecfleetError


class ClosureError(SpecfleetError):
    """A wheelhouse lacks a dependency the node will need."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_env(node: dict) -> dict[str, str]:
    """PEP 508 marker variables for a node probe (``wheelhouse.PROBE`` or a platform)."""
    darwin = node["sys_platform"] == "darwin"
    full = node.get("python_full") or node["python"]
    if full.count(".") == 1:
        full += ".0"
    impl = node.get("implementation", "cpython")
    return {"sys_platform": node["sys_platform"], "os_name": "posix",
            "platform_system": "Darwin" if darwin else "Linux",
            "platform_machine": node["machine"],
            "platform_release": "", "platform_version": "",
            "python_version": node["python"], "python_full_version": full,
            "implementation_name": impl,
            "platform_python_implementation": "CPython" if impl == "cpython" else "PyPy",
            "implementation_version": full, "extra": ""}


def wheel_requires(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as z:
        meta = next((n for n in z.namelist()
                     if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise ClosureError(f"{path.name}: not a wheel (no .dist-info/METADATA)")
        msg = HeaderParser().parsestr(z.read(meta).decode("utf-8", "replace"))
    return canonical(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def _holds(marker: Marker | None, env: dict[str, str], extras: Iterable[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": e}) for e in ({""} | set(extras)))


def check_closure(wheels: Iterable[Path], requested: Iterable[str], node: dict) -> None:
    """Raise ``ClosureError`` naming every requirement (from ``requested`` and from each
    wheel a node would install) whose marker holds on the node but that no wheel meets."""
    env = marker_env(node)
    have: dict[str, tuple[str, list[str]]] = {}
    for w in wheels:
        name, version, requires = wheel_requires(Path(w))
        have[name] = (version, requires)
    missing: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [("the plan", Requirement(r)) for r in requested]
    while todo:
        who, req = todo.pop()
        name = canonical(req.name)
        if name not in have:
            missing.append(f"{who} requires {req} but no wheel for {name} is in the lock")
            continue
        version = have[name][0]
        if req.specifier and not req.specifier.contains(Version(version), prereleases=True):
            missing.append(f"{who} requires {req} but the lock has {name} {version}")
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for line in have[name][1]:
            try:
                dep = Requirement(line)
            except InvalidRequirement as e:
                raise ClosureError(f"{name} {version}: unreadable Requires-Dist {line!r}: {e}") \
                    from None
            if _holds(dep.marker, env, req.extras):
                todo.append((f"{name} {version}", dep))
    if missing:
        raise ClosureError("the environment is incomplete for this node: "
                           + "; ".join(sorted(set(missing))))
