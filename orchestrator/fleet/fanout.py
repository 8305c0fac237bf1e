"""Run one coroutine per host with bounded concurrency; every host gets an outcome.

``ok``, ``failed`` (the command, its exit status and stderr tail) or ``unreachable``
(with the reason) — never stopping at the first bad host, as Ansible reports
failed vs unreachable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import RemoteError, SpecfleetError, UnreachableError
from .inventory import Host
from .transport import SSHOptions, connect


@dataclass
class Outcome:
    host: str
    status: str  # ok | failed | unreachable
    detail: str | None = None
    value: Any = None
    command: str | None = None
    exit_status: int | None = None
    stderr_tail: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


async def fan_out(hosts: list[Host], fn: Callable[[Host, Any], Awaitable[Any]],
                  options: SSHOptions) -> list[Outcome]:
    """``fn(host, transport)`` on every host, at most ``options.concurrency`` at once."""
    sem = asyncio.Semaphore(options.concurrency)

    async def one(h: Host) -> Outcome:
        t0 = time.monotonic()
        async with sem:
            try:
                async with connect(h, options) as t:
                    value = await fn(h, t)
                out = value if isinstance(value, Outcome) else Outcome(h.name, "ok", value=value)
            except RemoteError as e:
                tail = "\n".join(e.stderr.strip().splitlines()[-5:])
                out = Outcome(h.name, "failed", str(e), command=e.command,
                              exit_status=e.exit_status, stderr_tail=tail)
            except UnreachableError as e:
                out = Outcome(h.name, "unreachable", e.reason)
            except SpecfleetError as e:
                out = Outcome(h.name, "failed", str(e))
            except Exception as e:  # a bug must not sink the other hosts or hide this one
                import traceback

                where = traceback.extract_tb(e.__traceback__)[-1]
                out = Outcome(h.name, "failed", f"internal error: {type(e).__name__}: {e} (at "
                              f"{Path(where.filename).name}:{where.lineno}; please report it)")
        out.seconds = round(time.monotonic() - t0, 3)
        return out

    return list(await asyncio.gather(*(one(h) for h in hosts)))


def run_fan_out(hosts, fn, options: SSHOptions | None = None) -> list[Outcome]:
    """``fan_out`` to its end; SIGINT/SIGTERM cancel it and raise ``signals.Detach``."""
    from . import signals

    return signals.run(fan_out(hosts, fn, options or SSHOptions()))


# ran to its end, measured all it planned, but every run was set aside as unreliable: no
# failure (the exit status stays 0, nothing to retry), and no result either (said as such)
DONE = ("ok", "unreliable")


def not_ok(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status not in DONE]


def write_retry_file(outcomes: list[Outcome], path: Path) -> Path | None:
    """The not-ok hosts, one per line, for ``--limit @path``; removed when all were ok."""
    bad = not_ok(outcomes)
    try:
        if not bad:
            path.unlink(missing_ok=True)
            return None
        path.write_text("".join(f"{o.host}\n" for o in bad))
    except OSError as e:  # the results are shown and stored; only the list is lost
        raise SpecfleetError(f"--failed-hosts-file {path}: cannot write it ({e.strerror}); "
                             f"the hosts that were not ok: {', '.join(o.host for o in bad)}"
                             ) from None
    return path


def summary_line(outcomes: list[Outcome]) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in ("ok", "failed", "unreachable")}
    other = sorted({o.status for o in outcomes} - set(counts))  # busy, stopped
    return (f"{len(outcomes)} hosts: {counts['ok']} ok, {counts['failed']} failed, "
            f"{counts['unreachable']} unreachable"
            + "".join(f", {sum(o.status == s for o in outcomes)} {s}" for s in other))
