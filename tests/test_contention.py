"""A busy machine is said, not averaged: generations measured while other processes took a
large share of the CPU are flagged unreliable ("contended"), and the flag is the plan's to
tune. The audit that found this ran 96% CPU pressure and saw 0 of 96 generations flagged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.telemetry.cpu import other_share, parse_proc_pid_stat, parse_proc_stat
from agent.telemetry.sampler import unreliable_reasons
from orchestrator.errors import ConfigError
from orchestrator.sweep.jobspec import build_job
from orchestrator.sweep.lock import write_lock
from orchestrator.sweep.plan import load_plan
from tests.locks import plan_text
from tests.test_agent import run_agent

DATA = Path(__file__).with_name("data") / "linux"


def test_proc_stat_and_pid_stat_are_read_as_the_kernel_writes_them():
    # captured on this machine: cpu  249882 469 27610 306802 4418 0 2917 2047 0 0
    busy, total, steal = parse_proc_stat((DATA / "proc_stat.txt").read_text(), hz=100)
    assert total == pytest.approx((249882 + 469 + 27610 + 306802 + 4418 + 2917 + 2047) / 100)
    # the hypervisor's steal (8th column) is no process on the node: apart from busy
    assert steal == pytest.approx(2047 / 100)
    assert busy == pytest.approx(total - (306802 + 4418 + 2047) / 100)
    # a command name with spaces and a ")" must not shift the fields (proc(5))
    line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 1 0"
    assert parse_proc_pid_stat(line, hz=100) == pytest.approx(18.01)
    assert parse_proc_stat("intr 1 2 3") is None and parse_proc_pid_stat("garbage") is None


def test_the_share_is_what_others_took_of_the_capacity():
    a = {"cpu_busy_s": 100.0, "cpu_total_s": 400.0, "own_cpu_s": 10.0}
    # 2 s on 4 CPUs = 8 s of capacity; the machine was busy 6 s, 1.5 of them ours
    b = {"cpu_busy_s": 106.0, "cpu_total_s": 408.0, "own_cpu_s": 11.5}
    assert other_share(a, b) == 0.562  # rounded to 0.1%
    assert unreliable_reasons({"cpu_other_share": 0.5625}) == [
        "contended: other processes used 56% of the CPU (limit 25%)"]
    assert unreliable_reasons({"cpu_other_share": 0.5625}, contention=0.6) == []
    # work we cannot count (a runtime someone else started): not judged at all
    assert other_share(a, {**b, "own_cpu_s": None}) is None


def _burn(seconds: float) -> list[subprocess.Popen]:
    """Two processes spinning for a bounded time: a user's build, a browser, an indexer."""
    code = f"import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]


@pytest.mark.alone  # "quiet" needs a machine no other test is loading
def test_generations_under_cpu_pressure_are_flagged_and_quiet_ones_are_not(model_pair,
                                                                          tmp_path):
    def run(name: str, burn: bool) -> list[dict]:
        d = tmp_path / name
        d.mkdir()
        # long enough that a quiet generation spans the 0.2 CPU-s a share needs: with the
        # OpenBLAS preload the baseline ran 1560 tok/s, so 160 tokens (0.1 s on 2 CPUs) was
        # too short to judge and its share was None; 400 tokens spans ~0.28 s
        job = build_job(model_pair, ["code"], max_tokens=400)
        job["workloads"], job["knobs"] = job["workloads"][:1], {"num_draft_tokens": [2]}
        job["repetitions"] = 2
        (d / "job.json").write_text(json.dumps(job))
        burners = _burn(90) if burn else []
        try:
            proc = run_agent(d / "job.json", d / "j.jsonl", timeout=300)
        finally:
            for b in burners:
                b.kill()
                b.wait()
        assert proc.returncode == 0, proc.stderr
        ev = [json.loads(x) for x in (d / "j.jsonl").read_text().splitlines()]
        return [e for e in ev if e["type"] == "generation"]

    busy = run("busy", burn=True)
    assert len(busy) == 4
    for g in busy:  # two spinning processes on this 2-core machine
        assert g["cpu_other_share"] >= 0.25 and g["unreliable"] is True
        assert any(r.startswith("contended: other processes used ") for r in
                   g["unreliable_reasons"])
    quiet = run("quiet", burn=False)
    assert all(g["cpu_other_share"] is not None for g in quiet)
    assert not [g for g in quiet if any(r.startswith("contended") for r in
                                        g["unreliable_reasons"])], \
        [g["cpu_other_share"] for g in quiet]


