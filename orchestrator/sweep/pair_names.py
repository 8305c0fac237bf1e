"""Model pairs as people name them: the plan's source, else the models' folders."""

from __future__ import annotations

from pathlib import Path

from agent.protocol import model_roles

CALIBRATION_MARK = " (calibration)"


def model_name(doc: dict, role: str) -> str:
    """A model as people name it: its folder (with its parent when the folder is just
    "target" or "draft")."""
    p = Path(doc["models"][role]["path"])
    name = p.parent.name + "/" + p.name if p.name in ("target", "draft") else p.name
    # a calibration target is an instrument: its pair's series say so wherever they are named
    return name + CALIBRATION_MARK if doc["models"][role].get("calibration") else name


def model_pair_name(doc: dict) -> str:
    """The pair as people name it: the plan's models.source (and revision), else folders."""
    m = doc["models"]
    if m.get("source"):
        return m["source"] + (f"@{m['revision']}" if m.get("revision") else "") + (
            CALIBRATION_MARK if m["target"].get("calibration") else "")
    return " / ".join(model_name(doc, r) for r in ("target", "draft"))


def role_names(doc: dict) -> dict[str, str]:
    """Each model of a lineup by name (a lineup's pairs are named from these)."""
    roles = model_roles(doc["models"])
    return {r: model_name(doc, r) for r in roles} if len(roles) > 2 else {}
