"""The ``specfleet`` command line: option parsing only; the work lives in the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .errors import SpecfleetError

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INVENTORY = PROJECT_ROOT / "inventory" / "local.yml"

db_option = click.option("--db", "db_url", envvar="SPECFLEET_DB", default=None,
                         help="Store URL (SQLAlchemy), e.g. sqlite:///specfleet.db or "
                              "postgresql+psycopg://user@host/db. Env: SPECFLEET_DB. "
                              "Default: sqlite:///specfleet.db")


class _Group(click.Group):
    """Turns library errors into one-line messages at the CLI edge."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecfleetError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Group)
@click.version_option(package_name="specfleet")
def main():
    """specfleet: benchmark speculative decoding across a fleet of Macs running mlx-lm.

    Typical flow: `specfleet demo-models build models/`, then
    `specfleet sweep --models models/`, then `specfleet review --out review.html`.
    """


@main.group("demo-models")
def demo_models():
    """The project's own small target/draft pair (built offline, no model hub)."""


@demo_models.command("build")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--retrain", is_flag=True, help="Train even when the committed pair matches.")
@click.option("--json", "as_json", is_flag=True, help="Print the build record as JSON.")
def demo_models_build(out: Path, retrain: bool, as_json: bool):
    """Write OUT/target and OUT/draft (HF/MLX layout, shared tokenizer).

    Reuses the pair committed under tests/data/demo-models when its build key (hash of
    trainer, corpus, arguments and mlx version) matches; otherwise trains (minutes).
    """
    from .demo_models import build_demo_models

    record = build_demo_models(out, retrain=retrain,
                               log=(lambda m: click.echo(m, err=True)))
    click.echo(json.dumps(record, indent=2) if as_json else f"models written to {out}")


@main.group()
def inventory():
    """Inspect the inventory (Ansible-style YAML)."""


inventory_option = click.option(
    "-i", "--inventory", "inventory_path", type=click.Path(path_type=Path),
    default=DEFAULT_INVENTORY, show_default=True, help="Inventory file or folder.")
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
        click.option("--concurrency", type=int, default=64, show_default=True,
                     help="Hosts worked on at once."),
        click.option("--connect-timeout", type=float, default=10.0, show_default=True),
        click.option("--failed-hosts-file", type=click.Path(dir_okay=False, path_type=Path),
                     default=Path("specfleet.retry"), show_default=True,
                     help="Where the hosts that were not ok are written, for --limit @FILE."),
        click.option("--json", "as_json", is_flag=True, help="Print results as JSON."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _ssh(kw: dict):
    from .transport import SSHOptions

    return SSHOptions(known_hosts=kw.pop("known_hosts"),
                      accept_new_host_keys=kw.pop("accept_new_host_keys"),
                      ssh_config=kw.pop("ssh_config"), concurrency=kw.pop("concurrency"),
                      connect_timeout=kw.pop("connect_timeout"))


def _hosts(kw: dict):
    from .inventory import load_inventory

    path = kw.pop("inventory_path")
    return load_inventory(path).select(kw.pop("limit")), str(path)


def _report(outcomes, retry_file: Path, as_json: bool, extra: dict | None = None,
            describe=None) -> None:
    """Per-host lines (or JSON), a summary, the retry file; exit 1 if any host was not ok."""
    from .fanout import not_ok, summary_line, write_retry_file

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


@inventory.command("list")
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True)
def inventory_list(inventory_path: Path, limit: str | None, as_json: bool):
    """List the hosts a command would reach."""
    from .inventory import load_inventory

    hosts = load_inventory(inventory_path).select(limit)
    rows = [{"name": h.name, "address": h.address, "port": h.port or 22, "user": h.user,
             "connection": h.connection, "groups": list(h.groups)} for h in hosts]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            click.echo(f"{r['name']:<20} {r['connection']:<6} {r['user'] or '-'}@"
                       f"{r['address']}:{r['port']}  groups={','.join(r['groups'])}")


