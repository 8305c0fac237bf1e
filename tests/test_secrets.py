"""No secret is printed or written (issue 30, item 4): a store URL's password never reaches a
hint, a progress line, an error, a crash log, a page, a JSON summary or a file, through a
sweep, a Ctrl-C, an --attach, a review and a forced crash."""

from __future__ import annotations

import os
import stat

from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.redact import redact
from tests.controller import (
    signal_mid_sweep,
    specfleet,
    sweep_id_from,
)
from tests.locks import make_lock

SECRET = "PLANTED-s3cret-pw"


def _everything_under(folder) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_planted_password_appears_nowhere(tmp_path, model_pair, pg_url, monkeypatch):
    # PostgreSQL here trusts loopback, so any password connects: the URL carries one anyway
    url = pg_url.replace("postgres@", f"postgres:{SECRET}@")
    home = tmp_path / "home"
    monkeypatch.setenv("SPECFLEET_HOME", str(home))
    lock = make_lock(tmp_path, model_pair, widths=(2,), repetitions=3, max_tokens=32)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    args = ["-i", str(inv), "--failed-hosts-file", str(tmp_path / "retry")]
    # 1. a sweep given --db on the command line, Ctrl-C after the first generation
    log = tmp_path / "sweep.log"
    ctl = specfleet("sweep", str(lock), *args, "--db", url, log=log)
    sid = sweep_id_from(log)
    jf = tmp_path / "node" / "jobs" / f"{sid}.events.jsonl"
    assert signal_mid_sweep(ctl, jf, sid)[0] == 130
    text = log.read_text()
    masked = pg_url.replace("postgres@", "postgres:***@")
    assert f"specfleet sweep --attach {sid} -i {inv} --db '{masked}'" in text, text
    assert "put your password back for ***" in text
    # 2. the same store from SPECFLEET_DB: the hint leaves --db out (the shell has it)
    monkeypatch.setenv("SPECFLEET_DB", url)
    att = specfleet("sweep", "--attach", sid, *args, log=tmp_path / "attach.log")
    assert att.wait(timeout=300) == 0, (tmp_path / "attach.log").read_text()[-2000:]
    r = CliRunner().invoke(main, ["review", "--sweep", sid, "--out", str(tmp_path / "sweep.html")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["review", "--out", str(tmp_path / "week"),
                                  "--policy", str(tmp_path / "policy.json"),
                                  "--junit", str(tmp_path / "junit.xml")])
    assert r.exit_code == 0, r.output
    outputs = [r.output]
    # 3. errors that quote the URL: an unreachable store, a bad scheme
    down = url.replace("127.0.0.1:5432", "127.0.0.1:1")
    r = CliRunner().invoke(main, ["sweeps", "list", "--db", down])
    assert r.exit_code == 1 and "***" in r.output, r.output
    outputs.append(r.output)
    r = CliRunner().invoke(main, ["sweeps", "list", "--db", url.replace("postgresql+psycopg",
                                                                      "mysql")])
    assert r.exit_code == 1
    outputs.append(r.output)
    # 4. a forced crash (a bug's traceback quoting the URL): the log is masked, 0600, in 0700
    import orchestrator.store as store

    def crash(*a, **k):
        raise RuntimeError(f"planted bug while opening {url}")

    monkeypatch.setattr(store, "open_store", crash)  # commands import it when they run
    r = CliRunner().invoke(main, ["sweeps", "list", "--db", url])
    assert r.exit_code == 1 and "internal error: RuntimeError" in r.output, r.output
    outputs.append(r.output)
    logs = list((home / "crash").glob("crash-*.log"))
    assert len(logs) == 1
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "crash").stat().st_mode) == 0o700
    assert "planted bug while opening" in logs[0].read_text()
    # every output and every file the commands wrote (logs, pages, JSON, JUnit, policy,
    # the node's journal and job, the crash log)
    for out in outputs:
        assert SECRET not in out
    files = _everything_under(tmp_path)
    assert any(p.endswith(".html") for p in files) and any(p.endswith(".json") for p in files)
    leaked = [p for p, data in files.items() if SECRET.encode() in data]
    assert leaked == []
    assert os.environ["SPECFLEET_DB"] == url  # the secret was in play all along


def test_redact_masks_only_the_password():
    assert redact("postgresql+psycopg://bob:pa:ss@db.lab:5432/x and more") == \
        "postgresql+psycopg://bob:***@db.lab:5432/x and more"
    assert redact("--db 'postgresql://u:p@h/d'") == "--db 'postgresql://u:***@h/d'"
    for same in ("sqlite:///a.db", "postgresql://u@h/d", "http://127.0.0.1:8080/v1",
                 "user@host:22"):
        assert redact(same) == same


def test_odd_passwords_and_query_passwords_are_masked(tmp_path, pg_url, monkeypatch):
    """The audit's leaks: a password holding a space or quotes (masked only up to the
    space), a libpq ?password= parameter, a webhook's user:password."""
    from orchestrator.redact import redact_argv, redact_url

    for pw in ("PL ANTED", "PL'AN\"TED", "p@ss:w#rd"):
        url = pg_url.replace("postgres@", f"postgres:{pw}@")
        assert pw not in redact_url(url) and redact_url(url).count("***") == 1
        assert pw not in redact_argv(["specfleet", "sweep", "--db", url])
    q = pg_url.replace("127.0.0.1:5432", "127.0.0.1:1") + "?password=PLANTEDQ"
    r = CliRunner().invoke(main, ["sweeps", "list", "--db", q])
    assert r.exit_code == 1 and "PLANTEDQ" not in r.output and "password=***" in r.output
    home = tmp_path / "h"
    monkeypatch.setenv("SPECFLEET_HOME", str(home))
    from orchestrator.store import open_store

    open_store(f"sqlite:///{tmp_path / 'empty.db'}").record_failed_start(
        "planted", "planted", trigger="manual")  # a week with one (failed) sweep to review
    r = CliRunner().invoke(main, ["review", "--db", f"sqlite:///{tmp_path / 'empty.db'}",
                                  "--out", str(tmp_path / "r.html"), "--notify-timeout", "3",
                                  "--notify", "http://bot:HOOKSECRET@127.0.0.1:1/hook"])
    assert "could not notify http://bot:***@127.0.0.1:1/hook" in r.output, r.output
    assert "HOOKSECRET" not in r.output
