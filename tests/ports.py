"""Loopback ports for the tests' servers (planted runtimes, mlx_lm.server, sshd nodes)."""

from __future__ import annotations

import itertools
import os
import socket

_NEXT = itertools.count()


def free_port(address: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range (32768-60999 here), in a band of this
    xdist worker's own. A runtime the agent restarts must find its port still free, and the
    kernel hands out ephemeral ports to every bind(0) and outgoing connection of every
    test: one picked there was taken in between once ("Address already in use")."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    base = 20000 + 2000 * worker
    for _ in range(2000):
        port = base + next(_NEXT) % 2000
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:  # a service's, or one this worker still uses
                continue
            return port
    raise RuntimeError(f"no free port on {address} in {base}-{base + 1999}")


def wait_served(url: str, timeout_s: float = 10.0) -> bool:
    """Whether an OpenAI-style server at ``url`` answers ``/v1/models`` within ``timeout_s``
    (a planted runtime or mlx_lm.server the test started)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False
