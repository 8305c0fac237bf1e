"""One benchmark per machine: two controllers with different stores, node roots or users on
the same Mac once both measured it at once, unnoticed (the lock lived under the root)."""

import json
import os
import subprocess
import sys

from tests.test_agent import ROOT
from tests.test_agent_faults import _start_agent, _wait_for, small_job, write_job


def test_a_second_root_on_the_same_machine_is_refused_with_the_holder(tmp_path, model_pair,
                                                                       machine_lock):
    a, b = tmp_path / "rootA", tmp_path / "rootB"
    a.mkdir()
    b.mkdir()
    job = small_job(model_pair)
    job.update(mode="soak", soak={"duration_s": 30, "max_tokens": 24})
    first = _start_agent(write_job(a, job), a / "j.jsonl")
    try:
        _wait_for(a / "j.jsonl", lambda ev: any(e["type"] == "soak_sample" for e in ev))
        second = {**small_job(model_pair), "job_id": "other-controller"}
        (b / "job.json").write_text(json.dumps(second))
        # another root (its own agent.lock, cache and journal), the same machine
        proc = subprocess.run([sys.executable, "-m", "agent", "run", str(b / "job.json"),
                               "--journal", str(b / "j.jsonl"), "--lock", str(b / "agent.lock"),
                               "--cache-dir", str(b / "cache")], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 5
        assert (f"node is busy: job {job['job_id']} (pid {first.pid}, since ") in proc.stderr
        assert f"root lock {a / 'agent.lock'}) holds {machine_lock}" in proc.stderr
        last = [json.loads(x) for x in (b / "j.jsonl").read_text().splitlines()][-1]
        assert last["error"] == "node_busy"
    finally:
        first.kill()
        first.wait()


def test_the_machine_lock_is_shared_across_users(tmp_path, fleet):
    """Linux refuses O_CREAT on another user's file in a sticky /tmp; the lock must still be
    taken (and refused) by every user's agent."""
    path = f"/tmp/specfleet-test-shared-{os.getpid()}.lock"
    take = ("import sys, time; from pathlib import Path; from agent.lock import NodeLock; "
            "from agent.errors import NodeBusy\n"
            "try:\n"
            "    with NodeLock(Path(sys.argv[1]), sys.argv[2], shared=True):\n"
            "        print('held', flush=True); time.sleep(float(sys.argv[3]))\n"
            "except NodeBusy as e:\n"
            "    print(e); sys.exit(5)\n")
    users = [n.user for n in fleet.nodes[:2]]
    # Debian's default is 2 (refuse); this VM runs 0: make it refuse for the test
    knob = "/proc/sys/fs/protected_regular"
    before = open(knob).read().strip()

    def as_user(user, job, hold, **kw):
        return subprocess.Popen(["runuser", "-u", user, "--", sys.executable, "-c", take, path,
                                 job, str(hold)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)

    try:
        with open(knob, "w") as f:
            f.write("2")
        first = as_user(users[0], "job-a", 20)
        assert first.stdout.readline().strip() == "held"
        second = as_user(users[1], "job-b", 0)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 5, err
        assert out.startswith("node is busy: job job-a (pid ") and path in out
        os.killpg(first.pid, 9)  # runuser and the holder under it
        first.wait()
        third = as_user(users[1], "job-c", 0)  # the holder died: the kernel let go
        out, err = third.communicate(timeout=30)
        assert third.returncode == 0 and out.strip() == "held", err
    finally:
        with open(knob, "w") as f:
            f.write(before)
        if os.path.exists(path):
            os.unlink(path)


def test_two_controllers_with_their_own_stores_and_roots_on_one_node(fleet, model_pair,
                                                                     tmp_path):
    """Leases live in each controller's store and the root lock under each root: only the
    machine lock stands between them. One measures; the other is told who holds the node."""
    from tests.controller import json_from_log, specfleet
    from tests.locks import make_lock

    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2, max_tokens=64)
    procs = []
    for side in ("a", "b"):
        inv = tmp_path / f"hosts-{side}.yml"
        # the same node (address, user, machine lock), another specfleet root
        inv.write_text(fleet.inventory_yaml().replace(
            "  vars:\n", f"  vars:\n    specfleet_root: ~/root-{side}\n", 1))
        procs.append(specfleet("sweep", str(lock), "-i", str(inv), "--limit", "node1",
                               "--known-hosts", str(fleet.known_hosts), "--db",
                               f"sqlite:///{tmp_path / side}.db", "--no-provision",
                               "--failed-hosts-file", str(tmp_path / f"retry-{side}"), "--json",
                               log=tmp_path / f"{side}.log"))
    codes = sorted(p.wait(timeout=300) for p in procs)
    assert codes == [0, 1]
    logs = [(tmp_path / f"{s}.log").read_text() for s in ("a", "b")]
    loser = next(x for x in logs if '"status": "failed"' in x)
    assert "node is busy: job " in loser and fleet.machine_lock(0) in loser
    assert "root lock " in loser and "/root-" in loser  # who holds it, and from which root
    winner = json_from_log(next(x for x in logs if x is not loser and x))
    assert winner["status"] == "ok"
