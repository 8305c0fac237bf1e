"""``python -m agent run JOB.json [--journal PATH] [--quiet]`` and ``python -m agent version``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import AGENT_VERSION, SCHEMA


def own_compile_dir() -> Path | None:
    """On Linux, a temp folder of this user's own before mlx loads: ``specfleet-<uid>`` in
    the temp folder the user has (TMPDIR, else /tmp), made 0700, which TMPDIR then names.

    Why: mlx compiles its CPU kernels into ``$TMPDIR/mlx/<version>/cpu``, a folder the first
    user to run mlx on the machine creates (0755). Every other user's agent there then
    failed each generation whose kernel was not compiled yet ("[Compile::eval_cpu] Failed
    to compile function"): two node users on one Linux host, or a node beside a CI job.
    The folder stays under the system's temp folder (cleared as it is) and needs no home.
    One that is not this user's alone (another's, a symlink, open to others) is never
    used: a fresh one with a random name is made instead (mlx dlopens what it finds there).
    macOS gives each user a TMPDIR of their own already (and Metal compiles no CPU kernels)."""
    if sys.platform != "linux":
        return None
    import stat
    import tempfile

    tempfile.tempdir = None  # the temp folder the user has now, not one read earlier
    base = Path(tempfile.gettempdir())
    mine = f"specfleet-{os.geteuid()}"
    # already in it (an agent started by one, as --detach re-runs this one): not nested
    own = base if base.name == mine or base.name.startswith(mine + "-") else base / mine
    try:
        own.mkdir(mode=0o700, exist_ok=True)
        st = own.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{own} is not this user's folder")
        if st.st_mode & 0o077:
            own.chmod(0o700)  # ours, left open (a umask of 000): closed again
    except OSError:
        try:
            own = Path(tempfile.mkdtemp(prefix=f"specfleet-{os.geteuid()}-", dir=base))
        except OSError:  # a temp folder it cannot write: mlx's own error says so, by name
            return None
    os.environ["TMPDIR"] = str(own)  # std::filesystem::temp_directory_path reads it first
    tempfile.tempdir = None  # and Python's tempfile reads it afresh
    return own


def main(argv: list[str] | None = None) -> int:
    own_compile_dir()
    p = argparse.ArgumentParser(prog="python -m agent", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a job and journal one JSON event per line")
    run.add_argument("job", type=Path)
    run.add_argument("--journal", type=Path, default=None,
                     help="journal file (default: JOB with suffix .events.jsonl)")
    run.add_argument("--quiet", action="store_true", help="do not echo events to stdout")
    run.add_argument("--resume", action="store_true",
                     help="skip generations this job already journaled (after a crash)")
    run.add_argument("--lock", type=Path, default=None,
                     help="node lock file (default ~/.specfleet/agent.lock)")
    run.add_argument("--machine-lock", type=Path, default=None,
                     help="machine-wide lock shared by every specfleet root and user "
                          "(default $SPECFLEET_MACHINE_LOCK or /tmp/specfleet-machine.lock)")
    run.add_argument("--cache-dir", type=Path, default=None,
                     help="fingerprint cache folder (default ~/.specfleet/cache)")
    run.add_argument("--key-stdin", action="store_true",
                     help="read the journal's signing key (hex, one line) from stdin: the "
                          "controller's secret for this job, never on disk or in argv")
    run.add_argument("--detach", action="store_true",
                     help="run in the background (new session, survives the SSH session); "
                          "print the pid and write it to JOURNAL.pid")
    fol = sub.add_parser("follow", help="print journal events after --from-seq as they come")
    fol.add_argument("journal", type=Path)
    fol.add_argument("--from-seq", type=int, default=0)
    fol.add_argument("--pid", type=int, default=None,
                     help="agent pid (default: from JOURNAL.pid); exit when it is gone")
    sub.add_parser("version", help="print agent version and protocol schema as JSON")
    costs = sub.add_parser("costs", help="the instrument check: step costs of the job's pair "
                                         "and the loop's overhead, as JSON")
    costs.add_argument("job", type=Path)
    costs.add_argument("--reps", type=int, default=25)
    costs.add_argument("--rounds", type=int, default=5,
                       help="alternating rounds of step costs and measured speedup")
    args = p.parse_args(argv)
    if args.cmd == "costs":
        from .calibrate import node_costs
        from .errors import NodeBusy
        from .lock import NodeLock, machine_lock_path

        # its rounds time the pair: one benchmark a machine, as a sweep's generations
        try:
            with NodeLock(machine_lock_path(), "instrument-costs", shared=True,
                          note=f"costs of {args.job}"):
                print(json.dumps(node_costs(args.job, args.reps, args.rounds)))
        except NodeBusy as e:
            print(f"agent: {e}", file=sys.stderr)
            return e.exit_code
        return 0
    if args.cmd == "version":
        from .checks import installed_versions
        from .protocol import EVENT_SCHEMA

        print(json.dumps({"agent_version": AGENT_VERSION, "schema": SCHEMA,
                          "event_schema": EVENT_SCHEMA,
                          "python": sys.version.split()[0], **installed_versions()}))
        return 0
    if args.cmd == "follow":
        from .follow import follow, read_pid

        return follow(args.journal, args.from_seq, args.pid or read_pid(args.journal))
    from .runner import main_run

    journal = args.journal or args.job.with_suffix(".events.jsonl")
    # read before detaching: the detached agent's stdin is /dev/null, its key only in memory
    key = _read_key() if args.key_stdin else None
    if args.detach:
        _detach(journal)
    return main_run(args.job, journal, echo=not (args.quiet or args.detach),
                    resume=args.resume, lock_path=args.lock, cache_dir=args.cache_dir,
                    machine_lock=args.machine_lock, key=key)


def _read_key() -> bytes:
    """The signing key from stdin's first line (hex); refused unless 32 bytes or more."""
    text = sys.stdin.readline().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise SystemExit("agent: --key-stdin wants a hex key of 32 bytes or more on stdin")
    return key


def _detach(journal: Path) -> None:
    """Double fork into a new session; the parent prints the pid and exits."""
    import os

    from .follow import pid_file

    r, w = os.pipe()
    if os.fork() > 0:  # the caller's process: wait for the grandchild's pid, print, exit
        os.close(w)
        pid = os.read(r, 64).decode().strip()
        print(json.dumps({"pid": int(pid), "journal": str(journal)}))
        sys.stdout.flush()
        os._exit(0)
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    journal.parent.mkdir(parents=True, exist_ok=True)
    pid_file(journal).write_text(f"{os.getpid()}\n")
    os.write(w, str(os.getpid()).encode())
    os.close(w)
    out = os.open(str(journal) + ".out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)


if __name__ == "__main__":
    sys.exit(main())
