"""A calibration target's record (``specfleet-calibration.json`` beside its weights): what
``plan lock`` copies into the lock, read here without the builder (``calibration.py``,
which needs mlx-lm and the shipped prompts)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from pathlib import Path

from agent.fingerprint import fingerprint

from .errors import ConfigError

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
    if why := _numbers(record, c):
        return why
    if why := _copied_as_drafts(folder, record, c):
        return why
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


def _real(x) -> float | None:
    """``x`` as a finite number (a flag, text or NaN is none)."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def _numbers(record: dict, c: dict) -> str | None:
    """Why the record's numbers are no construction's: an expected acceptance that is not a
    number in [0, 1], or a noise scale that is not a number >= 0 (a record missing either
    would otherwise hold, and a series it marks could never be judged stale)."""
    a, s = record.get("expected_acceptance"), c.get("noise_scale")
    if (x := _real(a)) is None or not 0.0 <= x <= 1.0:
        return f"its expected acceptance {a!r} is not a number in [0, 1]"
    if (y := _real(s)) is None or y < 0.0:
        return f"its noise scale {s!r} is not a number >= 0"
    return None


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


def _copied_as_drafts(folder: Path, record: dict, c: dict) -> str | None:
    """Why the layers the record says are its draft's are not (None: they are): the
    tensors below the added layers (embeddings, the draft's decoder layers, norm, head) must
    hash, as fp32, to the record's digest of its draft's tensors. The added layers alone
    are no known answer: a target whose copied layers were edited computes other logits."""
    want = c.get("draft_tensors_sha256")
    if not isinstance(want, str):
        return ("it has no digest of the tensors copied from its draft (written by an older "
                "specfleet), so its draft's layers cannot be checked")
    try:
        have = tensors_digest(folder, below=int(c["draft_layers"]))
    except (KeyError, TypeError, ValueError, OSError) as e:
        return f"its copied tensors could not be read ({e})"
    if have != want:
        return (f"the tensors it says are copied from its draft (all but the layers from "
                f"{c['draft_layers']} on) hash to {have}, not the record's {want}: the "
                "draft's layers were edited since it was grown")
    return None


def draft_holds(record: dict, draft: Path) -> str | None:
    """Why ``draft`` (the folder whose fingerprint the record names) is not the draft the
    record's digest was taken of (None: it is). A record is outside the fingerprint, so its
    digest could be rewritten to fit edited weights; the draft's own tensors cannot."""
    want = (record.get("construction") or {}).get("draft_tensors_sha256")
    have = tensors_digest(Path(draft))
    if have != want:
        return (f"its digest of the draft's tensors is {want}, but the draft {draft} hashes "
                f"to {have}: the layers it says are copied from the draft are not the draft's")
    return None


_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def tensors_digest(folder: Path, below: int | None = None) -> str:
    """sha256 over a folder's safetensors tensors as little-endian fp32 (name, shape, values;
    by name), read from the files' headers and byte ranges without mlx. ``below``: only the
    decoder layers numbered below it (and every tensor outside the decoder layers)."""
    import numpy as np

    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
            for name in sorted(k for k in header if k != "__metadata__"):
                m = _LAYER.match(name)
                if below is not None and m and int(m.group(1)) >= below:
                    continue
                t = header[name]
                a, b = t["data_offsets"]
                fh.seek(8 + n + a)
                data = fh.read(b - a)
                if t["dtype"] == "BF16":
                    data = (np.frombuffer(data, "<u2").astype("<u4") << 16).tobytes()
                elif t["dtype"] == "F16":
                    data = np.frombuffer(data, "<f2").astype("<f4").tobytes()
                elif t["dtype"] != "F32":
                    data = t["dtype"].encode() + data  # never equal to an fp32 copy
                h.update(json.dumps([name, t["shape"]]).encode() + data)
    return "sha256:" + h.hexdigest()

def refuse_quantising(src: Path) -> None:
    """Refuse to quantise a calibration target. Refused rather than recorded: its known
    answer (acceptance 1.0 by construction, or measured on its fp32 weights) is gone once
    quantised (the demo's exact target at 4 bits accepts 0.82 at width 4), so a copy could
    only carry a record saying "acceptance unknown", an instrument with no answer to check,
    that every page would still have to mark and keep out of the policy. (Growing from a
    quantised draft is refused by ``models calibrate`` too: the pair is fp32.) Called by
    ``specfleet models quantize`` before ``tiers.quantize``."""
    if (src / CALIBRATION_FILE).exists():
        raise ConfigError(
            f"{src} is a calibration target ({src}/{CALIBRATION_FILE}): refusing to "
            "quantise it. Its known acceptance holds only for its own fp32 weights; a "
            "quantised copy has none and would be locked as a real model. To sweep a lighter "
            "calibration pair, quantise its draft (`specfleet models quantize DRAFT OUT "
            "--bits N`) and give that tier beside its own draft in the plan's lineup (a "
            "ladder rung); to check the instrument, sweep this target as it is. If the "
            f"folder is a real model's, remove its stray {CALIBRATION_FILE}")