@main.command()
@fleet_options
@click.argument("lock_path", metavar="[LOCK]", required=False,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--attach", "attach_id", metavar="SWEEP_ID", default=None,
              help="Re-attach to a sweep's running agents and ingest what they wrote.")
@click.option("--resume", "resume_id", metavar="SWEEP_ID", default=None,
              help="Restart a sweep's dead agents; they measure only what is missing.")
@click.option("--provision/--no-provision", default=True, show_default=True,
              help="Install the locked env on nodes first (--no-provision: nodes bring "
                   "specfleet_python; the agent still checks the pins).")
@click.option("--reconnect-timeout", type=float, default=120.0, show_default=True,
              help="Seconds to keep reconnecting to a node whose link dropped.")
@db_option
def sweep(lock_path, attach_id, resume_id, provision, reconnect_timeout, db_url,
          failed_hosts_file, as_json, **kw):
    """Run the sweep a LOCK describes on each node (LOCK = PLAN.lock.json).

    Agents run detached on the nodes and journal every event; the controller follows the
    journals into the store, reconnecting after dropped links. If the controller dies,
    `--attach SWEEP_ID` picks up; if an agent died, `--resume SWEEP_ID`. Exits non-zero if
    any node was not ok; the other nodes' results are stored.
    """
    from .dispatch import StderrProgress, SweepOptions, continue_sweep, start_sweep
    from .store import open_store

    if sum(x is not None for x in (lock_path, attach_id, resume_id)) != 1:
        raise click.UsageError("give a LOCK, or --attach SWEEP_ID, or --resume SWEEP_ID")
    ssh = _ssh(kw)
    inventory_path = kw["inventory_path"]
    doc = None
    if lock_path:
        doc, _ = _lock_from(lock_path, lambda m: click.echo(m, err=True))
        if kw["limit"] is None and doc["nodes"].get("limit"):
            kw["limit"] = doc["nodes"]["limit"]
    hosts, _ = _hosts(kw)
    store = open_store(db_url)
    opts = SweepOptions(ssh=ssh, provision=provision, reconnect_timeout_s=reconnect_timeout)
    sweep_id = attach_id or resume_id
    try:
        if doc is not None:
            result = start_sweep(
                doc, hosts, store, inventory=str(inventory_path), opts=opts,
                progress=StderrProgress(), announce=lambda sid: click.echo(
                    f"sweep {sid} started on {len(hosts)} node(s)", err=True))
        else:
            result = continue_sweep(sweep_id, hosts, store, resume=resume_id is not None,
                                    opts=opts, progress=StderrProgress())
    except KeyboardInterrupt:
        click.echo("interrupted: the agents keep running on the nodes; pick the sweep up "
                   "again with `specfleet sweep --attach SWEEP_ID` (the id is printed above; "
                   "`specfleet sweeps list` shows it too)", err=True)
        sys.exit(130)
    _report(result.outcomes, failed_hosts_file, as_json,
            extra={"sweep_id": result.sweep_id, "status": result.status},
            describe=lambda o: f"{o.value['events']} events")
    click.echo(f"sweep {result.sweep_id}: {result.status}", err=True)


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
    Python, power source and battery, low-power mode, thermal state, uptime, node lock."""
    from .facts import collect
    from .fanout import run_fan_out
    from .store import open_store

    ssh = _ssh(kw)
    hosts, _ = _hosts(kw)
    outcomes = run_fan_out(hosts, collect, ssh)
    store = open_store(db_url)
    for o in outcomes:
        if o.status == "ok":
            store.add_facts(o.host, o.value)
    _report(outcomes, failed_hosts_file, as_json, describe=_describe_facts)


@main.group()
def plan():
    """Plans (YAML) and their locks: exact wheels, weight fingerprints, prompt hashes."""


@plan.command("lock")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the lock's summary as JSON.")
def plan_lock(plan_path, as_json):
    """Write PLAN.lock.json next to PLAN. Sweeps run only from a lock."""
    from .plan import load_lock, load_plan, write_lock

    out = write_lock(load_plan(plan_path), lambda m: click.echo(m, err=True))
    doc = load_lock(out)
    summary = {"lock": str(out), "lock_id": doc["lock_id"],
               "environments": {d: e["env_id"] for d, e in doc["platforms"].items()},
               "models": {r: doc["models"][r]["fingerprint"] for r in ("target", "draft")},
               "prompts": doc["prompts"]}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"wrote {out}")
        for d, e in summary["environments"].items():
            click.echo(f"  env {e}  {d}")
        for r, fp in summary["models"].items():
            click.echo(f"  {r:<7} {fp}")
        click.echo(f"  {len(doc['prompts'])} prompts, {len(doc['job']['workloads'])} workloads")


@plan.command("check")
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
def plan_check(lock_path):
    """Verify that LOCK still matches its plan, weights and prompts."""
    from .plan import load_lock, verify_lock

    verify_lock(load_lock(lock_path), lock_path)
    click.echo(f"{lock_path}: matches its plan, weights and prompts")


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
              default=Path("specfleet.retry"), show_default=True)
@click.option("--json", "as_json", is_flag=True)
def node_prepare(ask_become_pass, check, known_hosts, failed_hosts_file, as_json, **kw):
    """Keep Macs awake on AC (pmset), keep Spotlight out of the specfleet root, create the
    root owned by the benchmark user. Host by host, with sudo."""
    import os

    from .prepare import prepare_host

    hosts, _ = _hosts(kw)
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

    _report(outcomes, failed_hosts_file, as_json,
            describe=lambda o: ", ".join(sorted({s["state"] for s in o.value})))


class TransferProgress:
    """Bytes and rate per host on stderr, at most twice a second per host."""

    def __init__(self):
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


def _lock_from(path: Path, log) -> tuple[dict, Path]:
    """A verified lock from a lock file, or from a plan (locked on the fly)."""
    from .plan import load_lock, load_plan, verify_lock, write_lock

    if path.suffix == ".json":
        doc = load_lock(path)
        verify_lock(doc, path)
        return doc, path
    out = write_lock(load_plan(path), log)
    log(f"locked {path} → {out}")
    return load_lock(out), out


@main.command()
@fleet_options
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False, path_type=Path))
@db_option
def provision(plan_path, db_url, failed_hosts_file, as_json, **kw):
    """Make each node ready for PLAN (a plan, or its .lock.json), idempotently: the pinned
    environment (hash-locked wheels installed offline), the agent artefact, and the model
    pair as verified blobs."""
    from .fanout import run_fan_out
    from .provision import provision_host
    from .store import open_store

    doc, _ = _lock_from(plan_path, lambda m: click.echo(m, err=True))
    store = open_store(db_url)
    store.record_lock(doc)
    ssh = _ssh(kw)
    hosts, _ = _hosts(kw)
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
                f"{v['weights_skipped_bytes'] / 2**20:.1f} MiB · {v['seconds']:.1f}s")

    _report(outcomes, failed_hosts_file, as_json, extra={"plan": str(plan_path)},
            describe=describe)


@main.command()
@click.option("--week", default=None, metavar="YYYY-Www",
              help="ISO week to review, e.g. 2026-W48 (default: the current week).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("review.html"),
              show_default=True, help="A folder, or an .html path (other formats beside it).")
@click.option("--format", "formats", default="html,md,json", show_default=True,
              help="Comma-separated: html, md, json.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Signal → action rules (YAML); default: the shipped set.")
@click.option("--sweep", "sweep_id", default=None,
              help="Instead, one sweep's detail page (baseline vs each draft width).")
@db_option
def review(week, out, formats, rules_file, sweep_id, db_url):
    """The weekly signal → action review: per series the numbers, gates and
    classification, the actions the rules call for with their evidence, regressions with
    the identity change that explains them, stale series, and charts."""
    from .analysis.rules import DEFAULT_RULES
    from .report import FORMATS, write_review
    from .review import render_review
    from .store import open_store

    store = open_store(db_url)
    if sweep_id:
        path = render_review(store, out, sweep_id)
        click.echo(f"review written to {path.resolve()}")
        return
    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = set(fmts) - set(FORMATS)
    if bad:
        raise click.BadParameter(f"unknown format {', '.join(sorted(bad))}", param_hint="--format")
    written = write_review(store, out, week=week, formats=fmts,
                           rules_file=rules_file or DEFAULT_RULES)
    for fmt, path in written.items():
        click.echo(f"review written to {path.resolve()}" if fmt == "html" else
                   f"{fmt} written to {path.resolve()}")


@main.command()
@fleet_options
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--provision/--no-provision", default=True, show_default=True)
@db_option
def nightly(lock_path, provision, db_url, failed_hosts_file, as_json, **kw):
    """The scheduled sweep: refuses to start while a previous nightly of the same plan
    runs, records trigger=nightly, prints one summary line, exits 1 if any node failed."""
    from .dispatch import StderrProgress, SweepOptions, start_sweep
    from .fanout import write_retry_file
    from .schedule import NightlyGuard
    from .store import open_store

    doc, _ = _lock_from(lock_path, lambda m: None)
    if kw["limit"] is None and doc["nodes"].get("limit"):
        kw["limit"] = doc["nodes"]["limit"]
    ssh = _ssh(kw)
    hosts, inventory_path = _hosts(kw)
    with NightlyGuard(doc["lock_id"]):
        store = open_store(db_url)
        result = start_sweep(doc, hosts, store, inventory=inventory_path,
                             opts=SweepOptions(ssh=ssh, provision=provision, trigger="nightly"),
                             progress=StderrProgress())
    bad = [o for o in result.outcomes if o.status != "ok"]
    ok = len(result.outcomes) - len(bad)
    line = (f"nightly {doc['name']} sweep {result.sweep_id}: {result.status} "
            f"({ok}/{len(result.outcomes)} nodes ok)")
    if bad:
        line += "; " + "; ".join(f"{o.host} {o.status}: {(o.detail or '')[:120]}" for o in bad)
    click.echo(line, err=as_json)
    if as_json:  # prints the JSON document and exits 1 if any node was not ok
        _report(result.outcomes, failed_hosts_file, True,
                extra={"sweep_id": result.sweep_id, "status": result.status})
    write_retry_file(result.outcomes, failed_hosts_file)
    sys.exit(1 if bad else 0)


@main.group()
def schedule():
    """Nightly sweeps: launchd (macOS), systemd user timer (Linux), cron as fallback."""


@schedule.command("install")
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--at", "at", default="02:00", show_default=True, help="Daily time, HH:MM.")
@click.option("--kind", type=click.Choice(["auto", "launchd", "systemd", "cron"]),
              default="auto", show_default=True)
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the files here (default: the scheduler's own folder / crontab).")
@click.option("--enable/--no-enable", default=True, show_default=True,
              help="Load the schedule into launchd / systemd after writing it.")
@click.option("-i", "--inventory", "inventory_path", type=click.Path(path_type=Path),
              default=None, help="Inventory the nightly run uses.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Where the nightly's output goes (default: next to LOCK).")
@db_option
def schedule_install(lock_path, at, kind, dest, enable, inventory_path, log_path, db_url):
    """Run `specfleet nightly LOCK` every day at --at."""
    from .plan import load_lock, verify_lock
    from .schedule import default_kind, install, render

    doc = load_lock(lock_path)
    verify_lock(doc, lock_path)
    kind = default_kind() if kind == "auto" else kind
    log = (log_path or lock_path.resolve().with_name(lock_path.stem + ".nightly.log"))
    files = render(kind, lock_path, doc, at, db_url=db_url, inventory=inventory_path,
                   log=log.resolve())
    for p in install(kind, files, dest, enable):
        click.echo(f"wrote {p}")
    click.echo(f"nightly {doc['name']} at {at} via {kind}" + ("" if enable else
                                                              " (not enabled)"))


@schedule.command("list")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True)
def schedule_list(dest, as_json):
    """Nightly schedules this user has installed."""
    from .schedule import entries

    rows = [{"name": e.name, "kind": e.kind, "at": e.at, "lock": e.lock, "path": str(e.path)}
            for e in entries(dest)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    for r in rows if not as_json else []:
        click.echo(f"{r['name']}  {r['kind']:<8} {r['at']}  {r['lock']}")


@schedule.command("remove")
@click.argument("name")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--disable/--no-disable", default=True, show_default=True)
def schedule_remove(name, dest, disable):
    """Disable and delete the nightly schedule NAME (see `schedule list`)."""
    from .schedule import remove

    for p in remove(name, dest, disable):
        click.echo(f"removed {p}")


@main.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--models/--no-models", default=True, show_default=True,
              help="Also build the demo model pair into FOLDER/models.")
def init(folder, models):
    """Scaffold FOLDER: an inventory, a plan for the demo pair, each file explained."""
    from .scaffold import init_project

    for p in init_project(folder, with_models=models, log=lambda m: click.echo(m, err=True)):
        click.echo(f"wrote {p}")
    click.echo(f"next: specfleet plan lock {folder / 'plan.yml'}")


@main.command()
@fleet_options
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--provision/--no-provision", default=True, show_default=True)
@click.option("--metrics", default="decode_tok_s,acceptance_rate,ttft_ms", show_default=True,
              help="Metrics that must agree between nodes.")
@click.option("--floor", type=float, default=0.03, show_default=True,
              help="Smallest tolerance, as a share of the larger median.")
@db_option
def repro(lock_path, provision, metrics, floor, db_url, failed_hosts_file, as_json, **kw):
    """Run LOCK on several nodes (--limit a,b,c) and check they agree, metric by metric,
    within a tolerance from each node's own repetition spread. Exit 0 only if so."""
    from datetime import datetime, timezone

    from .analysis.repro import compare, sweep_values
    from .dispatch import StderrProgress, SweepOptions, start_sweep
    from .store import open_store
    from .store.models import ReproCheck

    doc, _ = _lock_from(lock_path, lambda m: None)
    ssh = _ssh(kw)
    hosts, inventory_path = _hosts(kw)
    if len(hosts) < 2:
        raise click.UsageError("repro needs at least two nodes (--limit a,b)")
    store = open_store(db_url)
    result = start_sweep(doc, hosts, store, inventory=inventory_path,
                         opts=SweepOptions(ssh=ssh, provision=provision, trigger="repro"),
                         progress=StderrProgress())
    per_node, idents = sweep_values(store, result.sweep_id)
    report = compare(per_node, idents, tuple(m.strip() for m in metrics.split(",")), floor)
    report.update(sweep_id=result.sweep_id, created_at=datetime.now(timezone.utc).isoformat(),
                  not_ok=[o.host for o in result.outcomes if o.status != "ok"])
    report["reproducible"] = report["reproducible"] and not report["not_ok"]
    with store.engine.begin() as c:
        c.execute(ReproCheck.__table__.insert().values(
            sweep_id=result.sweep_id, created_at=datetime.now(timezone.utc),
            reproducible=report["reproducible"], report=report))
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        for d in report["disagreements"]:
            click.echo(f"DISAGREE {d['metric']} {d['config']}: {d['detail']}"
                       + (f" — identity: {'; '.join(d['identity'])}" if d["identity"] else ""))
        for n in report["not_ok"]:
            click.echo(f"{n}: did not finish the sweep")
        click.echo(f"repro sweep {result.sweep_id}: {report['checked']} comparisons, "
                   + ("reproducible" if report["reproducible"] else "NOT reproducible"))
    sys.exit(0 if report["reproducible"] else 1)


