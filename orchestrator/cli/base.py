"""The `specfleet` group, shared options and helpers; commands live beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..errors import SpecfleetError
from ..redact import redact, redact_argv

DEFAULT_INVENTORY = Path(__file__).resolve().parents[1] / "inventory" / "local.yml"

db_option = click.option("--db", "db_url", envvar="SPECFLEET_DB", default=None,
                         help="Store URL (SQLAlchemy), e.g. sqlite:///specfleet.db or "
                              "postgresql+psycopg://user@host/db. Env: SPECFLEET_DB. "
                              "Default: sqlite:///specfleet.db")


class Finite(click.FloatRange):
    """A number in range that is a real number: click's FloatRange lets nan through (every
    comparison with nan is false), and a timeout of nan seconds never ends."""

    def convert(self, value, param, ctx):
        import math

        v = super().convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return v


class _Group(click.Group):
    """Turns library errors into one-line messages at the CLI edge."""

    def main(self, args=None, *a, **kw):
        from ..fleet import signals

        if args is not None:  # called in-process (tests, CliRunner): an ordinary exit
            return super().main(args, *a, **kw)
        signals.WHOLE_PROCESS = True
        try:
            return super().main(args, *a, **kw)
        except signals.DetachExit as e:
            # the detach is said and everything stored: the interpreter's teardown took
            # 1.4-2.4 s on a loaded 2-core host, past the 2 s a detach may take
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecfleetError as e:
            raise click.ClickException(redact(str(e))) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own: usage errors, --help, Ctrl-C
        except Exception as e:
            # a store failure outside the paths that explain it; the store's errors are only
            # looked up when a command loaded sqlalchemy (importing it costs every command
            # ~0.2 s)
            failure = None
            if "sqlalchemy.exc" in sys.modules:
                from ..store.errors import StoreFull
                from ..store.errors import failure as store_failure

                failure = store_failure(e)
            if failure is None:
                raise click.ClickException(_crash(e)) from None
            msg = redact(failure.driver_message)
            if isinstance(failure, StoreFull):
                raise click.ClickException(
                    f"the store is out of disk space ({msg}); nothing stored so far is lost: "
                    "free space and run the command again (a sweep already started: "
                    "`specfleet sweep --attach SWEEP_ID`)") from None
            raise click.ClickException(f"store error: {msg}") from None


def _crash(e: Exception) -> str:
    """A bug, not the user's mistake: one line that says so, the traceback in a file (or on
    stderr with SPECFLEET_DEBUG=1) for the bug report."""
    import os
    import tempfile
    import time
    import traceback

    text = redact("".join(traceback.format_exception(e)))
    if os.environ.get("SPECFLEET_DEBUG"):
        sys.stderr.write(text)
        where = "above"
    else:
        # a folder of its own, 0700, and files 0600: a log holds the command line and
        # paths (passwords masked) and is nobody else's to read
        folder = Path(os.environ.get("SPECFLEET_HOME", Path.home() / ".specfleet")) / "crash"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.chmod(0o700)
            path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(redact_argv(sys.argv) + "\n" + text)
        except OSError:
            fd, name = tempfile.mkstemp(prefix="specfleet-crash-", suffix=".log")
            os.write(fd, text.encode())
            os.close(fd)
            path = Path(name)
        where = f"in {path}"
    said = redact(str(e))[:300]
    return (f"internal error: {type(e).__name__}: {said}. This is a bug in specfleet, "
            f"not in what you typed; the traceback is {where} (please attach it to a bug "
            "report). Stored results are not affected.")


@click.group(cls=_Group)
@click.version_option(package_name="specfleet")
@click.pass_context
def main(ctx):
    """specfleet: benchmark speculative decoding across a fleet of Macs running mlx-lm.

    Typical flow: `specfleet init lab/` (an inventory and a plan for the demo pair), then
    `specfleet plan lock lab/plan.yml`, `specfleet sweep lab/plan.lock.json -i
    lab/inventory/`, and `specfleet review --out review/`.

    A `specfleet.toml` in this folder or a parent sets defaults for --db and -i (`db =
    "sqlite:///runs.db"`, `inventory = ["lab/inventory/"]`); flags and SPECFLEET_DB win.
    """
    from .. import project_config

    found = project_config.find()
    if found is not None:
        try:
            cfg = project_config.load(found)
        except SpecfleetError as e:
            raise click.ClickException(str(e)) from None
        ctx.default_map = project_config.defaults(cfg, main)
        used = [k for k, v in (("db", cfg.db), ("inventory", cfg.inventory)) if v]
        # announced on stderr: a file found by walking up must never choose silently
        click.echo(f"specfleet: settings from {found}" +
                   (f" ({', '.join(used)})" if used else " (none set)"), err=True)



def inventory_option(fn):
    """-i (repeatable, merged as Ansible merges several -i) and --vault-password-file."""
    fn = click.option("--vault-password-file", type=click.Path(dir_okay=False, path_type=Path),
                      default=None, help="File holding the password for !vault values "
                      "(default: $ANSIBLE_VAULT_PASSWORD_FILE); an executable is run.")(fn)
    return click.option(
        "-i", "--inventory", "inventory_path", type=click.Path(path_type=Path), multiple=True,
        default=(DEFAULT_INVENTORY,), show_default=True,
        help="Inventory file or folder (YAML, INI or `ansible-inventory --list` JSON); "
             "repeat to merge several.")(fn)
limit_option = click.option(
    "--limit", default=None,
    help="Ansible host pattern: 'lab', 'a:b', 'lab:!mac3', 'lab:&studio', 'mac-*', '@retry-file'.")


def fleet_options(fn):
    """Inventory, --limit, SSH trust and fan-out options shared by every fleet command."""
    opts = [
        inventory_option, limit_option,
        click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
                     help="known_hosts file (default ~/.ssh/known_hosts); keys are checked "
                          "strictly."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record keys of hosts not yet in known_hosts (a changed "
                          "key is still refused)."),
        click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
                     help="OpenSSH client config (default ~/.ssh/config when present)."),
        click.option("--concurrency", type=click.IntRange(1, 1024), default=64,
                     show_default=True, help="Hosts worked on at once (1 to 1024)."),
        click.option("--connect-timeout", type=Finite(min=0.1), default=10.0,
                     show_default=True, help="Seconds to wait for each node's SSH connection."),
        click.option("--failed-hosts-file", type=click.Path(dir_okay=False, path_type=Path),
                     default=Path("specfleet.retry"), show_default=True,
                     callback=writable_file,
                     help="Where the hosts that were not ok are written, for --limit @FILE."),
        click.option("--json", "as_json", is_flag=True, help="Print results as JSON."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def writable_file(ctx, param, value: Path | None) -> Path | None:
    """Checked before any work: a file the command will write at its end."""
    if value is None:
        return value
    if str(value).strip() == "" or value.is_dir():
        raise click.BadParameter(f"{str(value)!r} is not a file name; give a file, e.g. "
                                 "specfleet.retry")
    if not value.resolve().parent.is_dir():
        raise click.BadParameter(f"{value}: folder {value.resolve().parent} does not exist")
    return value


def ssh_options(kw: dict):
    from ..fleet.transport import SSHOptions

    return SSHOptions(known_hosts=kw.pop("known_hosts"),
                      accept_new_host_keys=kw.pop("accept_new_host_keys"),
                      ssh_config=kw.pop("ssh_config"), concurrency=kw.pop("concurrency"),
                      connect_timeout=kw.pop("connect_timeout"))


def from_settings_file(param: str) -> bool:
    """Whether this command's ``param`` came from a specfleet.toml (click's default map)."""
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(param) == ParameterSource.DEFAULT_MAP


def inventory_from(kw: dict):
    from ..fleet.inventory import load_inventory

    paths = list(kw.pop("inventory_path"))
    # an inventory a specfleet.toml named may not choose what runs: only -i on the
    # command line (or the built-in default) may set interpreters
    return (load_inventory(paths, kw.pop("vault_password_file"),
                           choose_python=not from_settings_file("inventory_path")),
            ",".join(map(str, paths)))


def hosts_from(kw: dict):
    inv, where = inventory_from(kw)
    return inv.select(kw.pop("limit")), where


def hosts_of_plan(doc: dict, lock_path: Path, kw: dict):
    """hosts_from, with the plan's ``nodes.limit`` when no --limit was given; an error then
    names the plan's setting, not a --limit the user never typed."""
    from ..errors import ConfigError

    from_plan = kw["limit"] is None and doc["nodes"].get("limit")
    if from_plan:
        kw["limit"] = doc["nodes"]["limit"]
    try:
        return hosts_from(kw)
    except ConfigError as e:
        if not from_plan or "--limit" not in str(e):
            raise
        raise ConfigError(str(e).replace("--limit", f"{lock_path}: the plan's nodes.limit "
                                         f"{from_plan!r}", 1)
                          + "; pass --limit to choose hosts of this inventory") from None


