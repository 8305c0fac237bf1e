"""Resolve a plan's pins once per node platform into a wheelhouse with a hash lock.

``env_id`` is the hash of the lock (every wheel's file name and sha256, plus the
Python version), so two nodes with the same id run byte-identical packages.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import AGENT_REQUIREMENTS

from ..errors import SpecfleetError
from .blobs import CONTROLLER_CACHE
from .wheelclosure import ClosureError, canonical, check_closure

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


def _pin_name(pin: str) -> str:
    return canonical(re.split(r"[=<>\[ ;]", pin.strip(), maxsplit=1)[0])


def node_packages(packages: tuple[str, ...], node: dict) -> list[str]:
    """The plan's pins for the node, plus the agent's own requirements (psutil) unless the
    plan pins them itself. mlx on Linux needs its CPU backend extra (``mlx[cpu]``)."""
    out = []
    for p in packages:
        name = re.split(r"[=<>\[ ]", p, maxsplit=1)[0]
        if node["sys_platform"] == "linux" and name == "mlx" and "[" not in p:
            p = p.replace("mlx", "mlx[cpu]", 1)
        out.append(p)
    pinned = {_pin_name(p) for p in packages}
    out += [r for r in AGENT_REQUIREMENTS if _pin_name(r) not in pinned]
    return out


def agent_requirements_missing(versions: dict, packages: tuple[str, ...]) -> list[str]:
    """The agent's requirements an environment lacks (from ``agent version``'s versions),
    as 'name==version (found X)' lines; the plan's own pin of one wins."""
    pins = {_pin_name(p): p.split("==")[1].strip() for p in (*AGENT_REQUIREMENTS, *packages)
            if "==" in p}
    out = []
    for req in AGENT_REQUIREMENTS:
        name = _pin_name(req)
        have = versions.get(req.split("==")[0])
        if have != pins[name]:
            out.append(f"{name}=={pins[name]} (found {have or 'none'})")
    return out


def _wheel_name(file: str) -> tuple[str, str]:
    name, version = file.split("-")[:2]
    return canonical(name), version


# Bump when the way a wheelhouse is made changes, so no cached folder of the old kind is reused.
RESOLVER = "uv-compile+pip-download-no-deps/1"


def uv_target(node: dict) -> tuple[str, dict[str, str]]:
    """uv's ``--python-platform`` for a node, and the environment it reads the OS floor from."""
    arch = node["machine"]
    if node["sys_platform"] == "darwin":
        arch = "aarch64" if arch in ("arm64", "aarch64") else arch
        major = (node["mac_ver"] or "13").split(".")[0]
        return f"{arch}-apple-darwin", {"MACOSX_DEPLOYMENT_TARGET": f"{major}.0"}
    minor = int(node["libc"][1].split(".")[1])
    if minor < 17:
        raise ResolveError(f"glibc {node['libc'][1]} is older than manylinux 2.17")
    return f"{arch}-manylinux_2_{min(minor, 40)}", {}


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:  # pragma: no cover - uv is a dependency of the controller
        raise ResolveError("the controller needs uv to resolve environments for nodes: "
                           "pip install uv") from None
    return find_uv_bin()


def compile_pins(pkgs: list[str], python: str, node: dict) -> str:
    """Resolve ``pkgs`` with every marker evaluated for the node (uv), as a hashed
    requirements file of exact pins."""
    target, extra_env = uv_target(node)
    cmd = [_uv(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
           "--generate-hashes", "--only-binary", ":all:", "--python-platform", target,
           "--python-version", python]
    env = {**os.environ, **extra_env, "UV_NO_CONFIG": "1"}
    proc = subprocess.run(cmd, input="\n".join(pkgs) + "\n", capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        why = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or ["?"]
        raise ResolveError(f"could not resolve {', '.join(pkgs)} for {target} / Python "
                           f"{python}: " + " ".join(ln.strip() for ln in why[-4:]))
    return proc.stdout


def _download(requirements: Path, dest: Path, python: str, node: dict) -> None:
    # --no-deps: the closure is uv's, evaluated for the node; pip only fetches the exact,
    # hash-pinned files for the node's platform tags.
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest),
           "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp" if node["implementation"] == "cpython" else "py",
           "--require-hashes", "-r", str(requirements)]
    for p in pip_platforms(node):
        cmd += ["--platform", p]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        err = [ln for ln in proc.stderr.strip().splitlines()
               if ln.strip() and not ln.startswith("WARNING: Location")] or ["?"]
        raise ResolveError(f"pip could not fetch the resolved wheels for "
                           f"{pip_platforms(node)[0]}: {err[-1].strip()}")


def resolve(packages: tuple[str, ...], python: str, node: dict, log=print) -> Lock:
    """Download (or reuse) the wheelhouse for this platform and return its lock.

    Every wheelhouse, new or cached, passes the closure check for the node before use.
    """
    if node["python"] != python:
        raise ResolveError(f"the node runs Python {node['python_full']} but the plan pins "
                           f"{python}; set specfleet_base_python to a {python} interpreter")
    pkgs = node_packages(packages, node)
    platforms = pip_platforms(node)
    spec = {"packages": pkgs, "python": python, "platforms": platforms,
            "implementation": node["implementation"], "resolver": RESOLVER}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    folder = CONTROLLER_CACHE / "wheelhouses" / key
    lock_file = folder / "lock.json"
    if not lock_file.exists():
        log(f"resolving {', '.join(pkgs)} for {platforms[0]} / Python {python}")
        tmp = folder.with_name(key + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "requirements.txt").write_text(compile_pins(pkgs, python, node))
        _download(tmp / "requirements.txt", tmp, python, node)
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
    lock = Lock(env_id=data["env_id"], python=python, platform_key=key,
                wheels=tuple(data["wheels"]), folder=folder)
    check_lock(lock, pkgs, node)
    return lock


def check_lock(lock: Lock, pkgs: list[str], node: dict) -> None:
    """The closure check on a lock's wheels, as a ``ResolveError`` naming what is missing."""
    try:
        check_closure([lock.folder / w["file"] for w in lock.wheels], pkgs, node)
    except ClosureError as e:
        raise ResolveError(f"{e}; the lock for this platform cannot install offline") from None
