"""The ``specfleet`` command line: option parsing only; the work lives in the library.

One module per area; importing them registers their commands on ``main``.
"""

from . import exporting, fleet, planning, project, results, sweeping  # noqa: F401  (registers commands)
from .base import main

__all__ = ["main"]
