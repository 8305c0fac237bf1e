"""Real OpenSSH ``sshd`` nodes on loopback for tests: one user, key and config per node."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests import blas
from tests.ports import free_port

SSHD = "/usr/sbin/sshd"


@dataclass
class Node:
    name: str
    address: str
    port: int
    user: str
    home: Path
    proc: subprocess.Popen | None = None
    netns: str | None = None
    link: str | None = None
    ns_link: str | None = None


@dataclass
class Fleet:
    base: Path
    client_key: Path
    known_hosts: Path
    python: str
    nodes: list[Node] = field(default_factory=list)

    def machine_lock(self, i: int) -> str:
        """Every loopback node stands for a machine of its own: its own machine-wide lock
        (they all run on this one host, where they would otherwise share /tmp's)."""
        return f"/tmp/specfleet-test-{self.nodes[i].name}-{self.nodes[i].user}.lock"

    def host(self, i: int = 0, **overrides):
        """An inventory Host for node ``i`` (the library's own type, not a stand-in)."""
        from orchestrator.fleet.inventory import Host

        n = self.nodes[i]
        kw = dict(name=n.name, address=n.address, port=n.port, user=n.user,
                  key_file=str(self.client_key), python=self.python,
                  vars={"specfleet_machine_lock": self.machine_lock(i)})
        kw.update(overrides)
        return Host(**kw)

    def ssh_options(self, **kw):
        from orchestrator.fleet.transport import SSHOptions

        return SSHOptions(known_hosts=str(self.known_hosts), **kw)

    def inventory_yaml(self, extra_hosts: dict | None = None) -> str:
        lines = ["all:", "  vars:", f"    ansible_ssh_private_key_file: {self.client_key}",
                 f"    specfleet_python: {self.python}", "  children:", "    lab:",
                 "      hosts:"]
        for n in self.nodes:
            lines += [f"        {n.name}:", f"          ansible_host: {n.address}",
                      f"          ansible_port: {n.port}", f"          ansible_user: {n.user}",
                      f"          specfleet_machine_lock: "
                      f"{self.machine_lock(self.nodes.index(n))}"]
        for name, hv in (extra_hosts or {}).items():
            lines.append(f"        {name}:")
            lines += [f"          {k}: {v}" for k, v in hv.items()]
        return "\n".join(lines) + "\n"


def _wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not start")


def _setenv(lock: str) -> list[str]:
    """The nodes compute as this test run does: `make test` preloads OpenBLAS for its
    parallel part (tests/blas.py), and sshd would otherwise drop it from their sessions.
    And each node is a machine of its own even where an inventory written as a user would
    (the README's, the help examples') names no `specfleet_machine_lock`: two test modules'
    sweeps on two loopback nodes must not find "the machine" busy."""
    env = {k: os.environ[k] for k in blas.VARS if k in os.environ}
    env["SPECFLEET_MACHINE_LOCK"] = lock
    return ["SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())]


def _add_node(fleet: Fleet, i: int, address: str, port: int, netns: str | None = None,
              name: str | None = None) -> Node:
    """A user with a 0700 home and the client key, a host key, and an sshd for it."""
    base, key = fleet.base, fleet.client_key
    tag = base.name.rsplit("-", 1)[-1][:6].lower()
    user = f"sf{tag}{i}"[:31]
    home = base / f"home{i}"
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", "-p", "*", user],
                   check=True)
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(key.with_suffix(".pub"), home / ".ssh" / "authorized_keys")
    subprocess.run(["chown", "-R", f"{user}:{user}", str(home)], check=True)
    home.chmod(0o700)
    hostkey = base / f"host{i}_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)],
                   check=True)
    cfg = base / f"sshd{i}.conf"
    cfg.write_text("\n".join([
        f"ListenAddress {address}:{port}", f"HostKey {hostkey}", f"PidFile {base}/sshd{i}.pid",
        "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", f"AllowUsers {user}", "MaxStartups 200:30:400",
        "MaxSessions 100", "StrictModes yes", "Subsystem sftp internal-sftp", "LogLevel INFO",
        *_setenv(f"/tmp/specfleet-test-{name or f'node{i}'}-{user}.lock"), ""]))
    cmd = [SSHD, "-D", "-f", str(cfg), "-E", str(base / f"sshd{i}.log")]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    node = Node(name or f"node{i}", address, port, user, home, subprocess.Popen(cmd))
    node.netns = netns
    fleet.nodes.append(node)
    with open(fleet.known_hosts, "a") as f:
        f.write(f"[{address}]:{port} " + " ".join(
            hostkey.with_suffix(".pub").read_text().split()[:2]) + "\n")
    return node


