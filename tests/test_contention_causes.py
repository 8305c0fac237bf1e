""""Contended" names its real cause (issues 33/34): the CPU taken from a trial is told apart
as other processes on the node, the controller when it runs there (a local demo), and the
hypervisor's steal on a Linux VM, which is no process on the node at all. Each still counts
toward the plan's contention limit (it slows the trial alike); the words and the event
fields say which it was. macOS has no steal counter: there it is None, never 0."""

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.job import Job
from agent.protocol import contention_text, summary_contention_text
from agent.telemetry.cpu import (
    ControllerCpu,
    counters_from_psutil,
    cpu_shares,
    parse_proc_stat,
    taken_share,
)
from agent.telemetry.sampler import contention_reading, summarise_window, unreliable_reasons

DATA = Path(__file__).with_name("data") / "linux"


def _reading(busy, total, own, steal=None, controller=None) -> dict:
    return {"ts": 0.0, "cpu_busy_s": busy, "cpu_total_s": total, "own_cpu_s": own,
            "cpu_steal_s": steal, "controller_cpu_s": controller}


def test_a_captured_window_of_proc_stat_splits_steal_from_busy():
    # captured on this 2-CPU VM, 2 s apart, a CPU hog running (first lines):
    #   cpu  178422 328 31659 122982 1688 0 594 380 0 0
    #   cpu  178780 328 31701 122982 1688 0 594 381 0 0
    a = parse_proc_stat((DATA / "proc_stat_window_start.txt").read_text(), hz=100)
    b = parse_proc_stat((DATA / "proc_stat_window_end.txt").read_text(), hz=100)
    assert a and b
    assert b.total_s - a.total_s == pytest.approx((358 + 42 + 1) / 100)  # user, system, steal
    assert b.busy_s - a.busy_s == pytest.approx((358 + 42) / 100)
    assert b.steal_s - a.steal_s == pytest.approx(1 / 100)
    # the agent's own 1.2 CPU-s of it: the rest was other processes', one tick the host's
    first = _reading(a.busy_s, a.total_s, 10.0, a.steal_s)
    last = _reading(b.busy_s, b.total_s, 11.2, b.steal_s)
    assert cpu_shares(first, last) == {"other": round(2.8 / 4.01, 3), "controller": None,
                                       "steal": round(0.01 / 4.01, 3)}


def test_steal_is_said_as_the_hosts_and_counts_toward_the_limit():
    # 2 s on 2 CPUs = 4 s of capacity: ours 1.9, the host took 1.6 (steal), others 0.2
    first = _reading(100.0, 400.0, 10.0, steal=20.0)
    last = _reading(102.1, 404.0, 11.9, steal=21.6)
    s = cpu_shares(first, last)
    assert s == {"other": 0.05, "controller": None, "steal": 0.4}
    t = {"cpu_other_share": s["other"], "cpu_steal_share": s["steal"],
         "cpu_controller_share": None}
    [reason] = [r for r in unreliable_reasons(t) if r.startswith("contended")]
    assert reason == ("contended: other processes used 5% and the host (hypervisor) took "
                      "40% of the CPU (limit 25%)")
    assert contention_reading(t, 0.25) == {"share": 0.45, "limit": 0.25, "other": 0.05,
                                           "steal": 0.4}
    # under the limit all together: not set aside, whichever cause
    assert contention_reading({"cpu_other_share": 0.1, "cpu_steal_share": 0.1}, 0.25) is None
    # steal alone: no word of other processes
    alone = {"cpu_other_share": 0.0, "cpu_steal_share": 0.3}
    assert [r for r in unreliable_reasons(alone) if r.startswith("contended")] == [
        "contended: the host (hypervisor) took 30% of the CPU (limit 25%)"]


