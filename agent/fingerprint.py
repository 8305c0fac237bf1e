"""Model weight fingerprints: sha256 per file and a manifest hash.

Shared by agent and controller (the controller imports this module) so both
compute the identity of a model the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def _manifest_hash(m: list[dict]) -> str:
    return "sha256:" + hashlib.sha256(
        json.dumps(m, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _files_or_raise(model_dir: Path) -> list[Path]:
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    files = model_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no model files in {model_dir}")
    return files


def fingerprint(model_dir: str | Path) -> str:
    """The manifest hash: ``sha256:<hex>`` over the canonical JSON manifest."""
    _files_or_raise(Path(model_dir))
    return _manifest_hash(manifest(Path(model_dir)))


def cached_fingerprint(model_dir: str | Path, cache_file: Path) -> tuple[str, dict]:
    """The same fingerprint, re-hashing only files whose size or mtime changed.

    The cache maps absolute path → (size, mtime_ns, sha256). Returns the fingerprint and
    how many files were hashed vs taken from the cache.
    """
    model_dir = Path(model_dir).resolve()
    files = _files_or_raise(model_dir)
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    stats = {"hashed_files": 0, "cached_files": 0}
    m = []
    for p in files:
        st = p.stat()
        entry = cache.get(str(p))
        if entry and entry["size"] == st.st_size and entry["mtime_ns"] == st.st_mtime_ns:
            sha = entry["sha256"]
            stats["cached_files"] += 1
        else:
            sha = file_sha256(p)
            cache[str(p)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
            stats["hashed_files"] += 1
        m.append({"path": p.name, "size": st.st_size, "sha256": sha})
    if stats["hashed_files"]:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        tmp.replace(cache_file)
    return _manifest_hash(m), stats
