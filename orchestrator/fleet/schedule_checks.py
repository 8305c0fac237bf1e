"""`specfleet doctor --schedule`: will the nightly, started by launchd/systemd/cron at 02:00
with no terminal and no one logged in, get as far as the manual sweep does?

- SSH without a TTY: no passphrase prompt can be answered, and the login's ssh-agent is
  gone; a key without passphrase, or an ``IdentityAgent`` socket that outlives the login;
- macOS privacy (TCC): a job launchd starts may not read ~/Documents, ~/Desktop or
  ~/Downloads; a lab folder there fails at night and works by hand;
- systemd user timers run only while the user is logged in, unless lingering is on.
"""

from __future__ import annotations

import getpass
import re
import stat
import subprocess
import sys
from pathlib import Path

from .doctor import Check
from .inventory import Host

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # what ssh and asyncssh try
TCC_FOLDERS = ("Documents", "Desktop", "Downloads")


def has_no_passphrase(key: Path) -> bool:
    """ssh-keygen loads the private key with an empty passphrase, or fails."""
    r = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", str(key)], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=10)
    return r.returncode == 0


def _identity_agent(home: Path) -> Path | None:
    cfg = home / ".ssh" / "config"
    if not cfg.is_file():
        return None
    m = re.search(r"^\s*IdentityAgent\s+(\S+)", cfg.read_text(), re.M | re.I)
    if not m or m.group(1).lower() == "none" or m.group(1).startswith("$"):
        return None  # a variable (SSH_AUTH_SOCK) is the login's agent: not there at night
    return Path(m.group(1).strip('"')).expanduser()


def ssh_without_tty(hosts: list[Host], home: Path | None = None) -> list[Check]:
    """Can a job with no terminal and no login session authenticate to the remote nodes?"""
    home = home or Path.home()
    remote = [h for h in hosts if not h.is_local]
    if not remote:
        return [Check("tty-free", "ok", "every node is local: no SSH at night")]
    agent = _identity_agent(home)
    if agent is not None and agent.exists() and stat.S_ISSOCK(agent.stat().st_mode):
        return [Check("tty-free", "ok", f"IdentityAgent {agent} (a socket that does not "
                                        "depend on your login)")]
    out = []
    for h in remote:
        named = h.key_file or h.vars.get("ansible_ssh_private_key_file")
        keys = [Path(str(named)).expanduser()] if named else [
            home / ".ssh" / k for k in DEFAULT_KEYS]
        keys = [k for k in keys if k.is_file()]
        free = next((k for k in keys if has_no_passphrase(k)), None)
        if free:
            out.append(Check("tty-free", "ok", f"{h.name}: {free} has no passphrase"))
        else:
            out.append(Check(
                "tty-free", "FAIL", f"{h.name}: " + (
                    f"{', '.join(str(k) for k in keys)} need(s) a passphrase" if keys else
                    "no private key found") + " and no agent socket outlives your login: at "
                "night the nightly cannot log in",
                "ssh-keygen -t ed25519 -N '' -f ~/.ssh/specfleet_nightly, add the .pub to the "
                "node and set ansible_ssh_private_key_file, or set IdentityAgent in "
                "~/.ssh/config to an agent that runs without you"))
    return out


def tcc_protected(paths: list[Path], home: Path | None = None,
                  platform: str = sys.platform) -> list[Check]:
    """A warning per path launchd's jobs may not read (macOS privacy protection)."""
    if platform != "darwin":
        return []
    home = (home or Path.home()).resolve()
    out = []
    for p in paths:
        p = p.expanduser().resolve()
        for folder in TCC_FOLDERS:
            if p.is_relative_to(home / folder):
                out.append(Check("privacy", "warn", f"{p} is in ~/{folder}: macOS does not let "
                                 "a launchd job read it without Full Disk Access",
                                 f"move the lab folder out of ~/{folder} (e.g. ~/lab)"))
                break
    return out or [Check("privacy", "ok", "no path in ~/Documents, ~/Desktop or ~/Downloads")]


def lingering(kind: str, user: str | None = None,
              linger_dir: Path = Path("/var/lib/systemd/linger")) -> list[Check]:
    """systemd user timers need lingering to run while the user is not logged in."""
    if kind != "systemd":
        return []
    user = user or getpass.getuser()
    if (linger_dir / user).exists():
        return [Check("linger", "ok", f"lingering is on for {user}")]
    return [Check("linger", "warn", f"lingering is off for {user}: the timer fires only while "
                  "you are logged in", f"sudo loginctl enable-linger {user}")]


def schedule_checks(hosts: list[Host], paths: list[Path], kind: str) -> list[Check]:
    return [*ssh_without_tty(hosts), *tcc_protected(paths), *lingering(kind)]
