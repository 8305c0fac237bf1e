"""Facts fan-out: specfleet vs `ansible -m shell -f 50` on the same real sshd nodes.

Starts 50 loopback sshd nodes (root needed), runs the same facts script through both
tools on 1, 10 and 50 nodes, and prints median wall times and ratios.
Targets: ≥10× faster than ansible at 50 nodes; 50 nodes ≤1.5× our own 1-node time.

    .venv/bin/python bench/facts_fanout.py [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.fleet.facts import collect, facts_script  # noqa: E402
from orchestrator.fleet.fanout import run_fan_out  # noqa: E402
from tests.fleet import start_fleet, stop_fleet  # noqa: E402


def ansible_bin() -> Path:
    """ansible-core from PyPI in a venv of its own, made once."""
    venv = Path(tempfile.gettempdir()) / "specfleet-bench-ansible"
    exe = venv / "bin" / "ansible"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([venv / "bin" / "pip", "install", "-q", "ansible-core"], check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    ansible = ansible_bin()
    fleet = start_fleet(50, "/usr/bin/python3")
    try:
        inv = fleet.base / "ansible.ini"
        inv.write_text("[all]\n" + "".join(
            f"{n.name} ansible_host={n.address} ansible_port={n.port} ansible_user={n.user}\n"
            for n in fleet.nodes) + "[all:vars]\nansible_python_interpreter=/usr/bin/python3\n"
            f"ansible_ssh_private_key_file={fleet.client_key}\n"
            f"ansible_ssh_common_args='-o UserKnownHostsFile={fleet.known_hosts}'\n")
        script = facts_script("~/.specfleet", "python3")
        env = {"ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_LOCAL_TEMP": str(fleet.base / "at"),
               "PATH": "/usr/bin:/bin", "HOME": str(fleet.base)}
        print(f"{'nodes':>5}{'specfleet s':>13}{'ansible s':>11}{'ansible/specfleet':>19}"
              f"{'controller CPU s':>18}")
        ours_1 = None
        for n in (1, 10, 50):
            hosts = [fleet.host(i, python="/usr/bin/python3") for i in range(n)]
            ours, theirs, cpu = [], [], []
            for _ in range(args.reps):
                c0 = time.process_time()
                t0 = time.perf_counter()
                out = run_fan_out(hosts, collect, fleet.ssh_options())
                ours.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                assert all(o.status == "ok" for o in out), [o.detail for o in out]
                limit = ",".join(f"node{i + 1}" for i in range(n))
                t0 = time.perf_counter()
                r = subprocess.run([str(ansible), "all", "-i", str(inv), "--limit", limit, "-m",
                                    "shell", "-a", script, "-f", "50"], capture_output=True,
                                   text=True, env=env)
                theirs.append(time.perf_counter() - t0)
                assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            mo, mt = statistics.median(ours), statistics.median(theirs)
            ours_1 = ours_1 or mo
            print(f"{n:>5}{mo:>13.2f}{mt:>11.2f}{mt / mo:>18.1f}x"
                  f"{statistics.median(cpu):>18.2f}")
        print(f"specfleet 50 nodes / 1 node: {mo / ours_1:.2f}x (all 50 sshd and their shells "
              "share this machine's cores; a real fleet runs node work in parallel)")
    finally:
        stop_fleet(fleet)


if __name__ == "__main__":
    main()
