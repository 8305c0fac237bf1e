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
import threading
import time
from pathlib import Path

from agent.fingerprint import file_sha256
from agent.protocol import model_roles

from ..errors import RemoteError, SpecfleetError
from .blobs import CONTROLLER_CACHE, push_files, push_model
from .inventory import Host
from .node_paths import AGENT_DIR, expand_root
from .platforms import closest_platform, platform_node
from .transport import q
from .wheelhouse import (
    PROBE,
    Lock,
    ResolveError,
    agent_requirements_missing,
    check_lock,
    node_packages,
    resolve,
)

_resolve_locks: dict[str, threading.Lock] = {}
_verified: dict[tuple, Lock] = {}


def agent_artefact() -> tuple[str, list[Path]]:
    """The agent's id: sha256 over its files' relative paths and contents."""
    files = sorted(p for p in AGENT_DIR.rglob("*.py") if "__pycache__" not in p.parts)
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(AGENT_DIR).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16], files


def base_python(host: Host) -> str:
    return str(host.vars.get("specfleet_base_python",
                             host.vars.get("ansible_python_interpreter", "python3")))


def locked_wheelhouse(doc: dict, desc: str) -> Lock:
    """The lock's wheels for one platform, present in the controller cache and verified."""
    with _resolve_locks.setdefault(desc, threading.Lock()):  # once per platform, not per host
        key = (desc, doc["platforms"][desc]["env_id"])
        if key not in _verified:
            _verified[key] = _locked_wheelhouse(doc, desc)
        return _verified[key]


def _locked_wheelhouse(doc: dict, desc: str) -> Lock:
    entry = doc["platforms"][desc]
    folder = CONTROLLER_CACHE / "wheelhouses" / entry["platform_key"]
    ok = all((folder / w["file"]).exists() and file_sha256(folder / w["file"]) == w["sha256"]
             for w in entry["wheels"])
    if not ok:  # cache gone or tampered with: fetch again, and it must be the same bytes
        again = resolve(tuple(doc["packages"]), doc["python"],
                        platform_node(desc, doc["python"]), lambda m: None)
        if again.env_id != entry["env_id"]:
            raise SpecfleetError(f"the wheels for {desc} no longer resolve to the locked set "
                                 f"(env {entry['env_id']} locked, {again.env_id} now); "
                                 "re-lock the plan")
    lock = Lock(env_id=entry["env_id"], python=doc["python"],
                platform_key=entry["platform_key"], wheels=tuple(entry["wheels"]),
                folder=folder)
    node = platform_node(desc, doc["python"])
    try:  # a lock written before markers were evaluated for the node can lack mlx-metal
        check_lock(lock, node_packages(tuple(doc["packages"]), node), node)
    except ResolveError as e:
        raise SpecfleetError(f"{desc}: {e}; re-lock the plan") from None
    return lock


def platform_for(doc: dict, node: dict, host: Host) -> str:
    if node["python"] != doc["python"]:
        raise SpecfleetError(f"{host.name}: the node runs Python {node['python_full']} but the "
                             f"plan pins {doc['python']}; set specfleet_base_python to a "
                             f"{doc['python']} interpreter")
    if not doc["platforms"]:
        raise SpecfleetError(f"{host.name}: this lock manages no environments (its plan sets "
                             "environment.platforms: []); sweep with --no-provision")
    desc = closest_platform(doc["platforms"], node)
    if desc is not None:
        return desc
    have = f"{node['sys_platform']} {node['machine']} {' '.join(node['libc'])}{node['mac_ver']}"
    raise SpecfleetError(f"{host.name}: no locked environment fits this node ({have.strip()}); "
                         f"locked: {', '.join(doc['platforms'])}. Add it to "
                         "environment.platforms and re-lock")


