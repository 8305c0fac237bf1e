"""Secrets never reach a screen, a log or a page: store URLs are shown with the password
masked, wherever the text came from (a hint, an error, a crash log's command line)."""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@host — the password ends at the last '@' before the host part
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*:)"
                           r"(?P<password>[^\s'\"]*)(?P<at>@)(?=[^@\s'\"]*(?:[\s'\"]|$))")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: m["head"] + MASK + m["at"], text)


def has_password(url: str) -> bool:
    return redact(url) != url
