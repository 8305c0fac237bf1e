"""The fleet: inventory, facts, privileged prep, provisioning."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from .base import (
    TransferProgress,
    db_option,
    fleet_options,
    hosts_from,
    hosts_of_plan,
    inventory_option,
    limit_option,
    lock_from,
    main,
    report_outcomes,
    ssh_options,
    writable_file,
)


@main.group()
def inventory():
    """Inspect the inventory (Ansible-style YAML)."""


@inventory.command("list")
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True, help="Print the hosts as JSON.")
def inventory_list(as_json: bool, **kw):
    """List the hosts a command would reach.

    \b
    Example:
      specfleet inventory list -i lab/inventory/ -i ~/fleet/hosts.yml --limit 'all:!local' --json
    """
    hosts, _ = hosts_from(kw)
    rows = [{"name": h.name, "address": h.address, "port": h.port or 22, "user": h.user,
             "connection": h.connection, "python": h.python, "groups": list(h.groups)}
            for h in hosts]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            click.echo(f"{r['name']:<20} {r['connection']:<6} {r['user'] or '-'}@"
                       f"{r['address']}:{r['port']}  groups={','.join(r['groups'])}")


@main.group()
def fleet():
    """Look at the nodes: facts, reachability."""


def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.0f} GiB"


def _describe_facts(o) -> str:
    f = o.value
    lock = f["lock"]
    busy = f"busy ({lock['holder']['job_id']})" if lock.get("held") and lock.get("holder") \
        else ("busy" if lock.get("held") else "idle")
    power = f["power_source"] or "-"
    if f.get("battery_percent") is not None:
        power += f" {f['battery_percent']}%"
    flags = [x for x, on in (("low-power", f.get("low_power_mode")),
                             ("THROTTLED", f.get("thermal_throttled"))) if on]
    return (f"{f['os_name']} {f['os_version'] or ''} ({f['os_build'] or '-'}) · "
            f"{f['chip'] or '?'} · {_gib(f['ram_bytes'])} RAM · "
            f"{f['gpu_cores'] or '-'} GPU cores · {_gib(f['disk_free_bytes'])} free · "
            f"python {f['python_version'] or 'MISSING'} · {power} · {busy}"
            + (" · " + ", ".join(flags) if flags else ""))


@fleet.command("facts")
@fleet_options
@db_option
def fleet_facts(db_url, failed_hosts_file, as_json, **kw):
    """Collect and store each node's facts: OS and build, chip, RAM, GPU cores, free disk,
    Python, power source and battery, low-power mode, thermal state, uptime, node lock.

    \b
    Example:
      specfleet fleet facts -i lab/inventory/ --json
    """
    from ..fleet.facts import collect
    from ..fleet.fanout import run_fan_out
    from ..store import open_store

    ssh = ssh_options(kw)
    hosts, _ = hosts_from(kw)
    outcomes = run_fan_out(hosts, collect, ssh)
    store = open_store(db_url)
    for o in outcomes:
        if o.status == "ok":
            store.add_facts(o.host, o.value)
    report_outcomes(outcomes, failed_hosts_file, as_json, describe=_describe_facts)


@main.command()
@click.argument("lock_path", metavar="[LOCK]", required=False,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--schedule", "for_schedule", is_flag=True,
              help="Also check what a scheduled nightly needs: SSH without a terminal (a key "
                   "without passphrase or a lasting agent socket), no lab folder in macOS's "
                   "protected ~/Documents, ~/Desktop, ~/Downloads, systemd lingering.")
@fleet_options
def doctor(lock_path, failed_hosts_file, as_json, for_schedule=False, **kw):
    """Will a sweep work on these nodes? Per node, one line per check with the fix: SSH
    reachable, host key known, Python found (and the version LOCK's plan declares), disk
    free for LOCK's weights, power source and Low Power Mode, another benchmark holding the
    node, clock skew. Exits 1 if any check FAILs (a sweep would fail there); a `warn` only
    makes results doubtful (they would be set aside).

    \b
    Example:
      specfleet doctor lab/plan.lock.json -i lab/inventory/
      specfleet doctor lab/plan.lock.json -i lab/inventory/ --schedule
    """
    from ..fleet.doctor import probe, report
    from ..fleet.fanout import run_fan_out, write_retry_file
    from ..sweep.lock import load_lock

    doc = load_lock(lock_path) if lock_path else None
    ssh = ssh_options(kw)
    # the nodes the plan would sweep, unless --limit says
    hosts, _ = hosts_of_plan(doc, lock_path, kw) if doc is not None else hosts_from(kw)
    outcomes = run_fan_out(hosts, probe, ssh)
    rows = report(hosts, outcomes, doc)
    night = None  # the controller's side of a nightly: a section of its own, not a node
    if for_schedule:
        from dataclasses import asdict

        from ..fleet.schedule_checks import schedule_checks
        from ..sweep.schedule import default_kind

        paths = [Path.cwd()] + ([lock_path] if lock_path else []) + list(
            kw.get("inventory_path") or [])
        night = {"section": "schedule (this controller, at night)", "checks": [
            asdict(c) for c in schedule_checks(hosts, paths, default_kind())]}
    failing = [r["node"] for r in rows if any(c["status"] == "FAIL" for c in r["checks"])]
    night_fails = night is not None and any(c["status"] == "FAIL" for c in night["checks"])
    if as_json:
        click.echo(json.dumps({"nodes": rows, "failing": failing, **(
            {"schedule": {**night, "failing": night_fails}} if night else {})}, indent=2))
    else:
        from ..fleet.doctor import Check

        for r in ([{"node": night["section"], "checks": night["checks"]}] if night else []) \
                + rows:
            click.echo(r["node"])
            for c in r["checks"]:
                click.echo(Check(**c).line())
        click.echo(f"{len(rows)} node(s): " + (f"{len(failing)} would fail a sweep "
                                                f"({', '.join(failing)})" if failing
                                                else "ready for a sweep"))
        if night:
            click.echo("schedule: " + ("a check FAILs: a scheduled nightly would fail"
                                       if night_fails else "ready for a nightly"))
    written = write_retry_file([replace(o, status="failed") if o.host in failing and
                                o.status == "ok" else o for o in outcomes], failed_hosts_file)
    if written and not as_json:
        click.echo(f"check those again with --limit @{written}")
    if failing or night_fails:
        sys.exit(1)


@main.group()
def node():
    """One-time privileged node preparation (fabric, sudo)."""


@node.command("prepare")
@inventory_option
@limit_option
@click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
              help="known_hosts file (default ~/.ssh/known_hosts); unknown keys are refused.")
@click.option("--ask-become-pass", is_flag=True, help="Prompt for the sudo password.")
@click.option("--check", is_flag=True, help="Show what would change; change nothing.")
@click.option("--failed-hosts-file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("specfleet.retry"), show_default=True, callback=writable_file,
              help="Where the hosts that were not ok are written, for --limit @FILE.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def node_prepare(ask_become_pass, check, known_hosts, failed_hosts_file, as_json, **kw):
    """Keep Macs awake on AC (pmset), Low Power Mode off, Spotlight out of the specfleet
    root; create the root owned by the benchmark user. Host by host, with sudo.

    --check prints each step with the exact command it would run as root.

    \b
    Example (then without --check; add --ask-become-pass when sudo asks for a password):
      specfleet node prepare -i ~/fleet/hosts.yml --limit lab --check
    """
    import os
    import shlex

    from ..fleet.prepare import prepare_host

    hosts, _ = hosts_from(kw)
    password = click.prompt("BECOME password", hide_input=True, err=True) \
        if ask_become_pass else None
    known = known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    outcomes = []
    for h in hosts:  # one at a time: a sudo prompt per host must stay readable
        o = prepare_host(h, known, password, check)
        outcomes.append(o)
        if not as_json:
            for s in o.value or []:
                click.echo(f"[{h.name}] {s['state']:<22} {s['step']}", err=True)
                if s["state"] == "would change":
                    click.echo(f"[{h.name}] {'':<22} would run: sudo sh -c "
                               f"{shlex.quote(s['command'])}", err=True)

    report_outcomes(outcomes, failed_hosts_file, as_json,
            describe=lambda o: ", ".join(sorted({s["state"] for s in o.value})))


@main.command()
@fleet_options
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@db_option
def provision(plan_path, db_url, failed_hosts_file, as_json, **kw):
    """Make each node ready for PLAN (a plan, or its .lock.json), idempotently: the pinned
    environment (hash-locked wheels installed offline), the agent artefact, and the model
    pair as verified blobs.

    \b
    Example:
      specfleet provision plan.lock.json -i ~/fleet/hosts.yml --limit lab
    """
    from ..fleet.fanout import run_fan_out
    from ..fleet.provision import provision_host
    from ..store import open_store

    doc, _ = lock_from(plan_path, lambda m: click.echo(m, err=True))
    store = open_store(db_url)
    store.record_lock(doc)
    ssh = ssh_options(kw)
    hosts, _ = hosts_from(kw)
    bars = TransferProgress()
    outcomes = run_fan_out(
        hosts, lambda h, t: provision_host(h, t, doc, bars.for_host(h.name)), ssh)
    for o in outcomes:
        store.add_provision(o.host, doc["plan_sha256"], o.status,
                            o.value if o.status == "ok" else {"detail": o.detail})

    def describe(o) -> str:
        v = o.value
        return (f"env {v['env_id']} {v['env']} · agent {v['agent_id']} {v['agent']} · "
                f"weights sent {v['weights_sent_bytes'] / 2**20:.1f} MiB, skipped "
                f"{v['weights_skipped_bytes'] / 2**20:.1f} MiB"
                + (f" · {v['weights_resent_corrupt']} corrupt blob(s) found and re-sent"
                   if v.get("weights_resent_corrupt") else "") + f" · {v['seconds']:.1f}s")

    report_outcomes(outcomes, failed_hosts_file, as_json, extra={"plan": str(plan_path)},
            describe=describe)