def test_the_threshold_is_the_plans_and_checked(model_pair, tmp_path):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, extra="  contention_threshold: 1.5"))
    line = next(i for i, ln in enumerate(plan.read_text().splitlines(), 1)
                if "contention_threshold" in ln)
    with pytest.raises(ConfigError, match=r"contention_threshold: a share of the machine's "
                                          r"CPU in \(0, 1\], got 1.5") as e:
        write_lock(load_plan(plan), lambda m: None)
    assert e.value.line is not None and e.value.line <= line
    plan.write_text(plan_text(model_pair, extra="  contention_threshold: 0.6"))
    doc = json.loads(write_lock(load_plan(plan), lambda m: None).read_text())
    assert doc["job"]["contention_threshold"] == 0.6


def test_a_cpu_hog_beside_a_sweep_on_a_loopback_node_sets_its_runs_aside(fleet, model_pair,
                                                                        tmp_path):
    from click.testing import CliRunner

    from orchestrator.cli import main
    from orchestrator.review.sweep_page import review_data
    from orchestrator.store import open_store
    from tests.locks import make_lock

    # 160 tokens: each generation must span the 0.2 CPU-s a share needs; under `make test`'s
    # OpenBLAS preload (tests/blas.py) a 48-token one is too short to judge (share None)
    lock = make_lock(tmp_path, model_pair, widths=(2,), repetitions=2, max_tokens=160)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml())
    url = f"sqlite:///{tmp_path / 's.db'}"
    hogs = _burn(120)
    try:
        r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--limit", "node1",
                                      "--known-hosts", str(fleet.known_hosts), "--db", url,
                                      "--no-provision", "--failed-hosts-file",
                                      str(tmp_path / "retry")])
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.exit_code == 0, r.output
    data = review_data(open_store(url))
    for section in data["sections"]:
        spec = [row for row in section["rows"] if row.mode == "speculative"]
        assert spec and all(row.set_aside and row.speedup is None for row in spec)
        assert all(any(x.startswith("contended: other processes used ")
                       for x in row.unreliable_reasons) for row in section["rows"])
        assert section["verdict"].startswith("No conclusion: the speculative row is set "
                                             "aside as unreliable (")
        assert "contended: other processes used " in section["verdict"]


def test_a_configs_contention_is_sent_as_fields_and_said_once():
    """Planted trials: two contended (56%, 66% of the CPU, limit 25%), one throttled, one
    sound. The summary carries the shares and the limit as fields, says the contention once
    as their range, and counts only the throttled trial in its other reasons; the
    controller's boundary refuses a summary whose readings are not fractions."""
    from agent.protocol import contention_text
    from agent.summary import config_summary
    from orchestrator.sweep.decode import Decoder, Quarantined

    def trial(share=None, *reasons):
        g = {"decode_tok_s": 10.0, "unreliable": bool(reasons) or share is not None,
             "unreliable_reasons": [*reasons, *([contention_text(share, share, 0.25)]
                                               if share is not None else [])]}
        return {**g, "contention": {"share": share, "limit": 0.25}} if share else g

    s = config_summary([trial(0.56), trial(0.66), trial(None, "thermal throttling"),
                        trial()], cv_threshold=1.0)
    assert s["contention"] == {"shares": [0.56, 0.66], "limit": 0.25}
    assert s["unreliable_reasons"] == [
        "1 of 4 trials unreliable (thermal throttling)",
        "contended: other processes used 56–66% of the CPU (limit 25%)"]
    assert config_summary([trial()], 1.0)["contention"] is None
    event = {"schema": 1, "seq": 1, "type": "config_summary", "ts": 1.0, "job_id": "j",
             "workload": "w", "mode": "baseline", "config": {}, "num_draft_tokens": 0,
             "trials": 4, "metrics": s["metrics"], "unreliable": True,
             "unreliable_reasons": s["unreliable_reasons"], "contention": s["contention"]}
    decoded = Decoder("n").decode(json.dumps(event))
    assert type(decoded) is dict and decoded["contention"] == s["contention"]
    for bad in ({"shares": ["56%"], "limit": 0.25}, {"shares": [], "limit": 0.25},
                {"shares": [0.5]}, [0.5]):
        q = Decoder("n").decode(json.dumps({**event, "contention": bad}))
        assert type(q) is Quarantined and "contention" in q.reason


def _contention(t: dict) -> list[str]:
    # planted readings carry only the CPU counters: the other readings are unverified
    return [r for r in unreliable_reasons(t) if "contend" in r or "contention" in r]


def _reading(ts: float, busy: float, total: float, own: float) -> dict:
    return {"ts": ts, "cpu_busy_s": busy, "cpu_total_s": total, "own_cpu_s": own}


