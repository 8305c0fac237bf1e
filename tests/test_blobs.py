"""Weights travel content-addressed: only missing bytes, verified, resumable, refused when
the node's disk cannot hold them. Against real sshd nodes."""

import asyncio
import os
import shutil
import subprocess

import pytest

from agent.fingerprint import fingerprint
from orchestrator.errors import UnreachableError
from orchestrator.fleet.blobs import NodeDiskFull, push_model
from orchestrator.fleet.transport import connect


def push(fleet, host, models, cache, progress=None):
    async def go():
        async with connect(host, fleet.ssh_options()) as t:
            home = await t.home()
            return await push_model(t, host.name, host.python, f"{home}/{host.root[2:]}",
                                    models, cache, progress)
    return asyncio.run(go())


@pytest.fixture
def node_root(fleet):
    """A fresh specfleet root on node 1 for each test."""
    n = fleet.nodes[0]
    name = f".sf-{os.urandom(4).hex()}"
    yield name, n.home / name
    shutil.rmtree(n.home / name, ignore_errors=True)


def test_push_is_content_addressed_and_idempotent(fleet, model_pair, tmp_path, node_root):
    name, path = node_root
    host = fleet.host(0, root=f"~/{name}")
    models = {"target": model_pair / "target", "draft": model_pair / "draft"}
    first = push(fleet, host, models, tmp_path / "fp.json")
    total = sum(p.stat().st_size for p in model_pair.rglob("*") if p.is_file()
                and p.name != "BUILD.json")
    shared = (model_pair / "target" / "tokenizer.json").stat().st_size + \
        (model_pair / "target" / "tokenizer_config.json").stat().st_size
    assert first.files == 6  # tokenizer files are shared by target and draft
    assert first.sent_bytes == total - shared and first.skipped_bytes == 0
    again = push(fleet, host, models, tmp_path / "fp.json")
    assert again.sent_bytes == 0 and again.skipped_bytes == first.sent_bytes
    for role in models:
        snap = path / "models" / first.paths[role]["path"].split("/models/")[1]
        assert fingerprint(snap) == fingerprint(model_pair / role)
        assert all((snap / f).is_symlink() for f in os.listdir(snap))


def test_corrupted_blob_is_detected_and_resent(fleet, model_pair, tmp_path, node_root):
    name, path = node_root
    host = fleet.host(0, root=f"~/{name}")
    models = {"draft": model_pair / "draft"}
    push(fleet, host, models, tmp_path / "fp.json")
    blob = max((path / "blobs").glob("[0-9a-f]" * 64), key=lambda p: p.stat().st_size)
    with open(blob, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe\xfd")
    r = push(fleet, host, models, tmp_path / "fp.json")
    assert r.resent_corrupt == 1 and r.sent_bytes == blob.stat().st_size
    assert subprocess.run(["sha256sum", str(blob)], capture_output=True,
                          text=True).stdout.split()[0] == blob.name


def test_interrupted_transfer_resumes_from_its_offset(fleet, tmp_path, node_root):
    name, path = node_root
    big = tmp_path / "big"
    big.mkdir()
    (big / "model.safetensors").write_bytes(os.urandom(48 << 20))
    (big / "config.json").write_text('{"model_type": "llama"}')
    host = fleet.host(0, root=f"~/{name}")
    user = fleet.nodes[0].user
    seen = []

    def cut_after_16mib(n):
        seen.append(n)
        if sum(seen) >= 16 << 20 and len(seen) < 10**6:
            subprocess.run(["pkill", "-KILL", "-u", user], check=False)
            seen.append(10**6)  # cut once

    with pytest.raises(UnreachableError):
        push(fleet, host, {"target": big}, tmp_path / "fp.json", cut_after_16mib)
    have = sum(p.stat().st_size for p in (path / "blobs").glob("*.partial"))
    total = sum(p.stat().st_size for p in big.iterdir())
    # bytes in flight when the session died are lost: less than what was sent survives
    assert 8 << 20 <= have < total
    r = push(fleet, host, {"target": big}, tmp_path / "fp.json")
    assert r.resumed_bytes == have
    # only the missing bytes travelled (a small blob may have completed before the cut)
    assert r.sent_bytes + r.skipped_bytes == total - have
    snap = path / "models" / r.paths["target"]["path"].split("/models/")[1]
    assert fingerprint(snap) == fingerprint(big)


def test_full_disk_is_a_clear_error(fleet, model_pair, tmp_path):
    n = fleet.nodes[0]
    small = n.home / "small-root"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(small)],
                   check=True)
    try:
        subprocess.run(["chown", f"{n.user}:{n.user}", str(small)], check=True)
        host = fleet.host(0, root="~/small-root")
        with pytest.raises(NodeDiskFull) as e:
            push(fleet, host, {"target": model_pair / "target"}, tmp_path / "fp.json")
        msg = str(e.value)
        assert msg.startswith("node1: ") and "MiB free but the transfer needs" in msg
        assert "point specfleet_root at a bigger volume" in msg
        assert not list((small / "blobs").glob("*.partial"))  # nothing half-written
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
        small.rmdir()
