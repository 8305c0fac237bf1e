"""How a sweep runs: the options every node's run of it shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..fleet.transport import SSHOptions


@dataclass
class SweepOptions:
    ssh: SSHOptions = field(default_factory=SSHOptions)
    provision: bool = True
    reconnect_timeout_s: float = 120.0
    lease_ttl_s: float = 120.0
    trigger: str = "manual"
    # what a hint adds to `specfleet sweep --attach/--resume ID` so it runs as written:
    # the -i and --db this command was given (a password masked)
    hint_args: str = ""
    db_hint: str = ""  # its --db part alone


def again_command(sweep_id: str, opts: SweepOptions, verb: str) -> str:
    """The command that picks a sweep up again (``attach``, ``resume``), as the user can
    paste it."""
    return f"specfleet sweep --{verb} {sweep_id}{opts.hint_args}"
