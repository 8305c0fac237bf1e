"""Building the versioned job spec the controller sends to an agent."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from agent import SCHEMA
from agent.fingerprint import fingerprint

from .errors import ConfigError

PROMPTS = Path(__file__).parent / "prompts"
DEFAULT_WORKLOADS = ("code", "prose")


def load_workload(name_or_path: str) -> dict:
    """A shipped workload by name (``code``, ``prose``) or a user's JSONL prompt file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROMPTS / f"{name_or_path}.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in PROMPTS.glob("*.jsonl")))
        raise ConfigError(f"no workload {name_or_path!r} (shipped: {known})", str(path)) from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            w = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"invalid JSON: {e.msg}", str(path), lineno) from None
        missing = {"name", "prompt", "max_tokens"} - set(w)
        if missing:
            raise ConfigError(f"prompt record lacks {', '.join(sorted(missing))}", str(path),
                              lineno)
        sha = hashlib.sha256(w["prompt"].encode()).hexdigest()
        if w.get("prompt_sha256", sha) != sha:
            raise ConfigError("prompt text does not match its prompt_sha256 (edited?)",
                              str(path), lineno)
        out.append({**w, "prompt_sha256": sha})
    if len(out) != 1:
        raise ConfigError(f"expected one prompt record, found {len(out)}", str(path))
    return out[0]


def build_job(models_dir: Path, workloads: list[str] | None = None, *,
              max_tokens: int | None = None, repetitions: int = 1,
              draft_widths: list[int] | None = None, pins: dict | None = None) -> dict:
    """A schema-1 job for the pair in ``models_dir`` (``target/`` and ``draft/``)."""
    models = {}
    for role in ("target", "draft"):
        d = models_dir / role
        try:
            models[role] = {"path": str(d.resolve()), "fingerprint": fingerprint(d)}
        except FileNotFoundError as e:
            raise ConfigError(f"{e}; build the pair with `specfleet demo-models build "
                              f"{models_dir}`", str(d)) from None
    ws = [load_workload(w) for w in (workloads or DEFAULT_WORKLOADS)]
    if max_tokens:
        ws = [{**w, "max_tokens": max_tokens} for w in ws]
    return {
        "schema": SCHEMA, "job_id": uuid.uuid4().hex[:12], "models": models, "workloads": ws,
        "base": {"num_draft_tokens": 3, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                 "min_p": 0.0},
        "knobs": {"num_draft_tokens": draft_widths or [2, 3, 4, 6]},
        "repetitions": repetitions, "warmup_tokens": 16, "decode_skip_tokens": 64, "seed": 0,
        "pins": pins or {},
    }
