"""Why the sweep page set a row aside, said once per section (issue 33: repeated evidence is
stated once, rows keep what differs). The agent's reason for a spread is a long sentence
(the measure, the limit, what to do) that reads the same in every row but for its figure:
a row keeps the figure ("spread 36%"), its section says the rest once (``spread_note``).
A reason stored without the spread's fields (events before 1.9) is said whole, as is any
other reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .through_noise import spread_limits, spread_range


class AsideRow(Protocol):
    @property
    def aside_spreads(self) -> tuple[dict, ...]:
        """The spreads that set the row's own config aside."""
        ...


def reasons_said(reasons: list[tuple[str, dict | None]]) -> tuple[str, str]:
    """(every reason in full, the row's short words): ``reasons`` as (the agent's words, the
    spread's fields when the words are a spread's); the short words name each spread by
    its figure ("spread 28–31%") and keep every other reason as it is."""
    spreads = [sp for _, sp in reasons if sp]
    others = sorted({w for w, sp in reasons if not sp})
    short = ([f"spread {spread_range(spreads)}"] if spreads else []) + others
    return "; ".join(sorted({w for w, _ in reasons})), "; ".join(short)


def spread_note(rows: Sequence[AsideRow]) -> str | None:
    """What the section's rows set aside for their own spread share, once: the measure, the
    plan's limit and what to do (None: no row was)."""
    own = [r for r in rows if r.aside_spreads]
    if not own:
        return None
    spreads = [sp for r in own for sp in r.aside_spreads]
    n = len(own)
    return (f"{n} row{'s' if n > 1 else ''} set aside for {'their' if n > 1 else 'its'} "
            "spread: decode tok/s varied across repetitions more than the plan allows (under "
            f"{spread_limits(spreads)}; the robust CV, or how far a third of them lie from "
            "the median), each row by the figure it shows. Rerun with more repetitions or "
            "check the node for background load.")
