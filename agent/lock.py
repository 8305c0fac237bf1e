"""One job per node: an OS-level lock (flock) on a file that names its holder."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from .errors import NodeBusy


class NodeLock:
    """Held for the life of the agent process; the kernel releases it if we die."""

    def __init__(self, path: Path, job_id: str):
        self.path, self.job_id = path, job_id
        self._fd: int | None = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                h = json.loads(holder)
                who = f"job {h['job_id']} (pid {h['pid']}, since {h['started']})"
            except (ValueError, KeyError):
                h, who = None, "another agent"
            busy = NodeBusy(f"node is busy: {who} holds {self.path}")
            busy.holder = h  # for callers that word it their own way
            raise busy from None
        info = json.dumps({"job_id": self.job_id, "pid": os.getpid(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc):
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
