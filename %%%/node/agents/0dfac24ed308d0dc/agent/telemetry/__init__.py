"""Machine state while generating: thermal, power, swap, memory pressure.

``read_snapshot()`` returns one reading with the same keys on macOS and Linux
(None where a platform cannot tell). ``Sampler`` takes readings in a background
thread (~2 Hz) so each generation can say what the machine did during it.
"""

from .sampler import Sampler, read_snapshot, summarise_window, unreliable_reasons

__all__ = ["Sampler", "read_snapshot", "summarise_window", "unreliable_reasons"]
