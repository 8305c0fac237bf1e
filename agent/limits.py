"""The protocol's constants a short-lived process needs, without its event types.

``agent.protocol`` re-exports them; they live here so that ``python -m agent follow`` (run
over SSH for every followed journal) does not build every event class on start (~0.1 CPU-s).
"""

JOB_SCHEMA = 1
# Bounds of one event line: the controller sets aside a longer or deeper one, and the agent
# never writes one (a 16 MiB line is ~500k tokens of output with their ids and timings).
MAX_EVENT_BYTES = 16 << 20
MAX_EVENT_DEPTH = 32