def _then_same(*readings: dict):
    """A reader giving these readings, then the last one again (a clock that stopped: no
    reading after the run ever spans enough capacity)."""
    import itertools

    it = itertools.chain(readings, itertools.repeat(readings[-1]))
    return lambda: dict(next(it))


def test_a_run_too_short_to_judge_is_judged_from_the_reading_before_it():
    # A 16-token generation can take 50 ms: 0.1 CPU-s of capacity on 2 CPUs, too few
    # clock ticks to judge. It used to count as clean; now the reading taken just before
    # it stands in (a co-tenant busy then was busy during the run), else it is unverified.
    from agent.telemetry.sampler import Sampler, summarise_window

    planted = iter([
        _reading(100.0, 10.0, 40.0, 1.0),    # 1 s before the run: others took 1.6 of 2 s
        _reading(101.0, 11.9, 42.0, 1.1),    # the run starts
        _reading(101.05, 12.0, 42.1, 1.15),  # ... and ends 50 ms later
    ])
    sampler = Sampler(reader=lambda: next(planted))
    sampler.mark()
    start = sampler.mark()
    window = sampler.window(start, sampler.mark())
    assert len(window) == 2 and window.before is not None
    t = summarise_window(window)
    # from the reading before: busy 2.0 - own 0.15 over 2.1 of capacity
    assert t["cpu_other_share"] == round((2.0 - 0.15) / 2.1, 3)
    assert _contention(t) == [
        f"contended: other processes used {(2.0 - 0.15) / 2.1:.0%} of the CPU (limit 25%)"]

    # nothing before it (the job's first run): the reading just after it stands in, from
    # the run's start: busy 0.6 - own 0.1 over 0.6 of capacity
    first = _then_same(_reading(101.0, 11.9, 42.0, 1.1), _reading(101.05, 12.0, 42.1, 1.15),
                       _reading(101.3, 12.5, 42.6, 1.2))
    sampler = Sampler(reader=first)
    start = sampler.mark()
    window = sampler.window(start, sampler.mark())
    assert window.before is None and window.after is not None
    assert summarise_window(window)["cpu_other_share"] == round(0.5 / 0.6, 3)

    # no reading before or after it spans enough: unverified, never clean
    alone = _then_same(_reading(101.0, 11.9, 42.0, 1.1), _reading(101.05, 12.0, 42.1, 1.15))
    sampler = Sampler(reader=alone)
    start = sampler.mark()
    t = summarise_window(sampler.window(start, sampler.mark()))
    assert t["cpu_other_share"] is None
    [reason] = _contention(t)
    assert reason.startswith("unverified: contention window (the run took fewer clock ticks")

    # a reading too old (more than 5 s before) does not stand in
    old = _then_same(_reading(90.0, 0.0, 20.0, 0.0), _reading(101.0, 11.9, 42.0, 1.1),
                     _reading(101.05, 12.0, 42.1, 1.15))
    sampler = Sampler(reader=old)
    sampler.mark()
    start = sampler.mark()
    assert sampler.window(start, sampler.mark()).before is None

    # a reading taken while another runtime's process was ours counts "own" differently
    switched = _then_same(_reading(100.0, 10.0, 40.0, 1.0), _reading(101.0, 11.9, 42.0, 1.1),
                          _reading(101.05, 12.0, 42.1, 1.15))
    sampler = Sampler(reader=switched)
    sampler.mark()
    sampler.watch(4242)  # the agent switched to a runtime it started (its CPU now ours)
    start = sampler.mark()
    assert sampler.window(start, sampler.mark()).before is None

    # work we cannot count (own CPU unknown) stays not judged, by design
    t = summarise_window([_reading(1.0, 1.0, 2.0, None), _reading(1.05, 1.1, 2.1, None)])
    assert "contention window" not in t["readings_unavailable"]


def test_a_long_enough_run_is_judged_on_its_own_window():
    from agent.telemetry.sampler import Sampler, summarise_window

    planted = iter([_reading(100.0, 0.0, 40.0, 0.0),     # others busy long before: ignored
                    _reading(101.0, 12.0, 42.0, 0.2),
                    _reading(102.0, 13.9, 44.0, 2.0)])   # a quiet 1 s run: 0.1 of 2.0
    sampler = Sampler(reader=lambda: next(planted))
    sampler.mark()
    start = sampler.mark()
    w = sampler.window(start, sampler.mark())
    assert w.before is None
    assert summarise_window(w)["cpu_other_share"] == 0.05
