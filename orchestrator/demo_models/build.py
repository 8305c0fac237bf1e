"""Build the demo pair, reusing the committed result when the build key matches.

The build key is the sha256 of (trainer source, corpus, trainer arguments, mlx
version). ``orchestrator/demo_models/pair/`` (package data: an installed wheel reuses it
too) holds one trained pair plus ``BUILD.json``
naming its key and every file's sha256; a matching key means copying those files
(verified) instead of training for several minutes.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from ..errors import SpecfleetError
from .corpus import corpus_documents, corpus_sha256
from .train import DEFAULT_ARGS

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMMITTED = Path(__file__).resolve().parent / "pair"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def build_key(args: dict | None = None) -> dict:
    """Everything the trained weights depend on, and its hash."""
    args = {**DEFAULT_ARGS, **(args or {})}
    parts = {
        "trainer_sha256": hashlib.sha256(
            (Path(__file__).parent / "train.py").read_bytes()).hexdigest(),
        "corpus_sha256": corpus_sha256(corpus_documents()),
        "args": args,
        "mlx_version": metadata.version("mlx"),
    }
    parts["key"] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return parts


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(root: Path) -> dict[str, str]:
    return {f"{m}/{f}": file_sha256(root / m / f) for m in ("target", "draft") for f in FILES}


def openblas_env() -> dict[str, str]:
    """Preload OpenBLAS when a wheel ships it: mlx[cpu]'s reference BLAS is ~30x slower."""
    env = dict(os.environ)
    if sys.platform != "linux":
        return env
    for base in map(Path, sys.path):
        lib = base / "cmeel.prefix" / "lib" / "libopenblas.so.0"
        # the wheel's OpenBLAS links libgfortran, a system package (scripts/system-deps): a
        # preload that cannot load would stop every process it is given to
        if lib.exists() and ctypes.util.find_library("gfortran"):
            env["LD_PRELOAD"] = str(lib)
            env.setdefault("OPENBLAS_NUM_THREADS", "2")
            break
    return env


def build_demo_models(out: Path, *, retrain: bool = False, log=print,
                      committed: Path = COMMITTED) -> dict:
    """Write ``out/target`` and ``out/draft``; return the build record."""
    key = build_key()
    record_path = committed / "BUILD.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    out.mkdir(parents=True, exist_ok=True)
    if not retrain and record and record["key"] == key["key"]:
        for rel, sha in record["files"].items():
            src, dst = committed / rel, out / rel
            if file_sha256(src) != sha:
                raise SpecfleetError(f"committed model file {src} does not match BUILD.json; "
                                     "run `specfleet demo-models build --retrain`")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        shutil.copyfile(record_path, out / "BUILD.json")
        log(f"demo models: reused committed pair (build key {key['key'][:12]})")
        return {**record, "reused": True}
    local = _verified_record(out, key["key"])
    if not retrain and local:
        log(f"demo models: {out} already holds build key {key['key'][:12]}")
        return {**local, "reused": True}
    log(f"demo models: training (build key {key['key'][:12]}); this takes minutes")
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        # A child process, so LD_PRELOAD of OpenBLAS takes effect before mlx loads.
        code = ("import sys, json, pathlib;"
                "from orchestrator.demo_models.corpus import corpus_documents;"
                "from orchestrator.demo_models.train import build_pair;"
                "build_pair(corpus_documents(), pathlib.Path(sys.argv[1]))")
        subprocess.run([sys.executable, "-c", code, tmp], check=True, env=openblas_env(),
                       cwd=PROJECT_ROOT)
        for m in ("target", "draft"):
            if (out / m).exists():
                shutil.rmtree(out / m)
            os.replace(Path(tmp) / m, out / m)
    record = {**key, "files": _manifest(out)}
    (out / "BUILD.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return {**record, "reused": False}


def _verified_record(folder: Path, key: str) -> dict | None:
    """The build record of a folder trained earlier, if its key and files still match."""
    try:
        record = json.loads((folder / "BUILD.json").read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != key:
        return None
    try:
        if any(file_sha256(folder / rel) != sha for rel, sha in record["files"].items()):
            return None
    except OSError:
        return None
    return record


def commit_pair(src: Path) -> None:
    """Store a freshly trained pair as the committed cache (maintainers only)."""
    record = {**build_key(), "files": _manifest(src)}
    for rel in record["files"]:
        (COMMITTED / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, COMMITTED / rel)
    (COMMITTED / "BUILD.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
