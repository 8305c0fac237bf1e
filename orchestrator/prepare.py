"""One-time privileged node preparation with fabric, host by host.

Steps: keep the Mac awake on AC (``pmset``), keep Spotlight out of the specfleet root,
create the root owned by the benchmark user. ``check`` reports what would change and
changes nothing. Host keys are verified against the same known_hosts as asyncssh:
fabric's default policy would accept any key, so it is replaced by RejectPolicy.
"""

from __future__ import annotations

import os
import shlex

from .fanout import Outcome
from .inventory import Host

q = shlex.quote


def _connect(host: Host, known_hosts: str, password: str | None, timeout: float):
    import paramiko
    from fabric import Config, Connection

    kw = {"look_for_keys": host.key_file is None, "allow_agent": host.key_file is None}
    if host.key_file:
        kw["key_filename"] = os.path.expanduser(host.key_file)
    c = Connection(host=host.address, user=host.user, port=host.port, connect_kwargs=kw,
                   connect_timeout=int(timeout),
                   config=Config(overrides={"sudo": {"password": password},
                                            "run": {"in_stream": False}}))
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    if os.path.exists(known_hosts):
        c.client.load_host_keys(known_hosts)
    return c


def _steps(c, host: Host, root: str, owner: str, macos: bool) -> list[dict]:
    """Each step: how to see whether it is needed, and the privileged command that does it."""
    steps = []
    if macos:
        custom = c.run("pmset -g custom", hide=True, warn=True).stdout
        ac = custom.split("AC Power:")[-1] if "AC Power:" in custom else custom
        awake = " sleep                0" in ac or "\n sleep 0" in ac
        steps.append({"step": "keep awake on AC (pmset -c sleep 0 disksleep 0 powernap 0)",
                      "needed": not awake,
                      "command": "pmset -c sleep 0 disksleep 0 powernap 0"})
    exists = c.run(f"test -d {q(root)}", hide=True, warn=True).ok
    owned = exists and c.run(f"test \"$(stat -c %U {q(root)} 2>/dev/null || "
                             f"stat -f %Su {q(root)})\" = {q(owner)}", hide=True, warn=True).ok
    steps.append({"step": f"create {root} owned by {owner}", "needed": not owned,
                  "command": f"mkdir -p {q(root)} && chown {q(owner)} {q(root)}"})
    if macos:
        marker = f"{root}/.metadata_never_index"
        has = c.run(f"test -e {q(marker)}", hide=True, warn=True).ok
        # mdutil works per volume: only a root on its own volume can be switched off whole.
        steps.append({"step": f"keep Spotlight out of {root}", "needed": not has,
                      "command": f"touch {q(marker)} && (mount | grep -q ' on {root} ' && "
                                 f"mdutil -i off {q(root)} || true)"})
    return steps


def prepare_host(host: Host, known_hosts: str, password: str | None, check: bool,
                 timeout: float = 10.0) -> Outcome:
    import paramiko
    from invoke.exceptions import AuthFailure, UnexpectedExit

    try:
        c = _connect(host, known_hosts, password, timeout)
        c.open()
    except paramiko.SSHException as e:
        msg = str(e)
        if "not found in known_hosts" in msg:
            msg = f"host key not in {known_hosts}; refusing (fabric's accept-any is disabled)"
        return Outcome(host.name, "unreachable", msg)
    except (TimeoutError, OSError) as e:
        return Outcome(host.name, "unreachable", f"{host.endpoint}: {e}")
    try:
        home = c.run('printf %s "$HOME"', hide=True).stdout
        root = home + host.root[1:] if host.root.startswith("~") else host.root
        owner = str(host.vars.get("specfleet_become_user") or host.user or
                    c.run("id -un", hide=True).stdout.strip())
        macos = c.run("uname -s", hide=True).stdout.strip() == "Darwin"
        steps = _steps(c, host, root, owner, macos)
        for s in steps:
            if not s["needed"]:
                s["state"] = "ok"
            elif check:
                s["state"] = "would change"
            else:
                # in_stream=False: our stdin must not reach sudo (EOF would end its prompt)
                c.sudo(f"sh -c {q(s['command'])}", hide=True, in_stream=False)
                s["state"] = "changed"
        if not macos:
            steps.insert(0, {"step": "pmset / Spotlight", "needed": False,
                             "state": "skipped (not macOS)"})
        return Outcome(host.name, "ok", value=steps)
    except AuthFailure:
        return Outcome(host.name, "failed", "sudo refused the password (use "
                                            "--ask-become-pass with the right one)")
    except UnexpectedExit as e:
        r = e.result
        return Outcome(host.name, "failed", f"`{r.command}` exited {r.exited}",
                       command=r.command, exit_status=r.exited,
                       stderr_tail="\n".join((r.stderr or r.stdout).strip().splitlines()[-5:]))
    finally:
        c.close()
