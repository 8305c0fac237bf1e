"""Ending a sweep's agent on its node (``sweep --stop``), only once it is shown to be ours."""

from __future__ import annotations

import re
import shlex

from ..errors import SpecfleetError


class StopRefused(SpecfleetError):
    """--stop found another process under the stored PID and signalled nothing."""


# POSIX sh on the node (dash, bash, macOS sh; `ps -ww` is never cut): the agent's process
# group ends, but only once the PID is shown to be this sweep's agent: its command line
# runs JOB with JOURNAL, and it is at least as old as the agent's own job_started (a PID
# recycled since is younger). Anything else is named and never signalled.
STOP_SCRIPT = """pid=PID
started=STARTED
args=$(ps -ww -o args= -p $pid 2>/dev/null)
state=$(ps -o stat= -p $pid 2>/dev/null)
case "$state" in Z*) echo gone; exit 0 ;; esac
if [ -z "$args" ]; then echo gone; exit 0; fi
case "$args" in
  *" -m agent run "JOB" --journal "JOURNAL" "*) ;;
  *) echo "not-ours $args"; exit 0 ;;
esac
num() { v=$1; while [ ${#v} -gt 1 ] && [ "${v#0}" != "$v" ]; do v=${v#0}; done; echo "$v"; }
et=$(ps -o etime= -p $pid 2>/dev/null | tr -d ' ')
d=0
case "$et" in *-*) d=${et%%-*}; et=${et#*-} ;; esac
IFS=:; set -- $et; unset IFS
case $# in 3) h=$1 m=$2 s=$3 ;; 2) h=0 m=$1 s=$2 ;; *) h=0 m=0 s=${1:-0} ;; esac
age=$(( $(num $d) * 86400 + $(num $h) * 3600 + $(num $m) * 60 + $(num $s) ))
born=$(( $(date +%s) - age ))
if [ "$started" -gt 0 ] && [ "$born" -gt $(( started + 5 )) ]; then
  echo "too-young $born $args"; exit 0
fi
pg=$(ps -o pgid= -p $pid 2>/dev/null | tr -d ' ')
if [ -z "$pg" ]; then echo gone; exit 0; fi
kill -TERM -$pg 2>/dev/null || kill -TERM $pid 2>/dev/null
# a zombie has ended (nothing may reap it: a container's init, its parent)
alive() { st=$(ps -o stat= -p $pid 2>/dev/null); [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }
i=0
while [ $i -lt 50 ] && alive; do sleep 0.2; i=$((i+1)); done
if alive; then kill -KILL -$pg 2>/dev/null || kill -KILL $pid; echo killed
else echo stopped; fi
"""


def stop_script(pid: int, job_path: str, journal_path: str, started: float | None) -> str:
    """STOP_SCRIPT for one agent: its PID, the job and journal its command line must name
    (quoted: a quoted word in a case pattern is literal, glob characters and all) and when
    it said it started (0: not known yet, only the command line is checked)."""
    values = {"PID": str(int(pid)), "STARTED": str(int(started or 0)),
              "JOURNAL": shlex.quote(journal_path), "JOB": shlex.quote(job_path)}
    # one pass: a path that happens to hold "JOB" is not substituted again
    return re.sub(r"\b(PID|STARTED|JOURNAL|JOB)\b", lambda m: values[m.group(1)], STOP_SCRIPT)


def stop_said(said: str, host: str, pid: int, job_path: str, journal_path: str,
              out: str) -> str:
    """What the stop script's last line means for the user; a refusal is raised."""
    if said.startswith("not-ours"):
        raise StopRefused(
            f"{host}: refused to signal pid {pid}: it is not this sweep's agent "
            f"(its command line is {said.removeprefix('not-ours ')[:200]!r}, expected "
            f"`-m agent run {job_path} --journal {journal_path}`). The PID was "
            "reused, or the stored lease was edited; the agent, if any, has ended "
            "already. Nothing was signalled")
    if said.startswith("too-young"):
        raise StopRefused(
            f"{host}: refused to signal pid {pid}: that process started after "
            "this sweep's agent did (the PID was reused by another run of the same job "
            "file); nothing was signalled")
    return {"gone": f"agent (pid {pid}) had already ended",
            "stopped": f"agent (pid {pid}) stopped",
            "killed": f"agent (pid {pid}) killed after 10 s"}.get(said, out)
