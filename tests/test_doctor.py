"""`specfleet doctor` on real sshd nodes: one line per check with its fix; exit 1 when a
sweep would fail on some node."""

import fcntl
import json
import os
import pwd

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.sweep.lock import write_lock
from orchestrator.sweep.plan import load_plan
from tests.controller import agent_running, wait_for
from tests.locks import make_lock


def _doctor(*args):
    return CliRunner().invoke(main, ["doctor", *args])


def test_doctor_names_each_problem_with_its_fix(fleet, model_pair, tmp_path):
    n1, n2 = fleet.nodes[:2]
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml(extra_hosts={
        "ghost": {"ansible_host": "127.0.1.99", "ansible_port": 9}}))
    # node2's host key is not trusted: a known_hosts without its line
    known = tmp_path / "known_hosts"
    known.write_text("".join(x + "\n" for x in fleet.known_hosts.read_text().splitlines()
                             if f":{n2.port}" not in x))
    # another benchmark holds node1: its agent lock is taken, as a running agent takes it
    # (first, an agent an earlier test on this worker's nodes left detached has ended)
    wait_for(lambda: not agent_running(n1), what="node1's earlier agents to end")
    lock_file = n1.home / ".specfleet" / "agent.lock"
    lock_file.parent.mkdir(exist_ok=True)
    uid = pwd.getpwnam(n1.user)
    os.chown(lock_file.parent, uid.pw_uid, uid.pw_gid)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)  # as an agent does
    os.chown(lock_file, uid.pw_uid, uid.pw_gid)
    os.write(fd, json.dumps({"job_id": "abc123def456", "pid": 4242,
                             "started": "2026-11-26T02:00:00+00:00"}).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    retry = tmp_path / "retry"
    try:
        r = _doctor("-i", str(inv), "--known-hosts", str(known), "--failed-hosts-file",
                    str(retry))
        retried = sorted(retry.read_text().split())
        held = _doctor("-i", str(inv), "--known-hosts", str(known), "--limit", "node1",
                       "--json", "--failed-hosts-file", str(retry))
    finally:
        os.close(fd)
        lock_file.unlink()
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    lines = r.output.splitlines()
    assert "3 node(s): 3 would fail a sweep (node1, node2, ghost)" in lines
    assert any(x.startswith("  FAIL  busy       another benchmark holds the node (sweep "
                            "abc123def456, pid 4242") and
               "`specfleet sweep --stop abc123def456`" in x for x in lines), r.output
    assert any(x.startswith("  FAIL  host key") and "ssh-keyscan -p " + str(n2.port) in x
               and "--accept-new-host-keys" in x for x in lines)
    assert any(x.startswith("  FAIL  ssh") and "127.0.1.99" in x and "by hand" in x
               for x in lines)
    for name in ("ssh", "python", "disk", "power", "low power", "clock"):
        assert f"  ok    {name:<10}" in r.output  # node1's healthy checks, each named
    assert retried == ["ghost", "node1", "node2"]
    out = json.loads(held.stdout)
    assert out["failing"] == ["node1"] and held.exit_code == 1
    # freed, node1 is ready; a plan that declares another Python than the node runs fails
    ok = _doctor("-i", str(inv), "--known-hosts", str(known), "--limit", "node1",
                 "--failed-hosts-file", str(retry))
    assert ok.exit_code == 0 and "1 node(s): ready for a sweep" in ok.output, ok.output
    assert not retry.exists()
    lock = make_lock(tmp_path, model_pair)
    doc = json.loads(lock.read_text())
    assert _doctor(str(lock), "-i", str(inv), "--known-hosts", str(known), "--limit",
                   "node1").exit_code == 0
    other = tmp_path / "other.yml"
    other.write_text((tmp_path / "plan.yml").read_text().replace(
        f'python: "{doc["python"]}"', 'python: "3.99"'))
    lock = write_lock(load_plan(other), lambda m: None)
    r = _doctor(str(lock), "-i", str(inv), "--known-hosts", str(known), "--limit", "node1")
    assert r.exit_code == 1
    assert "the plan declares 3.99 and manages no environment (platforms: [])" in r.output
    assert "set specfleet_python to a Python 3.99 on the node" in r.output
