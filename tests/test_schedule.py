"""Nightly: schedule files from templates (plist parsed, systemd-analyze verify, cron line),
and the nightly command's guard, trigger and one-line summary against real sshd nodes."""

import plistlib
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import Sweep
from tests.controller import specfleet, wait_for
from tests.locks import make_lock


@pytest.fixture
def odd_lock(model_pair, tmp_path):
    """A lock in a folder whose name needs quoting everywhere: spaces, quotes, %, &."""
    d = tmp_path / "team's plans & 100% nightly"
    d.mkdir()
    return make_lock(d, model_pair)


def install(kind, lock, dest, at="02:30"):
    r = CliRunner().invoke(main, ["schedule", "install", str(lock), "--at", at, "--kind", kind,
                                  "--dest", str(dest), "--no-enable", "--db",
                                  "postgresql+psycopg://ci@db/specfleet"])
    assert r.exit_code == 0, r.output
    return r


def test_launchd_plist_parses_and_round_trips_paths(odd_lock, tmp_path):
    install("launchd", odd_lock, tmp_path / "agents")
    (plist,) = (tmp_path / "agents").glob("com.specfleet.nightly.*.plist")
    d = plistlib.loads(plist.read_bytes())  # a real XML plist parser, as plutil -lint
    assert d["ProgramArguments"][1:] == ["nightly", str(odd_lock.resolve())]
    assert d["StartCalendarInterval"] == {"Hour": 2, "Minute": 30}
    assert d["EnvironmentVariables"]["SPECFLEET_DB"] == "postgresql+psycopg://ci@db/specfleet"
    assert d["WorkingDirectory"] == str(odd_lock.resolve().parent)


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing")
def test_systemd_units_pass_systemd_analyze_verify(odd_lock, tmp_path):
    dest = tmp_path / "units"
    install("systemd", odd_lock, dest)
    timer = next(dest.glob("*.timer"))
    r = subprocess.run(["systemd-analyze", "verify", str(timer), str(timer.with_suffix(
        ".service"))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "OnCalendar=*-*-* 02:30:00" in timer.read_text()


def test_cron_line_quotes_and_list_remove(odd_lock, tmp_path):
    dest = tmp_path / "cron"
    install("cron", odd_lock, dest, at="3:05")
    line = (dest / "specfleet.cron").read_text().strip()
    fields = line.split(" ", 5)
    assert fields[:5] == ["5", "3", "*", "*", "*"]
    words = shlex.split(fields[5], comments=True)
    assert words[words.index("nightly") + 1] == str(odd_lock.resolve())
    listed = CliRunner().invoke(main, ["schedule", "list", "--dest", str(dest), "--json"])
    import json

    (entry,) = json.loads(listed.output)
    assert entry["kind"] == "cron" and entry["at"] == "03:05"
    assert entry["lock"] == str(odd_lock.resolve())
    r = CliRunner().invoke(main, ["schedule", "remove", entry["name"], "--dest", str(dest)])
    assert r.exit_code == 0 and (dest / "specfleet.cron").read_text() == ""
    bad = CliRunner().invoke(main, ["schedule", "remove", entry["name"], "--dest", str(dest)])
    assert bad.exit_code == 1 and "no nightly schedule named" in bad.output


def test_bad_time_is_refused(odd_lock, tmp_path):
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--at", "25:00",
                                  "--kind", "cron", "--dest", str(tmp_path)])
    assert r.exit_code == 1 and "expected HH:MM in 24-hour time" in r.output


def test_nightly_guard_trigger_and_summary(fleet, model_pair, tmp_path, sqlite_url):
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=3, max_tokens=96)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml(extra_hosts={
        "ghost": {"ansible_host": "127.0.1.99", "ansible_port": 9}}))
    common = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", sqlite_url,
              "--no-provision", "--failed-hosts-file", str(tmp_path / "retry")]
    first = specfleet("nightly", str(lock), "--limit", "node1:ghost", *common,
                      log=tmp_path / "n1.log")
    wait_for(lambda: "agent started" in (tmp_path / "n1.log").read_text(), what="nightly 1")
    second = specfleet("nightly", str(lock), "--limit", "node1", *common,
                       log=tmp_path / "n2.log")
    assert second.wait(timeout=60) == 1
    assert "a nightly of this plan is still running (pid " in (tmp_path / "n2.log").read_text()
    assert first.wait(timeout=300) == 1  # ghost is unreachable
    last = (tmp_path / "n1.log").read_text().strip().splitlines()[-1]
    assert last.startswith("nightly test-plan sweep ") and ": partial (1/2 nodes ok); ghost " \
        "unreachable: " in last
    with open_store(sqlite_url).engine.connect() as c:
        assert c.execute(select(Sweep.trigger)).scalars().all() == ["nightly"]
