"""The engine registry: every engine a job may run on, and the knobs each one honours.

Standard library only: the controller reads it to check plans (``plan lock`` refuses a knob
the plan's engine cannot honour, with file:line) and the agent to start the engine. A new
engine is its own module (a class with ``start(job, journal)`` and the ``loop.Engine``
methods) plus one entry here; a new knob is its entry in ``protocol.KNOBS`` plus its name
in each engine that honours it (see docs/knobs.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .protocol import KNOBS


@dataclass(frozen=True)
class EngineSpec:
    """One engine. ``knobs``: knob → the name the engine takes it under (an mlx-lm
    argument, an http request field); a knob not named here is refused for this engine."""

    name: str
    factory: str                     # "module:Class", imported only where it runs
    knobs: Mapping[str, str]
    # knobs the engine honours in autoregressive generation only: refused where a config
    # is paired with speculation (mlx-lm 0.32.2 drops max_kv_size when drafting)
    autoregressive_only: frozenset[str] = frozenset()
    job_type: str | None = None      # a job's engine.type; None: the default engine
    variants_are_configs: bool = False  # each variant fixes its own setup (http runtimes)
    sweeps_draft_width: bool = True  # a default sweep varies num_draft_tokens
    # runs in the agent's process: no server to queue at (no open-loop load), and a batch
    # cannot speculate (mlx-lm 0.32.2's BatchGenerator takes no draft model)
    in_process: bool = False
    notes: Mapping[str, str] = field(default_factory=dict)  # knob → why it is refused

    def start(self, job: Any, journal: Any) -> Any:
        """The engine ready to measure (imports its module: mlx on a node, not here)."""
        module, cls = self.factory.split(":")
        return getattr(importlib.import_module(module), cls).start(job, journal)

    def refusal(self, knob: str, speculates: bool = True) -> str | None:
        """Why this engine cannot honour ``knob`` (None: it can)."""
        if knob not in self.knobs:
            honoured = ", ".join(n for n in KNOBS if n in self.knobs)
            return (f"the {self.name} engine cannot honour {knob} (it honours {honoured})"
                    + (f"; {self.notes[knob]}" if knob in self.notes else ""))
        if knob in self.autoregressive_only and speculates:
            return (f"the {self.name} engine honours {knob} in autoregressive generation only "
                    "(mlx-lm ignores it when drafting), and every config of a sweep is "
                    "measured with speculation: leave it out")
        return None


_MLX_ARGS = {
    "num_draft_tokens": "num_draft_tokens", "temperature": "temp", "top_k": "top_k",
    "top_p": "top_p", "min_p": "min_p", "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold", "min_tokens_to_keep": "min_tokens_to_keep",
    "repetition_penalty": "repetition_penalty",
    "repetition_context_size": "repetition_context_size",
    "presence_penalty": "presence_penalty", "presence_context_size": "presence_context_size",
    "frequency_penalty": "frequency_penalty",
    "frequency_context_size": "frequency_context_size",
    "kv_bits": "kv_bits", "kv_group_size": "kv_group_size",
    "quantized_kv_start": "quantized_kv_start", "max_kv_size": "max_kv_size",
    "prefill_step_size": "prefill_step_size",
}
# OpenAI-compatible request fields (llama-server, vLLM, mlx_lm.server take these names)
_HTTP_FIELDS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_SERVER_SIDE = "a runtime sets it at start-up, not per request: put it in the variant's command"

ENGINES: dict[str, EngineSpec] = {e.name: e for e in (
    EngineSpec("mlx-lm", "agent.mlxengine:MlxEngine", _MLX_ARGS,
               autoregressive_only=frozenset({"max_kv_size"}), in_process=True),
    EngineSpec("http", "agent.httpruntime:HttpEngine", _HTTP_FIELDS, job_type="http",
               variants_are_configs=True, sweeps_draft_width=False,
               notes={"num_draft_tokens": "a variant's draft width is fixed by its server "
                      "command: declare one variant per width with num_draft_tokens",
                      **{k: _SERVER_SIDE for k in ("kv_bits", "kv_group_size",
                                                   "quantized_kv_start", "max_kv_size",
                                                   "prefill_step_size")}}),
)}
DEFAULT_ENGINE = "mlx-lm"
assert all(set(e.knobs) <= set(KNOBS) for e in ENGINES.values())


def is_runtime(name: str | None) -> bool:
    """A stored result's engine label names a runtime reached over http (its own name, e.g.
    "llama-server"), not an engine of this registry ("mlx-lm")."""
    return bool(name) and name not in ENGINES


def engine_named(name: str | None) -> EngineSpec:
    """An engine by the name a stored result or event carries (None: the default)."""
    return ENGINES[name or DEFAULT_ENGINE]


def engine_for(section: Mapping | None) -> EngineSpec:
    """The engine a job or plan runs on, from its ``engine`` section (none: in-process
    mlx-lm). Raises ValueError naming the known types for one no engine registers."""
    if not section:
        return ENGINES[DEFAULT_ENGINE]
    typ = section.get("type")
    for e in ENGINES.values():
        if e.job_type is not None and e.job_type == typ:
            return e
    types = ", ".join(repr(e.job_type) for e in ENGINES.values() if e.job_type)
    raise ValueError(f"engine.type: {typ!r} is not one of {types} (or leave engine out "
                     "for in-process mlx-lm)")
