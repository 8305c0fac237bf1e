"""Bad input through the CLI: the message a user sees, and the store left intact."""

from click.testing import CliRunner
from sqlalchemy import func, select

from orchestrator.cli import main
from orchestrator.store import open_store
from orchestrator.store.models import Event
from tests.locks import make_lock, plan_text

JOB = {"schema": 1, "models": {"target": {}, "draft": {}}}


def _seeded_store(url: str) -> int:
    store = open_store(url)
    store.create_sweep("earlier", JOB, None)
    return store.ingest("earlier", "n1", [{"schema": 1, "seq": i, "type": "x", "ts": 1.0}
                                          for i in range(1, 6)])


def _events(url: str) -> int:
    with open_store(url).engine.connect() as c:
        return c.scalar(select(func.count()).select_from(Event))


def test_missing_inventory(tmp_path, model_pair):
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert _seeded_store(url) == 5
    lock = make_lock(tmp_path, model_pair)
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(tmp_path / "none.yml"),
                                  "--db", url])
    assert r.exit_code == 1
    assert r.output.strip() == f"Error: {tmp_path / 'none.yml'}: file not found"
    assert _events(url) == 5


def test_malformed_inventory_names_file_and_line(tmp_path, model_pair):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _seeded_store(url)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    mac1:\n      ansible_host: 10.0.0.1\n"
                   "     ansible_port: 22\n")
    lock = make_lock(tmp_path, model_pair)
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db", url])
    assert r.exit_code == 1
    assert r.output.startswith(f"Error: {inv}:5: invalid YAML")
    assert _events(url) == 5


def test_plan_whose_model_folder_is_missing(tmp_path, model_pair):
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(tmp_path / "nowhere"))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 1
    assert f"Error: {plan}:7: models.target: {tmp_path / 'nowhere' / 'target'} is not a " \
        "folder" in r.output


def test_malformed_prompt_file_names_the_line(tmp_path, model_pair):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"name": "x", "prompt": "hi",\n')
    plan = tmp_path / "plan.yml"
    plan.write_text(plan_text(model_pair, use=("mine.jsonl",)))
    r = CliRunner().invoke(main, ["plan", "lock", str(plan)])
    assert r.exit_code == 1
    assert f"Error: {prompts}:1: invalid JSON" in r.output


def test_sweep_needs_exactly_one_of_lock_attach_resume(tmp_path):
    r = CliRunner().invoke(main, ["sweep", "--db", f"sqlite:///{tmp_path / 's.db'}"])
    assert r.exit_code == 2
    assert "give a LOCK, or one of --attach, --resume, --stop SWEEP_ID" in r.output


def test_a_week_that_is_not_an_iso_week_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _seeded_store(url)
    for week in ("2026-48", "2026-W60", "W48", "2026-W00"):
        r = CliRunner().invoke(main, ["review", "--week", week, "--db", url, "--out",
                                      str(tmp_path / "r.html")])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
        assert f"Error: --week: '{week}' is not an ISO week of a real year, like " in r.output
        assert "Traceback" not in r.output
    assert _events(url) == 5


def test_a_downgrade_to_no_such_revision_names_the_real_ones(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _seeded_store(url)
    before = open_store(url).current_revision()
    r = CliRunner().invoke(main, ["db", "downgrade", "9999", "--db", url])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert "Error: cannot downgrade to '9999': Can't locate revision identified by '9999'; " \
           "revisions: base, 0001, " in r.output
    assert open_store(url, migrate=False).current_revision() == before and _events(url) == 5


def test_store_urls_that_cannot_work_say_how_to_write_one(tmp_path):
    cases = {
        "mysql://u@h/db": "Error: --db: 'mysql' stores are not supported; use sqlite:///PATH "
                          "or postgresql+psycopg://USER@HOST:PORT/DB",
        str(tmp_path / "s.db"): f"Error: --db '{tmp_path / 's.db'}' is not a store URL; for a "
                                f"SQLite file write sqlite:///{tmp_path / 's.db'}",
        f"sqlite:///{tmp_path}": f"Error: --db sqlite:///{tmp_path}: that is a folder; name a "
                                 f"file in it, e.g. sqlite:///{tmp_path}/specfleet.db",
        "sqlite:///": "Error: --db sqlite:///: names no file; e.g. sqlite:///specfleet.db",
    }
    for url, message in cases.items():
        r = CliRunner().invoke(main, ["sweeps", "list", "--db", url])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (url, r.output)
        assert message in r.output, (url, r.output)
    assert not (tmp_path / "s.db").exists()  # nothing was created on the way


def test_a_mistyped_store_is_an_error_for_commands_that_only_read(tmp_path):
    """`--db sqlite:///no/such/dir/x.db` made a new empty store and answered "no sweeps";
    a command that only reads now says there is no store there, and creates nothing."""
    from click.testing import CliRunner

    from orchestrator.cli import main

    wrong = tmp_path / "no" / "such" / "dir" / "x.db"
    for args in (["sweeps", "list"], ["runs", "list"], ["db", "current"],
                 ["review", "--out", str(tmp_path / "r.html")], ["sweep", "--attach",
                                                                 "0123456789ab"]):
        r = CliRunner().invoke(main, [*args, "--db", f"sqlite:///{wrong}"])
        assert r.exit_code != 0, (args, r.output)
        assert f"no store at {wrong}: nothing has been stored there" in r.output, r.output
        assert not wrong.exists() and not wrong.parent.exists()


def test_a_store_in_a_missing_folder_is_refused_until_db_upgrade_creates_it(tmp_path,
                                                                            model_pair):
    """A sweep given `--db sqlite:///no/such/dir/x.db` once made the folders and a new empty
    store there; now the folder must exist, and `db upgrade` (as the error prints it) is
    the explicit way to start a store in a new one."""
    import shlex

    from click.testing import CliRunner

    from orchestrator.cli import main
    from tests.locks import make_lock

    lock = make_lock(tmp_path, model_pair)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    local:\n      ansible_connection: local\n"
                   f"      specfleet_root: {tmp_path / 'node'}\n")
    wrong = tmp_path / "no" / "such" / "dir" / "x.db"
    r = CliRunner().invoke(main, ["sweep", str(lock), "-i", str(inv), "--db",
                                  f"sqlite:///{wrong}"])
    assert r.exit_code == 1, r.output
    assert f"no folder {wrong.parent} for the store {wrong}: check --db" in r.output
    assert not (tmp_path / "no").exists() and not (tmp_path / "node").exists()
    fix = r.output.split("To start a store there: `")[1].split("`")[0]
    assert fix == f"specfleet db upgrade --db sqlite:///{wrong}"
    up = CliRunner().invoke(main, shlex.split(fix)[1:])
    assert up.exit_code == 0 and up.output.startswith("store at revision "), up.output
    assert wrong.is_file()
    cur = CliRunner().invoke(main, ["db", "current", "--db", f"sqlite:///{wrong}"])
    assert cur.exit_code == 0, cur.output
