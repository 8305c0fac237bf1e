"""Secrets never reach a screen, a log or a page: store URLs are shown with the password
masked, wherever the text came from (a hint, an error, a crash log's command line).

Two ways in: ``redact_url`` for a string known to be one URL (an option's value: the
password may hold anything but '/', spaces and quotes included) and ``redact`` for free
text (an error message), where a password ends at whitespace or a quote."""

from __future__ import annotations

import re

MASK = "***"
# scheme://user:password@host — in free text the password ends at the last '@' before
# the host part, and at whitespace or a quote
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*:)"
                           r"(?P<password>[^\s'\"]*)(?P<at>@)(?=[^@\s'\"]*(?:[\s'\"]|$))")
# libpq and SQLAlchemy also take the password as a query parameter
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd|pwd)=)[^&\s'\"#]*", re.I)
# one whole URL: user:password up to the last '@' before the first '/', '?' or '#'
_WHOLE_URL = re.compile(r"^(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@]*:)(?P<password>"
                        r"[^/?#]*)(?P<at>@)", re.S)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK + m["at"], text)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def redact_url(url: str) -> str:
    """One URL with its password (in user:password@ or a password= parameter) masked,
    whatever characters the password holds."""
    url = _WHOLE_URL.sub(lambda m: m["head"] + MASK + m["at"], url)
    return _QUERY_PASSWORD.sub(lambda m: m["head"] + MASK, url)


def redact_argv(argv: list[str]) -> str:
    """A command line to log: each argument that is a URL masked whole, then the rest."""
    return redact(" ".join(redact_url(a) if "://" in a else a for a in argv))


def has_password(url: str) -> bool:
    return redact_url(url) != url
