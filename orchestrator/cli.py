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
limit_option = click.option("--limit", default=None, help="Hosts or groups, e.g. 'mac1:lab'.")


@inventory.command("list")
@inventory_option
@limit_option
@click.option("--json", "as_json", is_flag=True)
def inventory_list(inventory_path: Path, limit: str | None, as_json: bool):
    """List the hosts a command would reach."""
    from .inventory import load_inventory

    hosts = load_inventory(inventory_path).select(limit)
    rows = [{"name": h.name, "address": h.address, "port": h.port, "user": h.user,
             "connection": h.connection, "groups": list(h.groups)} for h in hosts]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            click.echo(f"{r['name']:<20} {r['connection']:<6} {r['user'] or '-'}@"
                       f"{r['address']}:{r['port']}  groups={','.join(r['groups'])}")


@main.command()
@inventory_option
@limit_option
@click.option("--models", "models_dir", type=click.Path(path_type=Path), required=True,
              help="Folder with target/ and draft/ (see `specfleet demo-models build`).")
@click.option("-w", "--workload", "workloads", multiple=True,
              help="Shipped workload (code, memo, translation; or one record such as "
                   "code-long) or a JSONL prompt file. Repeatable. Default: all three shipped.")
@click.option("--context", "buckets", default="short", show_default=True,
              help="Context buckets for shipped workloads: short,medium,long.")
@click.option("--quality/--no-quality", default=False, show_default=True,
              help="Also run the frozen JSON/tool-call task set per config (pass rate).")
@click.option("--pin", "pins", multiple=True, metavar="DIST=VERSION",
              help="Refuse nodes whose installed version differs, e.g. --pin mlx-lm=0.32.2.")
@click.option("--max-tokens", type=int, default=None, help="Override each workload's ceiling.")
@click.option("--repetitions", type=int, default=1, show_default=True)
@click.option("--draft-widths", default="2,3,4,6", show_default=True,
              help="num_draft_tokens values to sweep.")
@click.option("--known-hosts", type=click.Path(path_type=Path), default=None,
              help="known_hosts file (default ~/.ssh/known_hosts); host keys are checked.")
@click.option("--failed-hosts-file", type=click.Path(path_type=Path), default=None,
              help="Write the names of hosts that were not ok here.")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the sweep result as JSON.")
def sweep(inventory_path, limit, models_dir, workloads, buckets, quality, pins, max_tokens,
          repetitions, draft_widths, known_hosts, failed_hosts_file, db_url, as_json):
    """Run a draft-width sweep against the autoregressive baseline on each node.

    Exits non-zero if any node was not ok; the other nodes' results are stored.
    """
    from .dispatch import StderrProgress, run_sweep
    from .inventory import load_inventory
    from .jobspec import build_job
    from .store import open_store
    from .transport import SSHOptions

    hosts = load_inventory(inventory_path).select(limit)
    widths = [int(x) for x in draft_widths.split(",") if x.strip()]
    pinned = {}
    for p in pins:
        dist, sep, version = p.partition("=")
        if not sep or not dist or not version:
            raise click.BadParameter(f"{p!r}: expected DIST=VERSION", param_hint="--pin")
        pinned[dist] = version
    job = build_job(models_dir, list(workloads) or None, max_tokens=max_tokens,
                    repetitions=repetitions, draft_widths=widths, pins=pinned, quality=quality,
                    buckets=tuple(b.strip() for b in buckets.split(",") if b.strip()))
    store = open_store(db_url)
    ssh = SSHOptions(known_hosts=str(known_hosts) if known_hosts else None)
    result = run_sweep(hosts, job, store, inventory=str(inventory_path), ssh=ssh,
                       progress=StderrProgress())
    _report_sweep(result, failed_hosts_file, as_json)


def _report_sweep(result, failed_hosts_file: Path | None, as_json: bool) -> None:
    bad = [o for o in result.outcomes if o.status != "ok"]
    if failed_hosts_file:
        failed_hosts_file.write_text("".join(f"{o.host}\n" for o in bad))
    if as_json:
        click.echo(json.dumps({"sweep_id": result.sweep_id, "status": result.status,
                               "outcomes": [o.__dict__ for o in result.outcomes]}, indent=2))
    else:
        for o in result.outcomes:
            click.echo(f"{o.host:<20} {o.status:<12} {o.events:>5} events"
                       + (f"  {o.detail}" if o.detail else ""))
        click.echo(f"sweep {result.sweep_id}: {result.status} "
                   f"({len(result.outcomes) - len(bad)}/{len(result.outcomes)} nodes ok)")
    if bad:
        sys.exit(1)


@main.command()
@click.option("--sweep", "sweep_id", default=None, help="Sweep id (default: the latest).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("review.html"), show_default=True)
@db_option
def review(sweep_id, out, db_url):
    """Render the HTML review of a sweep: speedup, acceptance, ITL p95, memory, exactness."""
    from .review import render_review
    from .store import open_store

    path = render_review(open_store(db_url), out, sweep_id)
    click.echo(f"review written to {path.resolve()}")


@main.group()
def db():
    """Store schema (Alembic migrations; SQLite or PostgreSQL)."""


@db.command("upgrade")
@db_option
def db_upgrade(db_url):
    """Migrate the store to the latest schema."""
    from .store import open_store

    click.echo(f"store at revision {open_store(db_url).current_revision()}")


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
