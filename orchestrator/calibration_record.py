"""A calibration target's record (``specfleet-calibration.json`` beside its weights): what
``plan lock`` copies into the lock, read here without the builder (``calibration.py``,
which needs mlx-lm and the shipped prompts)."""

from __future__ import annotations

import json
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
    return record
