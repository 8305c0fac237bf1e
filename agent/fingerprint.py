"""Model weight fingerprints: sha256 per file and a manifest hash.

Shared by agent and controller (the controller imports this module) so both
compute the identity of a model the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

# Files mlx-lm reads for a model; other files in the folder do not change results.
MODEL_FILE_PATTERNS = ("*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
                       "generation_config.json", "model.safetensors.index.json")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_files(model_dir: Path) -> list[Path]:
    found: set[Path] = set()
    for pattern in MODEL_FILE_PATTERNS:
        found.update(p for p in model_dir.glob(pattern) if p.is_file())
    return sorted(found)


def manifest(model_dir: Path) -> list[dict]:
    """(relative path, size, sha256) for every file the model loads, sorted by path."""
    return [{"path": p.name, "size": p.stat().st_size, "sha256": file_sha256(p)}
            for p in model_files(model_dir)]


def fingerprint(model_dir: str | Path) -> str:
    """The manifest hash: ``sha256:<hex>`` over the canonical JSON manifest."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    m = manifest(model_dir)
    if not m:
        raise FileNotFoundError(f"no model files in {model_dir}")
    return "sha256:" + hashlib.sha256(
        json.dumps(m, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