def test_the_controller_on_the_node_is_said_as_the_controllers():
    # 4 s of capacity: ours 1.5, the controller's ingest 0.6, others 0.4, steal 0.4
    first = _reading(100.0, 400.0, 10.0, steal=5.0, controller=3.0)
    last = _reading(102.5, 404.0, 11.5, steal=5.4, controller=3.6)
    s = cpu_shares(first, last)
    assert s == {"other": 0.1, "controller": 0.15, "steal": 0.1}
    t = {f"cpu_{k}_share": v for k, v in s.items()}
    assert [r for r in unreliable_reasons(t) if r.startswith("contended")] == [
        "contended: other processes used 10%, the controller on this node used 15% and the "
        "host (hypervisor) took 10% of the CPU (limit 25%)"]
    # the controller gone mid-window (None): its CPU is counted as other processes'
    gone = cpu_shares(first, {**last, "controller_cpu_s": None})
    assert gone == {"other": 0.25, "controller": None, "steal": 0.1}


def test_a_reading_without_steal_keeps_the_words_of_before():
    """macOS (no steal counter) and events before 1.10: the share is other processes'."""
    first, last = _reading(100.0, 400.0, 10.0), _reading(106.0, 408.0, 11.5)
    assert cpu_shares(first, last) == {"other": 0.562, "controller": None, "steal": None}
    assert unreliable_reasons({"cpu_other_share": 0.5625}) == [
        "contended: other processes used 56% of the CPU (limit 25%)"]
    assert contention_text(0.56, 0.66, 0.25) == (
        "contended: other processes used 56–66% of the CPU (limit 25%)")


