"""The event types of the journal, as frozen typed classes: the one definition.

Standard library only (the agent imports it on nodes). Each class is one event ``type``;
its fields are the fields the type declares: a field without a default is *required*
(present in every event of the type, though ``X | None`` may be null), a field with a
default is *optional* (null or absent). ``agent.protocol.EVENTS``, which the controller's
decode boundary checks, is derived from these annotations, so a field is declared once.

An event also carries the fields its type does not declare (a minor version adds fields;
a generation carries its metrics): they stay in ``raw``, the JSON object as decoded, and
``to_json`` gives it back whole. ``from_json`` trusts its input to have been checked
(the controller's boundary does that); build with it only what passed.
"""

from dataclasses import MISSING, dataclass, field, fields
from types import UnionType
from typing import Any, ClassVar, get_args, get_type_hints

EVENT_SCHEMA_MAJOR = 1
EVENT_SCHEMA_MINOR = 10
EVENT_SCHEMA = f"{EVENT_SCHEMA_MAJOR}.{EVENT_SCHEMA_MINOR}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """What every event carries: its place in the journal and the node's clock."""

    TYPE: ClassVar[str] = ""
    SCHEMA: ClassVar[str] = EVENT_SCHEMA
    seq: int
    ts: float
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: dict) -> "Event":
        """The typed event of a checked JSON object (``EVENT_CLASSES[obj["type"]]``)."""
        return _BUILDERS[obj["type"]](obj)

    def to_json(self) -> dict:
        """The JSON object: every field, declared or not."""
        out = dict(self.raw)
        out.setdefault("schema", EVENT_SCHEMA_MAJOR)
        out["type"] = self.TYPE
        for f in fields(self):
            v = getattr(self, f.name)
            # an optional field left out stays out (absent and null are the same to a reader)
            if f.name == "raw" or (v is None and f.default is None and f.name not in out):
                continue
            out[f.name] = v
        return out

    def get(self, name: str, default: Any = None) -> Any:
        """Any field by name, declared or not (a generation's metrics), as ``dict.get``."""
        if name != "raw" and name in self.__dataclass_fields__:
            return getattr(self, name)
        return self.raw.get(name, default)


def _event(type_name: str):
    def mark(cls):
        cls.TYPE = type_name
        return dataclass(frozen=True, kw_only=True, slots=True)(cls)
    return mark


OStr = str | None
OInt = int | None
ONum = float | None   # a number: JSON integer or float
ODict = dict | None
OList = list | None


@_event("job_started")
class JobStarted(Event):
    agent_version: OStr = None
    event_schema: OStr = None


@_event("environment_checked")
class EnvironmentChecked(Event):
    versions: dict
    fingerprints: dict
    quantization: ODict = None


@_event("models_loaded")
class ModelsLoaded(Event):
    load_s: ONum = None


@_event("plan")
class Plan(Event):
    total_generations: int
    already_done: OInt = None
    variants: OList = None
    workloads: OList = None


@_event("runtime_ready")
class RuntimeReady(Event):
    runtime: OStr = None
    variant: OStr = None


@_event("notice")
class Notice(Event):
    message: str
    workload: OStr = None
    variant: OStr = None
    adaptive: bool | None = None


@_event("generation")
class Generation(Event):
    run_index: int
    workload: str
    mode: str
    config: dict
    num_draft_tokens: int
    generated_tokens: int
    decode_tok_s: ONum
    ttft_ms: ONum
    variant: OStr = None
    runtime: OStr = None
    token_ids: OList = None
    telemetry: OList = None
    models: ODict = None
    acceptance_by_position: OList = None  # [{position, drafted, accepted, rate}], per width
    kv_quantised: bool | None = None      # 1.8: kv_bits took effect (null: none declared)
    kv_positions: OInt = None             # 1.8: positions the KV cache held at the end
    contention: ODict = None              # 1.8: {share, limit} when set aside as contended
    # 1.10: the CPU taken from the run by cause (shares of the machine's capacity): other
    # processes, the controller on this node, the host's steal (null: not read there); a
    # contended run's ``contention`` also names each (``other``, ``controller``, ``steal``)
    cpu_other_share: ONum = None
    cpu_controller_share: ONum = None
    cpu_steal_share: ONum = None


@_event("generation_failed")
class GenerationFailed(Event):
    error: str
    variant: OStr = None
    workload: OStr = None
    mode: OStr = None


@_event("knob_effect")
class KnobEffect(Event):
    message: str
    workload: OStr = None
    variant: OStr = None
    knob: OStr = None


