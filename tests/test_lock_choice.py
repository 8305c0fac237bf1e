"""Which locked platform a node takes, and the agent's own requirements in every lock."""

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.fleet.platforms import closest_platform, platform_node
from orchestrator.fleet.wheelhouse import agent_requirements_missing, node_packages

MACS = ["macos-14-arm64", "macos-15-arm64", "macos-13-arm64"]


def mac(major: int) -> dict:
    return platform_node(f"macos-{major}-arm64", "3.11") | {"mac_ver": f"{major}.2"}


def test_a_node_takes_its_own_major_else_the_highest_below():
    # known answers, written out by hand: 15 → 15; 14 → 14; 16 → 15 (none newer);
    # 13 → 13; 12 → none (every lock needs a newer macOS)
    assert closest_platform(MACS, mac(15)) == "macos-15-arm64"
    assert closest_platform(MACS, mac(14)) == "macos-14-arm64"
    assert closest_platform(MACS, mac(16)) == "macos-15-arm64"
    assert closest_platform(MACS, mac(13)) == "macos-13-arm64"
    assert closest_platform(MACS, mac(12)) is None
    # the order of the lock's list does not matter (the old rule took the first that fit)
    assert closest_platform(list(reversed(MACS)), mac(15)) == "macos-15-arm64"


def test_linux_takes_the_highest_glibc_not_above_its_own():
    locks = ["linux-x86_64-glibc2.28", "linux-x86_64-glibc2.36", "linux-x86_64-glibc2.39"]
    node = platform_node("linux-x86_64-glibc2.36", "3.11")
    assert closest_platform(locks, node) == "linux-x86_64-glibc2.36"
    node = platform_node("linux-x86_64-glibc2.35", "3.11")
    assert closest_platform(locks, node) == "linux-x86_64-glibc2.28"
    assert closest_platform(["macos-14-arm64"], node) is None


@given(st.sets(st.integers(11, 30), min_size=1), st.integers(11, 30))
def test_closest_is_same_major_else_highest_below_for_any_set(majors, node_major):
    descs = [f"macos-{m}-arm64" for m in sorted(majors, reverse=True)]
    got = closest_platform(descs, mac(node_major))
    below = [m for m in majors if m <= node_major]
    if not below:
        assert got is None
    else:
        want = node_major if node_major in majors else max(below)
        assert got == f"macos-{want}-arm64"


def test_every_node_lock_gets_the_agents_psutil_unless_the_plan_pins_it():
    pins = ("mlx==0.32.4", "mlx-lm==0.32.2")
    assert node_packages(pins, mac(15)) == [*pins, "psutil==7.2.2"]
    linux = platform_node("linux-x86_64-glibc2.36", "3.11")
    assert node_packages(pins, linux) == ["mlx[cpu]==0.32.4", "mlx-lm==0.32.2",
                                          "psutil==7.2.2"]
    assert node_packages((*pins, "psutil==6.1.0"), linux)[-1] == "psutil==6.1.0"


def test_provision_names_a_missing_or_wrong_psutil():
    pins = ("mlx==0.32.4",)
    assert agent_requirements_missing({"psutil": "7.2.2"}, pins) == []
    assert agent_requirements_missing({"psutil": None}, pins) == ["psutil==7.2.2 (found none)"]
    assert agent_requirements_missing({"psutil": "7.2.2"}, (*pins, "psutil==6.1.0")) == [
        "psutil==6.1.0 (found 7.2.2)"]
