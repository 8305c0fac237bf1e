"""Agent-side errors; each maps to an exit code the controller understands."""

from __future__ import annotations

from .protocol import EXIT_CODES


class AgentError(Exception):
    """Base of agent errors."""

    exit_code = 1
    kind = "agent_error"


class JobFileError(AgentError):
    """The job file is missing, not JSON, or not a valid schema-1 job. ``field`` is the
    key path of what is wrong ("knobs.top_p", "soak.workload"; None: the whole document)
    and ``problem`` the sentence without the file's name: a plan maps them to its own
    file and line, never by reading the text."""

    exit_code = EXIT_CODES["job_invalid"]
    kind = "job_invalid"

    def __init__(self, message: str, *, field: str | None = None,
                 problem: str | None = None):
        super().__init__(message)
        self.field = field
        self.problem = message if problem is None else problem


class EnvironmentMismatch(AgentError):
    """Installed versions or model fingerprints differ from the job's pins."""

    exit_code = EXIT_CODES["environment_mismatch"]
    kind = "environment_mismatch"


class ModelLoadError(AgentError):
    """The model directory does not load with mlx-lm."""

    exit_code = EXIT_CODES["model_load_failed"]
    kind = "model_load_failed"


class NodeBusy(AgentError):
    """Another agent holds the node lock."""

    exit_code = EXIT_CODES["node_busy"]
    kind = "node_busy"


class SpeculationUnsupported(AgentError):
    """The pair cannot run speculative decoding (tokenizers differ, cache not trimmable)."""

    exit_code = EXIT_CODES["speculation_unsupported"]
    kind = "speculation_unsupported"
