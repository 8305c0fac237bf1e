"""The controller ↔ agent contract, in one place: versions, knobs, events, metrics, exits.

Standard library only: the agent runs it on nodes, and the controller imports it to build
jobs, check plans and decode what nodes send. Anything that names a knob, an event type, a
metric or an exit code reads it from here.

Format history
--------------
- job 1: the job document (``schema: 1``); unknown keys are refused.
- events 1.0: one JSON object per journal line: ``schema`` (the major version, 1), ``seq``,
  ``type``, ``ts``, ``job_id`` and the fields of its type.
- events 1.1: ``job_started`` carries ``event_schema`` ("1.1") and ``agent_version``;
  optional fields only. A controller reading 1.x accepts any 1.y and ignores fields it does
  not know; a different major version is refused with the agent's version named.
- events 1.2: ``environment_checked`` carries ``quantization``: per role (target, draft)
  the tier its weights are stored at ("8-bit g64", "unquantised"), read from the model's
  own config.json; optional, so a 1.1 agent's events still decode.
- events 1.3: a job may hold a model lineup (several targets and drafts, roles ``target``,
  ``target-2``, ``draft``, ``draft-2`` …, see ``MODEL_ROLE``); ``environment_checked``
  then carries a fingerprint and a tier per role, and every ``generation`` and
  ``config_summary`` of a lineup names its pair in ``models`` (``{"target": role,
  "draft": role}``), so a result is never pooled across pairs. In a lineup every model
  stays loaded, so a generation's ``peak_mlx_memory_bytes`` is the process peak less the
  other models' weights (``other_models_resident_bytes``): the pair's own memory.
  An http variant may speculate without a draft model (``method``: prompt lookup, multi-token
  prediction): its generations and summaries, and the baseline generations measured beside
  it, carry ``method``. Optional: a job of one pair writes what 1.2 wrote.
- events 1.4: ``background_started`` says a job's co-tenant load runs (``background`` in the
  job: memory held, CPU workers, disk I/O); it is stopped as the job ends.
- events 1.5: ``load_level``: one variant at one level of a ``load`` ramp (``load``:
  concurrency or request_rate; ``level``), after the sweep: TTFT / ITL / TPOT / e2e
  percentiles, output tok/s per stream and in total, requests/s, errors (never averaged
  in), goodput against the job's SLOs, memory and swap during the level; ``status`` ok,
  saturated (``stop_reason``: the ramp stops there) or failed.
- events 1.6: ``load_level`` measures as vLLM's ``bench serve`` does: ITL is the gap
  between chunks (not tokens spread over it), TPOT (E2E − TTFT) / (tokens − 1); it carries
  ``offered_rps`` (the realised schedule's rate; a closed loop's sends), ``served_rps``
  and ``queue_growth_ms``, which the saturation rule reads (served below 95% of offered,
  or a growing queue, open and closed loop alike). An http ``generation`` without a
  tokenizer says when the runtime's ``usage`` count was implausible against the streamed
  text (``usage_problem``, ``usage_implausible``: then not used for rates; a
  ``usage_problem`` alone: taken but unverified, as many tokens a chunk as only byte
  tokens allow) and when a
  stream's split surrogate pairs were repaired (``stream_repaired``: how many).
  Optional, so a 1.5 agent's events still decode.
- events 1.7: ``generation`` carries ``kv_cache_bytes`` (the prompt cache the agent hands
  mlx-lm: target and draft), ``e2e_ms`` (request start to last token: TPOT per request)
  and ``mean_acceptance_length_vllm`` (1 + accepted per verify round: the bonus token
  counted, as vLLM and AIPerf count it); ``config_summary`` summarises them. Optional, so
  a 1.6 agent's events still decode.
- The event types are frozen classes (``agent.events``) and ``EVENTS`` is derived from them;
  no wire change. ``generation``'s ``acceptance_by_position`` (which every agent writes and
  the review indexes) is declared there, so the boundary checks its shape.
- events 1.8: ``generation`` carries ``kv_quantised`` (did mlx-lm quantise the KV cache:
  only once it holds ``quantized_kv_start`` positions; null without ``kv_bits``) and
  ``kv_positions``; a generation whose declared ``kv_bits`` never applied is set aside
  (its reason says so). A generation set aside as contended carries ``contention``
  (``share``: of the CPU other processes took, ``limit``), its ``config_summary`` the
  contended trials' ``shares`` and the ``limit``: readers take the figures from the
  fields, not the reason's text. Optional, so a 1.7 agent's events still decode.
- events 1.10: what took the CPU from a trial is told by cause: ``generation`` (and
  ``load_level``) carry ``cpu_other_share`` (other processes only, now), and
  ``cpu_controller_share`` (the controller's process and its journal followers, when the job
  names ``controller_pid``: a local node) and ``cpu_steal_share`` (a Linux VM's steal: the
  host ran another guest on our vCPUs; null on macOS, which has no such counter). A
  contended generation's ``contention`` keeps ``share`` (all taken, which the limit
  judges) and adds ``other``, ``controller``, ``steal``; a ``config_summary``'s adds the
  lists of each beside ``shares``. Before 1.10 ``cpu_other_share`` and ``share`` held
  steal and the controller too. Optional, so a 1.9 agent's events still decode.
- ``load_level`` (an open loop) carries ``served_rps`` as the point estimate (Theil-Sen's
  median lag slope) and ``served_rps_at_most``, the most served at 95% (Sen's bound), which
  the saturation rule judges by (before, ``served_rps`` was that bound). Optional: an
  older agent's events decode, and their ``served_rps`` is judged as the bound.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .events import (  # noqa: F401  (the event schema's version lives with its types)
    EVENT_CLASSES,
    EVENT_SCHEMA,
    EVENT_SCHEMA_MAJOR,
    EVENT_SCHEMA_MINOR,
    declared,
)
from .limits import JOB_SCHEMA, MAX_EVENT_BYTES, MAX_EVENT_DEPTH  # noqa: F401  (re-exported)

# -- model roles -----------------------------------------------------------------------

# A job's models: one target and one draft (roles "target", "draft"), or a lineup with
# more of either ("target-2", "draft-3" …). The pattern bounds what a node may name.
MODEL_ROLE = r"(target|draft)(-[1-9][0-9]?)?"
# speculation without a draft model, as http runtimes offer it (mlx-serve's prompt lookup,
# MTPLX's multi-token prediction heads); "draft-model" is the default of a speculative variant
DRAFT_FREE_METHODS = ("prompt-lookup", "mtp")
MAX_ROLES = 24


def model_roles(models: dict) -> list[str]:
    """The role keys of a models mapping (a job's, a lock's), targets first, in order."""
    import re

    roles = [k for k in models if re.fullmatch(MODEL_ROLE, k)]
    return sorted(roles, key=lambda r: (role_kind(r) != "target", int(r.split("-")[1])
                                        if "-" in r else 1))


def role_kind(role: str) -> str:
    """"draft-3" → "draft"."""
    return role.split("-", 1)[0]


# -- exit codes of `python -m agent run` ------------------------------------------------

EXIT_CODES: dict[str, int] = {
    "ok": 0, "job_invalid": 2, "environment_mismatch": 3, "model_load_failed": 4,
    "node_busy": 5, "speculation_unsupported": 6, "soak_failed": 7, "crash": 70,
}

# -- knobs --------------------------------------------------------------------------------
# Which engine honours a knob, and under what name, is the engine's own declaration
# (``agent/engines.py``); this registry says what a knob is and what values it takes.


def _int_at_least(lo: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _number(ok: Callable[[float], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v)


def _one_of(*allowed: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v in allowed


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


# What a knob acts on: the draft width, the sampler, a logits processor, the KV cache, or
# the prompt's prefill. A sampling or logits knob changes sampled output; a cache knob may
# change any output (quantised attention), so exactness is judged per cache setting.
KINDS = ("draft", "sampler", "logits", "cache", "prefill")


@dataclass(frozen=True)
class Knob:
    """One setting a sweep can vary. Every knob but the draft width is shared by a
    speculative run and its baseline: a run is compared with the baseline of its own
    settings. ``keyed``: part of every config even at its default (the first six knobs,
    so stored configs keep their keys); the others appear in a config only when set away
    from their default, which is the engine's own default."""

    name: str
    default: Any
    check: Callable[[Any], bool]
    rule: str                      # what a valid value is, in words
    kind: str = "sampler"
    unit: str = ""
    keyed: bool = False

    @property
    def sampling(self) -> bool:
        """Shared by a speculative run and its baseline (everything but the draft width)."""
        return self.kind != "draft"


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("num_draft_tokens", 3, _int_at_least(1), "an integer ≥ 1", "draft", "tokens", True),
    Knob("temperature", 0.0, _number(lambda v: v >= 0), "a number ≥ 0", keyed=True),
    Knob("top_k", 0, _int_at_least(0), "an integer ≥ 0 (0 = off)", keyed=True),
    Knob("top_p", 1.0, _number(lambda v: 0 < v <= 1), "a number in (0, 1]", keyed=True),
    Knob("min_p", 0.0, _number(lambda v: 0 <= v < 1), "a number in [0, 1)", keyed=True),
    # XTC ("exclude top choices"): mlx-lm's sampler and llama-server both take it
    Knob("xtc_probability", 0.0, _number(lambda v: 0 <= v <= 1), "a number in [0, 1]",
         keyed=True),
    Knob("xtc_threshold", 0.1, _number(lambda v: 0 <= v <= 0.5), "a number in [0, 0.5]"),
    Knob("min_tokens_to_keep", 1, _int_at_least(1), "an integer ≥ 1 (min_p keeps at least "
         "this many tokens)", unit="tokens"),
    # logits processors (mlx-lm's make_logits_processors); null or 0: off
    Knob("repetition_penalty", None, _or_null(_number(lambda v: v > 0)),
         "null (off) or a number > 0 (1 = no penalty)", "logits"),
    Knob("repetition_context_size", 20, _int_at_least(1), "an integer ≥ 1", "logits",
         "tokens"),
    Knob("presence_penalty", None, _or_null(_number(lambda v: True)), "null (off) or a number",
         "logits"),
    Knob("presence_context_size", 20, _int_at_least(1), "an integer ≥ 1", "logits", "tokens"),
    Knob("frequency_penalty", None, _or_null(_number(lambda v: True)),
         "null (off) or a number", "logits"),
    Knob("frequency_context_size", 20, _int_at_least(1), "an integer ≥ 1", "logits", "tokens"),
    # the KV cache: quantised once it holds quantized_kv_start tokens (mlx-lm's default 5000)
    Knob("kv_bits", None, _or_null(_one_of(2, 3, 4, 5, 6, 8)),
         "null (unquantised) or one of 2, 3, 4, 5, 6, 8", "cache", "bits"),
    Knob("kv_group_size", 64, _one_of(32, 64, 128), "one of 32, 64, 128", "cache"),
    Knob("quantized_kv_start", 5000, _int_at_least(0), "an integer ≥ 0", "cache", "tokens"),
    # a rotating cache of this many positions; autoregressive generation only (see engines)
    Knob("max_kv_size", None, _or_null(_int_at_least(8)), "null (unbounded) or an integer ≥ 8",
         "cache", "tokens"),
    # null: mlx-lm's own step (2048 autoregressive, 512 speculative in 0.32.2)
    Knob("prefill_step_size", None, _or_null(_int_at_least(1)),
         "null (mlx-lm's default) or an integer ≥ 1", "prefill", "tokens"),
)}
assert all(k.kind in KINDS for k in KNOBS.values())
KNOB_DEFAULTS: dict[str, Any] = {k.name: k.default for k in KNOBS.values()}
# the settings every config carries (the keyed ones but the draft width)
SAMPLING_DEFAULTS: dict[str, Any] = {k.name: k.default for k in KNOBS.values()
                                     if k.sampling and k.keyed}
