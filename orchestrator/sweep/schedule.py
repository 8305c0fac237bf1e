"""Nightly sweeps: launchd on macOS, a systemd user timer on Linux, a cron line otherwise.

The scheduled command is ``specfleet nightly LOCK``. Files are rendered from
``orchestrator/templates/schedule/``; ``install`` writes them (and enables them unless told not
to), ``list`` finds them again, ``remove`` disables and deletes them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from ..errors import ConfigError, SpecfleetError

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "schedule"
PREFIX = "specfleet-nightly-"
SECRETS = Path("~/.config/specfleet").expanduser()  # PGPASSFILEs of installed entries
CRON_FILE = "specfleet.cron"  # with --dest, cron lines go to this file instead of crontab


def _systemd_escape(value: str) -> str:
    """A literal value in a unit file: ``%`` starts a specifier (systemd.unit(5))."""
    return str(value).replace("%", "%%")


def _systemd_quote(value: str) -> str:
    return '"' + _systemd_escape(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_arg(value: str) -> str:
    """One ExecStart= argument: quoted, and ``$`` doubled, since systemd expands ``$VAR``
    and ``${VAR}`` there (systemd.service(5): "$$" is a literal dollar sign)."""
    return _systemd_quote(str(value).replace("$", "$$"))


def cron_escape(command: str) -> str:
    """cron turns an unescaped ``%`` in the command into a newline (crontab(5)); ``\\%``
    reaches the shell as ``%``."""
    return command.replace("%", "\\%")


def cron_unescape(command: str) -> str:
    """What cron hands to the shell for a command written with ``cron_escape``."""
    return command.replace("\\%", "%")


def check_value(value: str, what: str) -> str:
    """Refuse control characters: a newline in a unit file or crontab starts a new directive."""
    bad = next((c for c in str(value) if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ConfigError(f"{what} contains the control character {bad!r}; a schedule entry "
                          "cannot hold it safely (rename it)")
    return str(value)


def environment() -> Environment:
    # XML (plist) is escaped; unit files and cron lines are quoted by their own filters.
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined,
                      autoescape=select_autoescape(["plist.j2"]), keep_trailing_newline=True)
    env.filters.update(systemd_escape=_systemd_escape, systemd_quote=_systemd_quote,
                       systemd_argv=lambda argv: " ".join(_systemd_arg(a) for a in argv),
                       shell_quote=shlex.quote, cron_escape=cron_escape)
    return env


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str
    path: Path
    at: str
    lock: str


def default_kind() -> str:
    if sys.platform == "darwin":
        return "launchd"
    ok = shutil.which("systemctl") and subprocess.run(
        ["systemctl", "--user", "is-system-running"], capture_output=True).returncode in (0, 1)
    return "systemd" if ok else "cron"


def default_dest(kind: str, system: bool = False) -> Path:
    if kind == "launchd" and system:
        return Path("/Library/LaunchDaemons")
    return {"launchd": Path("~/Library/LaunchAgents"),
            "systemd": Path("~/.config/systemd/user")}.get(kind, Path("~")).expanduser()


def launchd_domain(system: bool) -> str:
    """``user/UID`` exists without a GUI login (``gui/UID`` does not: launchctl's error 125
    on a headless or SSH-managed Mac); ``system`` for a LaunchDaemon."""
    return "system" if system else f"user/{os.getuid()}"


def store_for_schedule(db_url: str | None, secrets: Path, name: str) -> tuple[str, dict]:
    """The store URL a scheduled run writes to, resolved now, and the environment it needs.

    Refuses the implicit default: a nightly without --db would write a different SQLite
    file (relative to the lock's folder) than the manual runs. A relative SQLite path is
    made absolute; a password leaves the URL for a 0600 PGPASSFILE (libpq reads it), so
    it is never in the plist or unit."""
    from ..store.urls import URL, make_url

    if not db_url:
        raise ConfigError("schedule install: name the store the nightly writes to (--db, "
                          "SPECFLEET_DB, or db in specfleet.toml); without one it would write "
                          "to a sqlite file of its own, not the one your manual runs use")
    url = make_url(db_url)
    if any(k.lower() in ("password", "passwd", "pwd") for k in url.query):
        raise ConfigError("schedule install: the store URL carries its password as a query "
                          "parameter, which would be written into the entry; put it in the "
                          "user:password@ part instead (it then goes to a 0600 PGPASSFILE)")
    env: dict[str, str] = {}
    if url.drivername.startswith("sqlite") and url.database in (None, "", ":memory:"):
        raise ConfigError(f"schedule install: the store {db_url!r} is in memory: the "
                          "nightly's results would be gone when it exits; name a file "
                          "(sqlite:////abs/path.db) or a PostgreSQL URL")
    if url.drivername.startswith("sqlite") and url.database:
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    if url.password is not None:
        if not url.drivername.startswith("postgresql"):
            raise ConfigError("schedule install: a password in the store URL is kept out of "
                              "the entry only for PostgreSQL (a PGPASSFILE); use a URL "
                              "without one")
        secrets.mkdir(parents=True, exist_ok=True)
        pgpass = secrets / f"{name}.pgpass"
        # libpq matches a line's host against the host parameter (a socket folder given
        # as ?host=/path), else "localhost" (libpq-pgpass)
        q_host, q_port = url.query.get("host"), url.query.get("port")
        esc = [str(v or "*").replace("\\", "\\\\").replace(":", "\\:") for v in
               (url.host or (q_host if isinstance(q_host, str) else None) or "localhost",
                url.port or (q_port if isinstance(q_port, str) else None) or 5432,
                url.database, url.username,
                url.password)]
        fd = os.open(pgpass, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(":".join(esc) + "\n")
        os.chmod(pgpass, 0o600)
        env["PGPASSFILE"] = str(pgpass.resolve())
        url = URL.create(url.drivername, url.username, None, url.host, url.port, url.database,
                         url.query)  # set(password=None) would keep it
    return url.render_as_string(hide_password=False), env


def parse_at(at: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", at)
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise ConfigError(f"--at {at!r}: expected HH:MM in 24-hour time, e.g. 02:00")
    return int(m.group(1)), int(m.group(2))


def render(kind: str, lock_path: Path, doc: dict, at: str, *, db_url: str | None,
           inventory: list[Path] | None, log: Path,
           options: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
           system: bool = False) -> dict[str, str]:
    """File name → content for one nightly schedule. ``options`` are passed to
    ``specfleet nightly`` as given (the ones the manual sweep needed)."""
    hour, minute = parse_at(at)
    name = PREFIX + doc["lock_id"][:12]
    exe = shutil.which("specfleet") or str(Path(sys.executable).with_name("specfleet"))
    argv = [exe, "nightly", str(lock_path.resolve())]
    for inv in inventory or []:
        argv += ["-i", str(inv.resolve())]
    argv += list(options)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if db_url:
        env["SPECFLEET_DB"] = db_url
    env.update(extra_env or {})
    for i, a in enumerate(argv):
        check_value(a, f"argument {i} of the nightly command ({a[:40]!r})")
    for k, v in env.items():
        check_value(v, f"environment variable {k}")
    for what, v in (("the plan name", doc["name"]), ("the log path", str(log)),
                    ("the lock's folder", str(lock_path.resolve().parent))):
        check_value(v, what)
    ctx = {"name": name, "label": "com.specfleet.nightly." + doc["lock_id"][:12],
           "plan_name": doc["name"], "lock_id": doc["lock_id"], "argv": argv, "env": env,
           "hour": hour, "minute": minute, "at": at, "workdir": str(lock_path.resolve().parent),
           "log": str(log), "env_words": "".join(f"{k}={shlex.quote(v)} "
                                                  for k, v in env.items()),
           "system": system, "user": _user()}
    j = environment()
    if kind == "launchd":
        return {f"{ctx['label']}.plist": j.get_template("launchd.plist.j2").render(**ctx)}
    if kind == "systemd":
        return {f"{name}.service": j.get_template("systemd.service.j2").render(**ctx),
                f"{name}.timer": j.get_template("systemd.timer.j2").render(**ctx)}
    if kind == "cron":
        return {CRON_FILE: j.get_template("cron.j2").render(**ctx)}
    raise ConfigError(f"--kind {kind!r}: choose launchd, systemd or cron")


def _user() -> str:
    import getpass

    return getpass.getuser()


def nightly_options(doc: dict, lock_path: Path, inventory: list[Path], *, limit: str | None,
                    vault_password_file: Path | None = None, provision: bool | None,
                    known_hosts: Path | None, ssh_config: Path | None,
                    connect_timeout: float | None,
                    choose_python: bool = True) -> tuple[tuple[str, ...], list[str]]:
    """The ``specfleet nightly`` options an entry carries, checked now rather than at 2 am:
    the inventory and pattern select hosts, and a lock without environments is swept with
    ``--no-provision``. Returns (options, notes for the user)."""
    from ..fleet.inventory import load_inventory, with_labels

    opts: list[str] = []
    notes: list[str] = []
    if not doc["platforms"]:
        if provision:
            raise ConfigError("--provision: this lock manages no environments (its plan sets "
                              "environment.platforms: []); the nightly must run with "
                              "--no-provision")
        if provision is None:
            notes.append("this lock manages no environments: the nightly runs with "
                         "--no-provision (nodes bring specfleet_python)")
        provision = False
    if provision is False:
        opts.append("--no-provision")
    if limit is not None:
        opts += ["--limit", limit]
    pattern = limit if limit is not None else doc["nodes"].get("limit")
    if inventory:
        # an inventory a specfleet.toml named stays as restricted in the entry: written as
        # -i there, it would otherwise be trusted to choose interpreters at 2 am
        hosts = load_inventory(inventory, vault_password_file,
                               choose_python=choose_python).select(pattern)
        hosts = with_labels(hosts, doc["nodes"].get("labels") or [],
                            f"{lock_path}: nodes.labels")
        notes.append(f"the nightly sweeps {len(hosts)} host(s): "
                     + ", ".join(h.name for h in hosts[:8]) + (" …" if len(hosts) > 8 else ""))
    for flag, path in (("--known-hosts", known_hosts), ("--ssh-config", ssh_config),
                       ("--vault-password-file", vault_password_file)):
        if path is not None:
            if not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")
            opts += [flag, str(path.resolve())]
    if connect_timeout is not None:
        opts += ["--connect-timeout", repr(float(connect_timeout))]
    return tuple(opts), notes


def _run(cmd: list[str], input: str | None = None) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, input=input)
    if p.returncode != 0:
        raise SpecfleetError(f"`{' '.join(cmd)}` failed: {p.stderr.strip()[-300:]}")


def launchd_load(path: Path, system: bool = False) -> list[list[str]]:
    """The launchctl commands that (re)load an entry: bootout first (a re-install of a loaded
    label fails otherwise; its failure when nothing is loaded is expected), then bootstrap."""
    domain = launchd_domain(system)
    return [["launchctl", "bootout", domain, str(path)],
            ["launchctl", "bootstrap", domain, str(path)]]


def install(kind: str, files: dict[str, str], dest: Path | None, enable: bool,
            system: bool = False) -> list[Path]:
    written = []
    if kind == "cron" and dest is None:  # the user's crontab, our line replaced by name
        name = files[CRON_FILE].rsplit("# ", 1)[1].strip()
        current = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
        kept = [ln for ln in current.splitlines() if not ln.endswith(f"# {name}")]
        _run(["crontab", "-"], "\n".join([*kept, files[CRON_FILE].rstrip()]) + "\n")
        return [Path("crontab")]
    dest = dest or default_dest(kind, system)
    dest.mkdir(parents=True, exist_ok=True)
    for fname, text in files.items():
        p = dest / fname
        if kind == "cron" and p.exists():  # one file, many schedules: replace ours only
            name = text.rsplit("# ", 1)[1].strip()
            kept = [ln for ln in p.read_text().splitlines() if not ln.endswith(f"# {name}")]
            text = "\n".join([*kept, text.rstrip()]) + "\n"
        # 0600: the entry names the store (its password, if any, is in a PGPASSFILE);
        # a LaunchDaemon must be root-owned and not writable by others: 0644
        mode = 0o644 if kind == "launchd" and system else 0o600
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(p, mode)  # an existing file keeps its mode through O_TRUNC
        written.append(p)
    if enable:
        if kind == "launchd":
            out, load = launchd_load(written[0], system)
            subprocess.run(out, capture_output=True)  # not loaded yet: fails, as expected
            _run(load)
        elif kind == "systemd":
            timer = next(p.name for p in written if p.suffix == ".timer")
            _run(["systemctl", "--user", "daemon-reload"])
            _run(["systemctl", "--user", "enable", "--now", timer])
    return written


def entries(dest: Path | None = None) -> list[Entry]:
    found = []
    for kind, system in (("launchd", False), ("launchd", True), ("systemd", False)):
        if system and dest is not None:
            continue
        folder = dest or default_dest(kind, system)
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            if kind == "launchd" and p.name.startswith("com.specfleet.nightly.") and \
                    p.suffix == ".plist":
                import plistlib

                d = plistlib.loads(p.read_bytes())
                at = f"{d['StartCalendarInterval']['Hour']:02d}:" \
                     f"{d['StartCalendarInterval']['Minute']:02d}"
                found.append(Entry(PREFIX + p.stem.rsplit(".", 1)[-1], kind, p, at,
                                   d["ProgramArguments"][2]))
            elif kind == "systemd" and p.name.startswith(PREFIX) and p.suffix == ".timer":
                cal = re.search(r"OnCalendar=\*-\*-\* (\d\d:\d\d)", p.read_text())
                svc = p.with_suffix(".service").read_text() if p.with_suffix(
                    ".service").exists() else ""
                hit = re.search(r'ExecStart="[^"]*" "nightly" "([^"]+)"', svc)
                found.append(Entry(p.stem, kind, p, cal.group(1) if cal else "?",
                                   hit.group(1) if hit else "?"))
    cron_src = (dest / CRON_FILE).read_text() if dest and (dest / CRON_FILE).exists() else (
        subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
        if dest is None and shutil.which("crontab") else "")
    for line in cron_src.splitlines():
        m = re.match(r"(\d+) (\d+) \* \* \* (.*) # (" + PREFIX + r"\w+)$", line)
        if m:
            words = shlex.split(cron_unescape(m.group(3)))
            lock = words[words.index("nightly") + 1] if "nightly" in words else "?"
            found.append(Entry(m.group(4), "cron", dest / CRON_FILE if dest else Path("crontab"),
                               f"{int(m.group(2)):02d}:{int(m.group(1)):02d}", lock))
    return found


def remove(name: str, dest: Path | None = None, disable: bool = True) -> list[Path]:
    hits = [e for e in entries(dest) if e.name == name]
    if not hits:
        raise SpecfleetError(f"no nightly schedule named {name!r} (`specfleet schedule list`)")
    removed = []
    for e in hits:
        if e.kind == "launchd":
            if disable:
                system = e.path.parent == default_dest("launchd", True)
                _run(["launchctl", "bootout", launchd_domain(system), str(e.path)])
            e.path.unlink()
            removed.append(e.path)
        elif e.kind == "systemd":
            if disable:
                _run(["systemctl", "--user", "disable", "--now", e.path.name])
            for p in (e.path, e.path.with_suffix(".service")):
                p.unlink(missing_ok=True)
                removed.append(p)
        else:
            text = e.path.read_text() if e.path.name == CRON_FILE else subprocess.run(
                ["crontab", "-l"], capture_output=True, text=True).stdout
            kept = "\n".join(ln for ln in text.splitlines() if not ln.endswith(f"# {name}"))
            if e.path.name == CRON_FILE:
                e.path.write_text(kept + ("\n" if kept else ""))
            else:
                _run(["crontab", "-"], kept + "\n")
            removed.append(e.path)
    secret = (dest or SECRETS) / f"{name}.pgpass"  # the password file install wrote, if any
    if secret.exists():
        secret.unlink()
        removed.append(secret)
    return removed


class NightlyGuard:
    """One nightly per plan at a time on this controller: the agent's flock-based lock
    (freed by the kernel if we die), worded for nightlies."""

    def __init__(self, lock_id: str):
        from agent.lock import NodeLock

        from ..fleet.blobs import CONTROLLER_CACHE

        self.lock = NodeLock(CONTROLLER_CACHE / f"nightly-{lock_id[:16]}.lock", lock_id)

    def __enter__(self):
        from agent.errors import NodeBusy

        try:
            self.lock.__enter__()
        except NodeBusy as e:
            h = getattr(e, "holder", None)
            who = f"pid {h['pid']} since {h['started']}" if h else "another process"
            raise SpecfleetError(f"a nightly of this plan is still running ({who}); "
                                 "not starting another") from None
        return self

    def __exit__(self, *exc):
        self.lock.__exit__(*exc)
