"""What a sweep ends with says what it gives: a sweep whose every generation was set aside
as unreliable ends "no reliable result", not `ok` (exit 0: nothing failed, nothing to
retry; `review --fail-on no-data` is the gate for it); what it measured is kept."""

import subprocess
import sys

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import Measurement, Sweep
from tests.locks import make_lock


def test_a_sweep_whose_every_generation_was_set_aside_has_no_reliable_result(model_pair,
                                                                             tmp_path):
    # planted: a CPU burner beside the agent and a contention limit it must exceed; long
    # enough generations that the sampler (every 0.5 s) reads the share on a fast machine
    lock = make_lock(tmp_path, model_pair, widths=(2,), max_tokens=400, repetitions=1,
                     extra="  contention_threshold: 0.000001")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    url = f"sqlite:///{tmp_path / 's.db'}"
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db", url,
                                      "--failed-hosts-file", str(tmp_path / "retry")])
    finally:
        burner.kill()
    assert r.exit_code == 0, r.output
    assert r.output.rstrip().endswith(": no reliable result (every generation was set aside as "
                                      "unreliable: see above)"), r.output
    assert not (tmp_path / "retry").exists()  # nothing failed: nothing to retry
    with open_store(url).engine.connect() as c:
        rows = c.execute(select(Measurement.unreliable)).scalars().all()
        status = c.execute(select(Sweep.status)).scalar()
    assert rows and all(rows), "every generation stored, each set aside"
    assert status == "unreliable"
    line = next(x for x in r.output.splitlines() if x.startswith("local "))
    assert line.split()[1] == "unreliable"
    assert f"no reliable result: all {len(rows)} generation(s) were set aside as unreliable " \
           "(contended: other processes used " in line
    assert "`specfleet review --sweep " in line and f" --db {url}`" in line
    assert "1 hosts: 0 ok, 0 failed, 0 unreachable, 1 unreliable" in r.output
    assert " ok " not in line
    hint = line.split("`")[1].split()  # the sweep page, as printed
    page = CliRunner().invoke(main, [*hint[1:], "--out", str(tmp_path / "sweep.html")])
    assert page.exit_code == 0, page.output
    assert "contended" in (tmp_path / "sweep.html").read_text()


def test_reasons_that_differ_only_in_their_numbers_are_said_once_with_their_range():
    """A busy demo's line once read "(contended: … 52% …; contended: … 77% …; contended:
    … 75% …)": the same words three times."""
    from orchestrator.sweep.outcome import reason_ranges

    cpu = "contended: other processes used {}% of the CPU (limit 25%)"
    assert reason_ranges([cpu.format(52), "swap grew 12.5 MB", cpu.format(77),
                          cpu.format(75)]) == [cpu.format("52–77"), "swap grew 12.5 MB"]
    assert reason_ranges([cpu.format(60)] * 3) == [cpu.format(60)]
    assert reason_ranges(["on battery"]) == ["on battery"] and reason_ranges([]) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["contended {}% of {} CPUs", "swap {} MB",
                                           "thermal {}", "spread {}% > {}%"]),
                          st.lists(st.integers(0, 999), min_size=2, max_size=2)),
                max_size=12))
def test_every_reason_is_kept_and_each_number_falls_in_its_range(drawn):
    import re

    from orchestrator.sweep.outcome import reason_ranges

    reasons = [t.format(*ns[:t.count("{}")]) for t, ns in drawn]
    out = reason_ranges(reasons)
    templates = [re.sub(r"\d+", "#", r) for r in reasons]
    assert [re.sub(r"\d+(–\d+)?", "#", o) for o in out] == list(dict.fromkeys(templates))
    for r, t in zip(reasons, templates):  # each reason's numbers lie in its line's ranges
        said = out[list(dict.fromkeys(templates)).index(t)]
        for n, rng in zip(re.findall(r"\d+", r), re.findall(r"\d+(?:–\d+)?", said)):
            lo, _, hi = rng.partition("–")
            assert int(lo) <= int(n) <= int(hi or lo)