@main.group()
def sweeps():
    """Sweeps in the store."""


@sweeps.command("list")
@click.option("--limit", "count", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@db_option
def sweeps_list(count, as_json, db_url):
    """The newest sweeps with their status and per-node outcome."""
    from .listing import sweeps as list_sweeps
    from .store import open_store

    rows = list_sweeps(open_store(db_url), count)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        nodes = " ".join(f"{n}:{st}" for n, st in r["nodes"].items())
        click.echo(f"{r['sweep_id']}  {r['created_at'][:19]}  {r['status']:<8} "
                   f"{r['trigger'] or '-':<8} {nodes}")


@main.group()
def runs():
    """Runs (one config on one node in one sweep) with their identity and summary."""


def _emit(rows: list[dict], as_json: bool, as_csv: bool, columns: tuple[str, ...]) -> None:
    from .listing import to_csv

    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
    elif as_csv:
        click.echo(to_csv(rows), nl=False)
    else:
        for r in rows:
            click.echo("  ".join(str(r[c] if r[c] is not None else "-") for c in columns))


@runs.command("list")
@click.option("--sweep", "sweep_id", default=None)
@click.option("--node", default=None)
@click.option("--workload", default=None)
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row, for spreadsheets.")
@db_option
def runs_list(sweep_id, node, workload, as_json, as_csv, db_url):
    """List runs: decode tok/s median/p95/CV, acceptance, identity."""
    from .listing import runs as list_runs
    from .store import open_store

    _emit(list_runs(open_store(db_url), sweep_id, node, workload), as_json, as_csv,
          ("id", "sweep_id", "node", "workload", "mode", "num_draft_tokens",
           "decode_tok_s_median", "acceptance_median", "unreliable"))


@runs.command("show")
@click.argument("run_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True, help="The run's measurements as CSV.")
@db_option
def runs_show(run_id, as_json, as_csv, db_url):
    """One run with its config, summary and every measured generation."""
    from .listing import run_detail, to_csv
    from .store import open_store

    d = run_detail(open_store(db_url), run_id)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
    elif as_csv:
        click.echo(to_csv(d["measurements"]), nl=False)
    else:
        for k, v in d.items():
            if k != "measurements":
                click.echo(f"{k:<22} {v}")
        for m in d["measurements"]:
            acc = m["acceptance_rate"]
            click.echo(f"  #{m['run_index']:<4} rep {m['repetition']}  "
                       f"{m['decode_tok_s'] or 0:8.1f} tok/s  ttft {m['ttft_ms'] or 0:7.1f} ms"
                       f"  acceptance {'-' if acc is None else acc}")


@main.group()
def db():
    """Store schema (Alembic migrations; SQLite or PostgreSQL)."""


@db.command("upgrade")
@db_option
def db_upgrade(db_url):
    """Migrate the store to the latest schema."""
    from .store import open_store

    click.echo(f"store at revision {open_store(db_url).current_revision()}")


@db.command("downgrade")
@click.argument("revision")
@db_option
def db_downgrade(revision, db_url):
    """Migrate the store down to REVISION (e.g. 0004, or base)."""
    from .store import open_store
    from .store.db import downgrade, resolve_url

    store = open_store(db_url, migrate=False)
    downgrade(store.engine, resolve_url(db_url), revision)
    click.echo(f"store at revision {store.current_revision() or 'base (empty)'}")


@db.command("current")
@db_option
def db_current(db_url):
    """Print the store's schema revision."""
    from .store import open_store

    click.echo(open_store(db_url, migrate=False).current_revision() or "empty (not migrated)")


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".specfleet-demo"), show_default=True)
@click.option("--max-tokens", type=int, default=None)
def demo(workdir: Path, max_tokens: int | None):
    """The embedded default: build the pair, sweep the local node, write the review."""
    from .demo import run_demo

    review_path = run_demo(workdir, max_tokens=max_tokens,
                           log=lambda m: click.echo(m, err=True))
    click.echo(f"review written to {review_path.resolve()}")
