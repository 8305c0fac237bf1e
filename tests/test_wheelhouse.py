"""Environments resolved for the node, not the controller: markers evaluated for the node's
platform and Python, and a closure check on every wheelhouse."""

import shutil

import pytest

from orchestrator.fleet.platforms import platform_node
from orchestrator.fleet.wheelclosure import ClosureError, check_closure
from orchestrator.fleet.wheelhouse import ResolveError, check_lock, node_packages, resolve

PINS = ("mlx==0.32.4", "mlx-lm==0.32.2")


def lock_for(desc):
    return resolve(PINS, "3.11", platform_node(desc, "3.11"), log=lambda m: None)


def versions(lock):
    return {w["name"]: w["version"] for w in lock.wheels}


@pytest.mark.parametrize("desc,tag", [("macos-14-arm64", "macosx_14_0_arm64"),
                                      ("macos-15-arm64", "macosx_15_0_arm64")])
def test_a_mac_lock_made_on_linux_has_mlx_metal(desc, tag):
    """pip on Linux drops `mlx-metal; platform_system == "Darwin"`; the lock must not."""
    lock = lock_for(desc)
    v = versions(lock)
    assert v["mlx"] == "0.32.4" and v["mlx-metal"] == "0.32.4" and v["mlx-lm"] == "0.32.2"
    assert v["psutil"] == "7.2.2"  # the agent's own, added to every node lock
    assert "mlx-cpu" not in v
    files = {w["name"]: w["file"] for w in lock.wheels}
    assert files["mlx"].endswith(f"cp311-cp311-{tag}.whl")
    assert files["mlx-metal"].endswith(f"{tag}.whl")
    assert "mlx-metal==0.32.4 --hash=sha256:" in lock.requirements()
    node = platform_node(desc, "3.11")
    check_lock(lock, node_packages(PINS, node), node)  # closed for the Mac


def test_a_linux_lock_has_the_cpu_backend_and_no_metal():
    lock = lock_for("linux-x86_64-glibc2.36")
    v = versions(lock)
    assert v["mlx-cpu"] == "0.32.4" and "mlx-metal" not in v and v["psutil"] == "7.2.2"
    assert not any("macosx" in w["file"] for w in lock.wheels)


def test_closure_check_names_what_pip_alone_would_have_dropped(tmp_path):
    """The wheel set pip --platform gives from Linux (no mlx-metal) is refused for a Mac,
    naming the requirement and its source; the same set is closed for no Linux node."""
    mac = lock_for("macos-14-arm64")
    kept = [mac.folder / w["file"] for w in mac.wheels if w["name"] != "mlx-metal"]
    node = platform_node("macos-14-arm64", "3.11")
    with pytest.raises(ClosureError, match=r"mlx 0\.32\.4 requires mlx-metal==0\.32\.4.*"
                                           r"no wheel for mlx-metal"):
        check_closure(kept, PINS, node)
    # a Linux lock without the CPU extra's wheel is refused for mlx[cpu]
    lin = lock_for("linux-x86_64-glibc2.36")
    lnode = platform_node("linux-x86_64-glibc2.36", "3.11")
    no_cpu = [lin.folder / w["file"] for w in lin.wheels if w["name"] != "mlx-cpu"]
    with pytest.raises(ClosureError, match=r"mlx-cpu"):
        check_closure(no_cpu, node_packages(PINS, lnode), lnode)
    # a wrong version is named with what the lock has
    with pytest.raises(ClosureError, match=r"requires mlx==0\.32\.3 but the lock has mlx "
                                           r"0\.32\.4"):
        check_closure([mac.folder / w["file"] for w in mac.wheels], ["mlx==0.32.3"], node)


def test_a_cached_wheelhouse_missing_a_wheel_is_refused_not_used(tmp_path, monkeypatch):
    """A wheelhouse in the cache that lost mlx-metal's wheel (a lock from before markers
    were evaluated) fails the closure check with the platform named."""
    import json

    import orchestrator.fleet.wheelhouse as wh

    mac = lock_for("macos-14-arm64")
    cache = tmp_path / "cache"
    shutil.copytree(mac.folder, cache / "wheelhouses" / mac.folder.name)
    lock_file = cache / "wheelhouses" / mac.folder.name / "lock.json"
    data = json.loads(lock_file.read_text())
    data["wheels"] = [w for w in data["wheels"] if w["name"] != "mlx-metal"]
    lock_file.write_text(json.dumps(data))
    monkeypatch.setattr(wh, "CONTROLLER_CACHE", cache)
    with pytest.raises(ResolveError, match=r"mlx-metal==0\.32\.4.*cannot install offline"):
        lock_for("macos-14-arm64")


def test_a_lock_made_before_the_agent_needed_psutil_is_refused():
    """Provision checks every node lock against the plan's pins plus the agent's own: a lock
    without psutil (made before it was added) is refused with the name and the fix."""
    from dataclasses import replace

    lock = lock_for("macos-15-arm64")
    old = replace(lock, wheels=tuple(w for w in lock.wheels if w["name"] != "psutil"))
    node = platform_node("macos-15-arm64", "3.11")
    with pytest.raises(ResolveError, match="psutil"):
        check_lock(old, node_packages(PINS, node), node)
    check_lock(lock, node_packages(PINS, node), node)  # the new lock is closed
