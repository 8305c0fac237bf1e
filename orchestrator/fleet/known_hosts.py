"""known_hosts read as OpenSSH reads it, so trust is decided as `ssh` decides it.

asyncssh's own matching differs where it matters for --accept-new-host-keys: a negated
pattern (``!addr``) is tested against the address as well as ``[addr]:port`` and so hid a
changed key; a port-less entry applied to any port; a key listed only under ``@revoked``
was not "known", so accept-new trusted it. Here, as in OpenSSH (CheckHostIP off, its
default since 8.5): the name looked up is the address the node is reached at, written
``[addr]:port`` unless the port is 22; patterns take ``*`` and ``?``, a matching ``!``
pattern voids its line, ``|1|`` names are HMAC-SHA1 hashes; ``@revoked`` keys are refused
whatever else is listed; ``@cert-authority`` keys vouch only for certificates.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field

import asyncssh


@dataclass
class HostKeys:
    """What a known_hosts file says of one node."""

    trusted: list = field(default_factory=list)   # plain keys: a different one is "changed"
    ca: list = field(default_factory=list)        # @cert-authority: certificates only
    revoked: list = field(default_factory=list)   # @revoked: never accepted

    def as_asyncssh(self) -> tuple[list, list, list]:
        return self.trusted, self.ca, self.revoked

    def is_revoked(self, key) -> bool:
        blob = key.public_data
        return any(k.public_data == blob for k in self.revoked)


def lookup_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def resolved_name(address: str, port: int | None, ssh_config: str | None = None) -> str:
    """The name OpenSSH looks a node up by in known_hosts: after ssh_config's HostName,
    Port and HostKeyAlias (as ``ssh -G`` resolves them), lowercased. A node reached as
    an alias is known by its real name: a changed key there is a changed key, never new.
    Without an ssh client here, the inventory's address and port."""
    import shutil
    import subprocess

    ssh = shutil.which("ssh")
    if ssh:
        cmd = [ssh, "-G", *(["-F", ssh_config] if ssh_config else []),
               *(["-p", str(port)] if port else []), "--", address]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            r = None
        if r is not None and r.returncode == 0:
            cfg = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
            alias = cfg.get("hostkeyalias", "none")
            if alias != "none":
                return alias.lower()
            try:
                resolved_port = int(cfg.get("port", port or 22))
            except ValueError:
                resolved_port = port or 22
            return lookup_name(cfg.get("hostname", address).lower(), resolved_port)
    return lookup_name(address.lower(), port or 22)


def _pattern(p: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                              for c in p.lower()) + r"\Z", re.S)


def names_match(names: str, name: str) -> bool:
    """Whether a line's host field names ``name`` (OpenSSH's match_hostname)."""
    if names.startswith("|1|"):
        try:
            _, _, salt, digest = names.split("|", 3)
            want = base64.b64decode(digest)
            # OpenSSH hashes the lowercased name
            got = hmac.new(base64.b64decode(salt), name.lower().encode(), hashlib.sha1).digest()
        except (ValueError, TypeError):
            return False
        return hmac.compare_digest(want, got)
    matched = False
    for pat in names.split(","):
        negated = pat.startswith("!")
        if _pattern(pat[1:] if negated else pat).match(name.lower()):
            if negated:
                return False  # a negated match voids the whole line
            matched = True
    return matched


def host_keys(text: str, name: str) -> HostKeys:
    """The keys ``text`` (a known_hosts file) holds for ``name`` (``resolved_name``);
    lines that do not parse are skipped, as OpenSSH skips them."""
    out = HostKeys()
    for line in text.splitlines():
        line = line.lstrip(" \t")
        marker = None
        if line.startswith("@"):
            # OpenSSH's marker ends at the line's first space (a tab only when there is
            # none): "@revoked<TAB>host<TAB>key" is no marker, and the line is skipped
            end = line.find(" ") if " " in line else line.find("\t")
            marker, line = (line[:end], line[end + 1:]) if end > 0 else (line, "")
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if marker not in (None, "@revoked", "@cert-authority") or len(fields) < 3:
            continue
        if not names_match(fields[0], name):
            continue
        try:
            key = asyncssh.import_public_key(f"{fields[1]} {fields[2]}")
        except (asyncssh.KeyImportError, ValueError):
            continue
        {None: out.trusted, "@revoked": out.revoked, "@cert-authority": out.ca}[marker] \
            .append(key)
    return out


def read_host_keys(path: str, name: str) -> HostKeys:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return host_keys(f.read(), name)
    except FileNotFoundError:
        return HostKeys()
