"""What a sweep ends with says what it gives: a sweep whose every generation was set aside
as unreliable ends "no reliable result", not `ok` (exit 0: nothing failed, nothing to
retry; `review --fail-on no-data` is the gate for it); what it measured is kept."""

import subprocess
import sys

from click.testing import CliRunner
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
