"""Content-addressed weights on nodes: ``ROOT/blobs/<sha256>`` plus snapshot folders.

A model becomes ``ROOT/models/<fingerprint>/<role>/<file>`` — symlinks into the blob
store — so two models sharing a tokenizer store it once, and a re-push moves nothing.
Only missing blobs travel; an interrupted transfer continues from the bytes already
in ``<sha256>.partial``; every blob is verified by sha256 before an atomic rename, and
a blob that no longer matches its name is deleted and sent again.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

# transport.q, which is shlex.quote: importing transport brings asyncssh (~0.4 CPU-s) to
# every command that only reads CONTROLLER_CACHE (`plan lock` resolves a wheelhouse)
from shlex import quote as q

from agent.fingerprint import VERIFY_MAX_AGE_S, cached_fingerprint, model_files

from ..errors import RemoteError, SpecfleetError

STREAMS = 4  # blobs in flight per node: many small wheels would otherwise go one by one
CONTROLLER_CACHE = Path(os.environ.get("SPECFLEET_CACHE", "~/.cache/specfleet")).expanduser()

# Runs on the node with its Python: blob states, free space, verify-and-rename.
NODE_HELPER = r'''
import hashlib, json, os, shutil, sys, time
root, cmd, arg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
now = time.time()
blobs = os.path.join(root, "blobs")
os.makedirs(blobs, exist_ok=True)
cache_path = os.path.join(blobs, ".verified.json")
try:
    cache = json.load(open(cache_path))
except Exception:
    cache = {}
def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for c in iter(lambda: f.read(1 << 20), b""):
            h.update(c)
    return h.hexdigest()
def key(st):
    # ctime and inode: a flipped byte with its mtime restored still changes ctime
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
def verified(name, path, max_age):
    st = os.stat(path)
    c = cache.get(name)
    if isinstance(c, dict) and c.get("key") == key(st) and (
            max_age is None or now - c.get("at", 0) < max_age):
        return True
    if sha(path) == name:
        cache[name] = {"key": key(os.stat(path)), "at": now}
        return True
    return False
out = {}
if cmd == "status":
    for b in arg["blobs"]:
        p = os.path.join(blobs, b["sha256"])
        if os.path.exists(p):
            if os.path.getsize(p) == b["size"] and verified(b["sha256"], p, arg["max_age"]):
                out[b["sha256"]] = "ok"
                continue
            os.remove(p)
            cache.pop(b["sha256"], None)
            out[b["sha256"]] = "corrupt"
        else:
            part = p + ".partial"
            n = os.path.getsize(part) if os.path.exists(part) else 0
            if n > b["size"]:
                os.remove(part)
                n = 0
            out[b["sha256"]] = "partial:%d" % n if n else "missing"
    out["_free_bytes"] = shutil.disk_usage(blobs).free
elif cmd == "receive":
    # Append stdin to <sha>.partial, hashing as bytes arrive (verification overlaps the
    # transfer), then rename into place only if the whole blob matches its name.
    name, size = arg["sha256"], arg["size"]
    part = os.path.join(blobs, name + ".partial")
    h = hashlib.sha256()
    have = 0
    if os.path.exists(part):
        with open(part, "rb") as f:
            for c in iter(lambda: f.read(1 << 20), b""):
                h.update(c)
                have += len(c)
    src = sys.stdin.buffer
    with open(part, "ab") as dst:
        while True:
            c = src.read1(1 << 20) if hasattr(src, "read1") else src.read(1 << 20)
            if not c:
                break
            dst.write(c)
            h.update(c)
            have += len(c)
    if have == size and h.hexdigest() == name:
        final = os.path.join(blobs, name)
        os.replace(part, final)
        cache[name] = {"key": key(os.stat(final)), "at": now}
        out[name] = "ok"
    elif have < size:
        out[name] = "short:%d" % have
    else:
        os.remove(part)
        out[name] = "mismatch"
elif cmd == "snapshot":
    dest, files = arg["dest"], arg["files"]
    tmp = dest + ".tmp-%d" % os.getpid()
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for f in files:
        os.symlink(os.path.relpath(os.path.join(blobs, f["sha256"]), tmp),
                   os.path.join(tmp, f["path"]))
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(tmp, dest)
    out["ok"] = True
tmp = cache_path + ".%d" % os.getpid()
json.dump(cache, open(tmp, "w"))
os.replace(tmp, cache_path)
print(json.dumps(out))
'''


class NodeDiskFull(SpecfleetError):
    """The node lacks the free space a transfer needs."""


@dataclass
class PushReport:
    files: int = 0
    sent_bytes: int = 0
    skipped_bytes: int = 0
    resumed_bytes: int = 0
    resent_corrupt: int = 0
    seconds: float = 0.0
    paths: dict = field(default_factory=dict)


async def _helper(t, python: str, root: str, cmd: str, arg) -> dict:
    res = await t.run(f"{q(python)} -c {q(NODE_HELPER)} {q(root)} {cmd} {q(json.dumps(arg))}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def local_manifest(model_dir: Path, cache_file: Path) -> tuple[str, list[dict]]:
    fp, _ = cached_fingerprint(model_dir, cache_file)
    cache = json.loads(cache_file.read_text())
    files = []
    for p in model_files(model_dir.resolve()):
        files.append({"path": p.name, "size": p.stat().st_size,
                      "sha256": cache[str(p)]["sha256"], "local": str(p)})
    return fp, files


async def push_files(t, host_name: str, python: str, root: str,
                     groups: dict[str, list[dict]], progress=None,
                     verify: str = "daily") -> PushReport:
    """Make each ``ROOT/<dest>`` a folder of links to blobs holding the given files.

    ``groups`` maps a destination (relative to root) to files ``{path, sha256, size,
    local}``; ``path`` is the link's name in that folder. Blobs already on the node are
    re-hashed when their stat key changed or their last hash is older than ``verify``
    allows; one that no longer matches its name is reported corrupt and sent again.
    """
    t0 = time.monotonic()
    report = PushReport()
    blobs = {f["sha256"]: f for files in groups.values() for f in files}
    state = await _helper(t, python, root, "status", {
        "blobs": [{"sha256": s, "size": f["size"]} for s, f in blobs.items()],
        "max_age": VERIFY_MAX_AGE_S[verify]})
    todo = {s: st for s, st in state.items() if not s.startswith("_") and st != "ok"}
    need = sum(blobs[s]["size"] - (int(st.split(":")[1]) if st.startswith("partial") else 0)
               for s, st in todo.items())
    if need > state["_free_bytes"]:
        raise NodeDiskFull(f"{host_name}: {root} has {state['_free_bytes'] / 2**20:.1f} MiB "
                           f"free but the transfer needs {need / 2**20:.1f} MiB more; free "
                           "space or point specfleet_root at a bigger volume")
    report.skipped_bytes = sum(f["size"] for s, f in blobs.items() if s not in todo)
    report.resent_corrupt = sum(1 for st in todo.values() if st == "corrupt")
    sem = asyncio.Semaphore(STREAMS)

    async def send(sha: str, st: str) -> tuple[str, str]:
        offset = int(st.split(":")[1]) if st.startswith("partial") else 0
        b = blobs[sha]
        async with sem:
            cmd = (f"{q(python)} -c {q(NODE_HELPER)} {q(root)} receive "
                   f"{q(json.dumps({'sha256': sha, 'size': b['size']}))}")
            try:
                res, n = await t.stream_file(Path(b["local"]), offset, cmd, progress)
            except RemoteError as e:
                if "No space left" in e.stderr:
                    raise NodeDiskFull(f"{host_name}: no space left on the node while writing "
                                       f"{root}/blobs ({b['path']})") from None
                raise
        report.resumed_bytes += offset
        report.sent_bytes += n
        return sha, json.loads(res.stdout.strip().splitlines()[-1])[sha]

    for _attempt in range(2):  # a blob that arrives corrupted is sent once more
        results = await asyncio.gather(*(send(s, st) for s, st in todo.items()))
        todo = {s: "missing" for s, r in results if r != "ok"}
        if not todo:
            break
    if todo:
        raise SpecfleetError(f"{host_name}: blobs still differ after re-sending: "
                             f"{', '.join(sorted(todo))[:200]}")
    for dest, files in groups.items():
        await _helper(t, python, root, "snapshot", {
            "dest": f"{root}/{dest}",
            "files": [{"path": f["path"], "sha256": f["sha256"]} for f in files]})
        report.paths[dest] = f"{root}/{dest}"
    report.files = len(blobs)
    report.seconds = round(time.monotonic() - t0, 3)
    return report


async def push_model(t, host_name: str, python: str, root: str, models: dict[str, Path],
                     cache_file: Path, progress=None, verify: str = "daily") -> PushReport:
    """Make ``ROOT/models/<fp>/<role>`` exist on the node for every role in ``models``."""
    groups, prints = {}, {}
    for role, d in models.items():
        try:
            fp, files = local_manifest(Path(d), cache_file)
        except OSError as e:  # the lock's folder changed since `plan lock`
            raise SpecfleetError(f"{role} model: {e}; re-lock the plan once the folder "
                                 "holds the model") from None
        dest = f"models/{fp.split(':')[-1][:24]}/{role}"
        groups[dest], prints[role] = files, (dest, fp)
    report = await push_files(t, host_name, python, root, groups, progress, verify)
    report.paths = {role: {"path": f"{root}/{dest}", "fingerprint": fp}
                    for role, (dest, fp) in prints.items()}
    return report
