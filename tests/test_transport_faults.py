"""SSH faults against real sshd nodes: every host gets an outcome, and trust is never silent."""

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.fleet.facts import collect
from orchestrator.fleet.fanout import run_fan_out
from orchestrator.fleet.transport import q
from tests.fleet import set_link

HOSTILE = ["it's", 'a"b', "x; touch /tmp/PWNED-{tag}", "$(touch /tmp/PWNED-{tag})",
           "`touch /tmp/PWNED-{tag}`", "line1\nline2; touch /tmp/PWNED-{tag}", "*", "~root",
           "a b\tc", "-rf"]


def test_fan_out_gives_every_host_an_outcome(big_fleet):
    hosts = [big_fleet.host(i) for i in range(10)]
    hosts[3] = big_fleet.host(3, port=1)                    # nothing listens: unreachable
    hosts[6] = big_fleet.host(6, key_file=str(big_fleet.base / "host1_ed25519"))  # wrong key

    async def work(h, t):
        if h.name == "node8":
            await t.run("echo boom >&2; exit 3")
        return (await t.run("echo $HOME")).stdout.strip()

    t0 = time.monotonic()
    out = run_fan_out(hosts, work, big_fleet.ssh_options())
    by = {o.host: o for o in out}
    assert [o.host for o in out] == [h.name for h in hosts]
    assert by["node4"].status == "unreachable" and "connection refused" in by["node4"].detail
    assert by["node7"].status == "unreachable" and "permission denied" in by["node7"].detail
    assert by["node8"].status == "failed" and by["node8"].exit_status == 3
    assert by["node8"].stderr_tail == "boom" and by["node8"].command == "echo boom >&2; exit 3"
    ok = [o for o in out if o.status == "ok"]
    assert len(ok) == 7 and all(o.value.startswith(str(big_fleet.base)) for o in ok)
    assert time.monotonic() - t0 < 30


def test_hostile_strings_are_data_not_commands(fleet, tmp_path):
    tag = tmp_path.name[-8:]
    strings = [s.format(tag=tag) for s in HOSTILE]
    host = fleet.host(0)

    async def work(h, t):
        echoed = []
        for s in strings:
            echoed.append((await t.run(f"printf %s {q(s)}")).stdout)
            d = f"sf-hostile/{s}"
            await t.run(f"mkdir -p {q(d)} && test -d {q(d)}")
        return echoed

    out = run_fan_out([host], work, fleet.ssh_options())[0]
    assert out.status == "ok", out.detail
    assert out.value == strings
    assert not list(Path("/tmp").glob(f"PWNED-{tag}*"))
    # a hostile interpreter path and root from host variables reach the node as literals
    evil = fleet.host(0, python=f"python3; touch /tmp/PWNED-{tag}",
                      root=f"~/sf-hostile/$(touch /tmp/PWNED-{tag})")
    facts = run_fan_out([evil], collect, fleet.ssh_options())[0]
    assert facts.status == "ok"
    assert facts.value["python_version"] is None and "not found" in facts.value["python_error"]
    assert not list(Path("/tmp").glob(f"PWNED-{tag}*"))


def test_unknown_host_key_refused_unless_accept_new(fleet, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = fleet.host(1)

    async def hello(h, t):
        return (await t.run("echo hi")).stdout.strip()

    strict = run_fan_out([host], hello, fleet.ssh_options().__class__(known_hosts=str(known)))
    assert strict[0].status == "unreachable"
    assert f"add it to {known} or pass --accept-new-host-keys" in strict[0].detail
    opts = fleet.ssh_options().__class__(known_hosts=str(known), accept_new_host_keys=True)
    assert run_fan_out([host], hello, opts)[0].value == "hi"
    line = known.read_text().strip()
    assert line.startswith(f"[{host.address}]:{host.port} ssh-ed25519 ")
    assert run_fan_out([host], hello, opts)[0].status == "ok"  # now known: plain connect


def test_changed_host_key_is_refused_even_with_accept_new(fleet, tmp_path):
    host = fleet.host(1)
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(tmp_path / "k")], check=True)
    assert other.returncode == 0
    fake = (tmp_path / "k.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{host.address}]:{host.port} {' '.join(fake)}\n")
    opts = fleet.ssh_options().__class__(known_hosts=str(known), accept_new_host_keys=True)

    async def hello(h, t):
        return "connected"

    out = run_fan_out([host], hello, opts)[0]
    assert out.status == "unreachable"
    assert "host key differs from the one in known_hosts — refusing" in out.detail
    assert known.read_text().count("\n") == 1  # nothing was added


def test_session_killed_mid_command_is_unreachable_not_success(fleet):
    user = fleet.nodes[1].user

    async def long(h, t):
        async def killer():
            await asyncio.sleep(1.0)
            subprocess.run(["pkill", "-KILL", "-u", user], check=False)
        k = asyncio.create_task(killer())
        res = await t.run("sleep 20; echo done")
        await k
        return res.stdout

    out = run_fan_out([fleet.host(1)], long, fleet.ssh_options())[0]
    assert out.status == "unreachable", out
    assert "connection lost" in out.detail


def test_link_cut_mid_command_is_detected_by_keepalive(netns_fleet):
    node = netns_fleet.nodes[0]
    host = netns_fleet.host(0)
    opts = netns_fleet.ssh_options(keepalive_interval=0.5, keepalive_count_max=2)

    async def long(h, t):
        async def cut():
            await asyncio.sleep(1.0)
            set_link(node, False)
        c = asyncio.create_task(cut())
        res = await t.run("sleep 30; echo done")
        await c
        return res.stdout

    t0 = time.monotonic()
    try:
        out = run_fan_out([host], long, opts)[0]
    finally:
        set_link(node, True)
    assert out.status == "unreachable", out
    assert time.monotonic() - t0 < 15  # keepalive noticed, we did not wait for the command


def test_node_down_before_the_run_times_out_cleanly(netns_fleet):
    node = netns_fleet.nodes[0]
    set_link(node, False, side="node")
    try:
        opts = netns_fleet.ssh_options(connect_timeout=2)
        out = run_fan_out([netns_fleet.host(0)], collect, opts)[0]
    finally:
        set_link(node, True, side="node")
    assert out.status == "unreachable"
    assert out.detail == f"no answer from {node.address}:22 within 2s"


@pytest.mark.parametrize("concurrency", [3])
def test_concurrency_is_bounded(big_fleet, concurrency):
    running, peak = [0], [0]

    async def work(h, t):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await t.run("sleep 0.3")
        running[0] -= 1

    opts = big_fleet.ssh_options(concurrency=concurrency)
    out = run_fan_out([big_fleet.host(i) for i in range(10)], work, opts)
    assert all(o.status == "ok" for o in out) and peak[0] == concurrency


def test_ssh_config_aliases_are_honoured(fleet, tmp_path):
    """A host known only by its ~/.ssh/config alias: HostName, Port, User, IdentityFile."""
    from orchestrator.fleet.inventory import load_inventory

    n = fleet.nodes[0]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host benchbox\n  HostName {n.address}\n  Port {n.port}\n  User {n.user}\n"
                   f"  IdentityFile {fleet.client_key}\n")
    inv = tmp_path / "hosts.ini"
    inv.write_text("[lab]\nbenchbox\n")
    host = load_inventory(inv).hosts[0]
    assert host.port is None and host.user is None

    async def who(h, t):
        return (await t.run("id -un")).stdout.strip()

    out = run_fan_out([host], who, fleet.ssh_options(ssh_config=str(cfg)))[0]
    assert out.status == "ok" and out.value == n.user
