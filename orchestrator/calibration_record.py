"""A calibration target's record (``specfleet-calibration.json`` beside its weights): what
``plan lock`` copies into the lock, read here without the builder (``calibration.py``,
which needs mlx-lm and the shipped prompts)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from agent.fingerprint import fingerprint

CALIBRATION_FILE = "specfleet-calibration.json"
SCHEMA = "specfleet-calibration/1"


def calibration_of(folder: Path, fp: str | None = None) -> dict | None:
    """The calibration record of a model folder, when it is one: its file's recorded
    fingerprint must be the folder's (weights edited since are no calibration)."""
    path = Path(folder) / CALIBRATION_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None
    if record.get("fingerprint") != (fp or fingerprint(folder)):
        return None
    return record if _as_constructed(Path(folder), record) else None


def _as_constructed(folder: Path, record: dict) -> bool:
    """An exact record (acceptance 1.0 by construction) is checked against the weights: its
    added layers' residual writes must be zero, or its known answer is no answer. (The record
    file is outside the fingerprint, so the fingerprint alone cannot vouch for it.)"""
    c = record.get("construction")
    if not isinstance(c, dict):
        return False
    exact = record.get("expected_acceptance") == 1.0
    if exact != (c.get("noise_scale") == 0.0):
        return False  # 1.0 with noise, or less than 1.0 without: the record contradicts itself
    if not exact:
        return True
    try:
        added = range(int(c["draft_layers"]), int(c["layers"]))
        writes = [f"model.layers.{i}.{n}" for i in added for n in c["residual_writes"]]
        return bool(writes) and all(_zero(folder, writes))
    except (KeyError, TypeError, ValueError, OSError):
        return False


def _zero(folder: Path, names: list[str]):
    """Per tensor named: are all its bytes zero (+0.0)? Read from the safetensors files'
    headers and byte ranges, no mlx needed; a tensor found nowhere is not zero."""
    left = set(names)
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
            for name in sorted(left & header.keys()):
                a, b = header[name]["data_offsets"]
                fh.seek(8 + n + a)
                data = fh.read(b - a)
                left.discard(name)
                yield len(data) == b - a and data.count(0) == len(data)
    yield from (False for _ in left)