DEFAULT_SWEEP: dict[str, list] = {"num_draft_tokens": [2, 3, 4, 6]}


STOP_PREFIX, STOP_SEP = "adaptive: ", " stops repeating: "


def stop_message(what: str, why: str) -> str:
    """An adaptive stop as the agent journals it: "adaptive: num_draft_tokens=2 stops
    repeating: slower than the best …" (``stop_parts`` reads it back)."""
    return f"{STOP_PREFIX}{what}{STOP_SEP}{why}"


def stop_parts(message: str) -> tuple[str, str] | None:
    """(what stopped, why) of a ``stop_message``; None for any other notice."""
    head, sep, why = message.partition(STOP_SEP)
    return (head.removeprefix(STOP_PREFIX), why) if sep else None


def knob_words(what: str) -> str:
    """A config an agent names as "knob=value", in words: "num_draft_tokens=4" → "draft
    width 4", "kv_bits=8" → "kv bits 8"; anything else (a variant's name) as it is."""
    m = re.fullmatch(r"([a-z][a-z0-9_]*)=(.*)", what)
    if m is None:
        return what
    name, value = m.groups()
    return f"{'draft width' if name == 'num_draft_tokens' else name.replace('_', ' ')} {value}"


def normal_config(config: dict) -> dict:
    """A config as it is keyed: an unkeyed knob at its default is left out (it is the
    engine's default either way), so a config's identity never depends on how it was
    spelled and the stored keys of configs without the newer knobs stay as they were."""
    return {k: v for k, v in config.items()
            if not (k in KNOBS and not KNOBS[k].keyed and v == KNOBS[k].default)}


