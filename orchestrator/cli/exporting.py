"""`specfleet export`: the store's results where teams already look (OTLP)."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from .base import Finite, db_option, main


@main.group()
def export():
    """Send stored results to other tools."""


def _when(ctx, param, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date or time like 2026-11-23 or "
                                 "2026-11-23T18:00") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


endpoint_option = click.option(
    "--endpoint", required=True, metavar="URL",
    help="OTLP/HTTP receiver (a collector), e.g. http://collector:4318; /v1/metrics is "
         "added unless the URL ends with it.")
timeout_option = click.option(
    "--timeout", "timeout_s", type=Finite(0.1, 600), default=10.0, show_default=True,
    metavar="SECONDS", help="Time the endpoint has to take the metrics, retries included.")


@export.command("otlp")
@endpoint_option
@click.option("--sweep", "sweep_ids", multiple=True, metavar="SWEEP_ID",
              help="A sweep to export (repeatable).")
@click.option("--week", default=None, metavar="YYYY-Www",
              help="The sweeps of an ISO week (e.g. 2026-W48, this, last).")
@click.option("--since", callback=_when, default=None, metavar="DATE",
              help="The sweeps started at or after DATE (UTC unless it says).")
@click.option("--until", callback=_when, default=None, metavar="DATE",
              help="The sweeps started before DATE.")
@timeout_option
@db_option
def export_otlp(endpoint, sweep_ids, week, since, until, timeout_s, db_url):
    """Send measurements as OpenTelemetry metrics over OTLP/HTTP: histograms of time to
    first token, time per output token and request duration under the GenAI semantic
    conventions' names (seconds), acceptance per request, and per speculative config its
    draft width and speedup. Set-aside numbers carry `specfleet.set_aside` with the
    reason. Nothing in the store changes.

    \b
    Example:
      specfleet export otlp --endpoint http://collector:4318 --week last
    """
    from ..export.otlp import export as run_export
    from ..export.points import Selection
    from ..review.week_runs import iso_week_bounds
    from ..store import open_store

    if week is not None and (since or until):
        raise click.UsageError("give --week or --since/--until, not both")
    if not (sweep_ids or week or since or until):
        raise click.UsageError("say what to export: --sweep SWEEP_ID, --week, or "
                               "--since/--until")
    if week is not None:
        since, until, _ = iso_week_bounds(week)
    sel = Selection(sweep_ids=list(sweep_ids), since=since, until=until)
    r = run_export(open_store(db_url, must_exist=True), sel, endpoint, timeout_s)
    click.echo(f"exported {r.values} values ({r.set_aside} set aside, marked) as "
               f"{r.data_points} data points from {len(r.sweeps)} sweep(s) to {r.endpoint}")


def export_after_sweep(db_url: str | None, sweep_id: str, endpoint: str | None,
                       timeout_s: float = 10.0) -> None:
    """`--otlp URL` on sweep and nightly: export the sweep just stored. A failure is said on
    stderr and changes nothing else: the sweep's result and exit status stand, and
    `specfleet export otlp --sweep ID` sends it later."""
    if not endpoint:
        return
    from ..errors import SpecfleetError
    from ..export.otlp import export as run_export
    from ..export.points import Selection
    from ..store import open_store

    try:
        r = run_export(open_store(db_url), Selection(sweep_ids=[sweep_id]), endpoint,
                       timeout_s)
    except SpecfleetError as e:
        click.echo(f"warning: {e} (the sweep's results are stored: `specfleet export otlp "
                   f"--sweep {sweep_id} --endpoint {endpoint}`)", err=True)
        return
    click.echo(f"exported {r.values} values of sweep {sweep_id} as {r.data_points} data "
               f"points to {r.endpoint}", err=True)
