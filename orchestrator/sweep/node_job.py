"""What a node is sent: its copy of the lock's job, the command that starts its agent, and
the identity its results are stored under."""

from __future__ import annotations

import json
import os

from agent.cotenant import profile_name
from agent.protocol import model_roles

from ..fleet.inventory import Host
from ..fleet.transport import q
from .jobspec import node_job as build_node_job
from .pair_names import model_pair_name, role_names


def _substitute(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(key, json.dumps(value)[1:-1])
    return text


def node_job(job: dict, doc: dict, sweep_id: str, models: dict, python: str,
             host: Host) -> dict:
    """The lock's job as this node runs it: its copies of the models, its Python (built
    through the agent's ``Job`` by ``jobspec.node_job``)."""
    own: dict = {}
    if job.get("engine"):  # runtime command lines name the node's copies of the pair
        paths = {"{target}": models["target"]["path"], "{draft}": models["draft"]["path"],
                 "{python}": python}
        own["engine"] = json.loads(_substitute(json.dumps(job["engine"]), paths))
    if host.vars.get("specfleet_memory_bandwidth_gbs"):  # per-node roofline override
        own["memory_bandwidth_gbs"] = float(host.vars["specfleet_memory_bandwidth_gbs"])
    if host.is_local:
        # this process follows and ingests the journal on the node it measures (a local
        # demo): the agent says its CPU as the controller's, not as other processes'. A
        # controller that attaches later is another process: its CPU counts as others'.
        own["controller_pid"] = os.getpid()
    return build_node_job(job, sweep_id, {
        r: {"path": models[r]["path"], "fingerprint": doc["models"][r]["fingerprint"]}
        for r in model_roles(doc["models"])}, **own)


def node_identity(doc: dict, job: dict, env_id: str | None, facts: dict) -> dict:
    """The parts of every result's identity this node's run fixes."""
    return {"env_id": env_id, "power_source": facts["power_source"],
            "model_pair": model_pair_name(doc),
            "background": profile_name(job["background"]) if job.get("background") else None,
            **({"role_names": names} if (names := role_names(doc)) else {})}


def agent_command(sn, host: Host, resume: bool) -> str:
    """The command line that starts (or resumes) the node's agent, detached; a node with a
    journal key reads it from the session's stdin (never argv: ``ps`` shows argv)."""
    return (f"cd {q(sn.agent_dir)} && {q(sn.python)} -m agent run {q(sn.job_path)} "
            f"--journal {q(sn.journal_path)} --lock {q(sn.root + '/agent.lock')} "
            f"--cache-dir {q(sn.root + '/cache')} --detach" + (" --resume" if resume else "")
            + (" --key-stdin" if sn.journal_key else "")
            + (f" --machine-lock {q(str(host.vars['specfleet_machine_lock']))}"
               if host.vars.get("specfleet_machine_lock") else ""))
