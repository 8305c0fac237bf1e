"""The one exception root of specfleet and its few flat subclasses."""

from __future__ import annotations


class SpecfleetError(Exception):
    """Base of every error specfleet raises on purpose."""


class ConfigError(SpecfleetError):
    """A user file (inventory, job, plan) is missing or malformed."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path, self.line = path, line
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(where + message)


class RemoteError(SpecfleetError):
    """A command on a node failed; carries host, command, exit status and stderr."""

    def __init__(self, host: str, command: str, exit_status: int | None, stderr: str):
        self.host, self.command, self.exit_status, self.stderr = host, command, exit_status, stderr
        tail = stderr.strip().splitlines()[-5:]
        super().__init__(f"{host}: `{command}` exited {exit_status}" +
                         (": " + " | ".join(tail) if tail else ""))


class UnreachableError(SpecfleetError):
    """A node could not be reached or the connection died mid-command."""

    def __init__(self, host: str, reason: str):
        self.host, self.reason = host, reason
        super().__init__(f"{host}: unreachable: {reason}")


class RemoteTimeoutError(UnreachableError, TimeoutError):
    """A node did not answer in time."""


class StoreError(SpecfleetError):
    """The result store cannot be opened or written."""
