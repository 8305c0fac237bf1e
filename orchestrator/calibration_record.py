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
    return calibration_check(folder, fp)[0]


def calibration_check(folder: Path, fp: str | None = None) -> tuple[dict | None, str | None]:
    """(the folder's calibration record, None) when it holds; (None, why not) when the
    folder has a record that does not hold; (None, None) when it has none."""
    path = Path(folder) / CALIBRATION_FILE
    if not path.exists():
        return None, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"it is not readable JSON ({e})"
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        return None, f"it is no {SCHEMA} record"
    if record.get("fingerprint") != (fp := fp or fingerprint(folder)):
        return None, (f"it records the fingerprint {record.get('fingerprint')}, but the "
                      f"folder's weights are {fp} (edited or regrown since)")
    why = _as_constructed(Path(folder), record)
    return (None, why) if why else (record, None)


def _as_constructed(folder: Path, record: dict) -> str | None:
    """Why the record is no construction's (None: it is one). An exact record (acceptance
    1.0 by construction) is checked against the weights: its added layers' residual writes
    must be zero, or its known answer is no answer. (The record file is outside the
    fingerprint, so the fingerprint alone cannot vouch for it.)"""
    c = record.get("construction")
    if not isinstance(c, dict):
        return "it has no construction"
    exact = record.get("expected_acceptance") == 1.0
    if exact != (c.get("noise_scale") == 0.0):
        # 1.0 with noise, or less than 1.0 without: the record contradicts itself
        return (f"it claims expected acceptance {record.get('expected_acceptance')} beside "
                f"noise scale {c.get('noise_scale')} (exact means no noise, and only exact "
                "is 1.0)")
    if not exact:
        return None
    try:
        added = range(int(c["draft_layers"]), int(c["layers"]))
        writes = [f"model.layers.{i}.{n}" for i in added for n in c["residual_writes"]]
        if writes and all(_zero(folder, writes)):
            return None
    except (KeyError, TypeError, ValueError, OSError):
        pass
    return ("it claims an exact pair (acceptance 1.0), but the added layers' residual "
            "writes are not all zero")


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
