"""One-time privileged node preparation with fabric, host by host.

macOS steps: keep the Mac awake on AC (``pmset -c sleep 0 disksleep 0 powernap 0``),
Low Power Mode off (``pmset -a lowpowermode 0``), Spotlight kept out of the specfleet
root; on every node: the root, owned by the benchmark user. ``check`` reports each step
with the exact command it would run and changes nothing. Host keys are verified against
the same known_hosts as asyncssh: fabric's default policy would accept any key, so it is
replaced by RejectPolicy. A host with ``ansible_connection: local`` runs the same steps on
the controller itself through invoke.

Every value that reaches a command is checked (no control characters, a root made of
path characters, a POSIX user name) and quoted: these commands run as root.
"""

from __future__ import annotations

import os
import re
import shlex

from ..errors import ConfigError
from .fanout import Outcome
from .inventory import Host

q = shlex.quote
_ROOT_OK = re.compile(r"~?[\w./ @+,:-]+")
_USER_OK = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*\$?")


def check_inputs(host: Host) -> None:
    """Refuse an inventory value that could be read as more than a path or a name."""
    if not _ROOT_OK.fullmatch(host.root) or "/../" in f"/{host.root}/":
        raise ConfigError(f"{host.name}: specfleet_root {host.root!r} may hold only letters, "
                          "digits, spaces and . _ / @ + , : - (and a leading ~)")
    owner = host.vars.get("specfleet_become_user") or host.user
    if owner is not None and not _USER_OK.fullmatch(str(owner)):
        raise ConfigError(f"{host.name}: user {str(owner)!r} is not a valid user name")


def parse_pmset_custom(text: str) -> dict[str, dict[str, str]]:
    """``pmset -g custom`` → {"AC Power": {key: value}, "Battery Power": {...}}. Keys may
    hold spaces ("Sleep On Power Button"); columns are padded with spaces."""
    out: dict[str, dict[str, str]] = {}
    section: dict[str, str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace() and line.rstrip().endswith(":"):
            section = out.setdefault(line.strip()[:-1], {})
            continue
        if section is None:
            continue
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        key, value = parts if len(parts) == 2 else (line.strip().rsplit(None, 1) + [""])[:2]
        section[key] = value.strip()
    return out


def mac_power_steps(custom: str) -> list[dict]:
    """The keep-awake and Low Power Mode steps from ``pmset -g custom``."""
    blocks = parse_pmset_custom(custom)
    ac = blocks.get("AC Power") or next(iter(blocks.values()), {})
    awake = all(ac.get(k, "0").split()[0] == "0" for k in ("sleep", "disksleep", "powernap"))
    steps = [{"step": "keep awake on AC (no system sleep, disk sleep or Power Nap)",
              "needed": not awake, "command": "pmset -c sleep 0 disksleep 0 powernap 0"}]
    lpm = [b.get("lowpowermode") for b in blocks.values() if "lowpowermode" in b]
    steps.append({"step": "Low Power Mode off on every power source",
                  "needed": any(v != "0" for v in lpm),
                  "command": "pmset -a lowpowermode 0",
                  **({} if lpm else {"note": "this Mac reports no lowpowermode setting"})})
    return steps


def _connect(host: Host, known_hosts: str, password: str | None, timeout: float):
    from fabric import Config

    overrides = {"sudo": {"password": password}, "run": {"in_stream": False}}
    if host.is_local:
        from invoke import Context

        return Context(config=Config(overrides=overrides))
    import paramiko
    from fabric import Connection

    kw: dict[str, object] = {"look_for_keys": host.key_file is None,
                             "allow_agent": host.key_file is None}
    if host.key_file:
        kw["key_filename"] = os.path.expanduser(host.key_file)
    c = Connection(host=host.address, user=host.user, port=host.port, connect_kwargs=kw,
                   connect_timeout=int(timeout), config=Config(overrides=overrides))
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    if os.path.exists(known_hosts):
        c.client.load_host_keys(known_hosts)
    return c


def _steps(c, root: str, owner: str, macos: bool) -> list[dict]:
    """Each step: whether it is needed, and the privileged command that does it."""
    steps = []
    if macos:
        steps += mac_power_steps(c.run("pmset -g custom", hide=True, warn=True).stdout)
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
                      "command": f"touch {q(marker)} && (mount | grep -qF -- "
                                 f"{q(' on ' + root + ' ')} && mdutil -i off {q(root)} "
                                 "|| true)"})
    return steps


def prepare_host(host: Host, known_hosts: str, password: str | None, check: bool,
                 timeout: float = 10.0) -> Outcome:
    import paramiko
    from invoke.exceptions import AuthFailure, UnexpectedExit

    try:
        check_inputs(host)
    except ConfigError as e:
        return Outcome(host.name, "failed", f"{e}; nothing was run")
    try:
        c = _connect(host, known_hosts, password, timeout)
        if not host.is_local:
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
        if not _USER_OK.fullmatch(owner):
            return Outcome(host.name, "failed", f"user {owner!r} is not a valid user name")
        macos = c.run("uname -s", hide=True).stdout.strip() == "Darwin"
        steps = _steps(c, root, owner, macos)
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
            steps.insert(0, {"step": "pmset, Low Power Mode, Spotlight", "needed": False,
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
        if not host.is_local:
            c.close()
