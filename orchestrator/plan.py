"""Plan files (YAML): the pinned environment and the model pair a fleet should run.

Only the parts provisioning needs live here; unknown keys are errors with file:line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .yamlfile import line_of, load_yaml

TOP_KEYS = {"name", "environment", "models", "workloads", "sweep", "gates", "nodes"}
ENV_KEYS = {"python", "packages"}
MODEL_KEYS = {"target", "draft", "source", "revision"}


@dataclass(frozen=True)
class Plan:
    path: Path
    python: str
    packages: tuple[str, ...]
    models: dict[str, Path]
    raw: dict = field(default_factory=dict, compare=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _no_unknown(d: dict, allowed: set, path: Path, where: str) -> None:
    for key in d:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r} (allowed: "
                              f"{', '.join(sorted(allowed))})", str(path), line_of(d, key))


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("a plan is a YAML mapping", str(path))
    _no_unknown(data, TOP_KEYS, path, "plan")
    env = data.get("environment")
    if not isinstance(env, dict):
        raise ConfigError("plan: 'environment' (python, packages) is required", str(path),
                          line_of(data, "environment"))
    _no_unknown(env, ENV_KEYS, path, "environment")
    python = str(env.get("python", ""))
    if not python or python.count(".") != 1:
        raise ConfigError(f"environment.python: expected MAJOR.MINOR such as '3.11', got "
                          f"{python!r}", str(path), line_of(env, "python"))
    packages = env.get("packages")
    if not isinstance(packages, list) or not packages or \
            not all(isinstance(p, str) and "==" in p for p in packages):
        raise ConfigError("environment.packages: a list of exact pins like 'mlx-lm==0.32.2'",
                          str(path), line_of(env, "packages"))
    models = data.get("models")
    if not isinstance(models, dict):
        raise ConfigError("plan: 'models' (target, draft) is required", str(path),
                          line_of(data, "models"))
    _no_unknown(models, MODEL_KEYS, path, "models")
    pair = {}
    for role in ("target", "draft"):
        if role not in models:
            raise ConfigError(f"models.{role}: required", str(path), line_of(models))
        p = (path.parent / str(models[role])).resolve()
        if not p.is_dir():
            raise ConfigError(f"models.{role}: {p} is not a folder", str(path),
                              line_of(models, role))
        pair[role] = p
    return Plan(path=path, python=python, packages=tuple(packages), models=pair,
                raw=json.loads(json.dumps(data)))
