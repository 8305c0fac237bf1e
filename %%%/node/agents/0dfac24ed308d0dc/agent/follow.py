"""``python -m agent follow JOURNAL --from-seq N [--pid PID]``: stream a journal.

Prints, one per line, every complete event with ``seq > N`` as it is written, and
exits once the agent process is gone and the journal is drained (or after a final
``job_finished``/``job_failed``). The controller runs this over SSH; when the link
drops it reconnects and follows again from the last sequence it stored.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from .protocol import FINAL_EVENTS


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
           wait_s: float = 30.0, out=sys.stdout) -> int:
    deadline = time.monotonic() + wait_s
    while not journal.exists():
        if not alive(pid) and time.monotonic() > deadline:
            print(json.dumps({"follow": "no journal", "journal": str(journal)}), file=sys.stderr)
            return 3
        time.sleep(poll_s)
    with open(journal, "rb") as f:
        buf = b""
        while True:
            chunk = f.read(1 << 20)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                done = False
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        event = None
                    seq = event.get("seq") if isinstance(event, dict) else None
                    # a line the controller cannot read is still sent: it decides, and
                    # keeps it aside with a reason rather than leaving a silent gap
                    if not isinstance(seq, int) or seq > from_seq:
                        out.write(line.decode("utf-8", "replace") + "\n")
                        final = isinstance(event, dict) and event.get("type") in FINAL_EVENTS
                        done = done or final
                out.flush()
                if done:
                    return 0
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