async def _env(t, host: Host, root: str, doc: dict, node: dict, progress) -> dict:
    desc = platform_for(doc, node, host)
    lock = await asyncio.to_thread(locked_wheelhouse, doc, desc)
    env_dir = f"{root}/envs/{lock.env_id}"
    t0 = time.monotonic()
    if (await t.run(f"test -f {q(env_dir + '/.complete')}", check=False)).exit_status == 0:
        return {"env_id": lock.env_id, "platform_lock": desc, "env": "reused", "env_seconds":
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
    # --no-compile: byte-compiling every installed module (transformers alone is thousands)
    # was 60% of the install's CPU; the agent's first import compiles the few it uses.
    await t.run(f"rm -rf {q(env_dir)} && {q(base_python(host))} -m venv {q(env_dir)} && "
                f"PIP_CONFIG_FILE=/dev/null {q(env_dir + '/bin/python')} -m pip install -q "
                f"--no-compile --disable-pip-version-check --no-index --find-links {q(wh)} "
                f"--require-hashes -r {q(req)}")
    await t.write_text(f"{env_dir}/.complete", json.dumps(
        {"env_id": lock.env_id, "wheels": [w["file"] for w in lock.wheels]}))
    return {"env_id": lock.env_id, "platform_lock": desc, "env": "created",
            "env_seconds": round(time.monotonic() - t0, 3),
            "wheels_sent_bytes": report.sent_bytes, "env_python": f"{env_dir}/bin/python"}


async def push_agent(t, root: str) -> dict:
    """The agent folder on the node (ROOT/agents/<agent_id>), pushed once per version."""
    agent_id, _ = agent_artefact()
    dest = f"{root}/agents/{agent_id}"
    if (await t.run(f"test -f {q(dest + '/.complete')}", check=False)).exit_status == 0:
        return {"agent_id": agent_id, "agent": "present", "agent_dir": dest}
    await t.run(f"rm -rf {q(dest)} && mkdir -p {q(dest)}")
    await t.put_dir(AGENT_DIR, f"{dest}/agent")
    await t.write_text(f"{dest}/.complete", agent_id)
    return {"agent_id": agent_id, "agent": "pushed", "agent_dir": dest}


async def provision_host(host: Host, t, doc: dict, progress=None) -> dict:
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
        env = await _env(t, host, root, doc, node, progress)
    except ResolveError as e:
        raise SpecfleetError(f"{host.name}: {e}") from None
    agent = await push_agent(t, root)
    weights = await push_model(t, host.name, base_python(host), root,
                               {r: Path(doc["models"][r]["path"])
                                for r in model_roles(doc["models"])},
                               CONTROLLER_CACHE / "fingerprints.json", progress,
                               verify=doc["models"].get("verify", "daily"))
    check = await t.run(f"cd {q(agent['agent_dir'])} && {q(env['env_python'])} -m agent version")
    versions = json.loads(check.stdout)
    for pin in doc["packages"]:
        name, version = pin.split("==")
        name = name.split("[")[0].strip()
        if versions.get(name) not in (None, version.strip()):
            raise SpecfleetError(f"{host.name}: env {env['env_id']} has {name} "
                                 f"{versions.get(name)}, the plan pins {version}")
    missing = agent_requirements_missing(versions, tuple(doc["packages"]))
    if missing:  # without psutil a Mac reads neither contention nor RSS: runs unverified
        raise SpecfleetError(f"{host.name}: env {env['env_id']} lacks what the agent reads "
                             f"the machine with: {', '.join(missing)}; re-lock the plan "
                             "(plan lock adds it to every node lock)")
    return {**env, **agent, "root": root, "platform": f"{node['sys_platform']}-{node['machine']}",
            "python": node["python_full"], "versions": versions,
            "models": weights.paths, "weights_sent_bytes": weights.sent_bytes,
            "weights_skipped_bytes": weights.skipped_bytes,
            "weights_resumed_bytes": weights.resumed_bytes,
            "weights_resent_corrupt": weights.resent_corrupt,
            "seconds": round(time.monotonic() - t0, 3)}
