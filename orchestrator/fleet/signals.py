"""SIGINT and SIGTERM detach the controller, from a terminal or from `kill`, at once.

The agents run detached on their nodes, so a controller that is asked to go only has to
stop following: the work in flight is cancelled (a local follower's process group is ended,
an SSH link closed) and the command says how to follow or stop the sweep. A second signal
while that happens changes nothing (it used to raise inside asyncio's shutdown: "Event loop
is closed"); the detach is already under way and bounded.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# 128 + the signal, as shells report it
EXIT_STATUS: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Detach(KeyboardInterrupt):
    """The controller was asked to go (``signum``): a KeyboardInterrupt, so whatever
    already explains Ctrl-C explains SIGTERM too."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS.get(self.signum, 130)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class DetachExit(SystemExit):
    """The exit after a detach was said (its code: ``EXIT_STATUS``)."""


# Set by the command line's entry when this process ends with the command: after a detach
# the signals then stay ignored until it does (in-process callers, tests, get them back).
WHOLE_PROCESS = False


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _handlers(handler) -> Iterator[None]:
    """``handler`` for SIGINT and SIGTERM, the previous ones restored after. SIGINT is taken
    even where it was ignored (a script's ``cmd &`` inherits SIG_IGN): for this controller
    it only detaches, and `kill -INT PID` must not go unanswered."""
    if not _main_thread():  # signals reach only the main thread's handlers
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    except (Detach, DetachExit):
        if WHOLE_PROCESS:  # leaving: a second signal must not interrupt the leaving
            ignore_signals()
        else:
            _restore(old)
        raise
    except BaseException:
        _restore(old)
        raise
    _restore(old)


def _restore(old: dict) -> None:
    for s, h in old.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)


@contextlib.contextmanager
def detach_on_signals() -> Iterator[None]:
    """Around a command: SIGINT or SIGTERM in its synchronous parts raises ``Detach``."""
    def raise_detach(signum, frame):
        ignore_signals()  # we are leaving: a second signal must not interrupt the leaving
        raise Detach(signum)

    with _handlers(raise_detach):
        yield


def ignore_signals() -> None:
    """While a detach is said and the process exits: a second signal changes nothing."""
    if _main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, but SIGINT or SIGTERM cancels ``coro`` (its cleanup runs) and
    raises ``Detach``; a second signal during that cleanup is ignored."""
    import asyncio  # here: every command imports this module, few run a loop (~0.05 CPU-s)

    if not _main_thread():
        return asyncio.run(coro)
    got: list[int] = []
    with asyncio.Runner() as runner:
        loop = runner.get_loop()
        task = loop.create_task(coro)

        def on_signal(signum, frame):
            if not got:
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(task.cancel)
            got.append(signum)

        # held until the runner has closed: its own cleanup (cancelling what is left,
        # joining the executor) is part of the detach
        with _handlers(on_signal):
            try:
                return loop.run_until_complete(task)
            except asyncio.CancelledError:
                if got:
                    raise Detach(got[0]) from None
                raise
            finally:
                runner.close()
