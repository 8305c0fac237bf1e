"""Agent-side errors; each maps to an exit code the controller understands."""

from __future__ import annotations


class AgentError(Exception):
    """Base of agent errors."""

    exit_code = 1
    kind = "agent_error"


class JobFileError(AgentError):
    """The job file is missing, not JSON, or not a valid schema-1 job."""

    exit_code = 2
    kind = "job_invalid"


class EnvironmentMismatch(AgentError):
    """Installed versions or model fingerprints differ from the job's pins."""

    exit_code = 3
    kind = "environment_mismatch"


class ModelLoadError(AgentError):
    """The model directory does not load with mlx-lm."""

    exit_code = 4
    kind = "model_load_failed"


class NodeBusy(AgentError):
    """Another agent holds the node lock."""

    exit_code = 5
    kind = "node_busy"


class SpeculationUnsupported(AgentError):
    """The pair cannot run speculative decoding (tokenizers differ, cache not trimmable)."""

    exit_code = 6
    kind = "speculation_unsupported"
