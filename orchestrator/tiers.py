"""Quantisation tiers of a model, made with mlx-lm's own conversion and recorded.

``quantize(src, out, bits, group_size)`` runs ``mlx_lm.convert`` (the pinned mlx-lm, the
same code a node would use) on a local MLX model folder and writes ``specfleet-tier.json``
beside the weights: the source folder's fingerprint, bits, group size and the mlx-lm
version. The tier is also in the folder's config.json (``quantization``), which the agent
reads into every run's identity, so results of two tiers are never pooled.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from importlib import metadata
from pathlib import Path

from agent.checks import quant_tier
from agent.fingerprint import fingerprint

from .errors import ConfigError

TIER_FILE = "specfleet-tier.json"
CALIBRATION_FILE = "specfleet-calibration.json"  # calibration_record's (a layer apart)
BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


def quantize(src: Path, out: Path, bits: int, group_size: int = 64) -> dict:
    """Write the ``bits``-bit tier of ``src`` to ``out``; returns its record."""
    if bits not in BITS:
        raise ConfigError(f"--bits {bits}: mlx-lm quantises to {', '.join(map(str, BITS))} bits")
    if group_size not in GROUP_SIZES:
        raise ConfigError(f"--group-size {group_size}: one of "
                          f"{', '.join(map(str, GROUP_SIZES))}")
    if not (src / "config.json").is_file():
        raise ConfigError(f"{src}: not a model folder (no config.json)")
    if quant_tier(src) not in (None, "unquantised"):
        raise ConfigError(f"{src} is already quantised ({quant_tier(src)}); quantise from the "
                          "unquantised weights, so every tier has one source")
    if out.exists():
        raise ConfigError(f"{out} exists; choose a new folder (a tier is written whole)")
    if (src / CALIBRATION_FILE).exists():  # the CLI says more (refuse_quantising)
        raise ConfigError(f"{src} is a calibration target ({src}/{CALIBRATION_FILE}): refusing "
                          "to quantise it (its known acceptance holds only for its fp32 "
                          "weights; `specfleet models quantize` says what to do instead)")
    from mlx_lm import convert

    source = fingerprint(src)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # mlx_lm.convert prints its progress on stdout: keep stdout for our answer (--json)
        with contextlib.redirect_stdout(sys.stderr):
            convert(str(src), mlx_path=str(tmp), quantize=True, q_bits=bits,
                    q_group_size=group_size)
        record = {"source": str(src.resolve()), "source_fingerprint": source, "bits": bits,
                  "group_size": group_size, "tier": quant_tier(tmp),
                  "mlx_lm": metadata.version("mlx-lm"), "mlx": metadata.version("mlx")}
        (tmp / TIER_FILE).write_text(json.dumps(record, indent=2) + "\n")
        tmp.rename(out)  # a tier appears whole or not at all
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**record, "fingerprint": fingerprint(out)}
