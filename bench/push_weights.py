"""Weights push: specfleet blobs vs `rsync -e ssh` to the same real sshd node.

A 500 MiB model (random bytes: incompressible, like weights) is pushed to a fresh
node root by each tool, interleaved, median of --reps. Then a re-push of the present
model, and a push interrupted at half that resumes. Targets: first push ≥0.9× rsync's
throughput; re-push ≤1 s; resume sends only the missing bytes.

    .venv/bin/python bench/push_weights.py [--mib 500] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.errors import UnreachableError  # noqa: E402
from orchestrator.fleet.blobs import push_model  # noqa: E402
from orchestrator.fleet.transport import connect  # noqa: E402
from tests.fleet import start_fleet, stop_fleet  # noqa: E402


def push(fleet, root_name: str, model: Path, cache: Path, progress=None):
    host = fleet.host(0, root=f"~/{root_name}", python="/usr/bin/python3")

    async def go():
        async with connect(host, fleet.ssh_options()) as t:
            return await push_model(t, host.name, host.python,
                                    f"{fleet.nodes[0].home}/{root_name}", {"target": model},
                                    cache, progress)
    return asyncio.run(go())


def rsync(fleet, model: Path, dest: str) -> None:
    n = fleet.nodes[0]
    ssh = (f"ssh -i {fleet.client_key} -p {n.port} -o UserKnownHostsFile={fleet.known_hosts} "
           "-o Ciphers=aes128-gcm@openssh.com")
    subprocess.run(["rsync", "-a", "-e", ssh, f"{model}/", f"{n.user}@{n.address}:{dest}/"],
                   check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    fleet = start_fleet(1, "/usr/bin/python3")
    work = Path(tempfile.mkdtemp(prefix="specfleet-bench-"))
    try:
        model = work / "model"
        model.mkdir()
        with open(model / "model.safetensors", "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(1 << 20))
        (model / "config.json").write_text('{"model_type": "llama"}')
        size = sum(p.stat().st_size for p in model.iterdir())
        cache = work / "fp.json"
        push(fleet, "warm", model, cache)  # hash the local files once (cached afterwards)
        home = fleet.nodes[0].home
        ours, theirs = [], []
        for i in range(args.reps):
            t0 = time.perf_counter()
            r = push(fleet, f"sf{i}", model, cache)
            ours.append(time.perf_counter() - t0)
            assert r.sent_bytes == size
            t0 = time.perf_counter()
            rsync(fleet, model, f"rs{i}")
            theirs.append(time.perf_counter() - t0)
            for d in (f"sf{i}", f"rs{i}"):
                shutil.rmtree(home / d, ignore_errors=True)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(f"first push of {size / 2**20:.0f} MiB (median of {args.reps}):")
        print(f"  specfleet {mo:6.2f} s  {size / mo / 2**20:7.1f} MiB/s")
        print(f"  rsync     {mt:6.2f} s  {size / mt / 2**20:7.1f} MiB/s")
        print(f"  specfleet throughput / rsync: {mt / mo:.2f}x")
        push(fleet, "again", model, cache)
        t0 = time.perf_counter()
        r = push(fleet, "again", model, cache)
        print(f"re-push of the present model: {time.perf_counter() - t0:.2f} s, "
              f"{r.sent_bytes} bytes sent")
        sent = []

        def cut(n: int) -> None:
            sent.append(n)
            if sum(sent) >= size // 2 and len(sent) < 10**7:
                subprocess.run(["pkill", "-KILL", "-u", fleet.nodes[0].user], check=False)
                sent.append(10**7)

        try:
            push(fleet, "resume", model, cache, cut)
        except UnreachableError:
            pass
        have = sum(p.stat().st_size for p in (home / "resume" / "blobs").glob("*.partial"))
        r = push(fleet, "resume", model, cache)
        print(f"resume after a cut at {have / 2**20:.0f} MiB: sent {r.sent_bytes / 2**20:.1f} "
              f"MiB of {size / 2**20:.0f} (missing {(size - have) / 2**20:.1f} MiB)")
    finally:
        stop_fleet(fleet)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
