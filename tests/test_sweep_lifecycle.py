"""Kill each party mid-sweep — link, agent, controller — on five real sshd nodes with
PostgreSQL as the store, then compare the store with the node journals event by event."""

import signal

import pytest

from tests.controller import (
    agent_running,
    hold_agents,
    journal,
    journal_path,
    journaled_generations,
    json_from_log,
    kill_agent,
    kill_link,
    signal_mid_sweep,
    specfleet,
    stored_events,
    stored_generations,
    sweep_id_from,
    wait_for,
)
from tests.locks import make_lock

NODES = 5
QUIET = "  cv_threshold: 1.0\n  contention_threshold: 1.0"


@pytest.fixture(scope="module")
def five(big_fleet, model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("lifecycle")
    inv = d / "hosts.yml"
    inv.write_text(big_fleet.inventory_yaml())
    # short generations: the test holds the agents (SIGSTOP) while it kills, so each has
    # work left whatever this machine's speed (96 tokens a generation used to buy that);
    # 4 widths, not 2: with 12 generations a node it failed under CI's load (2026-11-28)
    lock = make_lock(d, model_pair, use=("code",), widths=(2, 3, 4, 6), repetitions=3,
                     max_tokens=24, extra=QUIET)
    return d, inv, lock


def common(fleet, inv, url, d):
    return ["-i", str(inv), "--limit", ",".join(f"node{i}" for i in range(1, NODES + 1)),
            "--known-hosts", str(fleet.known_hosts), "--db", url, "--no-provision",
            "--failed-hosts-file", str(d / "retry"), "--reconnect-timeout", "60"]


def test_kill_link_agent_and_controller_then_attach_and_resume(big_fleet, five, pg_url):
    d, inv, lock = five
    nodes = big_fleet.nodes[:NODES]
    total = 1 * 4 * 3 * 2  # workloads × widths × repetitions × (baseline, speculative)
    log = d / "controller1.log"
    ctl = specfleet("sweep", str(lock), *common(big_fleet, inv, pg_url, d), log=log)
    sid = sweep_id_from(log)
    # each agent is held (SIGSTOP) once its journal has two generations, so none can
    # finish before the faults land; each goes on where it stopped when released (SIGCONT)
    held: set[str] = set()

    def hold_each() -> bool:
        for n in nodes:
            if n.name not in held and journaled_generations(n, sid) >= 2:
                hold_agents([n])
                held.add(n.name)
        return len(held) == NODES

    wait_for(hold_each, what="every node to journal two generations")
    wait_for(lambda: all(stored_generations(pg_url, sid, n.name) >= 2 for n in nodes),
             what="every node to store them")
    kill_link(nodes[2])     # node3: the SSH link dies; the controller must reconnect
    kill_agent(nodes[3])    # node4: the agent dies; it must be resumed later
    hold_agents(nodes[2:3], signal.SIGCONT)
    wait_for(lambda: stored_generations(pg_url, sid, "node3") >= 4, what="node3 to go on")
    ctl.send_signal(signal.SIGKILL)  # the controller dies; agents keep running
    ctl.wait()
    assert all(agent_running(n) for n in (nodes[0], nodes[1], nodes[4]))
    assert not agent_running(nodes[3])
    hold_agents(nodes, signal.SIGCONT)

    attach_log = d / "attach.log"
    att = specfleet("sweep", "--attach", sid, *common(big_fleet, inv, pg_url, d), "--json",
                    log=attach_log)
    assert att.wait(timeout=600) == 1  # node4's agent is dead: not ok until resumed
    out = json_from_log(attach_log.read_text())
    by = {o["host"]: o for o in out["outcomes"]}
    assert by["node4"]["status"] == "failed"
    assert f"specfleet sweep --resume {sid}" in by["node4"]["detail"]
    assert all(by[f"node{i}"]["status"] == "ok" for i in (1, 2, 3, 5))

    res = specfleet("sweep", "--resume", sid, *common(big_fleet, inv, pg_url, d),
                    log=d / "resume.log")
    assert res.wait(timeout=600) == 0, (d / "resume.log").read_text()[-3000:]

    for n in nodes:  # zero lost, zero duplicated: the store is exactly the journal
        j = journal(n, sid)
        assert stored_events(pg_url, sid, n.name) == j
        assert [e["seq"] for e in j] == list(range(1, len(j) + 1))
        runs = sorted(e["run_index"] for e in j if e["type"] == "generation")
        assert runs == list(range(total)), n.name
        assert j[-1]["type"] == "job_finished"
    assert any(e["type"] == "plan" and e["already_done"] > 0
               for e in journal(nodes[3], sid))  # node4 resumed, did not start over


def test_ctrl_c_leaves_agents_running_and_attach_finishes(fleet, model_pair, tmp_path,
                                                           sqlite_url):
    # 16 tokens: the agent is held (SIGSTOP) for the signal, so it has work left at any
    # length (64 used to buy that); about the lifecycle: a busy machine's runs still count
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=3, max_tokens=16,
                     extra=QUIET)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    args = ["-i", str(inv), "--limit", "node1", "--known-hosts", str(fleet.known_hosts),
            "--db", sqlite_url, "--no-provision", "--failed-hosts-file", str(tmp_path / "r")]
    log = tmp_path / "c.log"
    ctl = specfleet("sweep", str(lock), *args, log=log)
    sid = sweep_id_from(log)
    assert signal_mid_sweep(ctl, journal_path(fleet.nodes[0], sid), sid)[0] == 130
    assert f"interrupted: sweep {sid} goes on on the nodes" in log.read_text()
    assert f"follow it again: specfleet sweep --attach {sid} -i " in log.read_text()
    assert agent_running(fleet.nodes[0])
    att = specfleet("sweep", "--attach", sid, *args, log=tmp_path / "a.log")
    assert att.wait(timeout=300) == 0, (tmp_path / "a.log").read_text()[-2000:]
    assert stored_events(sqlite_url, sid, "node1") == journal(fleet.nodes[0], sid)


