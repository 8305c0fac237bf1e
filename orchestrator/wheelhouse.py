"""Resolve a plan's pins once per node platform into a wheelhouse with a hash lock.

``env_id`` is the hash of the lock (every wheel's file name and sha256, plus the
Python version), so two nodes with the same id run byte-identical packages.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .blobs import CONTROLLER_CACHE
from .errors import SpecfleetError

PROBE = ("import json, platform, sys; print(json.dumps({'sys_platform': sys.platform, "
         "'machine': platform.machine(), 'python': '%d.%d' % sys.version_info[:2], "
         "'python_full': platform.python_version(), 'libc': list(platform.libc_ver()), "
         "'mac_ver': platform.mac_ver()[0], 'implementation': sys.implementation.name}))")


class ResolveError(SpecfleetError):
    """pip could not resolve the pins for a node's platform."""


@dataclass(frozen=True)
class Lock:
    env_id: str
    python: str
    platform_key: str
    wheels: tuple[dict, ...]  # file, name, version, sha256, size
    folder: Path

    def requirements(self) -> str:
        return "".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n"
                       for w in self.wheels)


def pip_platforms(node: dict) -> list[str]:
    """The platform tags pip may pick wheels for on that node."""
    arch = node["machine"]
    if node["sys_platform"] == "darwin":
        arch = "arm64" if arch in ("arm64", "aarch64") else arch
        major = int((node["mac_ver"] or "11").split(".")[0])
        tags = [f"macosx_{v}_0_{arch}" for v in range(major, 10, -1)]
        return tags + [f"macosx_{v}_0_universal2" for v in range(major, 10, -1)]
    libc, version = node["libc"]
    if libc != "glibc":
        raise ResolveError(f"only glibc Linux nodes are supported, this one reports {libc!r}")
    minor = int(version.split(".")[1])
    return [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)] + [
        f"manylinux2014_{arch}", f"linux_{arch}"]


def node_packages(packages: tuple[str, ...], node: dict) -> list[str]:
    """mlx on Linux needs its CPU backend extra (``mlx[cpu]``); macOS uses Metal."""
    out = []
    for p in packages:
        name = re.split(r"[=<>\[ ]", p, maxsplit=1)[0]
        if node["sys_platform"] == "linux" and name == "mlx" and "[" not in p:
            p = p.replace("mlx", "mlx[cpu]", 1)
        out.append(p)
    return out


def _wheel_name(file: str) -> tuple[str, str]:
    name, version = file.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def resolve(packages: tuple[str, ...], python: str, node: dict, log=print) -> Lock:
    """Download (or reuse) the wheelhouse for this platform and return its lock."""
    if node["python"] != python:
        raise ResolveError(f"the node runs Python {node['python_full']} but the plan pins "
                           f"{python}; set specfleet_base_python to a {python} interpreter")
    pkgs = node_packages(packages, node)
    platforms = pip_platforms(node)
    spec = {"packages": pkgs, "python": python, "platforms": platforms,
            "implementation": node["implementation"]}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    folder = CONTROLLER_CACHE / "wheelhouses" / key
    lock_file = folder / "lock.json"
    if not lock_file.exists():
        log(f"resolving {', '.join(pkgs)} for {platforms[0]} / Python {python}")
        tmp = folder.with_name(key + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(tmp),
               "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp" if node["implementation"] == "cpython" else "py"]
        for p in platforms:
            cmd += ["--platform", p]
        proc = subprocess.run(cmd + pkgs, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ResolveError(f"pip could not resolve {', '.join(pkgs)} for {platforms[0]}: "
                               + (proc.stderr.strip().splitlines() or ["?"])[-1])
        wheels = []
        for whl in sorted(tmp.glob("*.whl")):
            name, version = _wheel_name(whl.name)
            wheels.append({"file": whl.name, "name": name, "version": version,
                           "sha256": hashlib.sha256(whl.read_bytes()).hexdigest(),
                           "size": whl.stat().st_size})
        env_id = hashlib.sha256(json.dumps({"python": python, "wheels": [
            (w["file"], w["sha256"]) for w in wheels]}).encode()).hexdigest()[:16]
        (tmp / "lock.json").write_text(json.dumps({"env_id": env_id, "spec": spec,
                                                   "wheels": wheels}, indent=2))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    data = json.loads(lock_file.read_text())
    return Lock(env_id=data["env_id"], python=python, platform_key=key,
                wheels=tuple(data["wheels"]), folder=folder)
