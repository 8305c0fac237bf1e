"""Node leases: one controller at a time runs a sweep on a node."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable

from ..errors import SpecfleetError
from ..store import Store


def controller_id() -> str:
    """This controller as a lease holder: ``host:pid:nonce``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def dead_here(holder: str) -> bool:
    """Is a lease holder ("host:pid:nonce") a controller of this machine that has exited?"""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's controller: its lease expires on its own
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def hold_lease(store: Store, node: str, holder: str, sweep_id: str, ttl_s: float,
               say: Callable[[str], None]) -> None:
    """Take or renew ``node``'s lease for ``holder``; a node leased to a live controller
    is an error naming who holds it and until when."""
    lease = store.acquire_lease(node, holder, sweep_id, ttl_s)
    if not lease["ours"] and dead_here(lease["holder"]):
        # a controller of this machine that is gone (killed, crashed): its lease would
        # hold the node until it expires for no one
        if store.take_lease(node, lease["holder"], holder, sweep_id, ttl_s):
            say(f"reclaimed the node's lease from controller {lease['holder']} "
                f"(sweep {lease['sweep_id']}), which is no longer running")
            return
        lease = store.acquire_lease(node, holder, sweep_id, ttl_s)
    if not lease["ours"]:
        raise SpecfleetError(
            f"node busy: leased by {lease['holder']} for sweep {lease['sweep_id']} until "
            f"{lease['expires_at']:%Y-%m-%d %H:%M:%S}")
