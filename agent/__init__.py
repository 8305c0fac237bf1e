"""specfleet node agent: runs a sweep job with mlx-lm and journals events.

Imports only the standard library, mlx and mlx-lm (psutil optional). Never
imports ``orchestrator``: the controller copies this folder to nodes as is.
"""

AGENT_VERSION = "0.1.0"
from .limits import JOB_SCHEMA as SCHEMA  # noqa: E402,F401  (the job schema)
