"""Sweeps: run a lock, nightly, reproducibility checks."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from ..errors import SpecfleetError
from .base import (
    Finite,
    db_option,
    fleet_options,
    hosts_from,
    lock_from,
    main,
    plan_hosts,
    report_outcomes,
    ssh_options,
)
from .exporting import export_after_sweep


def _sweep_id(ctx, param, value: str | None) -> str | None:
    if value is not None and (not value.strip() or not value.isprintable() or len(value) > 64):
        raise click.BadParameter("a sweep id, as `specfleet sweeps list` shows it")
    return value


@main.command()
@fleet_options
@click.argument("lock_path", metavar="[LOCK]", required=False,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--attach", "attach_id", metavar="SWEEP_ID", default=None, callback=_sweep_id,
              help="Re-attach to a sweep's running agents and ingest what they wrote.")
@click.option("--resume", "resume_id", metavar="SWEEP_ID", default=None, callback=_sweep_id,
              help="Restart a sweep's dead agents; they measure only what is missing.")
@click.option("--stop", "stop_id", metavar="SWEEP_ID", default=None, callback=_sweep_id,
              help="End a sweep's agents and release its nodes; what they measured is stored "
                   "(--resume SWEEP_ID later measures the rest).")
@click.option("--provision/--no-provision", default=None,
              help="Install the locked env on nodes first (the default when the lock manages "
                   "environments); --no-provision: nodes bring specfleet_python, and the agent "
                   "still checks the pins (the default for a plan with platforms: []).")
@click.option("--reconnect-timeout", type=Finite(min=0), default=120.0,
              show_default=True,
              help="Seconds to keep reconnecting to a node whose link dropped.")
@click.option("--otlp", "otlp_url", default=None, metavar="URL",
              help="Afterwards, export the sweep's results to this OTLP/HTTP endpoint (as "
                   "`specfleet export otlp`); a failure is a warning, the sweep's result "
                   "stands.")
@db_option
def sweep(lock_path, attach_id, resume_id, stop_id, provision, reconnect_timeout, otlp_url,
          db_url, failed_hosts_file, as_json, **kw):
    """Run the sweep a LOCK describes on each node (LOCK = PLAN.lock.json).

    Agents run detached on the nodes and journal every event; the controller follows the
    journals into the store, reconnecting after dropped links. If the controller dies,
    `--attach SWEEP_ID` picks up; if an agent died, `--resume SWEEP_ID`. Exits non-zero if
    any node was not ok; the other nodes' results are stored.

    \b
    Example:
      specfleet sweep lab/plan.lock.json -i lab/inventory/
    """
    from ..store import open_store
    from ..sweep.dispatch import StderrProgress, SweepOptions, continue_sweep, start_sweep

    if sum(x is not None for x in (lock_path, attach_id, resume_id, stop_id)) != 1:
        raise click.UsageError("give a LOCK, or one of --attach, --resume, --stop SWEEP_ID")
    ssh = ssh_options(kw)
    kw_inventory = list(kw["inventory_path"])
    doc = None
    if lock_path:
        doc, _ = lock_from(lock_path, lambda m: click.echo(m, err=True))
        hosts, inventory_path = plan_hosts(doc, lock_path, kw)
    else:
        chose = kw.get("limit") is not None  # --limit: pick up only these nodes
        hosts, inventory_path = hosts_from(kw)
    store = open_store(db_url, must_exist=doc is None)  # --attach/--resume/--stop: it exists
    provision = _provision(doc, provision, lambda m: click.echo(m, err=True))
    opts = SweepOptions(ssh=ssh, provision=provision, reconnect_timeout_s=reconnect_timeout,
                        hint_args=_hint_args(kw_inventory, db_url), db_hint=_db_hint(db_url))
    sweep_id = attach_id or resume_id or stop_id
    with explained_interrupt(db_url, kw_inventory, sweep_id) as started:
        def announce(sid: str) -> None:
            started.append(sid)
            click.echo(f"sweep {sid} started on {len(hosts)} node(s)", err=True)

        if doc is not None:
            result = start_sweep(doc, hosts, store, inventory=str(inventory_path), opts=opts,
                                 progress=StderrProgress(), announce=announce)
        else:
            result = continue_sweep(sweep_id, hosts, store, resume=resume_id is not None,
                                    opts=opts, progress=StderrProgress(), leave_out=chose,
                                    stop=stop_id is not None)
    if stop_id:
        for o in result.outcomes:
            click.echo(f"{o.host:<20} {o.detail or o.status}")
        # a node that had finished (ok, or with no reliable result) has nothing to stop
        left = [o.host for o in result.outcomes if o.status not in ("ok", "unreliable",
                                                                    "stopped")]
        if left:  # never "free" when a node's agent could not be shown ended
            raise click.ClickException(f"sweep {result.sweep_id}: not stopped on "
                                       f"{', '.join(left)} (see above)")
        click.echo(f"sweep {result.sweep_id}: stopped; its nodes are free", err=True)
        return
    export_after_sweep(db_url, result.sweep_id, otlp_url)  # before: report_outcomes may exit
    if result.left_out:  # said first: report_outcomes exits when a node was not ok
        click.echo(f"left out, still to finish: {', '.join(result.left_out)} (pick them up "
                   f"with `specfleet sweep --attach {result.sweep_id}{opts.hint_args}`)",
                   err=True)
    report_outcomes(result.outcomes, failed_hosts_file, as_json,
            extra={"sweep_id": result.sweep_id, "status": result.status,
                   "left_out": list(result.left_out)},
            describe=lambda o: f"{o.value['events']} events")
    click.echo(f"sweep {result.sweep_id}: " + ("no reliable result (every generation was set "
               "aside as unreliable: see above)" if result.status == "unreliable"
               else result.status), err=True)


@contextlib.contextmanager
def explained_interrupt(db_url: str | None, inventory: list[Path],
                        sweep_id: str | None = None):
    """Around a sweep: yields the list its `announce` appends the new sweep's id to; on
    SIGINT or SIGTERM (Ctrl-C or `kill`, from anywhere), says which sweep goes on and how
    to follow or stop it (``interrupted``)."""
    from ..fleet.signals import Detach, detach_on_signals

    started: list[str] = []
    with detach_on_signals():
        try:
            yield started
        except KeyboardInterrupt as e:
            interrupted(started[0] if started else sweep_id, db_url, inventory,
                        e if isinstance(e, Detach) else Detach())


def interrupted(sweep_id: str | None, db_url: str | None, inventory: list[Path],
                why=None) -> None:
    """Ctrl-C or SIGTERM: the agents go on measuring on their nodes; say so, and how to
    follow or stop them, with the sweep's own id and the options this command was given.
    Exit status 130 after SIGINT, 143 after SIGTERM (128 + the signal, as shells report)."""
    from ..fleet.signals import Detach, DetachExit, ignore_signals

    ignore_signals()  # a second Ctrl-C while this is said, or the process ends, changes nothing
    why = why or Detach()
    said = "interrupted" if why.name == "SIGINT" else f"controller ended by {why.name}"
    if sweep_id is None:
        click.echo(f"{said} before a sweep started: nothing runs on the nodes", err=True)
        raise DetachExit(why.exit_status)
    extra = _hint_args(inventory, db_url)
    click.echo(f"{said}: sweep {sweep_id} goes on on the nodes (its agents are detached "
               f"and journal everything).\n  follow it again: specfleet sweep --attach "
               f"{sweep_id}{extra}\n  stop it:         specfleet sweep --stop {sweep_id}"
               f"{extra}", err=True)
    raise DetachExit(why.exit_status)


def _hint_args(inventory: list[Path], db_url: str | None) -> str:
    """The options a printed `specfleet sweep --attach/--resume/--stop` needs: -i as given
    and --db (see _db_hint)."""
    import shlex

    return "".join(f" -i {shlex.quote(str(p))}" for p in inventory) + _db_hint(db_url)


def _db_hint(db_url: str | None) -> str:
    """--db for a hint the user copies: none when SPECFLEET_DB gives it (the same shell
    still has it), masked when it holds a password (hints land in nightly logs)."""
    import os
    import shlex

    from ..redact import has_password, redact_url

    if not db_url or os.environ.get("SPECFLEET_DB") == db_url:
        return ""
    if has_password(db_url):
        return f" --db {shlex.quote(redact_url(db_url))}  (put your password back for ***)"
    return f" --db {shlex.quote(db_url)}"


def _record_failed_nightly(db_url: str | None, lock_path: Path, reason: str) -> None:
    import uuid

    from ..store import open_store
    from ..sweep.dispatch import controller_id

    try:
        open_store(db_url).record_failed_start(
            uuid.uuid4().hex[:12], f"nightly of {lock_path} did not start: {reason}",
            trigger="nightly", controller=controller_id())
    except Exception as e:  # the store itself is down: the log line is all that is left
        click.echo(f"(could not record the failed nightly in the store: {e})", err=True)


@main.command()
@fleet_options
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--provision/--no-provision", default=None,
              help="As for `sweep`: on unless the lock manages no environments.")
@click.option("--otlp", "otlp_url", default=None, metavar="URL",
              help="Afterwards, export the sweep's results to this OTLP/HTTP endpoint (as "
                   "`specfleet export otlp`); a failure is a warning, the sweep's result "
                   "stands.")
@db_option
def nightly(lock_path, provision, otlp_url, db_url, failed_hosts_file, as_json, **kw):
    """The scheduled sweep: refuses to start while a previous nightly of the same plan
    runs, records trigger=nightly, prints one summary line, exits 1 if any node failed.

    \b
    Example:
      specfleet nightly lab/plan.lock.json -i lab/inventory/
    """
    from ..fleet.fanout import not_ok, write_retry_file
    from ..store import open_store
    from ..sweep.dispatch import StderrProgress, SweepOptions, start_sweep
    from ..sweep.schedule import NightlyGuard

    try:
        doc, _ = lock_from(lock_path, lambda m: None)
        ssh = ssh_options(kw)
        hosts, inventory_path = plan_hosts(doc, lock_path, kw)
    except SpecfleetError as e:
        # nobody watches a nightly: the night it missed, and why, goes into the store
        _record_failed_nightly(db_url, lock_path, str(e))
        raise
    provision = _provision(doc, provision, lambda m: None)
    with NightlyGuard(doc["lock_id"]), explained_interrupt(
            db_url, [Path(p) for p in inventory_path.split(",")]) as started:
        result = start_sweep(doc, hosts, open_store(db_url), inventory=inventory_path,
                             opts=SweepOptions(ssh=ssh, provision=provision, trigger="nightly"),
                             progress=StderrProgress(), announce=started.append)
    export_after_sweep(db_url, result.sweep_id, otlp_url)
    bad = not_ok(result.outcomes)
    ok = len(result.outcomes) - len(bad)
    line = (f"nightly {doc['name']} sweep {result.sweep_id}: {result.status} "
            f"({ok}/{len(result.outcomes)} nodes ok)")
    if bad:
        line += "; " + "; ".join(f"{o.host} {o.status}: {(o.detail or '')[:120]}" for o in bad)
    click.echo(line, err=as_json)
    if as_json:  # prints the JSON document and exits 1 if any node was not ok
        report_outcomes(result.outcomes, failed_hosts_file, True,
                extra={"sweep_id": result.sweep_id, "status": result.status})
    write_retry_file(result.outcomes, failed_hosts_file)
    sys.exit(1 if bad else 0)


@main.command()
@fleet_options
@click.argument("lock_path", metavar="LOCK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--provision/--no-provision", default=None,
              help="As for `sweep`: on unless the lock manages no environments.")
@click.option("--metrics", default="decode_tok_s,acceptance_rate,ttft_ms", show_default=True,
              help="Metrics that must agree between nodes.")
@click.option("--floor", type=Finite(min=0, max=1), default=0.03, show_default=True,
              help="Smallest tolerance, as a share of the larger median.")
@db_option
def repro(lock_path, provision, metrics, floor, db_url, failed_hosts_file, as_json, **kw):
    """Run LOCK on several nodes (--limit a,b,c) and check they agree, metric by metric,
    within a tolerance from each node's own repetition spread. Runs flagged unreliable are
    set aside, never compared. Exit 0 if reproducible, 1 if not, 3 if inconclusive.

    \b
    Example:
      specfleet repro lab/plan.lock.json -i lab/inventory/ -i ~/fleet/hosts.yml --limit local,mac-a
    """
    from datetime import datetime, timezone

    from ..fleet.fanout import not_ok
    from ..review.repro import compare, sweep_values, verdict
    from ..store import open_store
    from ..store.repro_checks import record_repro
    from ..sweep.dispatch import StderrProgress, SweepOptions, start_sweep

    doc, _ = lock_from(lock_path, lambda m: None)
    ssh = ssh_options(kw)
    hosts, inventory_path = hosts_from(kw)
    if len(hosts) < 2:
        raise click.UsageError("repro needs at least two nodes (--limit a,b)")
    provision = _provision(doc, provision, lambda m: click.echo(m, err=True))
    store = open_store(db_url)
    with explained_interrupt(db_url, [Path(p) for p in inventory_path.split(",")]) as started:
        result = start_sweep(doc, hosts, store, inventory=inventory_path,
                             opts=SweepOptions(ssh=ssh, provision=provision, trigger="repro"),
                             progress=StderrProgress(), announce=started.append)
    per_node, idents, set_aside = sweep_values(store, result.sweep_id)
    report = compare(per_node, idents, tuple(m.strip() for m in metrics.split(",")), floor)
    report.update(sweep_id=result.sweep_id, created_at=datetime.now(timezone.utc).isoformat(),
                  not_ok=[o.host for o in not_ok(result.outcomes)],
                  set_aside=set_aside)
    report["verdict"] = verdict(report)
    report["reproducible"] = report["verdict"] == "reproducible"
    record_repro(store, result.sweep_id, report)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        for d in report["disagreements"]:
            click.echo(f"DISAGREE {d['metric']} {d['config']}: {d['detail']}"
                       + (f" — identity: {'; '.join(d['identity'])}" if d["identity"] else ""))
        for n in report["not_ok"]:
            click.echo(f"{n}: did not finish the sweep")
        for x in set_aside:
            click.echo(f"SET ASIDE {x['node']} {x['config']}: {'; '.join(x['reasons'])}")
        click.echo(f"repro sweep {result.sweep_id}: {report['checked']} comparisons, "
                   + report["verdict"])
    # 3: the data could not answer (unreliable or nothing compared), not a disagreement
    sys.exit(0 if report["reproducible"] else 3 if report["verdict"].startswith(
        "inconclusive") else 1)


def _provision(doc: dict | None, asked: bool | None, say) -> bool:
    """Declared = applied: a plan with ``platforms: []`` manages no environments, so its
    sweeps do not provision (the nodes bring their Python, the agent checks the pins);
    asking for --provision then is refused rather than ignored."""
    manages = bool(doc and doc.get("platforms"))
    if asked is None:
        if doc is not None and not manages:
            say("this lock manages no environments (environment.platforms: []): nodes use "
                "their own Python (specfleet_python); the agent checks the pins")
        return manages if doc is not None else True
    if asked and doc is not None and not manages:
        raise click.UsageError("--provision: this lock manages no environments (its plan sets "
                               "environment.platforms: []); drop --provision, or list the "
                               "platforms to install in the plan")
    return asked


def _folder_name(ctx, param, value: str) -> Path:
    """An empty string is no folder (as a Path it would silently be the current one)."""
    if not str(value).strip():
        raise click.BadParameter("give a folder name, e.g. .specfleet-calibrate")
    return Path(value)


@main.command()
@fleet_options
@click.option("--draft", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Grow the calibration target from this draft (default: the "
                                 "project's demo draft).")
@click.option("--workdir", type=click.Path(file_okay=False),
              default=".specfleet-calibrate", show_default=True, callback=_folder_name,
              help="Folder for the calibration pair (cached by content) and its plan.")
@click.option("--layers", type=click.IntRange(min=3), default=16, show_default=True,
              help="Layers of the grown target.")
@click.option("--repetitions", type=click.IntRange(1, 50), default=3, show_default=True)
@click.option("--max-tokens", type=click.IntRange(16, 4096), default=64, show_default=True)
@click.option("--rounds", type=click.IntRange(5, 50), default=5, show_default=True,
              help="Alternating rounds per node of step costs and measured speedup (the "
                   "speed verdict is a 90% interval for the median of their ratios, which "
                   "needs at least 5 rounds; more narrow it on a noisy node).")
@db_option
def calibrate(draft, workdir, layers, repetitions, max_tokens, rounds, db_url,
              failed_hosts_file, as_json, **kw):
    """Check the instrument on each node with a calibration pair (a target grown from the
    draft with identity layers): acceptance exactly 1.0 and output identical to
    autoregressive; the speedup at each width within 10% of the one predicted from the
    node's own step costs (both measured in alternating rounds on the node, judged on a
    90% interval for the median ratio: ok or off only when it is clear of ±10%, else
    unverified, too noisy to judge); the agent's loop against a
    bare mlx-lm loop. One line per node:
    "instrument ok" or what is off and by how much. Exit 0 if every node is ok, 1 if one
    is off or failed, 3 if a reading could not be taken (e.g. a contended node). Nodes run
    their own Python (specfleet_python) with this controller's mlx and mlx-lm versions
    (the agent checks the pins); the pair's weights are pushed as a sweep pushes them.

    \b
    Example:
      specfleet calibrate -i lab/inventory/ --layers 8 --repetitions 1 --max-tokens 32
    """
    from ..demo_models import build_demo_models
    from ..instrument import check_instrument
    from ..store import open_store
    from ..sweep.dispatch import StderrProgress

    ssh = ssh_options(kw)
    hosts, inventory_path = hosts_from(kw)

    def say(m: str) -> None:
        click.echo(m, err=True)

    if draft is None:
        build_demo_models(workdir / "models", log=say)
        draft = workdir / "models" / "draft"
    checks = check_instrument(hosts, open_store(db_url), workdir, draft, layers=layers,
                              repetitions=repetitions, max_tokens=max_tokens, rounds=rounds,
                              ssh=ssh, inventory=inventory_path, progress=StderrProgress(), log=say)
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2, default=str))
    else:
        for c in checks:
            click.echo(c.line)
    statuses = {c.status for c in checks}
    sys.exit(1 if statuses & {"off", "failed"} else 3 if "unverified" in statuses else 0)