def setting(config: dict, name: str) -> Any:
    """A knob's value in a config, its default when the config leaves it out."""
    return config.get(name, KNOB_DEFAULTS[name])


def baseline_key(config: dict) -> str:
    """What a run shares with its baseline: every setting but the draft width (an http
    variant names itself elsewhere). Exactness and speedup compare within one key."""
    import json

    return json.dumps({k: v for k, v in normal_config(config).items()
                       if k in KNOBS and KNOBS[k].sampling}, sort_keys=True)


# A knob that acts only through another: while that one is off, mlx-lm ignores it (a greedy
# sampler takes no top_p; an unquantised cache no group size), and so do OpenAI-style
# runtimes. A config setting it would show a value never applied. (knob, needs, test, words)
_ON = {"temperature": (lambda v: v > 0, "temperature > 0 (temperature 0 samples greedily)"),
       "min_p": (lambda v: v > 0, "min_p > 0"),
       "xtc_probability": (lambda v: v > 0, "xtc_probability > 0"),
       "kv_bits": (lambda v: v is not None, "kv_bits set (the cache is not quantised)"),
       **{f"{p}_penalty": ((lambda v: v not in (None, 0)), f"{p}_penalty set")
          for p in ("repetition", "presence", "frequency")}}
ACTS_ONLY_WITH: tuple[tuple[str, str], ...] = (
    *((k, "temperature") for k in ("top_k", "top_p", "min_p", "xtc_probability",
                                   "xtc_threshold", "min_tokens_to_keep")),
    ("min_tokens_to_keep", "min_p"), ("xtc_threshold", "xtc_probability"),
    ("kv_group_size", "kv_bits"), ("quantized_kv_start", "kv_bits"),
    *((f"{p}_context_size", f"{p}_penalty") for p in ("repetition", "presence", "frequency")),
)


