"""Model weight fingerprints: sha256 per file and a manifest hash.

Shared by agent and controller (the controller imports this module) so both
compute the identity of a model the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

# Files mlx-lm reads for a model; other files in the folder do not change results.
MODEL_FILE_PATTERNS = ("*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
                       "generation_config.json", "model.safetensors.index.json")


# A plan's ``models.verify``: how old a file's last full hash may be before it is re-read.
VERIFY_MAX_AGE_S: dict[str, float | None] = {"always": 0.0, "daily": 86400.0, "never": None}


def stat_key(st: os.stat_result) -> list[int]:
    """What a cached hash is keyed on. A write changes ctime and ``utime`` cannot set it back,
    so a flipped byte with its mtime restored still misses; a replaced file has a new inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def cache_fresh(entry: dict | None, st: os.stat_result, max_age_s: float | None,
                now: float) -> bool:
    """Can a cached hash stand in for reading the file again?"""
    if not entry or entry.get("key") != stat_key(st):
        return False
    return max_age_s is None or now - entry.get("verified_at", 0) < max_age_s


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


def cached_fingerprint(model_dir: str | Path, cache_file: Path,
                       verify: str = "daily") -> tuple[str, dict]:
    """The same fingerprint, re-hashing files whose size, mtime, inode or ctime changed,
    and every file whose last full hash is older than ``verify`` allows (always, daily,
    never).

    The cache maps absolute path → {key, sha256, verified_at}. Returns the fingerprint and
    how many files were hashed vs taken from the cache.
    """
    max_age = VERIFY_MAX_AGE_S[verify]
    model_dir = Path(model_dir).resolve()
    files = _files_or_raise(model_dir)
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    stats = {"hashed_files": 0, "cached_files": 0}
    m = []
    now = time.time()
    for p in files:
        st = p.stat()
        entry = cache.get(str(p))
        if cache_fresh(entry, st, max_age, now):
            sha = entry["sha256"]
            stats["cached_files"] += 1
        else:
            sha = file_sha256(p)
            cache[str(p)] = {"key": stat_key(st), "sha256": sha, "verified_at": now}
            stats["hashed_files"] += 1
        m.append({"path": p.name, "size": st.st_size, "sha256": sha})
    if stats["hashed_files"]:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        tmp.replace(cache_file)
    return _manifest_hash(m), stats