@_event("config_summary")
class ConfigSummary(Event):
    workload: str
    mode: str
    config: dict
    num_draft_tokens: int
    trials: int
    metrics: dict
    unreliable: bool
    values: ODict = None
    unreliable_reasons: OList = None
    parity: ODict = None
    models: ODict = None
    contention: ODict = None   # 1.8: {shares: the contended trials', limit}; 1.10: + per
    #                            cause (other, controller, steal) the trials' shares
    spread: ODict = None       # 1.9: {value: decode tok/s robust CV, limit} when set aside


@_event("acceptance_by_bucket")
class AcceptanceByBucket(Event):
    rows: list


@_event("quality")
class Quality(Event):
    mode: str
    num_draft_tokens: int
    tasks: int
    passed: int
    pass_rate: float
    models: ODict = None


@_event("soak_sample")
class SoakSample(Event):
    index: int
    elapsed_s: float
    decode_tok_s: ONum = None
    rss_bytes: ONum = None
    swap_used_bytes: ONum = None


@_event("soak_result")
class SoakResult(Event):
    status: str
    generations: int
    workload: OStr = None
    num_draft_tokens: OInt = None
    duration_s: ONum = None
    peak_rss_bytes: ONum = None
    swap_in_bytes: ONum = None
    reasons: OList = None


@_event("job_finished")
class JobFinished(Event):
    status: str
    generations: int
    failed: OInt = None
    reasons: OList = None


@_event("background_started")
class BackgroundStarted(Event):
    pid: int
    profile: dict


@_event("load_level")
class LoadLevel(Event):
    workload: str
    variant: str
    mode: str
    load: str
    level: float
    status: str
    # an open loop's served rate: the point estimate, and the most it can be said to have
    # served (95%), which the saturation verdict rests on (events 1.9; absent before)
    served_rps: ONum = None
    served_rps_at_most: ONum = None


@_event("job_failed")
class JobFailed(Event):
    error: str
    message: str
    exit_code: OInt = None


EVENT_CLASSES: dict[str, type[Event]] = {c.TYPE: c for c in (
    JobStarted, EnvironmentChecked, ModelsLoaded, Plan, RuntimeReady, Notice, Generation,
    GenerationFailed, KnobEffect, ConfigSummary, AcceptanceByBucket, Quality, SoakSample,
    SoakResult, JobFinished, BackgroundStarted, LoadLevel, JobFailed)}

# -- the declaration the boundary checks, derived from the classes --------------------------

_BASE = {f.name for f in fields(Event)}


def json_types(annotation: Any) -> tuple[type, ...]:
    """The JSON types a field's annotation admits: ``float`` takes integers too (JSON
    has one number type), ``X | None`` takes null. ``bool`` is never an ``int`` here."""
    parts = get_args(annotation) if isinstance(annotation, UnionType) else (annotation,)
    out: list[type] = []
    for p in parts:
        out.extend((int, float) if p is float else (p,))
    return tuple(dict.fromkeys(out))


def declared(cls: type[Event]) -> tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]:
    """(required, optional): each declared field of ``cls`` and its JSON types."""
    hints = get_type_hints(cls)
    required: dict[str, tuple[type, ...]] = {}
    optional: dict[str, tuple[type, ...]] = {}
    for f in fields(cls):
        if f.name in _BASE:
            continue
        no_default = f.default is MISSING and f.default_factory is MISSING
        (required if no_default else optional)[f.name] = json_types(hints[f.name])
    return required, optional


def _builder(cls: type[Event]):
    """``obj → cls`` in straight-line code: built once per event on ingest's hot path.

    Why not ``cls(**fields)``: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, which cost more than the boundary's checks; here each slot is
    set through its own descriptor (what ``__init__`` would have set, nothing else)."""
    names = ["seq", "ts", "raw"] + [f.name for f in fields(cls) if f.name not in _BASE]
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    body = ["def build(obj):", "    self = new(cls)", "    g = obj.get",
            "    s_seq(self, obj['seq'])", "    s_ts(self, obj['ts'])", "    s_raw(self, obj)"]
    for n in names:
        namespace[f"s_{n}"] = getattr(cls, n).__set__  # the slot's member descriptor
        if n not in _BASE:
            body.append(f"    s_{n}(self, g({n!r}))")
    body.append("    return self")
    exec("\n".join(body), namespace)  # noqa: S102 - our own field names, from our classes
    return namespace["build"]


_BUILDERS = {t: _builder(c) for t, c in EVENT_CLASSES.items()}
