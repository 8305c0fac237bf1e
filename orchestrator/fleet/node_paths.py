"""Where things live on a node, and the agent folder the controller copies there."""

from __future__ import annotations

import re
from pathlib import Path

import agent

from ..errors import SpecfleetError

AGENT_DIR = Path(agent.__file__).resolve().parent


def expand_root(root: str, home: str) -> str:
    """``~`` / ``~/x`` in a node root, with the node's own home."""
    return home + root[1:] if root == "~" or root.startswith("~/") else root


_ID = re.compile(r"[0-9a-f]{16}")  # agent and env ids: sha256 prefixes (provision.py)


def placement_problems(host, root: str, row, sweep_id: str) -> list[str]:
    """What of a sweep node's stored placement (``sweep_nodes``: root, python, agent_dir,
    job and journal paths) is not what the inventory host would choose. The store is not
    trusted to say what runs on a node: anyone who can write it (a shared PostgreSQL, a
    ``db=`` in a specfleet.toml) would otherwise run code as the user. ``root`` is the
    host's root expanded with the node's home."""
    out: list[str] = []

    def bad(what: str, stored, want: str) -> None:
        out.append(f"{what} is {stored!r} in the store but the inventory would use {want}")

    envs, agents = f"{root}/envs/", f"{root}/agents/"
    if row.root is not None and row.root != root:
        bad("its root", row.root, repr(root))
    py = row.python
    if py is not None and py != host.python and not (
            py.startswith(envs) and py.endswith("/bin/python")
            and _ID.fullmatch(py[len(envs):-len("/bin/python")])):
        bad("its Python", py, f"{host.python!r} or {envs}<env id>/bin/python")
    ad = row.agent_dir
    if ad is not None and not (ad.startswith(agents) and _ID.fullmatch(ad[len(agents):])):
        bad("its agent folder", ad, f"{agents}<agent id>")
    for what, stored, want in (("its job file", row.job_path, f"{root}/jobs/{sweep_id}.json"),
                               ("its journal", row.journal_path,
                                f"{root}/jobs/{sweep_id}.events.jsonl")):
        if stored is not None and stored != want:
            bad(what, stored, repr(want))
    return out


def check_placement(host, root: str, row, sweep_id: str) -> None:
    """Refuse (nothing run) a stored placement the inventory would not choose."""
    problems = placement_problems(host, root, row, sweep_id)
    if problems:
        raise SpecfleetError(
            f"{host.name}: refusing to run anything for sweep {sweep_id}: "
            + "; ".join(problems) + ". The store may have been edited; check who can write "
            "it, and the inventory's specfleet_python / specfleet_root for this node")