def inert_knobs(config: dict) -> list[tuple[str, str, str]]:
    """(knob, the knob it needs, why) for each knob a config sets away from its default
    while the knob it acts through is off: declared, but the engine would not apply it."""
    out = []
    for name, needs in ACTS_ONLY_WITH:
        if config.get(name, KNOB_DEFAULTS[name]) != KNOB_DEFAULTS[name] and \
                not _ON[needs][0](setting(config, needs)):
            out.append((name, needs, f"{name} acts only with {_ON[needs][1]}: mlx-lm would "
                                     f"ignore it; set {needs} too, or leave {name} out"))
    return out


def knob_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not valid for knob ``name`` (None when it is)."""
    knob = KNOBS.get(name)
    if knob is None:
        return f"unknown knob {name!r}; known: {', '.join(KNOBS)}"
    if not knob.check(value):
        return f"{name}={value!r} is not valid; it must be {knob.rule}"
    return None


# -- contention ---------------------------------------------------------------------------

# What took the CPU from a trial, each cause in a reader's words (events 1.10): other
# processes on the node, the controller when it runs there (a local demo), and the
# hypervisor's steal (a Linux VM's host ran another guest on our vCPUs: no process of ours).
CONTENTION_CAUSES = (("other", "other processes used"),
                     ("controller", "the controller on this node used"),
                     ("steal", "the host (hypervisor) took"))


def _span(low: float, high: float) -> str:
    lo, hi = f"{low:.0%}", f"{high:.0%}"
    return lo if lo == hi else f"{lo[:-1]}–{hi}"


def contention_text(low: float, high: float, limit: float,
                    parts: dict[str, tuple[float, float]] | None = None) -> str:
    """How a contention reading reads, from its structured fields (fractions of the CPU
    taken from the trial, all causes together): one trial, or a config's range of trials.
    ``parts``: per cause (``CONTENTION_CAUSES``) the range of its own share; each cause
    that took a visible share is named. Without parts (events before 1.10) the share is
    said as other processes', as those agents said it."""
    said = [(words, parts[k]) for k, words in CONTENTION_CAUSES
            if parts and parts.get(k) and f"{parts[k][1]:.0%}" != "0%"]
    if parts and not said:  # every cause under 0.5%, together over a tiny limit
        k, words = max(((k, w) for k, w in CONTENTION_CAUSES if parts.get(k)),
                       key=lambda kw: parts[kw[0]][1], default=("other", "other processes used"))
        said = [(words, parts.get(k) or (low, high))]
    if not said:
        said = [("other processes used", (low, high))]
    body = [f"{words} {_span(*rng)}" for words, rng in said]
    text = body[0] if len(body) == 1 else ", ".join(body[:-1]) + " and " + body[-1]
    return f"contended: {text} of the CPU (limit {limit:.0%})"