# psutil's cpu_times() as its own source declares it (giampaolo/psutil): on macOS
# (psutil/_psosx.py) user, nice, system, idle; on Linux (_pslinux.py) with iowait, irq,
# softirq, steal, guest, guest_nice (guest time is inside user and nice)
MacTimes = collections.namedtuple("scputimes", "user nice system idle")
LinuxTimes = collections.namedtuple(
    "scputimes", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_psutil_counters_on_macos_have_no_steal_and_on_linux_steal_apart():
    mac = counters_from_psutil(MacTimes(100.0, 1.0, 30.0, 269.0))
    assert mac == (131.0, 400.0, None)
    linux = counters_from_psutil(LinuxTimes(100.0, 1.0, 30.0, 250.0, 9.0, 0.0, 2.0, 8.0,
                                            5.0, 0.0))
    # total: the ten fields less guest (inside user) = 400; busy: less idle, iowait, steal
    assert linux == (133.0, 400.0, 8.0)


def test_a_summary_carries_each_cause_and_says_their_ranges_once():
    from agent.summary import config_summary
    from orchestrator.sweep.decode import Decoder, Quarantined

    def trial(**c):
        c = {"limit": 0.25, **c}
        c["share"] = round(sum(c.get(k) or 0 for k in ("other", "controller", "steal")), 3)
        return {"decode_tok_s": 10.0, "unreliable": True, "contention": c,
                "unreliable_reasons": [contention_text(c["share"], c["share"], 0.25, {
                    k: (c[k], c[k]) for k in ("other", "controller", "steal") if k in c})]}

    s = config_summary([trial(other=0.1, steal=0.3), trial(other=0.05, steal=0.5)], 1.0)
    assert s["contention"] == {"shares": [0.4, 0.55], "limit": 0.25, "other": [0.1, 0.05],
                               "steal": [0.3, 0.5]}
    assert s["unreliable_reasons"] == [
        "contended: other processes used 5–10% and the host (hypervisor) took 30–50% of the "
        "CPU (limit 25%)"]
    assert summary_contention_text(s["contention"]) == s["unreliable_reasons"][0]
    event = {"schema": 1, "seq": 1, "type": "config_summary", "ts": 1.0, "job_id": "j",
             "workload": "w", "mode": "baseline", "config": {}, "num_draft_tokens": 0,
             "trials": 2, "metrics": s["metrics"], "unreliable": True,
             "unreliable_reasons": s["unreliable_reasons"], "contention": s["contention"]}
    assert Decoder("n").decode(json.dumps(event))["contention"] == s["contention"]
    for bad in ({**s["contention"], "steal": [0.3]}, {**s["contention"], "steal": ["30%"]},
                {**s["contention"], "other": 0.1}):
        q = Decoder("n").decode(json.dumps({**event, "contention": bad}))
        assert type(q) is Quarantined and "contention." in q.reason


def test_the_review_merges_each_causes_range_across_runs():
    from orchestrator.review.page import collapse_reasons

    a = {"low": 0.4, "high": 0.4, "limit": 0.25, "parts": {"steal": (0.4, 0.4)}}
    b = {"low": 0.3, "high": 0.6, "limit": 0.25,
         "parts": {"other": (0.1, 0.2), "steal": (0.2, 0.4)}}
    said = [contention_text(c["low"], c["high"], 0.25, c["parts"]) for c in (a, b)]
    assert collapse_reasons(said, [a, b]) == [
        "contended: other processes used 10–20% and the host (hypervisor) took 20–40% of "
        "the CPU (limit 25%)"]


counter = st.floats(0, 50, allow_nan=False)


@given(busy=counter, own=counter, steal=counter, ctl=counter, idle=st.floats(0.2, 50))
@example(busy=1.0, own=0.0, steal=0.0, ctl=0.0, idle=0.2)
def test_the_split_judges_what_the_whole_share_judged(busy, own, steal, ctl, idle):
    """Telling the causes apart moves no trial across the limit: all taken together is
    the share the agent judged before steal and the controller were split out (busy with
    steal, less ours), within the rounding of three parts."""
    own, ctl = min(own, busy), min(ctl, max(0.0, busy - own))
    total = busy + steal + idle
    s = cpu_shares(_reading(0.0, 0.0, 0.0, 0.0, 0.0), _reading(busy, total, own, steal, ctl))
    assert s is not None and all(0 <= v <= 1 for v in s.values())
    whole = min(1.0, (busy + steal - own) / total)
    assert taken_share(s) == pytest.approx(whole, abs=0.002)


def _hog(seconds: float) -> subprocess.Popen:
    code = f"import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_controller_pid_is_the_one_process_that_had_it():
    me = ControllerCpu(os.getpid())
    assert me.cpu() is not None and me.cpu() > 0
    gone = _hog(0.0)
    gone.wait()
    assert ControllerCpu(gone.pid).cpu() is None  # no such process: counted as others'
    job = {"schema": 1, "job_id": "j", "models": {"target": {"path": "t"},
                                                  "draft": {"path": "d"}},
           "workloads": [{"name": "w", "prompt": "p", "max_tokens": 4}], "base": {},
           "knobs": {}, "controller_pid": 4242}
    assert Job.from_json(job).controller_pid == 4242
    assert Job.from_json(Job.from_json(job).to_json()).controller_pid == 4242


def test_a_local_node_is_sent_the_controllers_pid_and_a_remote_one_is_not(model_pair):
    from orchestrator.fleet.inventory import Host
    from orchestrator.sweep.jobspec import build_job
    from orchestrator.sweep.node_job import node_job

    job = build_job(model_pair, ["code"], max_tokens=8)
    doc = {"models": {r: {"fingerprint": "f"} for r in ("target", "draft")}}
    models = {r: {"path": str(model_pair / r)} for r in ("target", "draft")}
    local = Host(name="here", address="127.0.0.1", connection="local")
    remote = Host(name="there", address="10.0.0.2")
    assert node_job(job, doc, "s", models, "python3", local)["controller_pid"] == os.getpid()
    assert "controller_pid" not in node_job(job, doc, "s", models, "python3", remote)


@pytest.mark.alone  # the shares need a machine no other test is loading
def test_a_hog_is_other_processes_and_the_controller_is_its_own(model_pair, tmp_path):
    """A real run: the test is the controller (its pid in the job) and spins a thread, as
    ingest would; a CPU hog it starts (bounded, it stops itself) is another process. The
    run says each apart, and steal (read from /proc/stat on this VM) apart from both."""
    from orchestrator.sweep.jobspec import build_job
    from tests.blas import openblas
    from tests.test_agent import run_agent

    job = build_job(model_pair, ["code"], max_tokens=400)
    job["workloads"], job["knobs"] = job["workloads"][:1], {"num_draft_tokens": [2]}
    job["controller_pid"] = os.getpid()
    (tmp_path / "job.json").write_text(json.dumps(job))
    stop = time.time() + 120

    def spin():  # the controller's own work on the node
        while time.time() < stop:
            pass

    hog, ingest = _hog(120), threading.Thread(target=spin, daemon=True)
    ingest.start()
    try:
        proc = run_agent(tmp_path / "job.json", tmp_path / "j.jsonl", timeout=300,
                         env={**os.environ, **openblas()})
    finally:
        stop = 0.0
        hog.kill()
        hog.wait()
        ingest.join()
    assert proc.returncode == 0, proc.stderr
    gens = [e for e in map(json.loads, (tmp_path / "j.jsonl").read_text().splitlines())
            if e["type"] == "generation"]
    assert len(gens) == 2
    for g in gens:  # three spinning on 2 CPUs beside the agent: each takes a visible share
        assert g["cpu_other_share"] >= 0.1 and g["cpu_controller_share"] >= 0.1, g
        assert g["cpu_steal_share"] is not None  # read apart on Linux, whatever its size
        c = g["contention"]
        assert c["share"] == taken_share({k: g[f"cpu_{k}_share"]
                                          for k in ("other", "controller", "steal")})
        [reason] = [r for r in g["unreliable_reasons"] if r.startswith("contended")]
        assert "other processes used " in reason
        assert "the controller on this node used " in reason


def test_a_window_of_samples_carries_each_share_as_fields():
    """The sampler's window, planted readings: what a generation event carries."""
    w = [_reading(100.0, 400.0, 10.0, steal=5.0, controller=3.0),
         _reading(101.0, 402.0, 10.5, steal=5.1, controller=3.2),
         _reading(102.5, 404.0, 11.5, steal=5.4, controller=3.6)]
    t = summarise_window(w)
    assert (t["cpu_other_share"], t["cpu_controller_share"], t["cpu_steal_share"]) == (
        0.1, 0.15, 0.1)
    mac = summarise_window([{**r, "cpu_steal_s": None, "controller_cpu_s": None} for r in w])
    assert (mac["cpu_other_share"], mac["cpu_controller_share"], mac["cpu_steal_share"]) == (
        0.25, None, None)


def test_the_busy_banner_names_who_took_the_cpu():
    from orchestrator.review.busy import busy_who

    assert busy_who([{"low": 0.6, "high": 0.7, "limit": 0.25}]) == "other processes"
    assert busy_who([{"low": 0.4, "high": 0.4, "limit": 0.25,
                      "parts": {"other": (0.001, 0.001), "steal": (0.4, 0.4)}}]) == \
        "the host (hypervisor)"
    assert busy_who(reasons=[
        "contended: other processes used 10%, the controller on this node used 15% and the "
        "host (hypervisor) took 10% of the CPU (limit 25%)"]) == \
        "other processes, the controller on this node and the host (hypervisor)"


def test_a_sweep_page_of_a_node_whose_host_took_the_cpu_says_so(tmp_path):
    from orchestrator.review.sweep_page import render_review
    from orchestrator.store import open_store
    from tests.history import generation, ingest_lines, new_sweep
    from tests.store_templates import fresh_sqlite
    from tests.test_pages import visible
    from tests.test_weekly_review import W20

    store = open_store(fresh_sqlite(tmp_path / "s.db"))
    sid = new_sweep(store, W20)
    stolen = ["contended: the host (hypervisor) took 40% of the CPU (limit 25%)"]
    events = [generation(mode, k, unreliable=True, unreliable_reasons=stolen, repetition=rep,
                         acceptance_rate=0.5 if k else None,
                         **({"knob": "num_draft_tokens", "knob_value": k} if k else {}))
              for mode, k in (("baseline", 0), ("speculative", 2)) for rep in range(2)]
    ingest_lines(store, sid, "local", events, W20.timestamp())
    text = visible(render_review(store, tmp_path / "sweep.html", sid).read_text())
    assert "2 of 2 rows were set aside because the host (hypervisor) competed for the CPU" \
        in text
    assert "other processes" not in text


def test_the_weekly_caveat_names_who_competed():
    from orchestrator.review.verdict import _shaky

    stolen = {"reasons": ["contended: the host (hypervisor) took 40% of the CPU (limit 25%)"]}
    assert _shaky({"set_aside": [stolen]}) == [
        "the host (hypervisor) competed for the CPU in some runs (set aside)"]
    fields = {"reasons": ["contended: …"], "contention": [
        {"low": 0.5, "high": 0.5, "limit": 0.25,
         "parts": {"other": (0.3, 0.3), "controller": (0.2, 0.2)}}]}
    assert _shaky({"set_aside": [fields]}) == [
        "other processes and the controller on this node competed for the CPU in some runs "
        "(set aside)"]


def test_the_controllers_journal_followers_count_as_the_controllers_and_a_hog_does_not():
    """Real processes, children of this test (the controller): one whose command line is a
    journal follower's (``-m agent follow``) spins 0.5 CPU-s; a hog spins as long. Only the
    follower's CPU joins the controller's."""
    spin = "import time\nt = time.process_time() + 0.5\nwhile time.process_time() < t: pass\n"
    me = ControllerCpu(os.getpid())
    before, ours = me.cpu(), sum(os.times()[:2])
    follower = subprocess.Popen([sys.executable, "-c", spin + "time.sleep(60)", "-m", "agent",
                                 "follow", "journal.jsonl"])
    hog = subprocess.Popen([sys.executable, "-c", spin + "time.sleep(60)"])
    try:
        deadline = time.time() + 60
        while time.time() < deadline and min(_cpu(follower.pid), _cpu(hog.pid)) < 0.5:
            time.sleep(0.1)
        after, ours = me.cpu(), sum(os.times()[:2]) - ours
        followed = _cpu(follower.pid)
    finally:
        for p in (follower, hog):
            p.kill()
            p.wait()
    assert before is not None and after is not None
    # the controller's: this process's own, and the follower's (its start-up included)
    assert after - before == pytest.approx(ours + followed, abs=0.05)
    assert followed < 1.0  # ... and not the hog's 0.5 on top


def _cpu(pid: int) -> float:
    from agent.telemetry.cpu import parse_proc_pid_stat

    try:
        return parse_proc_pid_stat(Path(f"/proc/{pid}/stat").read_text()) or 0.0
    except OSError:
        return 0.0


def test_a_local_sweep_reads_the_controller_and_the_host_apart(model_pair, tmp_path):
    """Through the controller on a local node: the job it writes names its pid, and every
    judged generation carries the controller's share and the host's steal as fields."""
    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.locks import make_lock

    lock = make_lock(tmp_path, model_pair, widths=(2,), max_tokens=400, repetitions=1,
                     extra="  contention_threshold: 1.0")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db",
                                  f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 0, r.output
    [job] = (tmp_path / "node" / "jobs").glob("*[0-9a-f].json")
    assert json.loads(job.read_text())["controller_pid"] == os.getpid()
    journal = job.with_name(job.stem + ".events.jsonl").read_text().splitlines()
    gens = [e for e in map(json.loads, journal) if e["type"] == "generation"]
    judged = [g for g in gens if g["cpu_other_share"] is not None]
    assert judged, [g["readings_unavailable"] for g in gens]
    assert all(g["cpu_controller_share"] is not None and g["cpu_steal_share"] is not None
               for g in judged)
