"""``python -m agent run JOB.json [--journal PATH] [--quiet]`` and ``python -m agent version``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import AGENT_VERSION, SCHEMA


def main(argv: list[str] | None = None) -> int:
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
    run.add_argument("--cache-dir", type=Path, default=None,
                     help="fingerprint cache folder (default ~/.specfleet/cache)")
    sub.add_parser("version", help="print agent version and protocol schema as JSON")
    args = p.parse_args(argv)
    if args.cmd == "version":
        from .checks import installed_versions

        print(json.dumps({"agent_version": AGENT_VERSION, "schema": SCHEMA,
                          "python": sys.version.split()[0], **installed_versions()}))
        return 0
    from .runner import main_run

    return main_run(args.job, args.journal, echo=not args.quiet, resume=args.resume,
                    lock_path=args.lock, cache_dir=args.cache_dir)


if __name__ == "__main__":
    sys.exit(main())
