"""The demo corpus: small files present on every CPython install.

Letting the tiny models memorise a small corpus is what gives clean,
workload-dependent acceptance (see shared notes): code from a few stdlib
modules, prose from ``pydoc_data.topics``. Files were chosen that are
byte-identical across CPython 3.11 patch releases (colorsys and the "assignment"
topic are not), so the corpus hash — part of the build key — travels further.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

CODE_MODULES = ("bisect", "fnmatch", "heapq")
PROSE_TOPICS = ("assert", "break", "class", "continue", "for", "if", "while")


def _module_source(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"stdlib module {name!r} not found")
    return Path(spec.origin).read_text(encoding="utf-8")


def corpus_documents() -> list[str]:
    """Return the corpus as a list of documents, in a fixed order."""
    from pydoc_data import topics

    docs = [_module_source(m) for m in CODE_MODULES]
    docs += [topics.topics[t] for t in PROSE_TOPICS if t in topics.topics]
    return docs


def corpus_sha256(docs: list[str]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()
