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

SSHD = "/usr/sbin/sshd"


@dataclass
class Node:
    name: str
    address: str
    port: int
    user: str
    home: Path
    proc: subprocess.Popen | None = None


@dataclass
class Fleet:
    base: Path
    client_key: Path
    known_hosts: Path
    python: str
    nodes: list[Node] = field(default_factory=list)

    def host(self, i: int = 0, **overrides):
        """An inventory Host for node ``i`` (the library's own type, not a stand-in)."""
        from orchestrator.inventory import Host

        n = self.nodes[i]
        kw = dict(name=n.name, address=n.address, port=n.port, user=n.user,
                  key_file=str(self.client_key), python=self.python)
        kw.update(overrides)
        return Host(**kw)

    def ssh_options(self, **kw):
        from orchestrator.transport import SSHOptions

        return SSHOptions(known_hosts=str(self.known_hosts), **kw)

    def inventory_yaml(self, extra_hosts: dict | None = None) -> str:
        lines = ["all:", "  vars:", f"    ansible_ssh_private_key_file: {self.client_key}",
                 f"    specfleet_python: {self.python}", "  children:", "    lab:",
                 "      hosts:"]
        for n in self.nodes:
            lines += [f"        {n.name}:", f"          ansible_host: {n.address}",
                      f"          ansible_port: {n.port}", f"          ansible_user: {n.user}"]
        for name, hv in (extra_hosts or {}).items():
            lines.append(f"        {name}:")
            lines += [f"          {k}: {v}" for k, v in hv.items()]
        return "\n".join(lines) + "\n"


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not start")


def start_fleet(count: int, python: str) -> Fleet:
    if os.geteuid() != 0 or not Path(SSHD).exists():
        raise RuntimeError("the sshd fleet needs root and openssh-server (make test installs it)")
    base = Path(tempfile.mkdtemp(prefix="specfleet-fleet-"))
    base.chmod(0o755)
    key = base / "client_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    fleet = Fleet(base=base, client_key=key, known_hosts=base / "known_hosts", python=python)
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    known = []
    tag = base.name.rsplit("-", 1)[-1][:6].lower()
    for i in range(1, count + 1):
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
        address = f"127.0.1.{i}"
        port = _free_port(address)
        cfg = base / f"sshd{i}.conf"
        cfg.write_text("\n".join([
            f"ListenAddress {address}:{port}", f"HostKey {hostkey}", f"PidFile {base}/sshd{i}.pid",
            "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", f"AllowUsers {user}", "MaxStartups 200:30:400",
            "StrictModes yes", "Subsystem sftp internal-sftp", "LogLevel INFO", ""]))
        proc = subprocess.Popen([SSHD, "-D", "-f", str(cfg), "-E", str(base / f"sshd{i}.log")])
        node = Node(f"node{i}", address, port, user, home, proc)
        fleet.nodes.append(node)
        known.append(f"[{address}]:{port} " + " ".join(
            hostkey.with_suffix(".pub").read_text().split()[:2]))
    fleet.known_hosts.write_text("\n".join(known) + "\n")
    for n in fleet.nodes:
        _wait_listening(n.address, n.port)
    return fleet


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
    shutil.rmtree(fleet.base, ignore_errors=True)
