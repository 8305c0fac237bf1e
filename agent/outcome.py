"""One request of a load level and what sending it returned: the records the load loops
(``agent.load``) fill and the served-rate reading (``agent.served``) judges, in a module
of their own so neither of the two imports the other's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    """One request of a level (seconds since the level started)."""

    scheduled: float            # when it should have been sent
    sent: float                 # when it was (later: the dispatcher, or no free slot)
    chunk_times: list[float] = field(default_factory=list)  # since ``sent``, per chunk
    end: float = 0.0            # since the level started (set when it ends)
    error: str | None = None
    drafted: int | None = None  # what the runtime reported drafting and accepting
    accepted: int | None = None
    tokens: int | None = None   # output tokens (None: one per chunk)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def output_tokens(self) -> int:
        return self.tokens if self.tokens is not None else len(self.chunk_times)

    @property
    def last(self) -> float:
        """When its last chunk came (since the level started): where vLLM's E2EL ends
        (``most_recent_timestamp``), not when the server closed the stream."""
        return self.sent + self.chunk_times[-1]


@dataclass
class Reply:
    """What a sent request returns: its chunks' arrival times (seconds since it was sent),
    its output tokens where counted (None: one per chunk), and the drafting the runtime
    reported, if any."""

    chunk_times: list[float]
    tokens: int | None = None
    drafted: int | None = None
    accepted: int | None = None
