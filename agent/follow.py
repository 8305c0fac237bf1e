"""``python -m agent follow JOURNAL --from-seq N [--pid PID]``: stream a journal.

Prints, one per line, every complete event with ``seq > N`` as it is written, and
exits once the agent process is gone and the journal is drained. A final
``job_finished``/``job_failed`` does not end it while the agent runs: a forged or damaged
line must not end following early. The controller runs this over SSH; when the link
drops it reconnects and follows again from the last sequence it stored.

Lines go out as the bytes they are (the controller's decode boundary judges them), and no
line stops the follower: one that is not JSON, or nests deeper than the parser's stack,
is still sent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .protocol import MAX_EVENT_BYTES


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours is not running; on Linux, look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _seq(line: bytes) -> int | None:
    """The line's seq, when it is a readable event; None for anything else."""
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # a hostile line may nest 100,000 levels deep
        return None
    seq = event.get("seq") if isinstance(event, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def follow(journal: Path, from_seq: int, pid: int | None, poll_s: float = 0.05,
           wait_s: float = 30.0, out=None) -> int:
    out = out if out is not None else sys.stdout.buffer
    deadline = time.monotonic() + wait_s
    while not journal.exists():
        if not alive(pid) and time.monotonic() > deadline:
            print(json.dumps({"follow": "no journal", "journal": str(journal)}), file=sys.stderr)
            return 3
        time.sleep(poll_s)
    with open(journal, "rb") as f:
        buf = b""
        skipping = False  # inside a line longer than any event: its head went out already
        while True:
            chunk = f.read(1 << 20)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if skipping and lines:
                    lines, skipping = lines[1:], False  # the long line's tail
                if len(buf) > MAX_EVENT_BYTES:
                    # bounded memory: the controller sets the line aside by its length
                    if not skipping:
                        lines.append(buf[:MAX_EVENT_BYTES + 1])
                    buf, skipping = b"", True
                for line in lines:
                    if not line.strip():
                        continue
                    # a line the controller cannot read is still sent: it decides, and
                    # keeps it aside with a reason rather than leaving a silent gap
                    if from_seq <= 0 or (seq := _seq(line)) is None or seq > from_seq:
                        out.write(line + b"\n")
                out.flush()
                continue
            if not alive(pid):
                # one last read: the agent may have written just before exiting
                rest = f.read()
                if rest:
                    buf += rest
                    continue
                return 0
            time.sleep(poll_s)


def pid_file(journal: Path) -> Path:
    return journal.with_name(journal.name + ".pid")


def read_pid(journal: Path) -> int | None:
    try:
        return int(pid_file(journal).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
