"""One benchmark per machine: two controllers with different stores, node roots or users on
the same Mac once both measured it at once, unnoticed (the lock lived under the root)."""

import json
import os
import signal
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
        # held (SIGSTOP), it keeps the machine lock without generating on while the second
        # agent starts and is refused (its soak burned a CPU meanwhile, as in test_agent_faults)
        first.send_signal(signal.SIGSTOP)
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

    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2, max_tokens=64,
                     extra="  cv_threshold: 1.0\n  contention_threshold: 1.0")  # about locks
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
    loser = next(x for x in logs if '"status": "busy"' in x)  # not started, not failed
    assert "node is busy: job " in loser and fleet.machine_lock(0) in loser
    assert "root lock " in loser and "/root-" in loser  # who holds it, and from which root
    winner = json_from_log(next(x for x in logs if x is not loser and x))
    assert winner["status"] == "ok"


def test_a_busy_node_names_its_holder_and_three_ways_on_and_is_not_a_failed_sweep(
        model_pair, tmp_path, machine_lock):
    """Another job holds the machine: the sweep says who (job, pid, command, since) and
    the three ways on (wait; --stop it as printed; a lock of its own for a simulated node),
    is recorded `busy` (not started) rather than failed, so `--fail-on failed-sweep` stays
    green; each printed way then works as written."""
    import shlex

    from click.testing import CliRunner
    from sqlalchemy import select

    from orchestrator.cli import main
    from orchestrator.store import open_store
    from orchestrator.store.models import Sweep
    from tests.controller import hold_sweep, specfleet, sweep_id_from, wait_for
    from tests.locks import make_lock

    # 16 tokens: the holder is held (SIGSTOP) after its first generation, so it holds the
    # machine at any length (48 used to buy that); the third way's sweep runs it whole
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), max_tokens=16, repetitions=4)
    url = f"sqlite:///{tmp_path / 's.db'}"
    inv = {}
    for name in ("first", "second"):
        inv[name] = tmp_path / f"{name}.yml"
        inv[name].write_text(f"all:\n  hosts:\n    {name}:\n      ansible_connection: local\n"
                             f"      specfleet_root: {tmp_path / name}\n")

    def args(name: str) -> list[str]:
        return ["-i", str(inv[name]), "--db", url,
                "--failed-hosts-file", str(tmp_path / f"retry-{name}")]

    def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; "
                               "main()", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, **(env or {})})

    holder = specfleet("sweep", str(lock), *args("first"), log=tmp_path / "first.log")
    sid = sweep_id_from(tmp_path / "first.log")
    jf = tmp_path / "first" / "jobs" / f"{sid}.events.jsonl"
    try:
        wait_for(lambda: jf.is_file() and '"type":"generation"' in jf.read_text(),
                 what="the holder's first generation")
        assert hold_sweep(sid)  # it holds the machine lock for as long as the test needs
        holder.send_signal(signal.SIGINT)  # its controller leaves; the agent goes on
        assert holder.wait(60) == 130
        pid = json.loads(jf.read_text().splitlines()[0])["pid"]
        busy = cli("sweep", str(lock), *args("second"))
        text = busy.stdout + busy.stderr
        assert busy.returncode == 1, text
        assert f"not started: job {sid} (pid {pid}, since " in text, text
        assert "command python -m agent run " in text and f"/jobs/{sid}.json --journal" in text
        assert f"holds {machine_lock}; the node is busy with that job. Either wait until it " \
               "ends and run this again; or if nobody follows that sweep any more, end it: " \
               f"`specfleet sweep --stop {sid} -i {inv['first']} --db {url}`; or if this " \
               "node is a simulated one" in text
        assert "run the command with `SPECFLEET_MACHINE_LOCK=/tmp/specfleet-lock-NAME` in " \
               "front" in text
        assert "1 hosts: 0 ok, 0 failed, 0 unreachable, 1 busy" in text
        with open_store(url).engine.connect() as c:
            statuses = dict(c.execute(select(Sweep.id, Sweep.status)).all())
        assert sorted(statuses.values()) == ["busy", "running"]
        r = CliRunner().invoke(main, ["review", "--week", "this", "--out", str(tmp_path / "r"),
                                      "--db", url, "--fail-on", "failed-sweep"])
        # no failed sweep (a week with no reliable runs yet is no-data, whatever was asked)
        assert "failed-sweep:" not in r.output and "finding(s) for --fail-on" in r.output, \
            r.output
        # the third way, as printed: a lock of its own, and the sweep runs beside the holder
        own = cli("sweep", str(lock), *args("second"),
                  env={"SPECFLEET_MACHINE_LOCK": str(tmp_path / "own.lock")})
        assert own.returncode == 0, own.stderr[-2000:]
        # the second, as printed: the holder ends and the machine is free
        stop = text.split("end it: `")[1].split("`")[0]
        hold_sweep(sid, signal.SIGCONT)
        done = cli(*shlex.split(stop)[1:])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "its nodes are free" in done.stderr
    finally:
        hold_sweep(sid, signal.SIGCONT)
        holder.kill()
