"""One job per node: OS-level locks (flock) on files that name their holder.

Two locks: one under the node's specfleet root, and one for the whole machine, so that two
controllers with different roots (or different users) never benchmark the same Mac at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from .errors import NodeBusy


class NodeLock:
    """Held for the life of the agent process; the kernel releases it if we die."""

    def __init__(self, path: Path, job_id: str, *, shared: bool = False, note: str = ""):
        self.path, self.job_id, self.shared, self.note = path, job_id, shared, note
        self._fd: int | None = None

    def _open(self) -> int:
        if not self.shared:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        # a machine-wide file in a sticky world-writable folder (/tmp): every user must be
        # able to open it, and Linux refuses O_CREAT on another user's file there
        try:
            return os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            os.fchmod(fd, 0o666)  # whatever the umask: other users' agents take it too
            return fd
        except FileExistsError:  # another agent made it just now
            return os.open(self.path, os.O_RDWR)

    def __enter__(self):
        try:
            fd = self._open()
        except PermissionError as e:
            raise NodeBusy(f"cannot open the machine lock {self.path} ({e.strerror}); "
                           "another user's agent made it unwritable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                h = json.loads(holder)
                who = (f"job {h['job_id']} (pid {h['pid']}, since {h['started']}"
                       + (f", command {h['command']}" if h.get("command") else "")
                       + (f", {h['note']})" if h.get("note") else ")"))
            except (ValueError, KeyError):
                h, who = None, "another agent"
            busy = NodeBusy(f"node is busy: {who} holds {self.path}")
            busy.holder = h  # for callers that word it their own way
            raise busy from None
        info = json.dumps({"job_id": self.job_id, "pid": os.getpid(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "note": self.note,
                           "command": _command_line()})
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


def _command_line() -> str:
    """This process's command line, for whoever finds the lock taken (shortened)."""
    import shlex

    argv = list(sys.argv)
    if argv and Path(argv[0]).name == "__main__.py":  # `python -m agent ...`, as it was run
        argv[:1] = ["-m", Path(argv[0]).parent.name]
    line = shlex.join([Path(sys.executable).name, *argv])
    return line if len(line) <= 400 else line[:399] + "…"


def machine_lock_path() -> Path:
    """The machine-wide lock: ``SPECFLEET_MACHINE_LOCK`` if set (tests give each simulated
    machine its own), else one file in /tmp that every user's agent shares."""
    return Path(os.environ.get("SPECFLEET_MACHINE_LOCK") or "/tmp/specfleet-machine.lock")
