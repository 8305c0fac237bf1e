"""``python -m agent follow JOURNAL --from-seq N [--pid PID]``: stream a journal.

Prints, one per line, every complete line the store may not account for yet (each with
``seq > N``, and the others ``reread.Reread`` names) as it is written, and
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

from .limits import MAX_EVENT_BYTES
from .reread import Reread


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
        fd = f.fileno()
        pick = Reread(from_seq, lambda at, n: os.pread(fd, n, at))
        buf = b""
        at = 0  # the journal offset buf starts at
        skipping = False  # inside a line longer than any event: its head went out already
        while True:
            chunk = f.read(1 << 20)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                starts = []
                for line in lines:
                    starts.append(at)
                    at += len(line) + 1
                if skipping and lines:
                    lines, starts, skipping = lines[1:], starts[1:], False  # its tail
                if len(buf) > MAX_EVENT_BYTES:
                    # bounded memory: the controller sets the line aside by its length
                    if not skipping:
                        lines.append(buf[:MAX_EVENT_BYTES + 1])
                        starts.append(at)
                    at += len(buf)
                    buf, skipping = b"", True
                for line, start in zip(lines, starts):
                    if not line.strip():
                        continue
                    # a line over the limit goes out as its head, however it arrived (whole
                    # in one read or not): the row the controller keeps is the same each time,
                    # and `sweeps verify` hashes that head on the node
                    line = line[:MAX_EVENT_BYTES + 1]
                    # a line the controller cannot read is still sent: it decides, and
                    # keeps it aside with a reason rather than leaving a silent gap
                    for x in pick.pick(line, start):
                        out.write(x + b"\n")
                out.flush()
                continue
            if not alive(pid):
                # one last read: the agent may have written just before exiting
                rest = f.read()
                if rest:  # read again from there: buf holds only bytes not split yet
                    f.seek(-len(rest), os.SEEK_CUR)
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
