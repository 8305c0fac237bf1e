"""Plans and locks; nightly schedules."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .base import (
    Finite,
    db_option,
    from_settings_file,
    main,
)


@main.group()
def plan():
    """Plans (YAML) and their locks: exact wheels, weight fingerprints, prompt hashes."""


@plan.command("lock")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the lock's summary as JSON.")
def plan_lock(plan_path, as_json):
    """Write PLAN.lock.json next to PLAN. Sweeps run only from a lock.

    \b
    Example:
      specfleet plan lock lab/plan.yml
    """
    from agent.protocol import model_roles

    from ..sweep.lock import load_lock, write_lock
    from ..sweep.plan import load_plan

    out = write_lock(load_plan(plan_path), lambda m: click.echo(m, err=True))
    doc = load_lock(out)
    summary = {"lock": str(out), "lock_id": doc["lock_id"],
               "environments": {d: e["env_id"] for d, e in doc["platforms"].items()},
               "models": {r: doc["models"][r]["fingerprint"] for r in model_roles(doc["models"])},
               "lineup": doc["models"].get("lineup") or [["target", "draft"]],
               "prompts": doc["prompts"]}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"wrote {out}")
        for d, e in summary["environments"].items():
            click.echo(f"  env {e}  {d}")
        for r, fp in summary["models"].items():
            tier = doc["models"][r].get("tier", {}).get("tier")
            click.echo(f"  {r:<9} {fp}  {tier or ''}".rstrip())
        if len(summary["lineup"]) > 1:
            click.echo(f"  lineup: {len(summary['lineup'])} pairs ("
                       + ", ".join(f"{t}+{d}" for t, d in summary["lineup"]) + ")")
        click.echo(f"  {len(doc['prompts'])} prompts, {len(doc['job']['workloads'])} workloads")


@plan.command("check")
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
def plan_check(lock_path):
    """Verify that LOCK still matches its plan, weights and prompts.

    \b
    Example:
      specfleet plan check lab/plan.lock.json
    """
    from ..sweep.lock import load_lock, verify_lock

    verify_lock(load_lock(lock_path), lock_path)
    click.echo(f"{lock_path}: matches its plan, weights and prompts")


@main.group()
def schedule():
    """Nightly sweeps: launchd (macOS), systemd user timer (Linux), cron as fallback."""


@schedule.command("install")
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--at", "at", default="02:00", show_default=True, help="Daily time, HH:MM.")
@click.option("--kind", type=click.Choice(["auto", "launchd", "systemd", "cron"]),
              default="auto", show_default=True,
              help="Scheduler: launchd (macOS), a systemd user timer, or cron; auto picks "
                   "the one this machine runs.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the files here to look at (default: the scheduler's own folder / "
                   "crontab, and the entry is loaded).")
@click.option("--enable/--no-enable", default=None,
              help="Load the schedule into launchd / systemd after writing it (default: "
                   "yes, unless --dest is given).")
@click.option("-i", "--inventory", "inventory_path", type=click.Path(path_type=Path),
              multiple=True, help="Inventory the nightly run uses (checked now; repeatable).")
@click.option("--vault-password-file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Vault password file the nightly reads the inventory with.")
@click.option("--limit", default=None,
              help="Host pattern the nightly sweeps (default: the plan's nodes.limit).")
@click.option("--provision/--no-provision", default=None,
              help="As for `sweep`. Default: provision, or --no-provision when the lock "
                   "manages no environments (environment.platforms: []).")
@click.option("--known-hosts", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="known_hosts file the nightly checks host keys against.")
@click.option("--ssh-config", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="OpenSSH client config the nightly reads.")
@click.option("--connect-timeout", type=Finite(min=0.1), default=None,
              help="Seconds the nightly waits for each node's SSH connection.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Where the nightly's output goes (default: next to LOCK).")
@click.option("--system", is_flag=True,
              help="launchd: a LaunchDaemon in /Library/LaunchDaemons run as this user "
                   "(UserName; needs sudo) instead of a LaunchAgent in user/UID.")
@db_option
def schedule_install(lock_path, at, kind, dest, enable, inventory_path, vault_password_file,
                     limit, provision, known_hosts, ssh_config, connect_timeout, log_path,
                     system, db_url):
    """Run `specfleet nightly LOCK` every day at --at, with the options the manual sweep
    needed (--limit, --no-provision, --known-hosts…) written into the entry.

    The store must be named (--db, SPECFLEET_DB or specfleet.toml): the entry holds its
    resolved URL (a SQLite path made absolute); a PostgreSQL password goes to a 0600
    PGPASSFILE, never into the entry. On macOS the LaunchAgent loads into user/UID
    (no GUI login needed); --system makes it a LaunchDaemon.

    \b
    Example (--dest: write the entry there to look at; without it, it is installed):
      specfleet schedule install lab/plan.lock.json -i lab/inventory/ --limit local \\
        --at 03:30 --dest schedules/ --db sqlite:///specfleet.db
    """
    from ..sweep.lock import load_lock, verify_lock
    from ..sweep.schedule import (
        PREFIX,
        SECRETS,
        default_kind,
        install,
        nightly_options,
        parse_at,
        render,
        store_for_schedule,
    )

    parse_at(at)
    doc = load_lock(lock_path)
    verify_lock(doc, lock_path)
    kind = default_kind() if kind == "auto" else kind
    if system and kind != "launchd":  # declared = applied: never silently ignored
        from ..errors import ConfigError

        raise ConfigError(f"--system makes a launchd LaunchDaemon; --kind {kind} has no such "
                          "mode (a systemd user timer needs lingering: see doctor --schedule)")
    enable = dest is None if enable is None else enable  # --dest writes files to look at
    log = (log_path or lock_path.resolve().with_name(lock_path.stem + ".nightly.log"))
    options, notes = nightly_options(doc, lock_path, list(inventory_path), limit=limit,
                                     vault_password_file=vault_password_file,
                                     provision=provision, known_hosts=known_hosts,
                                     ssh_config=ssh_config, connect_timeout=connect_timeout,
                                     choose_python=not from_settings_file("inventory_path"))
    for n in notes:
        click.echo(n, err=True)
    secrets = dest if dest is not None else SECRETS
    url, extra_env = store_for_schedule(db_url, secrets, PREFIX + doc["lock_id"][:12])
    files = render(kind, lock_path, doc, at, db_url=url, inventory=list(inventory_path),
                   log=log.resolve(), options=options, extra_env=extra_env, system=system)
    for p in install(kind, files, dest, enable, system):
        click.echo(f"wrote {p}")
    click.echo(f"nightly {doc['name']} at {at} via {kind}" + ("" if enable else
                                                              " (not enabled)"))


@schedule.command("list")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Look in this folder (as given to `schedule install --dest`).")
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as JSON.")
def schedule_list(dest, as_json):
    """Nightly schedules this user has installed.

    \b
    Example:
      specfleet schedule list --dest schedules/ --json
    """
    from ..sweep.schedule import entries

    rows = [{"name": e.name, "kind": e.kind, "at": e.at, "lock": e.lock, "path": str(e.path)}
            for e in entries(dest)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    for r in rows if not as_json else []:
        click.echo(f"{r['name']}  {r['kind']:<8} {r['at']}  {r['lock']}")


@schedule.command("remove")
@click.argument("name")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Remove from this folder (as given to `schedule install --dest`).")
@click.option("--disable/--no-disable", default=None,
              help="Unload it from launchd / systemd before deleting its files (default: "
                   "yes, unless --dest is given: files written there were never loaded).")
def schedule_remove(name, dest, disable):
    """Disable and delete the nightly schedule NAME (see `schedule list`).

    \b
    Example:
      specfleet schedule remove NAME --dest schedules/
    """
    from ..sweep.schedule import remove

    disable = dest is None if disable is None else disable
    for p in remove(name, dest, disable):
        click.echo(f"removed {p}")
