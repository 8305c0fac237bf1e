"""Project set-up: the demo pair, the embedded demo, `init`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .base import (
    main,
)


@main.group("demo-models")
def demo_models():
    """The project's own small target/draft pair (built offline, no model hub)."""


@demo_models.command("build")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--retrain", is_flag=True, help="Train even when the committed pair matches.")
@click.option("--json", "as_json", is_flag=True, help="Print the build record as JSON.")
def demo_models_build(out: Path, retrain: bool, as_json: bool):
    """Write OUT/target and OUT/draft (HF/MLX layout, shared tokenizer).

    Reuses the pair committed under orchestrator/demo_models/pair when its build key (hash of
    trainer, corpus, arguments and mlx version) matches; otherwise trains (minutes).

    \b
    Example:
      specfleet demo-models build models/
    """
    from ..demo_models import build_demo_models

    record = build_demo_models(out, retrain=retrain,
                               log=(lambda m: click.echo(m, err=True)))
    click.echo(json.dumps(record, indent=2) if as_json else f"models written to {out}")


@main.group()
def models():
    """Model folders: quantisation tiers made with mlx-lm's own conversion."""


@models.command("quantize")
@click.argument("src", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--bits", type=click.IntRange(2, 8), required=True,
              help="Bits per weight: 2, 3, 4, 5, 6 or 8.")
@click.option("--group-size", type=click.IntRange(32, 128), default=64, show_default=True,
              help="Weights per quantisation group: 32, 64 or 128.")
@click.option("--json", "as_json", is_flag=True, help="Print the tier's record as JSON.")
def models_quantize(src: Path, out: Path, bits: int, group_size: int, as_json: bool):
    """Write a quantised tier of SRC (an unquantised MLX model folder) to OUT with
    mlx_lm.convert, recording the source fingerprint, bits and group size in
    OUT/specfleet-tier.json. Each run's identity names the tier, so tiers never pool.

    \b
    Example:
      specfleet models quantize lab/models/draft lab/models/draft-6bit --bits 6
    """
    from ..calibration_record import refuse_quantising
    from ..tiers import quantize

    refuse_quantising(src)  # a calibration target's known answer is its fp32 weights'
    record = quantize(src, out, bits, group_size)
    click.echo(json.dumps(record, indent=2) if as_json else
               f"{record['tier']} tier of {src} written to {out} ({record['fingerprint']})")


@models.command("calibrate")
@click.argument("draft", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--layers", type=click.IntRange(min=2), default=32, show_default=True,
              help="Decoder layers of the grown target (the draft's plus added ones).")
@click.option("--acceptance", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0,
              show_default=True, help="1.0: identity layers (exact). Below 1: noise in the "
              "added layers, its scale chosen by measuring on the shipped prompts.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="Seed of the noise.")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration record as JSON.")
def models_calibrate(draft: Path, out: Path, layers: int, acceptance: float, seed: int,
                     as_json: bool):
    """Grow a calibration target from DRAFT into OUT: the draft's layers plus identity
    layers (their residual writes are zero), so the pair's acceptance is known (1.0
    exactly) while the target costs more per step. OUT/specfleet-calibration.json records
    the draft's fingerprint, the construction and the expected acceptance. An instrument,
    not a model: its series are marked as calibration everywhere.

    \b
    Example:
      specfleet models calibrate lab/models/draft lab/models/calibration --layers 32
    """
    from ..calibration import calibrate

    record = calibrate(draft, out, layers=layers, acceptance=acceptance, seed=seed,
                       log=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(record, indent=2) if as_json else
               f"calibration target of {draft} ({layers} layers, expected acceptance "
               f"{record['expected_acceptance']}) written to {out} ({record['fingerprint']})")


def named_folder(ctx, param, value: str | None) -> Path | None:
    """An empty string is no folder (as a Path it would silently be the current one)."""
    if value is None:
        return None
    if not str(value).strip():
        raise click.BadParameter("give a folder name, e.g. lab/")
    return Path(value)


@main.command()
@click.argument("folder", type=click.Path(file_okay=False), callback=named_folder)
@click.option("--models/--no-models", default=True, show_default=True,
              help="Also build the demo model pair into FOLDER/models.")
def init(folder, models):
    """Scaffold FOLDER: an inventory, a plan for the demo pair, each file explained.

    \b
    Example:
      specfleet init lab/
    """
    from ..scaffold import init_project

    for p in init_project(folder, with_models=models, log=lambda m: click.echo(m, err=True)):
        click.echo(f"wrote {p}")
    click.echo(f"next: specfleet plan lock {folder / 'plan.yml'}")


@main.command()
@click.option("--workdir", type=click.Path(file_okay=False),
              default=".specfleet-demo", show_default=True, callback=named_folder,
              help="Folder for the demo's models, plan, store, node files and pages.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Tokens generated per prompt (default: each workload's own).")
def demo(workdir: Path, max_tokens: int | None):
    """The embedded default: build the pair, sweep the local node, write the review.

    \b
    Example:
      specfleet demo --workdir .specfleet-demo --max-tokens 32
    """
    import os
    import sys

    from ..demo import LOCAL_INVENTORY, next_steps, run_demo
    from .sweeping import explained_interrupt

    with explained_interrupt(f"sqlite:///{(workdir / 'specfleet.db').resolve()}",
                             [LOCAL_INVENTORY]) as started:
        review_path = run_demo(workdir, max_tokens=max_tokens,
                               log=lambda m: click.echo(m, err=True), announce=started.append)
    click.echo(f"review written to {review_path.resolve()}")
    # the command as this shell can run it: `make demo` runs .venv/bin/specfleet, which is
    # not on PATH until the venv is activated
    exe = sys.argv[0] if os.path.basename(sys.argv[0]) == "specfleet" else "specfleet"
    from .. import project_config
    from ..demo import declare_store

    written = declare_store(workdir)
    if written:
        click.echo(f"wrote {written}: commands run here now read the demo's store")
    found = project_config.find()
    declared = found is not None and project_config.load(found).db == \
        f"sqlite:///{(workdir / 'specfleet.db').resolve()}"
    for line in next_steps(workdir, os.path.relpath(exe) if os.sep in exe else exe,
                           declared):
        click.echo(line)