def test_attach_can_leave_a_node_out_and_the_sweep_waits_for_it(fleet, model_pair, tmp_path,
                                                                 sqlite_url):
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=2, max_tokens=16,
                     extra=QUIET)  # held for the signal: short generations leave work too
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    args = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", sqlite_url,
            "--no-provision", "--failed-hosts-file", str(tmp_path / "r")]
    log = tmp_path / "c.log"
    ctl = specfleet("sweep", str(lock), "--limit", "node1,node2", *args, log=log)
    sid = sweep_id_from(log)
    assert signal_mid_sweep(ctl, journal_path(fleet.nodes[0], sid), sid)[0] == 130
    # pick up node1 only (node2 is out of reach, say): it finishes, the sweep does not
    one = specfleet("sweep", "--attach", sid, "--limit", "node1", *args, "--json",
                    log=tmp_path / "one.log")
    assert one.wait(timeout=300) == 0, (tmp_path / "one.log").read_text()[-2000:]
    text = (tmp_path / "one.log").read_text()
    out = json_from_log(text)
    assert out["status"] == "running" and out["left_out"] == ["node2"]
    assert [o["host"] for o in out["outcomes"]] == ["node1"]
    assert f"left out, still to finish: node2 (pick them up with `specfleet sweep --attach " \
           f"{sid} -i {inv} --db {sqlite_url}`)" in text  # as given: it runs as written
    assert stored_events(sqlite_url, sid, "node1") == journal(fleet.nodes[0], sid)
    # then all of them: node1 is already done, node2 is followed to its end
    rest = specfleet("sweep", "--attach", sid, *args, "--json", log=tmp_path / "rest.log")
    assert rest.wait(timeout=300) == 0, (tmp_path / "rest.log").read_text()[-2000:]
    assert json_from_log((tmp_path / "rest.log").read_text())["status"] == "ok"
    assert stored_events(sqlite_url, sid, "node2") == journal(fleet.nodes[1], sid)
