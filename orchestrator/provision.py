"""Make each node ready for a plan, idempotently: pinned env, agent artefact, weights.

Environment: the plan's pins resolved once per node platform into a hash-locked
wheelhouse on the controller; wheels travel as blobs (no internet on the node) and
are installed with ``--no-index --require-hashes`` into ``ROOT/envs/<env_id>``. An env
whose ``.complete`` marker exists is reused without touching anything.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

from .blobs import CONTROLLER_CACHE, push_files, push_model
from .dispatch import AGENT_DIR, expand_root
from .errors import RemoteError, SpecfleetError
from .inventory import Host
from .plan import Plan
from .transport import q
from .wheelhouse import PROBE, ResolveError, resolve

_resolve_locks: dict[str, asyncio.Lock] = {}


def agent_artefact() -> tuple[str, list[Path]]:
    """The agent's id: sha256 over its files' relative paths and contents."""
    files = sorted(p for p in AGENT_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(AGENT_DIR).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16], files


def base_python(host: Host) -> str:
    return str(host.vars.get("specfleet_base_python", "python3"))


async def _env(t, host: Host, root: str, plan: Plan, node: dict, progress) -> dict:
    key = json.dumps(node, sort_keys=True)
    lock_guard = _resolve_locks.setdefault(key, asyncio.Lock())
    async with lock_guard:  # one resolution per platform, even with many hosts at once
        lock = await asyncio.to_thread(resolve, plan.packages, plan.python, node,
                                       lambda m: None)
    env_dir = f"{root}/envs/{lock.env_id}"
    t0 = time.monotonic()
    if (await t.run(f"test -f {q(env_dir + '/.complete')}", check=False)).exit_status == 0:
        return {"env_id": lock.env_id, "env": "reused", "env_seconds":
                round(time.monotonic() - t0, 3), "wheels_sent_bytes": 0,
                "env_python": f"{env_dir}/bin/python"}
    wheels = [{"path": w["file"], "sha256": w["sha256"], "size": w["size"],
               "local": str(lock.folder / w["file"])} for w in lock.wheels]
    report = await push_files(t, host.name, base_python(host), root,
                              {f"envs/{lock.env_id}.wheels": wheels}, progress)
    req = f"{env_dir}.requirements.txt"
    await t.write_text(req, lock.requirements())
    wh = f"{env_dir}.wheels"
    # PIP_CONFIG_FILE=/dev/null: the node's own pip config must not add indexes or links.
    await t.run(f"rm -rf {q(env_dir)} && {q(base_python(host))} -m venv {q(env_dir)} && "
                f"PIP_CONFIG_FILE=/dev/null {q(env_dir + '/bin/python')} -m pip install -q "
                f"--disable-pip-version-check --no-index --find-links {q(wh)} "
                f"--require-hashes -r {q(req)}")
    await t.write_text(f"{env_dir}/.complete", json.dumps(
        {"env_id": lock.env_id, "wheels": [w["file"] for w in lock.wheels]}))
    return {"env_id": lock.env_id, "env": "created",
            "env_seconds": round(time.monotonic() - t0, 3),
            "wheels_sent_bytes": report.sent_bytes, "env_python": f"{env_dir}/bin/python"}


async def _agent(t, root: str) -> dict:
    agent_id, _ = agent_artefact()
    dest = f"{root}/agents/{agent_id}"
    if (await t.run(f"test -f {q(dest + '/.complete')}", check=False)).exit_status == 0:
        return {"agent_id": agent_id, "agent": "present", "agent_dir": dest}
    await t.run(f"rm -rf {q(dest)} && mkdir -p {q(dest)}")
    await t.put_dir(AGENT_DIR, f"{dest}/agent")
    await t.write_text(f"{dest}/.complete", agent_id)
    return {"agent_id": agent_id, "agent": "pushed", "agent_dir": dest}


async def provision_host(host: Host, t, plan: Plan, progress=None) -> dict:
    """Env, agent and weights on one node; returns what was done and how long it took."""
    t0 = time.monotonic()
    root = expand_root(host.root, await t.home())
    await t.run(f"mkdir -p {q(root)}")
    try:
        node = json.loads((await t.run(f"{q(base_python(host))} -c {q(PROBE)}")).stdout)
    except RemoteError as e:
        raise SpecfleetError(f"{host.name}: no usable Python at {base_python(host)!r} "
                             f"({e.stderr.strip()[-200:]}); set specfleet_base_python") from None
    try:
        env = await _env(t, host, root, plan, node, progress)
    except ResolveError as e:
        raise SpecfleetError(f"{host.name}: {e}") from None
    agent = await _agent(t, root)
    weights = await push_model(t, host.name, base_python(host), root, plan.models,
                               CONTROLLER_CACHE / "fingerprints.json", progress)
    check = await t.run(f"cd {q(agent['agent_dir'])} && {q(env['env_python'])} -m agent version")
    versions = json.loads(check.stdout)
    for pin in plan.packages:
        name, version = pin.split("==")
        name = name.split("[")[0].strip()
        if versions.get(name) not in (None, version.strip()):
            raise SpecfleetError(f"{host.name}: env {env['env_id']} has {name} "
                                 f"{versions.get(name)}, the plan pins {version}")
    return {**env, **agent, "platform": f"{node['sys_platform']}-{node['machine']}",
            "python": node["python_full"], "versions": versions,
            "models": weights.paths, "weights_sent_bytes": weights.sent_bytes,
            "weights_skipped_bytes": weights.skipped_bytes,
            "weights_resumed_bytes": weights.resumed_bytes,
            "seconds": round(time.monotonic() - t0, 3)}
