"""Nightly: schedule files from templates (plist parsed, systemd-analyze verify, cron line),
and the nightly command's guard, trigger and one-line summary against real sshd nodes."""

import plistlib
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import Sweep
from tests.controller import hold_agents, specfleet, wait_for
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
    assert d["ProgramArguments"][1:] == ["nightly", str(odd_lock.resolve()), "--no-provision"]
    assert d["StandardOutPath"] == d["StandardErrorPath"] == str(
        odd_lock.resolve().with_name("plan.lock.nightly.log"))
    assert d["StartCalendarInterval"] == {"Hour": 2, "Minute": 30}
    assert d["EnvironmentVariables"]["SPECFLEET_DB"] == "postgresql+psycopg://ci@db/specfleet"
    assert d["WorkingDirectory"] == str(odd_lock.resolve().parent)
    # loaded into user/UID, which needs no GUI login (gui/UID fails headless: error 125)
    assert d["LimitLoadToSessionType"] == "Background" and "UserName" not in d


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing")
def test_systemd_units_pass_systemd_analyze_verify(odd_lock, tmp_path):
    dest = tmp_path / "units"
    install("systemd", odd_lock, dest)
    timer = next(dest.glob("*.timer"))
    r = subprocess.run(["systemd-analyze", "verify", str(timer), str(timer.with_suffix(
        ".service"))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "OnCalendar=*-*-* 02:30:00" in timer.read_text()


def cron_command(line: str) -> tuple[str, str]:
    """What cron runs for a crontab line, per crontab(5): an unescaped % ends the command
    (the rest becomes its stdin) and a backslash-escaped % is a plain %."""
    command = line.split(" ", 5)[5]
    out, i = [], 0
    while i < len(command):
        if command[i] == "\\" and command[i + 1:i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if command[i] == "%":
            return "".join(out), command[i + 1:]
        out.append(command[i])
        i += 1
    return "".join(out), ""


def test_cron_line_quotes_and_list_remove(odd_lock, tmp_path):
    dest = tmp_path / "cron"
    url = "postgresql+psycopg://ci:p%40ss%25w0rd@db/specfleet"  # percent-encoded password
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--at", "3:05",
                                  "--kind", "cron", "--dest", str(dest), "--no-enable",
                                  "--db", url])
    assert r.exit_code == 0, r.output
    line = (dest / "specfleet.cron").read_text().strip()
    fields = line.split(" ", 5)
    assert fields[:5] == ["5", "3", "*", "*", "*"]
    command, stdin = cron_command(line)
    assert stdin == ""  # no % split the command
    words = shlex.split(command, comments=True)
    # the password is never in the entry: a 0600 PGPASSFILE holds it (libpq reads it)
    assert "SPECFLEET_DB=postgresql+psycopg://ci@db/specfleet" in words
    assert "p%40ss" not in line and "p@ss" not in line
    pgpass = Path(next(w for w in words if w.startswith("PGPASSFILE=")).split("=", 1)[1])
    assert pgpass.read_text() == "db:5432:specfleet:ci:p@ss%w0rd\n"
    assert pgpass.stat().st_mode & 0o777 == 0o600
    assert words[words.index("nightly") + 1] == str(odd_lock.resolve())
    assert words[words.index("cd") + 1] == str(odd_lock.resolve().parent)
    # the crontab line holds the store URL: only its owner may read it
    assert (dest / "specfleet.cron").stat().st_mode & 0o777 == 0o600
    listed = CliRunner().invoke(main, ["schedule", "list", "--dest", str(dest), "--json"])
    import json

    (entry,) = json.loads(listed.output)
    assert entry["kind"] == "cron" and entry["at"] == "03:05"
    assert entry["lock"] == str(odd_lock.resolve())
    r = CliRunner().invoke(main, ["schedule", "remove", entry["name"], "--dest", str(dest)])
    assert r.exit_code == 0 and (dest / "specfleet.cron").read_text() == ""
    assert not pgpass.exists()  # the password file goes with its entry
    bad = CliRunner().invoke(main, ["schedule", "remove", entry["name"], "--dest", str(dest)])
    assert bad.exit_code == 1 and "no nightly schedule named" in bad.output


@pytest.mark.parametrize("kind", ["launchd", "systemd", "cron"])
def test_every_entry_is_0600_and_carries_the_sweep_options(odd_lock, tmp_path, kind):
    """The options the manual sweep needed reach the entry; a lock that manages no
    environments gets --no-provision without being told."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    mac-a: {ansible_host: 127.0.0.1}\n"
                   "    mac-b: {ansible_host: 127.0.0.2}\n")
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    dest = tmp_path / kind
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--kind", kind,
                                  "--dest", str(dest), "--no-enable", "-i", str(inv),
                                  "--limit", "mac-a", "--known-hosts", str(kh), "--db",
                                  "postgresql+psycopg://ci:secret@db/specfleet"])
    assert r.exit_code == 0, r.output
    assert "runs with --no-provision" in r.output and "sweeps 1 host(s): mac-a" in r.output
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in dest.iterdir())
    assert all("secret" not in f.read_text() for f in dest.iterdir() if f.suffix != ".pgpass")
    files = [f for f in dest.iterdir() if f.suffix != ".pgpass"]
    if kind == "launchd":
        argv = plistlib.loads(files[0].read_bytes())["ProgramArguments"]
    elif kind == "systemd":
        svc = next(f for f in files if f.suffix == ".service").read_text()
        exec_line = next(ln for ln in svc.splitlines() if ln.startswith("ExecStart="))
        argv = shlex.split(exec_line[len("ExecStart="):])
    else:
        argv = shlex.split(cron_command(files[0].read_text().strip())[0], comments=True)
    tail = argv[argv.index("nightly"):]
    assert tail[2:4] == ["-i", str(inv.resolve())]
    assert "--no-provision" in tail and tail[tail.index("--limit") + 1] == "mac-a"
    assert tail[tail.index("--known-hosts") + 1] == str(kh.resolve())


def test_hostile_values_are_refused_or_inert(model_pair, tmp_path):
    """A newline would start a new unit directive or crontab line: refused. XML and shell
    metacharacters are escaped: the plist parses and the unit verifies."""
    from orchestrator.sweep.lock import write_lock
    from orchestrator.sweep.plan import load_plan
    from tests.locks import plan_text

    d = tmp_path / "p"
    d.mkdir()
    (d / "plan.yml").write_text(plan_text(model_pair).replace(
        "name: test-plan", 'name: "x\\nExecStartPre=/bin/touch /tmp/pwned"'))
    lock = write_lock(load_plan(d / "plan.yml"), lambda m: None)
    for kind in ("launchd", "systemd", "cron"):
        r = CliRunner().invoke(main, ["schedule", "install", str(lock), "--kind", kind,
                                      "--dest", str(tmp_path / kind), "--no-enable",
                                      "--db", "sqlite:///s.db"])
        assert r.exit_code == 1 and "the plan name contains the control character '\\n'" \
            in r.output, r.output
        assert not (tmp_path / kind).exists() or not any((tmp_path / kind).iterdir())
    r = CliRunner().invoke(main, ["schedule", "install", str(lock), "--kind", "cron",
                                  "--dest", str(tmp_path / "c2"), "--no-enable",
                                  "--db", "sqlite:///s.db",
                                  "--limit", "lab\n* * * * * touch /tmp/pwned"])
    assert r.exit_code == 1 and "control character" in r.output
    (d / "plan.yml").write_text(plan_text(model_pair).replace(
        "name: test-plan", "name: \"a -- <b> & 'c' %n $(id)\""))
    lock = write_lock(load_plan(d / "plan.yml"), lambda m: None)
    dest = tmp_path / "ok"
    for kind in ("launchd", "systemd"):
        r = CliRunner().invoke(main, ["schedule", "install", str(lock), "--kind", kind,
                                      "--dest", str(dest), "--no-enable",
                                      "--db", "sqlite:///s.db"])
        assert r.exit_code == 0, r.output
    plistlib.loads(next(dest.glob("*.plist")).read_bytes())
    if shutil.which("systemd-analyze"):
        timer = next(dest.glob("*.timer"))
        v = subprocess.run(["systemd-analyze", "verify", str(timer),
                            str(timer.with_suffix(".service"))], capture_output=True, text=True)
        assert v.returncode == 0, v.stderr


def test_provision_on_a_lock_without_environments_is_refused(odd_lock, tmp_path):
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--kind", "cron",
                                  "--dest", str(tmp_path), "--no-enable", "--provision"])
    assert r.exit_code == 1 and "must run with --no-provision" in r.output


def test_a_nightly_that_cannot_start_is_in_the_weekly_review(model_pair, tmp_path, sqlite_url):
    """The plan changed after the schedule was installed: the nightly stops, and the week's
    review names the night and the reason."""
    import json

    lock = make_lock(tmp_path, model_pair)
    plan = tmp_path / "plan.yml"
    plan.write_text(plan.read_text().replace("repetitions: 1", "repetitions: 2"))
    r = CliRunner().invoke(main, ["nightly", str(lock), "--db", sqlite_url])
    assert r.exit_code == 1 and "plan" in r.output
    out = tmp_path / "rev"
    r = CliRunner().invoke(main, ["review", "--db", sqlite_url, "--out", str(out),
                                  "--format", "json,md,html"])
    assert r.exit_code == 0, r.output
    (js,) = out.glob("*.json")
    (f,) = json.loads(js.read_text())["failures"]
    assert f["trigger"] == "nightly" and f["status"] == "failed"
    assert f["nodes"][0]["reason"].startswith(f"nightly of {lock} did not start: ")
    assert "changed" in f["nodes"][0]["reason"]
    (md,) = out.glob("*.md")
    assert "## Sweeps that did not finish ok" in md.read_text()


def test_bad_time_is_refused(odd_lock, tmp_path):
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--at", "25:00",
                                  "--kind", "cron", "--dest", str(tmp_path)])
    assert r.exit_code == 1 and "expected HH:MM in 24-hour time" in r.output


def test_nightly_guard_trigger_and_summary(fleet, model_pair, tmp_path, sqlite_url):
    # the first nightly's agent is held (SIGSTOP) while the second is refused: 32 tokens
    # leave it work past "agent started" (96 used to outlast the second's start unheld)
    lock = make_lock(tmp_path, model_pair, widths=(2, 3), repetitions=3, max_tokens=32)
    inv = tmp_path / "hosts.yml"
    inv.write_text(fleet.inventory_yaml(extra_hosts={
        "ghost": {"ansible_host": "127.0.1.99", "ansible_port": 9}}))
    common = ["-i", str(inv), "--known-hosts", str(fleet.known_hosts), "--db", sqlite_url,
              "--no-provision", "--failed-hosts-file", str(tmp_path / "retry")]
    first = specfleet("nightly", str(lock), "--limit", "node1:ghost", *common,
                      log=tmp_path / "n1.log")
    wait_for(lambda: "agent started" in (tmp_path / "n1.log").read_text(), what="nightly 1")
    hold_agents(fleet.nodes[:1])
    try:
        second = specfleet("nightly", str(lock), "--limit", "node1", *common,
                           log=tmp_path / "n2.log")
        assert second.wait(timeout=60) == 1
    finally:
        hold_agents(fleet.nodes[:1], signal.SIGCONT)
    assert "a nightly of this plan is still running (pid " in (tmp_path / "n2.log").read_text()
    assert first.wait(timeout=300) == 1  # ghost is unreachable
    last = (tmp_path / "n1.log").read_text().strip().splitlines()[-1]
    assert last.startswith("nightly test-plan sweep ") and ": partial (1/2 nodes ok); ghost " \
        "unreachable: " in last
    with open_store(sqlite_url).engine.connect() as c:
        assert c.execute(select(Sweep.trigger)).scalars().all() == ["nightly"]


def test_a_store_must_be_named_and_is_written_resolved(odd_lock, tmp_path, monkeypatch):
    """Without --db a nightly would write to a SQLite file of its own (relative to the lock's
    folder): refused, saying how. A relative SQLite path is written absolute."""
    monkeypatch.delenv("SPECFLEET_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--kind", "cron",
                                  "--dest", str(tmp_path / "c"), "--no-enable"])
    assert r.exit_code == 1 and "name the store the nightly writes to (--db" in r.output
    assert not (tmp_path / "c").exists()
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--kind", "cron",
                                  "--dest", str(tmp_path / "c"), "--system", "--db", "sqlite:///s.db"])
    assert r.exit_code == 1 and "--system makes a launchd LaunchDaemon" in r.output
    r = CliRunner().invoke(main, ["schedule", "install", str(odd_lock), "--kind", "launchd",
                                  "--dest", str(tmp_path / "l"), "--no-enable",
                                  "--db", "sqlite:///runs/specfleet.db"])
    assert r.exit_code == 0, r.output
    (plist,) = (tmp_path / "l").glob("*.plist")
    env = plistlib.loads(plist.read_bytes())["EnvironmentVariables"]
    assert env["SPECFLEET_DB"] == f"sqlite:///{tmp_path.resolve()}/runs/specfleet.db"


def test_system_daemon_runs_as_the_user_and_reinstall_boots_out_first(odd_lock, tmp_path,
                                                                      monkeypatch):
    """--system: a LaunchDaemon with UserName, loaded into the system domain; a LaunchAgent
    goes to user/UID. launchctl is the macOS edge: a recording stand-in on PATH shows the
    commands (bootout before bootstrap, so a re-install of a loaded label works)."""
    import getpass
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "launchctl").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                                       '[ "$1" = bootout ] && exit 3\nexit 0\n')
    (bin_dir / "launchctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for system, domain in ((False, f"user/{os.getuid()}"), (True, "system")):
        dest = tmp_path / f"d{system}"
        args = ["schedule", "install", str(odd_lock), "--kind", "launchd", "--dest", str(dest),
                "--enable", "--db", "sqlite:///s.db"] + (["--system"] if system else [])
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        (plist,) = dest.glob("*.plist")
        d = plistlib.loads(plist.read_bytes())
        if system:
            assert d["UserName"] == getpass.getuser() and "LimitLoadToSessionType" not in d
            assert plist.stat().st_mode & 0o777 == 0o644  # launchd refuses a writable daemon
        assert calls.read_text().splitlines()[-2:] == [f"bootout {domain} {plist}",
                                                       f"bootstrap {domain} {plist}"]


def _systemd_argv(exec_line: str) -> list[str]:
    """ExecStart= as systemd reads it (systemd.service(5)): quoted words, then "$$" a
    literal "$" and "%%" a literal "%" (a lone "$VAR" or "%x" would be expanded)."""
    words = shlex.split(exec_line[len("ExecStart="):])
    for w in words:
        assert "$" not in w.replace("$$", ""), w  # nothing left for systemd to expand
    return [w.replace("$$", "$").replace("%%", "%") for w in words]


_FOLDER = st.text(st.characters(min_codepoint=32, max_codepoint=0x24FF,
                                blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12
                  ).filter(lambda s: s not in (".", "..") and "/" not in s) | st.sampled_from(
    ["$HOME", "${PATH}", "$$", "100%d", "%h %n", "a&b<c>", "it's \"q\"", "back\\slash"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(folder=_FOLDER)
def test_any_folder_name_reaches_every_scheduler_literally(model_pair, tmp_path, folder):
    """The lock's path is written into a plist, a unit and a crontab line; whatever the
    folder is called, each scheduler hands the nightly exactly that path."""
    import tempfile

    src = _LOCK.get("lock") or _LOCK.setdefault("lock", make_lock(
        Path(tempfile.mkdtemp()), model_pair))
    with tempfile.TemporaryDirectory() as d:
        where = Path(d) / folder
        where.mkdir()
        lock = where / "plan.lock.json"
        lock.write_bytes(src.read_bytes())
        want = str(lock.resolve())
        for kind in ("launchd", "systemd", "cron"):
            dest = Path(d) / f"out-{kind}"
            install(kind, lock, dest)
            files = [f for f in dest.iterdir() if f.suffix != ".pgpass"]
            if kind == "launchd":
                argv = plistlib.loads(files[0].read_bytes())["ProgramArguments"]
            elif kind == "systemd":
                svc = next(f for f in files if f.suffix == ".service").read_text()
                argv = _systemd_argv(next(ln for ln in svc.splitlines()
                                          if ln.startswith("ExecStart=")))
            else:
                argv = shlex.split(cron_command(files[0].read_text().strip())[0],
                                   comments=True)
            assert argv[argv.index("nightly") + 1] == want, (kind, argv)


_LOCK: dict = {}