def contention_parts(readings: list[dict]) -> dict[str, tuple[float, float]] | None:
    """Per cause, the range of its shares over some trials' readings (``{other, controller,
    steal}``, a number or null each); None when no reading names a cause (before 1.10)."""
    out = {}
    for k, _ in CONTENTION_CAUSES:
        vals = [r[k] for r in readings if r.get(k) is not None]
        if vals:
            out[k] = (min(vals), max(vals))
    return out or None


def trial_contention_text(c: dict) -> str:
    """A generation's ``contention`` (``share``, ``limit``, and per cause its own share)
    in words: the reason the trial was set aside."""
    return contention_text(c["share"], c["share"], c["limit"],
                           contention_parts([c]))


def summary_contention_parts(c: dict) -> dict[str, tuple[float, float]] | None:
    """Per cause, the range of a config summary's contended trials' shares (None before
    events 1.10, whose summaries carry ``shares`` alone)."""
    n = len(c["shares"])
    return contention_parts([{k: (c.get(k) or [None] * n)[i] for k, _ in CONTENTION_CAUSES}
                             for i in range(n)])


def summary_contention_text(c: dict) -> str:
    """A config summary's ``contention`` (its contended trials' ``shares``, per cause the
    lists ``other``, ``controller``, ``steal``, and the ``limit``) in words."""
    return contention_text(min(c["shares"]), max(c["shares"]), c["limit"],
                           summary_contention_parts(c))


# -- events -------------------------------------------------------------------------------

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))
OPT_LIST = (list, type(None))
OPT_DICT = (dict, type(None))
OPT_BOOL = (bool, type(None))


@dataclass(frozen=True)
class EventType:
    """One event type of the stream: the fields every event of it carries (``required``) and
    the fields it may carry (``optional``; null or absent allowed), each with its JSON types.

    The controller's decode boundary checks exactly this, so every field a reader indexes
    (``e["message"]``) must be required here, and every optional field a reader formats as a
    number must be typed here. Fields not named are allowed (minor versions add them)."""

    required: dict[str, tuple[type, ...]] = field(default_factory=dict)
    optional: dict[str, tuple[type, ...]] = field(default_factory=dict)


# The event types of schema 1.x, derived from their typed classes (``agent.events``): the
# one declaration the boundary, the store's read path and readers follow.
EVENTS: dict[str, EventType] = {t: EventType(*declared(c)) for t, c in EVENT_CLASSES.items()}
# type → required fields and their JSON types (what the boundary insists on)
EVENT_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    t: e.required for t, e in EVENTS.items()}
FINAL_EVENTS = ("job_finished", "job_failed")

# Per-generation metrics, units in the names (what `generation` events carry).
GENERATION_METRICS = (
    "ttft_ms", "e2e_ms", "prefill_ms", "prefill_tok_s", "decode_tok_s", "decode_tok_s_mean",
    "itl_p50_ms", "itl_p95_ms", "itl_p99_ms", "generated_tokens", "drafted_tokens",
    "accepted_tokens", "acceptance_rate", "verify_rounds", "mean_accepted_len",
    "mean_acceptance_length_vllm",
    "peak_mlx_memory_bytes", "kv_cache_bytes", "rss_peak_bytes", "swap_used_before_bytes",
    "swap_used_after_bytes", "swap_in_bytes", "bytes_per_token", "bandwidth_utilisation",
)
# What the agent itself needs on a node, pinned: every node lock gets these (plan lock) and
# provision checks them, because without psutil a Mac cannot read contention or RSS.
AGENT_REQUIREMENTS = ("psutil==7.2.2",)
# Telemetry sample keys (the ~2 Hz sampler's readings inside a generation).
TELEMETRY_KEYS = ("swap_used_bytes", "swap_in_bytes_total", "rss_bytes", "memory_pressure",
                  "thermal_throttled", "cpu_speed_limit_pct", "power_source",
                  "low_power_mode")


def cv_threshold_problem(v: object) -> str | None:
    """Why ``v`` is no spread limit (``cv_threshold``), else None. 0 sets aside every config
    of two or more trials on a quiet node (every verdict "decided through the noise"), and a
    negative one writes a spread limit the orchestrator's boundary refuses (every flagged
    summary quarantined): above 0 only, said by the agent's parser and the plan's alike. No
    upper bound: a spread can pass 100% (234 and 17 tok/s on a contended node), and a plan
    that sets nothing aside says so with a large one (5.0)."""
    if not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < math.inf:
        return None
    return ("cv_threshold: the decode tok/s spread over which a config's repetitions are set "
            f"aside, above 0 (0.10 is 10%), got {v!r}")
