"""The store's failures as the project's own errors: the one place that knows SQLAlchemy's.

Callers outside ``store/`` catch these, never ``sqlalchemy.exc``: ``failure(e)`` maps a
driver error to one of three kinds (down: worth waiting for; full: someone must free
space; refused: what was sent is wrong), and ``translated()`` raises that kind instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from ..errors import StoreError

# the store is unreachable or busy (stopped, restarting, locked by another process)
_DOWN = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
         sa_exc.DisconnectionError)


class StoreFailure(StoreError):
    """A store operation failed in the database layer; ``original`` is the driver's error."""

    def __init__(self, original: BaseException):
        self.original = original
        super().__init__(str(original))

    @property
    def first_line(self) -> str:
        """The error's first line (SQLAlchemy's text: the driver's class, then its message)."""
        return (str(self.original).splitlines() or [type(self.original).__name__])[0]

    @property
    def driver_message(self) -> str:
        """The driver's own first line, without SQLAlchemy's wrapping."""
        orig = getattr(self.original, "orig", None)
        return (str(orig if orig else self.original).splitlines() or [""])[0]


class StoreDown(StoreFailure):
    """The store cannot be reached or is busy: worth waiting for, however long."""


class StoreFull(StoreFailure):
    """The store is out of disk space: waiting alone never ends it."""


class StoreRefused(StoreFailure):
    """The store refused what it was sent (a constraint, a bad statement)."""


def _out_of_space(text: str) -> bool:
    return "disk is full" in text or "No space left" in text


def failure(e: BaseException) -> StoreFailure | None:
    """The project's error for a database error ``e``; None when ``e`` is not one."""
    if isinstance(e, StoreFailure):
        return e
    return _mapped(e) if isinstance(e, sa_exc.SQLAlchemyError) else None


def _mapped(e: sa_exc.SQLAlchemyError) -> StoreFailure:
    first = (str(e).splitlines() or [type(e).__name__])[0]
    if _out_of_space(first):
        return StoreFull(e)
    if getattr(e, "connection_invalidated", False) or isinstance(e, _DOWN):
        return StoreDown(e)
    return StoreRefused(e)


@contextmanager
def translated() -> Iterator[None]:
    """Run a block of store calls; a database error leaves it as a ``StoreFailure``."""
    try:
        yield
    except sa_exc.SQLAlchemyError as e:
        raise _mapped(e) from e