def start_fleet(count: int, python: str) -> Fleet:
    if os.geteuid() != 0 or not Path(SSHD).exists():
        raise RuntimeError("the sshd fleet needs root and openssh-server (make test installs it)")
    base = Path(tempfile.mkdtemp(prefix="specfleet-fleet-"))
    base.chmod(0o755)
    key = base / "client_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fleet = Fleet(base=base, client_key=key, known_hosts=base / "known_hosts", python=python)
    fleet.known_hosts.write_text("")
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    for i in range(1, count + 1):
        address = f"127.0.1.{i}"
        _add_node(fleet, i, address, free_port(address))
    for n in fleet.nodes:
        _wait_listening(n.address, n.port)
    return fleet


def _clear_stale_link(address: str) -> None:
    """A run killed mid-test leaves its veth holding this worker's /30: the new node's
    address would route to the dead namespace (CI: "sshd on 10.213.17.2:22 did not
    start"). Deleting the host side deletes the pair."""
    out = subprocess.run(["ip", "-o", "addr", "show", "to", f"{address}/30"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        subprocess.run(["ip", "link", "del", line.split()[1].split("@")[0]], check=False)


def add_netns_node(fleet: Fleet, i: int) -> Node:
    """A node in its own network namespace behind a veth pair, so a test can cut its link."""
    tag = fleet.base.name.rsplit("-", 1)[-1][:4].lower()
    ns, host_if, ns_if = f"sf{tag}{i}", f"sfh{tag}{i}", f"sfn{tag}{i}"
    # each parallel test worker (gw0, gw1 …) gets its own /30s: no two namespaces share one
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    a, b = f"10.213.{worker * 16 + i}.1", f"10.213.{worker * 16 + i}.2"
    _clear_stale_link(a)
    for cmd in (["ip", "netns", "add", ns],
                ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
                ["ip", "link", "set", ns_if, "netns", ns],
                ["ip", "addr", "add", f"{a}/30", "dev", host_if],
                ["ip", "link", "set", host_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{b}/30", "dev", ns_if],
                ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
                ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]):
        subprocess.run(cmd, check=True)
    node = _add_node(fleet, i, b, 22, netns=ns, name=f"netnode{i}")
    node.link, node.ns_link = host_if, ns_if
    _wait_listening(b, 22)
    return node


def set_link(node: Node, up: bool, side: str = "controller") -> None:
    """Bring the veth down on the controller's side (a cut cable) or the node's side (the
    node vanished: packets to it are silently lost)."""
    state = "up" if up else "down"
    if side == "controller":
        subprocess.run(["ip", "link", "set", node.link, state], check=True)
    else:
        subprocess.run(["ip", "netns", "exec", node.netns, "ip", "link", "set", node.ns_link,
                        state], check=True)


def stop_fleet(fleet: Fleet) -> None:
    for n in fleet.nodes:
        if n.proc and n.proc.poll() is None:
            n.proc.terminate()
            try:
                n.proc.wait(5)
            except subprocess.TimeoutExpired:
                n.proc.kill()
        subprocess.run(["pkill", "-KILL", "-u", n.user], check=False)
        subprocess.run(["userdel", n.user], check=False, capture_output=True)
        if getattr(n, "netns", None):
            subprocess.run(["ip", "link", "del", n.link], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", n.netns], check=False, capture_output=True)
    shutil.rmtree(fleet.base, ignore_errors=True)
