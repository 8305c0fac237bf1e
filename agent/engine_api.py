"""What the one measuring loop and an engine exchange: variants, planned slots, requests,
and the ``Engine`` protocol every engine (mlx-lm in process, runtimes over HTTP) meets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from .job import Job, Workload
from .trace import Trace


class EngineUnavailable(Exception):
    """A variant cannot be made ready (a runtime that does not start); its generations fail
    and the others go on."""


@dataclass(frozen=True)
class Variant:
    name: str
    speculative: bool
    num_draft_tokens: int | None = None  # fixed by the variant (http); None: the config's
    reference: str | None = None  # the baseline it is compared with; None: the engine's first
    models: tuple[str, str | None] | None = None  # (target, draft) roles, in a lineup
    method: str | None = None  # speculation without a draft model ("prompt-lookup", "mtp")


@dataclass(frozen=True)
class Request:
    variant: Variant
    prompt: str
    max_tokens: int
    config: dict                  # the sampling knobs and num_draft_tokens
    seed: int
    fields: dict = field(default_factory=dict)  # an http runtime's own request fields
    tools: tuple = ()
    prompt_key: str | None = None  # a workload's name: lets an engine reuse its prompt ids


@dataclass(frozen=True)
class Slot:
    """One planned generation."""

    workload: Workload
    variant: Variant
    knob: str
    knob_value: Any
    config: dict
    fields: dict
    repetition: int
    reference: str | None = None      # the baseline variant of its pairing
    partner: Variant | None = None    # the candidate of its pairing (itself, for one)

    @property
    def mode(self) -> str:
        return "speculative" if self.variant.speculative else "baseline"


class Engine(Protocol):
    name: str                        # its name in the registry (agent/engines.py)
    variants_are_configs: bool       # each variant fixes its own setup (http runtimes)
    variants: tuple[Variant, ...]    # the reference (baseline) first, when there is one
    holds_all_variants: bool         # may switch variant between any two generations
    field_knobs: dict                # request fields swept like knobs (http runtimes)

    def activate(self, variant: Variant) -> Variant | None:
        """Make the variant ready (raise EngineUnavailable); the variant to warm up, if
        anything needs a warm-up now."""
        ...

    def runtime_pid(self, variant: Variant) -> int | None:
        """The process whose memory the telemetry should watch (None: the agent's own)."""
        ...

    def cpu_accounted(self, variant: Variant) -> bool:
        """Whether all CPU doing this variant's work can be counted as ours (the agent, or
        a runtime it started); if not, contention by other processes is not judged."""
        ...

    def prompt_tokens(self, w: Workload) -> int | None: ...

    def generate(self, req: Request) -> Trace: ...

    def extras(self, m: dict, req: Request) -> dict:
        """Engine-specific fields derived from the metrics (e.g. the memory roofline)."""
        ...

    def load_sender(self, variant: Variant, w: Workload, config: dict):
        """For open-loop load levels: a thread-safe ``send(i) -> token arrival times``."""
        ...

    def closed_loop(self, variant: Variant, w: Workload, config: dict, concurrency: int,
                    requests: int):
        """A closed-loop load level: (outcomes, wall seconds) as ``agent.load`` gives them."""
        ...

    def describe(self, slot: Slot) -> tuple[dict, dict]:
        """Event fields naming the engine's variant, and the config as events record it."""
        ...

    def explain(self, e: Exception, variant: Variant) -> str: ...

    def notices(self, job: Job) -> list[dict]: ...

    def close(self) -> None: ...
