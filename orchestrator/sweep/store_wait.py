"""Store calls that wait out a store that is down: the node's journal keeps every event
meanwhile, so the wait costs nothing but time."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from ..errors import StoreError
from ..store.errors import StoreDown, StoreFull, StoreRefused, translated

STORE_RETRY_MAX_S = 10.0   # a store that is down is asked again at least this often
STORE_DOWN_SAY_S = 60.0    # once the wait is that long, "still unreachable" once a minute


def _call(fn: Callable[..., Any], args: tuple) -> Any:
    with translated():
        return fn(*args)


async def with_store(fn: Callable[..., Any], *args: Any, sweep_id: str,
                     say: Callable[[str], None], launched: bool = True) -> Any:
    """``fn(*args)`` in a thread, waiting out a store that is down for as long as it
    takes (bounded backoff). A store that refuses what it was sent, or is out of space,
    is an error at once, naming the command that stores the events later (or, before
    any agent was ``launched``, that nothing was measured and the sweep starts again)."""
    down_since, delay, said = None, 0.5, -math.inf
    while True:
        try:
            result = await asyncio.to_thread(_call, fn, args)
        except StoreFull as e:
            then = (f"free space, then `specfleet sweep --attach {sweep_id}` (the node's "
                    "journal keeps every event)" if launched else
                    "free space, then start the sweep again (no agent was started on this "
                    "node: nothing was measured)")
            raise StoreError(f"the controller's store is out of disk space ({e.first_line}); "
                             f"{then}") from None
        except StoreRefused as e:
            raise StoreError(f"the store refused a write ({e.first_line[:300]}); the node's "
                             f"journal keeps every event: `specfleet sweep --attach "
                             f"{sweep_id}` stores them once this is fixed") from None
        except StoreDown as e:
            now = time.monotonic()
            down_since = down_since or now
            # each longer wait is said, then once a minute: 22 nodes, not 22 lines a second
            if delay < STORE_RETRY_MAX_S or now - said >= STORE_DOWN_SAY_S:
                said = now
                say(f"store unreachable for {now - down_since:.0f}s ({e.first_line[:100]}); "
                    f"retrying in {delay:g}s. Nothing is lost: the node's journal keeps every "
                    "event, stored once the store answers")
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MAX_S)
            continue
        if down_since is not None:
            say(f"store reachable again after {time.monotonic() - down_since:.0f}s; "
                "going on, nothing lost")
        return result
