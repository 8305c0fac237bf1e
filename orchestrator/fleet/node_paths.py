"""Where things live on a node, and the agent folder the controller copies there."""

from __future__ import annotations

from pathlib import Path

import agent

AGENT_DIR = Path(agent.__file__).resolve().parent


def expand_root(root: str, home: str) -> str:
    """``~`` / ``~/x`` in a node root, with the node's own home."""
    return home + root[1:] if root == "~" or root.startswith("~/") else root