def plan_hosts(doc: dict, lock_path: Path, kw: dict):
    """The hosts a lock's plan sweeps: its ``nodes.limit`` unless --limit was given, then
    only those carrying all of its ``nodes.labels``."""
    from ..fleet.inventory import with_labels

    hosts, inventory_path = hosts_of_plan(doc, lock_path, kw)
    return with_labels(hosts, doc["nodes"].get("labels") or [],
                       f"{lock_path}: nodes.labels"), inventory_path


def report_outcomes(outcomes, retry_file: Path, as_json: bool, extra: dict | None = None,
            describe=None) -> None:
    """Per-host lines (or JSON), a summary, the retry file; exit 1 if any host was not ok."""
    from ..fleet.fanout import not_ok, summary_line, write_retry_file

    written = write_retry_file(outcomes, retry_file)
    if as_json:
        click.echo(json.dumps({**(extra or {}), "summary": summary_line(outcomes),
                               "outcomes": [o.as_dict() for o in outcomes],
                               "retry_file": str(written) if written else None},
                              indent=2, default=str))
    else:
        for o in outcomes:
            text = describe(o) if describe and o.status == "ok" else (o.detail or "")
            click.echo(f"{o.host:<20} {o.status:<12} {text}")
            if o.stderr_tail:
                for line in o.stderr_tail.splitlines():
                    click.echo(f"{'':<20} | {line}")
        click.echo(summary_line(outcomes))
        if written:
            click.echo(f"retry the hosts that were not ok with --limit @{written}")
    if not_ok(outcomes):
        sys.exit(1)



class TransferProgress:
    """Bytes and rate per host on stderr, at most twice a second per host."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}
        self.t0: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def for_host(self, host: str):
        import time

        self.t0[host] = time.monotonic()
        self.sent[host] = 0

        def cb(n: int) -> None:
            now = time.monotonic()
            self.sent[host] += n
            if now - self.last.get(host, 0) >= 0.5:
                self.last[host] = now
                rate = self.sent[host] / max(now - self.t0[host], 1e-6)
                click.echo(f"[{host}] sent {self.sent[host] / 2**20:8.1f} MiB "
                           f"({rate / 2**20:6.1f} MiB/s)", err=True)
        return cb


def lock_from(path: Path, log) -> tuple[dict, Path]:
    """A verified lock from a lock file, or from a plan (locked on the fly)."""
    from ..sweep.lock import load_lock, verify_lock, write_lock
    from ..sweep.plan import load_plan

    if path.suffix == ".json":
        doc = load_lock(path)
        verify_lock(doc, path)
        return doc, path
    out = write_lock(load_plan(path), log)
    log(f"locked {path} → {out}")
    return load_lock(out), out

