"""Each test module's CPU-seconds and wall time when run on its own: where the suite's time goes.

Every module runs in a pytest process of its own (``-p no:randomly -m "not alone"``, the
OpenBLAS preload of ``make test``) inside a cgroup v1 ``cpuacct`` group of its own, which
its children inherit (agents, the sshd test nodes, Chromium), so the CPU it reads is the
module's whole cost, not this host's load: other work on the machine changes a module's
wall time, hardly its CPU-s. The shared PostgreSQL server is outside the group. Prints
one line per module as it ends, then the table sorted by wall time (the order
``SLOW_FIRST`` in tests/conftest.py wants: longest first) and the total. A module run
alone pays its own collection and session fixtures (an sshd fleet, the model pair), which
``make test``'s workers pay once each. Needs root. Run:
``.venv/bin/python bench/module_cpu.py [--jobs 2] [tests/test_docs.py ...]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CGROUP = Path("/sys/fs/cgroup/cpuacct")


def blas_env() -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "tests.blas"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return dict(x.split("=", 1) for x in out)


def run_module(module: str, env: dict[str, str], logs: Path) -> tuple[float, float, int]:
    """(CPU-s, wall s, exit status) of one module's pytest process and its children."""
    group = CGROUP / f"specfleet-bench-{os.getpid()}-{module.replace('/', '_')}"
    group.mkdir()
    try:
        t0 = time.monotonic()
        with open(logs / f"{Path(module).stem}.log", "wb") as log:
            p = subprocess.Popen(
                ["sh", "-c", f'echo $$ > {group}/tasks && exec "$@"', "sh", sys.executable,
                 "-m", "pytest", module, "-q", "-p", "no:randomly", "-m", "not alone"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            code = p.wait()
        wall = time.monotonic() - t0
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
        return cpu, wall, code
    finally:
        for pid in (group / "tasks").read_text().split():  # a straggler the module left
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
        time.sleep(0.2)
        group.rmdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("modules", nargs="*", help="default: every tests/**/test_*.py")
    ap.add_argument("--jobs", type=int, default=2, help="modules at once (2-core host: 2)")
    args = ap.parse_args()
    if os.geteuid() != 0 or not CGROUP.is_dir():
        sys.exit(f"needs root and a cgroup v1 cpuacct hierarchy at {CGROUP}")
    modules = args.modules or sorted(str(p.relative_to(ROOT))
                                     for p in (ROOT / "tests").rglob("test_*.py"))
    env = {**os.environ, **blas_env()}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as `make test`: bytecode cached (Makefile)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"module-cpu-{os.getpid()}"
    logs.mkdir()
    print(f"logs: {logs}", flush=True)

    def one(module: str) -> tuple[str, float, float, int]:
        cpu, wall, code = run_module(module, env, logs)
        print(f"{cpu:7.1f} CPU-s {wall:6.0f} s  exit {code}  {module}", flush=True)
        return module, cpu, wall, code

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, modules))
    print("\n  CPU-s  wall s  exit  module (longest first)")
    for module, cpu, wall, code in sorted(rows, key=lambda r: -r[2]):
        print(f"{cpu:7.1f} {wall:7.0f} {code:5}  {module}")
    print(f"{sum(r[1] for r in rows):7.1f} {sum(r[2] for r in rows):7.0f}        "
          f"in all ({len(rows)} modules)")


if __name__ == "__main__":
    main()
