"""Plans and locks for tests: the demo pair, the controller's own Python, no managed env."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

from orchestrator.sweep.lock import write_lock
from orchestrator.sweep.plan import load_plan


def plan_text(model_pair: Path, use=("code",), widths=(2,), max_tokens=32, quality=False,
              repetitions=1, context=("short",), extra: str = "") -> str:
    pins = [f"{d}=={metadata.version(d)}" for d in ("mlx", "mlx-lm")]
    return "\n".join([
        "name: test-plan", "environment:",
        f'  python: "{sys.version_info.major}.{sys.version_info.minor}"',
        f"  packages: {json.dumps(pins)}", "  platforms: []",
        "models:", f"  target: {model_pair / 'target'}", f"  draft: {model_pair / 'draft'}",
        "workloads:", f"  use: {json.dumps(list(use))}", f"  context: {json.dumps(list(context))}",
        f"  max_tokens: {max_tokens}", f"  quality: {'true' if quality else 'false'}",
        "sweep:", (f"  knobs: {{num_draft_tokens: {json.dumps(list(widths))}}}" if widths
                   else "  knobs: {temperature: [0.0]}"),  # an http engine sweeps no width
        f"  repetitions: {repetitions}", extra]) + "\n"


def make_lock(folder: Path, model_pair: Path, name: str = "plan.yml", **kw) -> Path:
    """Write a plan and lock it; returns the lock's path."""
    plan = folder / name
    plan.write_text(plan_text(model_pair, **kw))
    return write_lock(load_plan(plan), lambda m: None)
