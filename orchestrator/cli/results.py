"""The store and what people read from it: review, sweeps, runs, migrations."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from .base import (
    Finite,
    db_option,
    hosts_from,
    inventory_option,
    main,
)


@main.command()
@click.option("--week", default=None, metavar="YYYY-Www",
              help="ISO week to review, e.g. 2026-W48, or this / last (default: this week).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("review.html"),
              show_default=True, help="A folder, or an .html path (other formats beside it).")
@click.option("--format", "formats", default="html,md,json", show_default=True,
              help="Comma-separated: html, md, json.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Signal → action rules (YAML); default: the shipped set.")
@click.option("--sweep", "sweep_id", default=None,
              help="Instead, one sweep's detail page (baseline vs each draft width).")
@click.option("--fail-on", "fail_on", multiple=True, metavar="CAUSES",
              help="Exit 1 if the week shows any of these (comma-separated; the option may "
                   "be repeated, each adds its causes): regression, "
                   "gate-miss (a series with no production candidate; brings no-data and stale "
                   "with it), "
                   "no-data (a series with no reliable evidence this week, or no runs at all), "
                   "stale, failed-sweep; one line per finding on stderr. For CI.")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write JUnit XML: one test case per series × gate.")
@click.option("--notify", "notify_url", default=None, metavar="URL",
              help="Also POST a JSON summary (Slack-style `text` plus fields) to this webhook; "
                   "retried 3 times within --notify-timeout, never changes the exit status.")
@click.option("--notify-timeout", "notify_timeout", type=Finite(0.1, 600), default=30.0,
              show_default=True, metavar="SECONDS",
              help="Total time --notify may take, retries included (a slow server is "
                   "abandoned, with a warning).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write the week's verdicts as a runtime policy (JSON: "
                                 "per series speculation on/off, draft width, fallback ladder).")
@click.option("--policy-calibration", is_flag=True,
              help="Put calibration pairs' series in the policy too (left out by default: "
                   "an instrument, not a model).")
@db_option
def review(week, out, formats, rules_file, sweep_id, fail_on, junit, notify_url,
           notify_timeout, policy_file, policy_calibration, db_url):
    """The weekly signal → action review: per series the numbers, gates and
    classification, the actions the rules call for with their evidence, regressions with
    the identity change that explains them, stale series, and charts.

    \b
    Example (CI, after the nightly sweeps):
      specfleet review --week this --out review/ --fail-on regression,failed-sweep \\
        --junit review/junit.xml
    """
    import sys

    from ..errors import SpecfleetError
    from ..review import ci
    from ..review.report import FORMATS, review_analysis, write_review
    from ..review.rules import DEFAULT_RULES
    from ..review.sweep_page import render_review
    from ..store import open_store

    try:
        # repeated, each adds: CI files often write one flag a cause (the last alone
        # was kept, silently, before: audit 27s)
        causes = ci.parse_causes(",".join(fail_on)) if fail_on else ()
    except SpecfleetError as e:
        raise click.BadParameter(str(e).removeprefix("--fail-on: "),
                                 param_hint="--fail-on") from None
    if policy_calibration and not policy_file:
        raise click.UsageError("--policy-calibration says what goes in the policy: give "
                               "--policy FILE too")
    store = open_store(db_url, must_exist=True)
    if sweep_id:
        if fail_on or junit or notify_url or policy_file:
            raise click.UsageError("--fail-on, --junit, --notify and --policy review a week, "
                                   "not --sweep")
        path = render_review(store, out, sweep_id)
        click.echo(f"review written to {path.resolve()}")
        return
    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = set(fmts) - set(FORMATS)
    if bad:
        raise click.BadParameter(f"unknown format {', '.join(sorted(bad))}", param_hint="--format")
    a = review_analysis(store, week=week, rules_file=rules_file or DEFAULT_RULES)
    written = write_review(store, out, formats=fmts, analysis=a,
                           policy_calibration=policy_calibration)
    for fmt, path in written.items():
        click.echo(f"review written to {path.resolve()}" if fmt == "html" else
                   f"{fmt} written to {path.resolve()}")
    found = ci.findings(a)
    if policy_file:
        from ..review.verdict import policy

        policy_file.parent.mkdir(parents=True, exist_ok=True)
        policy_file.write_text(json.dumps(policy(a, policy_calibration), indent=2,
                                          sort_keys=True) + "\n")
        click.echo(f"policy written to {policy_file.resolve()}")
    if junit:
        click.echo(f"junit written to {ci.write_junit(a, junit).resolve()}")
    if notify_url:
        why = ci.notify(notify_url, a, found, causes or ci.CAUSES, deadline_s=notify_timeout)
        from ..redact import redact, redact_url

        shown = redact_url(notify_url)  # a webhook's user:password is a secret too
        click.echo(f"notified {shown}" if why is None else
                   f"warning: could not notify {shown}: {redact(why)}", err=why is not None)
    causes = ci.gated_causes(causes, a)
    failing = ci.summary_lines(found, causes)
    for line in failing:
        click.echo(line, err=True)
    if causes:
        click.echo(f"review {a['week']}: {len(failing)} finding(s) for --fail-on "
                   f"{','.join(causes)}", err=True)
    if failing:
        sys.exit(1)


@main.command()
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="The comparison as JSON.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also render it as a self-contained HTML page.")
@db_option
def compare(a, b, as_json, out, db_url):
    """Compare two sets of runs per config (every knob) and metric: each side's level (the
    geometric mean of its nights, the centre B/A is the ratio of), B/A with its 95%
    confidence interval and p from the nights (one median per run, not the repetitions)
    and a verdict, identity differences first.

    A and B are each a sweep id, an ISO week (or this-week, last-week), or KEY=VALUE
    filters joined by commas (KEY: sweep, week, trigger, node, chip, env_id, mlx_version,
    mlx_lm_version, os_build, model_pair, engine, target_fingerprint, draft_fingerprint,
    prompt_sha256, power_source). Runs flagged unreliable are listed, never compared.

    Other pairs: 2026-W47 2026-W48; trigger=manual trigger=nightly;
    mlx_lm_version=0.32.2 mlx_lm_version=0.33.0.

    \b
    Example (one node against another, this week):
      specfleet compare node=local,week=this node=mac-a,week=this --json
    """
    from ..review.compare import as_text
    from ..review.compare import compare as run_compare
    from ..store import open_store

    c = run_compare(open_store(db_url, must_exist=True), a, b)
    if out:
        from ..review.report import environment

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(environment(True).get_template("compare.html.j2").render(c=c),
                       encoding="utf-8")
    click.echo(json.dumps(c, indent=2, default=str) if as_json else as_text(c))
    if out:
        click.echo(f"comparison written to {out.resolve()}", err=as_json)


@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--week", default=None, metavar="YYYY-Www",
              help="The week whose verdicts the index shows (default: the current week).")
@db_option
def site(out, week, db_url):
    """Write a static history site into OUT: an index of every series (verdict, latest
    run, sparkline; filter and sort, also from the URL as ?q=WORDS&sort=COLUMN) and one
    page per series with its whole history, change points and identity changes marked.

    \b
    Example:
      specfleet site public/      # then open public/index.html
    """
    from ..review.site import write_site
    from ..store import open_store

    store = open_store(db_url, must_exist=True)
    click.echo(f"site written to {write_site(store, out, week=week).resolve()}")


@main.group()
def sweeps():
    """Sweeps in the store."""


def _not_a_count(ctx, param, value):
    if value is not None:
        raise click.BadParameter("--limit is a host pattern in specfleet; the number of "
                                 f"sweeps to list is --last (e.g. --last {value})")


@sweeps.command("list")
@click.option("--last", "count", type=click.IntRange(1, 100_000), default=20,
              show_default=True, help="How many sweeps to list, newest first.")
@click.option("--limit", hidden=True, expose_value=False, callback=_not_a_count)
@click.option("--json", "as_json", is_flag=True, help="Print the sweeps as JSON.")
@db_option
def sweeps_list(count, as_json, db_url):
    """The newest sweeps with their status and per-node outcome.

    \b
    Example:
      specfleet sweeps list --last 5
    """
    from ..listing import sweeps as list_sweeps
    from ..store import open_store

    rows = list_sweeps(open_store(db_url, must_exist=True), count)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    _emit([{**r, "created_at": r["created_at"][:19],
            "nodes": " ".join(f"{n}:{st}" + (f"({r['missing'][n]} missing)"
                                              if n in r["missing"] else "")
                              for n, st in r["nodes"].items())} for r in rows],
          False, False, ("sweep_id", "created_at", "status", "trigger", "nodes"))


@sweeps.command("verify")
@click.argument("sweep_id")
@inventory_option
@click.option("--known-hosts", type=click.Path(dir_okay=False), default=None,
              help="known_hosts file (default ~/.ssh/known_hosts); keys are checked strictly.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), default=None,
              help="OpenSSH client config (default ~/.ssh/config when present).")
@click.option("--connect-timeout", type=Finite(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for each node's SSH connection.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@db_option
def sweeps_verify(sweep_id, known_hosts, ssh_config, connect_timeout, as_json, db_url, **kw):
    """Compare the store with each node's journal (over SSH): every journal line stored
    once with the same content, or set aside with its reason. Prints "complete", or per
    node the missing seqs (holes) and conflicts; exit 1 unless complete.

    \b
    Example:
      specfleet sweeps verify SWEEP_ID -i lab/inventory/
    """
    from ..fleet.transport import SSHOptions
    from ..store import open_store
    from ..sweep.verify import verify_sweep

    hosts, _ = hosts_from({**kw, "limit": None})
    report = verify_sweep(open_store(db_url, must_exist=True), sweep_id, hosts,
                          SSHOptions(known_hosts=known_hosts, ssh_config=ssh_config,
                                     connect_timeout=connect_timeout))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for n in report.nodes:
            click.echo(n.line())
        click.echo(report.summary())
    sys.exit(0 if report.complete else 1)


@main.group()
def runs():
    """Runs (one config on one node in one sweep) with their identity and summary."""


def _emit(rows: list[dict], as_json: bool, as_csv: bool, columns: tuple[str, ...]) -> None:
    from ..listing import to_csv

    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
    elif as_csv:
        click.echo(to_csv(rows), nl=False)
    else:  # a header and aligned columns; --json / --csv are for scripts
        cells = [[str(r[c] if r[c] is not None else "-") for c in columns] for r in rows]
        widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(columns)]
        for line in [list(columns), *cells]:
            click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())


@runs.command("list")
@click.option("--sweep", "sweep_id", default=None, help="Only this sweep's runs (its id).")
@click.option("--node", default=None, help="Only this node's runs (its inventory name).")
@click.option("--workload", default=None, help="Only this workload's runs (e.g. code).")
@click.option("--engine", default=None,
              help="Only this runtime: mlx-lm (in process) or an http runtime's name.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header row, for spreadsheets.")
@db_option
def runs_list(sweep_id, node, workload, engine, as_json, as_csv, db_url):
    """List runs: decode tok/s median/p95/CV, acceptance, identity.

    \b
    Example:
      specfleet runs list --workload code --csv > runs.csv
    """
    from ..listing import runs as list_runs
    from ..store import open_store

    store = open_store(db_url, must_exist=True)
    _emit(list_runs(store, sweep_id, node, workload, engine), as_json, as_csv,
          ("id", "sweep_id", "node", "engine", "workload", "mode", "num_draft_tokens",
           "decode_tok_s_median", "acceptance_median", "unreliable"))


@runs.command("show")
@click.argument("run_id", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="The run's measurements as CSV.")
@db_option
def runs_show(run_id, as_json, as_csv, db_url):
    """One run with its config, summary and every measured generation.

    \b
    Example:
      specfleet runs show 1
    """
    from ..listing import run_detail, to_csv
    from ..store import open_store

    d = run_detail(open_store(db_url, must_exist=True), run_id)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
    elif as_csv:
        click.echo(to_csv(d["measurements"]), nl=False)
    else:
        _show_run(d)


def _show_run(d: dict) -> None:
    """Aligned sections: what ran, its identity, its numbers, each generation."""
    def section(title: str, items: Sequence[tuple[str, object]]) -> None:
        click.echo(title)
        for k, v in items:
            click.echo(f"  {k:<22} {'-' if v is None else v}")

    def num(v, spec=".2f"):
        return None if v is None else format(v, spec)

    section(f"run {d['id']}", [(k, d[k]) for k in ("sweep_id", "node", "engine", "model_pair",
                                                     "workload",
                                                     "context_bucket", "mode",
                                                     "num_draft_tokens", "trials")]
            + [("config", json.dumps(d["config"], sort_keys=True))])
    section("identity", [(k, d[k]) for k in ("chip", "os_build", "env_id", "mlx_version",
                                              "mlx_lm_version", "target_fingerprint",
                                              "draft_fingerprint", "prompt_sha256")])
    m = (d.get("summary") or {}).get("metrics") or {}
    rows = [(name, " · ".join(f"{k} {num(v, '.4g') if isinstance(v, float) else v or '-'}"
                              for k, v in (m.get(name) or {}).items()))
            for name in m]
    reasons = (d.get("summary") or {}).get("unreliable_reasons") or []
    section("summary", rows + [("unreliable", "; ".join(reasons) if reasons else "no")])
    click.echo(f"generations ({len(d['measurements'])})")
    for g in d["measurements"]:
        acc = g["acceptance_rate"]
        click.echo(f"  #{g['run_index']:<4} rep {g['repetition']}  "
                   f"{g['decode_tok_s'] or 0:8.1f} tok/s  ttft {g['ttft_ms'] or 0:7.1f} ms"
                   f"  acceptance {'-' if acc is None else f'{acc:.3f}'}"
                   + ("  UNRELIABLE" if g["unreliable"] else ""))
    for u in d.get("unreadable_events") or []:
        click.echo(f"UNREADABLE {u}")


@main.group()
def db():
    """Store schema (Alembic migrations; SQLite or PostgreSQL)."""


@db.command("upgrade")
@db_option
def db_upgrade(db_url):
    """Migrate the store to the latest schema; where there is none, create it (and its
    folder): the one command that starts a store in a folder that does not exist yet.

    \b
    Example:
      specfleet db upgrade --db sqlite:///specfleet.db
    """
    from ..store import open_store

    click.echo(f"store at revision {open_store(db_url, create_folder=True).current_revision()}")


@db.command("downgrade")
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Delete what the downgrade drops without asking.")
@db_option
def db_downgrade(revision, yes, db_url):
    """Migrate the store down to REVISION (e.g. 0004, or base).

    A downgrade that would delete stored data (tables or columns a later revision added)
    first lists what it would delete, with row counts, and asks; without a terminal it
    needs --yes. The next command that opens the store upgrades it again and says so. Below
    0018 it is refused while a sweep node with a signed journal may still write: its key,
    which tells the agent's lines from anyone's, would be lost.

    \b
    Example (on a copy; --yes drops what it lists without asking):
      cp specfleet.db old.db && specfleet db downgrade 0008 --yes --db sqlite:///old.db
    """
    import sys

    from ..store import open_store
    from ..store.db import resolve_url
    from ..store.revisions import (
        downgrade_store,
        keyed_nodes_still_running,
        losses_on_downgrade,
    )

    url = resolve_url(db_url)
    store = open_store(db_url, migrate=False)
    if running := keyed_nodes_still_running(store, revision):
        # not --yes's to drop: the key is what tells the agent's lines from anyone's
        raise click.ClickException(
            f"downgrading to {revision} would drop the journal keys of {len(running)} sweep "
            f"node(s) still running ({', '.join(running[:5])}): their lines could no longer "
            "be told from lines anyone appended. Nothing was changed; let those sweeps "
            "finish (or `specfleet sweep --stop SWEEP_ID`), then downgrade")
    losses = losses_on_downgrade(store, url, revision)
    if losses and not yes:
        listing = "".join(f"\n  {x}" for x in losses)
        if not sys.stdin.isatty():
            raise click.ClickException(
                f"downgrading to {revision} would delete:{listing}\nnothing was changed; "
                "add --yes to delete it")
        click.confirm(f"downgrading to {revision} would delete:{listing}\ndelete it?",
                      abort=True)
    downgrade_store(store, url, revision)
    click.echo(f"store at revision {store.current_revision() or 'base (empty)'}")


@db.command("current")
@db_option
def db_current(db_url):
    """Print the store's schema revision.

    \b
    Example:
      specfleet db current --db sqlite:///specfleet.db
    """
    from ..store import open_store

    click.echo(open_store(db_url, migrate=False, must_exist=True).current_revision()
               or "empty (not migrated)")
