"""How the controller reaches a node: SSH (asyncssh) or the local machine.

Both transports offer the same three operations — run a command, copy a folder,
stream a command's stdout line by line — so dispatch code never branches on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from agent.protocol import MAX_EVENT_BYTES

from ..errors import RemoteError, RemoteTimeoutError, UnreachableError
from .inventory import Host
from .known_hosts import HostKeys, read_host_keys, resolved_name

CHUNK = 1 << 20
# The default key exchange costs ~80 ms of CPU per connection on small machines.
KEX_ALGS = ["curve25519-sha256", "curve25519-sha256@libssh.org", "ecdh-sha2-nistp256"]
# AES-GCM runs on AES-NI / ARMv8 crypto units: several times chacha20's speed for weights.
CIPHERS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
           "aes128-ctr", "aes256-ctr"]


@dataclass(frozen=True)
class SSHOptions:
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts, checked strictly
    accept_new_host_keys: bool = False  # like StrictHostKeyChecking=accept-new
    ssh_config: str | None = None  # None: ~/.ssh/config when it exists (asyncssh's default)
    connect_timeout: float = 10.0
    keepalive_interval: float = 15.0  # asyncssh sends none unless asked
    keepalive_count_max: int = 3
    concurrency: int = 64

    @property
    def known_hosts_path(self) -> str:
        return self.known_hosts or os.path.expanduser("~/.ssh/known_hosts")


@dataclass
class Result:
    exit_status: int
    stdout: str
    stderr: str


class LocalTransport:
    """The controller's own machine, without SSH (the embedded demo default)."""

    def __init__(self, host: Host):
        self.host = host

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def home(self) -> str:
        return os.path.expanduser("~")

    async def run(self, command: str, check: bool = True, input: str | None = None) -> Result:
        proc = await asyncio.create_subprocess_shell(
            command, stdin=asyncio.subprocess.PIPE if input is not None else None,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(input.encode() if input is not None else None)
        res = Result(proc.returncode or 0, _text(out), _text(err))
        if check and res.exit_status != 0:
            raise RemoteError(self.host.name, command, res.exit_status, res.stderr)
        return res

    async def write_text(self, remote: str, text: str) -> None:
        await asyncio.to_thread(Path(remote).write_text, text, encoding="utf-8")

    async def stream_file(self, local: Path, offset: int, command: str,
                          progress=None) -> tuple[Result, int]:
        """Run ``command`` with ``local[offset:]`` on its stdin; returns (result, bytes)."""
        proc = await asyncio.create_subprocess_shell(
            command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stdin is not None  # asked for with PIPE
        sent = await _pump(local, offset, proc.stdin, progress)
        proc.stdin.close()
        out, err = await proc.communicate()
        res = Result(proc.returncode or 0, _text(out), _text(err))
        if res.exit_status != 0:
            raise RemoteError(self.host.name, command, res.exit_status, res.stderr)
        return res, sent

    async def put_dir(self, local: Path, remote: str) -> None:
        await asyncio.to_thread(shutil.copytree, local, remote, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))

    async def stream_lines(self, command: str) -> AsyncIterator[str]:
        # its own process group: the shell's children (the follower) hold the pipe, and
        # Python 3.11's Process.wait() returns only once every pipe is closed, so ending
        # only the shell left Ctrl-C waiting until the agent finished its job
        proc = await asyncio.create_subprocess_shell(
            command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        assert proc.stdout is not None and proc.stderr is not None  # asked for with PIPE
        stderr_task = asyncio.create_task(proc.stderr.read())
        try:
            async for line in split_lines(proc.stdout.read):
                yield line
            await proc.wait()
            err = (await stderr_task).decode(errors="replace")
        finally:  # closed early: stop the command rather than leave it to the collector
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            if not stderr_task.done():
                stderr_task.cancel()
        if proc.returncode != 0:
            raise RemoteError(self.host.name, command, proc.returncode, err)


class SSHTransport:
    """One asyncssh connection per host, reused for every channel."""

    def __init__(self, host: Host, options: SSHOptions):
        self.host, self.options = host, options
        self.conn: asyncssh.SSHClientConnection | None = None

    async def __aenter__(self):
        h, o = self.host, self.options
        if not os.path.isfile(o.known_hosts_path):
            # no file trusts no key: say which file, and how to trust this one
            if not o.accept_new_host_keys:
                raise UnreachableError(h.name, (
                    f"{o.known_hosts_path} does not exist, so no host key is trusted yet: "
                    f"add this node's with `ssh-keyscan -p {h.port or 22} {h.address} >> "
                    f"{o.known_hosts_path}` (check it), or pass --accept-new-host-keys"))
            self.conn = await self._connect(None)
            _append_known_host(o.known_hosts_path, self._known_name(),
                               self.conn.get_server_host_key())
            return self
        port = h.port or 22
        name = self._known_name()  # `ssh -G` once per connection
        keys = read_host_keys(o.known_hosts_path, name)
        try:
            self.conn = await self._connect(keys)
        except asyncssh.HostKeyNotVerifiable as e:
            known = bool(keys.trusted)
            if known or not o.accept_new_host_keys:
                why = ("the host key differs from the one in known_hosts — refusing (possible "
                       "man-in-the-middle; remove the old key only if the node was reinstalled)"
                       if known else f"host key not verifiable ({e.reason}); add it to "
                       f"{o.known_hosts_path} or pass --accept-new-host-keys"
                       + _port22_hint(o.known_hosts_path, h.address, port))
                if keys.revoked and "revoked" in str(e.reason):
                    why = (f"the host key is marked @revoked in {o.known_hosts_path} — "
                           "refusing; the node needs a new host key")
                raise UnreachableError(h.name, why) from None
            self.conn = await self._connect(None)
            presented = self.conn.get_server_host_key()
            if presented is not None and keys.is_revoked(presented):
                self.conn.close()
                raise UnreachableError(h.name, (
                    f"the host key is marked @revoked in {o.known_hosts_path} — refusing "
                    "(--accept-new-host-keys never trusts a revoked key); the node needs a "
                    "new host key")) from None
            _append_known_host(o.known_hosts_path, name, presented)
        return self

    def _known_name(self) -> str:
        """The name this node has in known_hosts, as OpenSSH resolves it."""
        return resolved_name(self.host.address, self.host.port, self.options.ssh_config)

    @property
    def live(self) -> asyncssh.SSHClientConnection:
        """The open connection (only used inside ``async with``)."""
        assert self.conn is not None, "use the transport as `async with connect(host)`"
        return self.conn

    async def _connect(self, known_hosts):
        h, o = self.host, self.options
        kwargs = {"known_hosts": known_hosts.as_asyncssh() if isinstance(known_hosts, HostKeys)
                  else known_hosts, "kex_algs": KEX_ALGS,
                  "encryption_algs": CIPHERS, "compression_algs": None,
                  "keepalive_interval": o.keepalive_interval,
                  "keepalive_count_max": o.keepalive_count_max,
                  "connect_timeout": o.connect_timeout}
        if h.port:
            kwargs["port"] = h.port
        if isinstance(known_hosts, HostKeys) and known_hosts.ca and not known_hosts.trusted:
            # a CA vouches for certificates only: offer plain keys too, so a node without
            # a certificate is "not known" (as for ssh), not a failed handshake
            kwargs["server_host_key_algs"] = "default"
        if o.ssh_config:
            kwargs["config"] = [o.ssh_config]
        if h.user:
            kwargs["username"] = h.user
        if h.key_file:
            kwargs["client_keys"] = [os.path.expanduser(h.key_file)]
        try:
            return await asyncssh.connect(h.address, **kwargs)
        except asyncssh.HostKeyNotVerifiable:
            raise
        except asyncio.TimeoutError:
            raise RemoteTimeoutError(h.name, f"no answer from {h.endpoint} "
                                             f"within {o.connect_timeout:g}s") from None
        except asyncssh.PermissionDenied as e:
            raise UnreachableError(h.name, f"{h.endpoint}: permission denied for user "
                                           f"{h.user or '(default)'} ({e.reason}); check "
                                           "ansible_user and the key") from None
        except ConnectionRefusedError:
            raise UnreachableError(h.name, f"{h.endpoint}: connection refused (is sshd "
                                           "running and ansible_port right?)") from None
        except socket.gaierror as e:
            raise UnreachableError(h.name, f"cannot resolve {h.address}: {e.strerror}") from None
        except (OSError, asyncssh.Error) as e:
            reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e)
            raise UnreachableError(h.name, f"{h.endpoint}: {reason}") from None

    async def __aexit__(self, *exc):
        if self.conn is not None:
            self.conn.close()
            await self.conn.wait_closed()

    async def home(self) -> str:
        return (await self.run('printf %s "$HOME"')).stdout

    async def run(self, command: str, check: bool = True, input: str | None = None) -> Result:
        try:
            r = await self.live.run(command, check=False, input=input)
        except (OSError, asyncssh.Error) as e:
            raise UnreachableError(self.host.name, f"connection lost: {e}") from None
        if r.exit_status is None:  # the session died mid-command: not a success
            raise UnreachableError(self.host.name, f"connection lost during `{command}`")
        res = Result(r.exit_status, str(r.stdout or ""), str(r.stderr or ""))
        if check and res.exit_status != 0:
            raise RemoteError(self.host.name, command, res.exit_status, res.stderr)
        return res

    async def write_text(self, remote: str, text: str) -> None:
        try:
            r = await self.live.run(f"cat > {q(remote)}", input=text, check=False)
        except (OSError, asyncssh.Error) as e:
            raise UnreachableError(self.host.name, f"connection lost: {e}") from None
        if r.exit_status != 0:
            raise RemoteError(self.host.name, f"cat > {remote}", r.exit_status,
                              str(r.stderr or ""))

    async def stream_file(self, local: Path, offset: int, command: str,
                          progress=None) -> tuple[Result, int]:
        """Run ``command`` with ``local[offset:]`` on its stdin over one channel.

        A plain byte stream keeps the pipe full (no per-block round trips as with SFTP
        writes); a dropped session leaves a shorter file that the next push resumes.
        """
        try:
            async with self.live.create_process(command, encoding=None) as proc:
                # a dead session stops the pump; the exit status check below reports it
                sent = await _pump(local, offset, proc.stdin, progress,
                                   lambda: proc.is_closing() or self.live.is_closed())
                proc.stdin.write_eof()
                done = await proc.wait(check=False)  # collects what stdout/stderr still hold
                out = _text(done.stdout)
                err = _text(done.stderr)
        except (OSError, asyncssh.Error) as e:
            raise UnreachableError(self.host.name, f"transfer broke: {e}") from None
        if proc.exit_status is None:
            raise UnreachableError(self.host.name, "connection lost during a transfer")
        if proc.exit_status != 0:
            raise RemoteError(self.host.name, command[:120], proc.exit_status, err)
        return Result(proc.exit_status, out, err), sent

    async def put_dir(self, local: Path, remote: str) -> None:
        try:
            async with self.live.start_sftp_client() as sftp:
                await sftp.makedirs(remote, exist_ok=True)
                for path in sorted(local.rglob("*")):
                    if "__pycache__" in path.parts:
                        continue
                    dest = f"{remote}/{path.relative_to(local).as_posix()}"
                    if path.is_dir():
                        await sftp.makedirs(dest, exist_ok=True)
                    else:
                        await sftp.put(str(path), dest)
        except (OSError, asyncssh.Error) as e:
            raise UnreachableError(self.host.name, f"copy to {remote} failed: {e}") from None

    async def stream_lines(self, command: str) -> AsyncIterator[str]:
        try:
            # bytes, split here: asyncssh's readline cuts a line longer than the channel's
            # window (2 MiB) into pieces, and a 3 MiB event arrived as two unreadable lines
            proc = await self.live.create_process(command, encoding=None)
            stderr_task = asyncio.create_task(proc.stderr.read())
            ended = False
            try:
                async for line in split_lines(proc.stdout.read):
                    yield line
                await proc.wait(check=False)
                err = _text(await stderr_task)
                ended = True
            finally:
                proc.close()
                if not ended:  # closed early (Ctrl-C, SIGTERM): do not wait for the channel.
                    # sshd closes it only once the command exits, and a follower waiting for
                    # a held agent's next line does not: the controller would wait with it.
                    # Closing the connection ends the command's session.
                    stderr_task.cancel()
                else:
                    await proc.wait_closed()
        except (OSError, asyncssh.Error) as e:
            raise UnreachableError(self.host.name, f"connection lost: {e}") from None
        if proc.exit_status is None:
            raise UnreachableError(self.host.name, f"connection lost during `{command}`")
        if proc.exit_status != 0:
            raise RemoteError(self.host.name, command, proc.exit_status, err)


async def split_lines(read, limit: int = MAX_EVENT_BYTES) -> AsyncIterator[str]:
    """A byte stream's lines, each whole however long, up to ``limit`` bytes: a longer one
    yields its first ``limit + 1`` bytes (the decode boundary sets it aside by its length)
    and the rest of it is skipped, so memory stays bounded. Bytes that are not UTF-8 come
    through escaped (surrogateescape), for the boundary to refuse, never replaced."""
    buf = b""
    skipping = False
    while True:
        chunk = await read(CHUNK)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        if skipping and lines:
            lines, skipping = lines[1:], False
        if len(buf) > limit:
            if not skipping:
                lines.append(buf[:limit + 1])
            buf, skipping = b"", True
        for line in lines:
            yield line.decode("utf-8", "surrogateescape") + "\n"
    if buf and not skipping:
        yield buf.decode("utf-8", "surrogateescape")


async def _pump(local: Path, offset: int, stdin, progress=None,
                stopped=lambda: False) -> int:
    """Copy ``local[offset:]`` into a process's stdin in CHUNK blocks; returns bytes sent."""
    sent = 0
    with open(local, "rb") as src:
        src.seek(offset)
        for chunk in iter(lambda: src.read(CHUNK), b""):
            if stopped():
                break
            stdin.write(chunk)
            await stdin.drain()
            sent += len(chunk)
            if progress:
                progress(len(chunk))
    return sent


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _known_hosts_lines(path: str, port: int) -> tuple[str, list[str]]:
    """known_hosts as OpenSSH reads it for ``port``: for 22 it looks up the bare host name,
    so ``[host]:22`` patterns never match (asyncssh's match() would count them). Returns
    the text to match and the dropped ``[host]:22`` patterns."""
    kept, dropped = [], []
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        fields = line.split(None, 1)
        if port != 22 or len(fields) < 2 or fields[0].startswith(("#", "@", "|")):
            kept.append(line)
            continue
        pats = fields[0].split(",")
        good = [x for x in pats if not re.fullmatch(r"!?\[[^\]]+\]:22", x)]
        dropped += [x for x in pats if x not in good]
        if good:
            kept.append(",".join(good) + " " + fields[1])
    return "\n".join(kept) + "\n", dropped


def _port22_hint(path: str, address: str, port: int) -> str:
    try:
        _, dropped = _known_hosts_lines(path, port)
    except OSError:
        return ""
    if f"[{address}]:22" in dropped:
        return (f"; {path} lists it as [{address}]:22, which OpenSSH does not use for port "
                f"22: write that entry as {address}")
    return ""


def _append_known_host(path: str, name: str, key) -> None:
    """Record a first-seen host key (``--accept-new-host-keys``) under the name OpenSSH
    would look it up by."""
    line = f"{name} {key.export_public_key().decode().strip()}\n"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        f.write(line)


def connect(host: Host, options: SSHOptions | None = None):
    """The transport for a host, used as ``async with connect(host) as t``."""
    return LocalTransport(host) if host.is_local else SSHTransport(host, options or SSHOptions())


def q(arg: str) -> str:
    """Quote one remote shell argument."""
    return shlex.quote(arg)
