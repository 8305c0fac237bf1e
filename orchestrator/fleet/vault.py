"""Ansible Vault values (``!vault`` in inventories and vars files), format 1.1 / 1.2 AES256.

The published format: a ``$ANSIBLE_VAULT;1.1;AES256`` header (1.2 adds a vault id), then
the hex of ``hex(salt) \\n hex(hmac) \\n hex(ciphertext)``. Keys come from
PBKDF2-HMAC-SHA256(password, salt, 10000 iterations, 80 bytes): 32 for AES-256-CTR, 32 for
the HMAC-SHA256 over the ciphertext, 16 for the initial counter; the plaintext is PKCS#7
padded. The password comes from ``--vault-password-file`` or
``ANSIBLE_VAULT_PASSWORD_FILE`` (an executable file is run and its output used).
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import os
import subprocess
from pathlib import Path

from ..errors import ConfigError


class VaultError(ConfigError):
    """A vaulted value cannot be decrypted."""


def read_password(path: str | Path | None) -> bytes | None:
    """The vault password from a file (or from running it, when it is executable)."""
    path = path or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if not path:
        return None
    p = Path(path).expanduser()
    try:
        if os.access(p, os.X_OK) and p.is_file():
            out = subprocess.run([str(p)], capture_output=True, check=True).stdout
        else:
            out = p.read_bytes()
    except (OSError, subprocess.CalledProcessError) as e:
        raise ConfigError(f"cannot read the vault password: {e}", str(p)) from None
    return out.strip(b"\r\n")


def decrypt(text: str, password: bytes) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("$ANSIBLE_VAULT;"):
        raise VaultError("not an Ansible Vault value (no $ANSIBLE_VAULT header)")
    header = lines[0].split(";")
    if header[1] not in ("1.1", "1.2") or header[2] != "AES256":
        raise VaultError(f"vault format {';'.join(header[1:3])} is not supported "
                         "(1.1 or 1.2 with AES256)")
    try:
        salt_hex, mac_hex, data_hex = binascii.unhexlify("".join(lines[1:])).split(b"\n", 2)
        salt, mac, data = (binascii.unhexlify(x) for x in (salt_hex, mac_hex, data_hex))
    except (ValueError, binascii.Error):
        raise VaultError("the vault value is damaged (not the hex the format requires)") \
            from None
    key = hashlib.pbkdf2_hmac("sha256", password, salt, 10000, dklen=80)
    if not hmac.compare_digest(hmac.new(key[32:64], data, hashlib.sha256).digest(), mac):
        raise VaultError("the vault password does not decrypt it (HMAC mismatch)")
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    d = Cipher(algorithms.AES(key[:32]), modes.CTR(key[64:80])).decryptor()
    padded = d.update(data) + d.finalize()
    n = padded[-1] if padded else 0
    if not 1 <= n <= 16 or padded[-n:] != bytes([n]) * n:
        raise VaultError("the decrypted value has bad padding")
    return padded[:-n].decode("utf-8")
