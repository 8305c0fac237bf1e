"""YAML loading that remembers line numbers, so errors can name file:line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import ConfigError


class LineDict(dict):
    """A mapping that knows the line of each key (1-based) and of itself."""

    line: int = 0
    key_lines: dict


@dataclass(frozen=True)
class VaultText:
    """A ``!vault`` scalar as written in the file, decrypted only on use (by ``fleet.vault``,
    which needs a password: a YAML file is read without one)."""

    ciphertext: str
    line: int | None = None

    def __str__(self) -> str:  # never leak into a message or a listing
        return "<vaulted>"


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    d = LineDict()
    d.line = node.start_mark.line + 1
    d.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in d:
            raise ConfigError(f"duplicate key {key!r}", None, key_node.start_mark.line + 1)
        d[key] = loader.construct_object(value_node, deep=True)
        d.key_lines[key] = key_node.start_mark.line + 1
    return d


def _construct_vault(loader: _Loader, node: yaml.ScalarNode):
    return VaultText(loader.construct_scalar(node), node.start_mark.line + 1)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("!vault", _construct_vault)


def load_yaml(path: Path):
    """Parse a YAML file; every error becomes a ConfigError naming file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", str(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", str(path)) from None
    try:
        return yaml.load(text, Loader=_Loader)
    except ConfigError as e:
        raise ConfigError(str(e).split(": ", 1)[-1], str(path), e.line) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError(f"invalid YAML: {e.problem or e.context}", str(path), line) from None


def line_of(d, key=None) -> int | None:
    if isinstance(d, LineDict):
        return d.key_lines.get(key, d.line) if key is not None else d.line
    return None
