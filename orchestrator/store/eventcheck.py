"""What makes a JSON object a valid event of the schema: one check, two users.

The controller's decode boundary (``orchestrator.sweep.decode``) runs it on every journal
line a follower reads, and the store's read path (``store.queries.events``) runs it again
on every stored event a reader asks for, so an event stored by an older, weaker boundary
reaches no reader in a shape the reader does not expect: it is shown as unreadable.

The checks are derived from the protocol (``agent.events``: per event type its required
and optional fields with their types; bounded size and nesting) and from the store's own
column definitions, so a column added to the store is checked without being named here.
They are plain ``type()`` comparisons: no object is built per check.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, Integer, String, Text

from agent.load import LOADS
from agent.protocol import (
    CONTENTION_CAUSES,
    DRAFT_FREE_METHODS,
    EVENT_SCHEMA_MAJOR,
    EVENTS,
    GENERATION_METRICS,
    MAX_EVENT_DEPTH,
    MAX_ROLES,
    MODEL_ROLE,
    role_kind,
)

from .jsondepth import openings, too_deep
from .models import Measurement, Run, TelemetrySample

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
# an event's time must be one a datetime and PostgreSQL's to_timestamp can hold (ingest
# derives measured_at from it): 1970-01-01 up to the end of year 9999
MAX_TS = 253402300800.0

# -- column rules, derived from the store's tables ----------------------------------------

INT, BIG, FLOAT, BOOL, STR, ANY = range(6)


def _rules(table, names, skip=()) -> tuple[tuple[str, int, int, bool], ...]:
    out = []
    columns = getattr(table, "__table__", table).c  # a mapped class, or a Table (a view)
    for name in names:
        if name in skip:
            continue
        col = columns[name]
        t = col.type
        if isinstance(t, BigInteger):
            kind, size = BIG, 0
        elif isinstance(t, Integer):
            kind, size = INT, 0
        elif isinstance(t, Float):
            kind, size = FLOAT, 0
        elif isinstance(t, Boolean):
            kind, size = BOOL, 0
        elif isinstance(t, String) and not isinstance(t, Text):
            kind, size = STR, t.length or 0
        elif isinstance(t, Text):
            kind, size = STR, 0
        elif isinstance(t, JSON):
            kind, size = ANY, 0
        else:  # pragma: no cover - a new column type must be given a rule
            raise TypeError(f"no decode rule for {col.table.name}.{name}: {t!r}")
        out.append((name, kind, size, bool(col.nullable)))
    return tuple(out)


def _measurement_fields() -> tuple[str, ...]:
    from .rows import MEASUREMENT_COLUMNS

    return MEASUREMENT_COLUMNS


GENERATION_RULES = _rules(Measurement, _measurement_fields(),
                          skip=("knob_value", "unreliable_reasons"))
SAMPLE_RULES = _rules(TelemetrySample, ("ts", *[
    c.name for c in TelemetrySample.c if c.name not in ("sweep_id", "node", "seq", "idx", "ts")]))
# a config_summary becomes a `runs` row: its strings are checked against those columns
SUMMARY_RULES = _rules(Run, ("workload", "mode", "knob", "context_bucket", "prompt_sha256",
                             "engine"))
KNOB_VALUE_MAX: int = Measurement.__table__.c["knob_value"].type.length  # type: ignore[attr-defined]
QUANT_MAX: int = Run.__table__.c["draft_quant"].type.length  # type: ignore[attr-defined]


def _value_problem(name: str, v: Any, kind: int, size: int, nullable: bool) -> str | None:
    t = type(v)
    if v is None:
        return None if nullable else f"{name} is missing"
    if kind == FLOAT:
        if t is float or t is int:
            return None if t is int or v == v else f"{name} is NaN"
        return f"{name} must be a number, got {t.__name__}"
    if kind == INT or kind == BIG:
        if t is not int:
            return f"{name} must be an integer, got {t.__name__}"
        top = MAX_INT32 if kind == INT else MAX_INT64
        return None if -top <= v <= top else f"{name}={v} is out of range"
    if kind == BOOL:
        return None if t is bool else f"{name} must be true/false, got {t.__name__}"
    if kind == STR:
        if t is not str:
            return f"{name} must be a string, got {t.__name__}"
        if size and len(v) > size:
            return f"{name} is {len(v)} characters long; the store holds {size}"
        if "\x00" in v:
            return f"{name} holds a NUL character"
        return None
    return None


def column_test(kind: int, size: int) -> str | None:
    """Python source true when a present value ``v`` does not fit a column of this kind
    (None: a JSON column takes anything)."""
    top = MAX_INT32 if kind == INT else MAX_INT64
    return {
        FLOAT: "(type(v) is not float and type(v) is not int) or v != v",
        INT: f"type(v) is not int or not {-top} <= v <= {top}",
        BIG: f"type(v) is not int or not {-top} <= v <= {top}",
        BOOL: "type(v) is not bool",
        STR: "type(v) is not str or '\\x00' in v" + (f" or len(v) > {size}" if size else ""),
    }.get(kind)


def _checker(rules, label: str):
    """One function that checks every rule's value in straight-line code.

    Why generated: this runs for every value of every generation event (ingest's hot
    path), and a loop over the rules spent most of its time on the loop itself. The
    common case is one ``type()`` comparison per value; ``_value_problem`` words what failed.
    """
    body = [f"def {label}(e):", "    get = e.get"]
    for name, kind, size, nullable in rules:
        body.append(f"    v = get({name!r})")
        body.append("    if v is None:")
        body.append("        pass" if nullable else f"        return {name + ' is missing'!r}")
        fail = f"_value_problem({name!r}, v, {kind}, {size}, {nullable})"
        test = column_test(kind, size)
        if test is not None:  # JSON columns take anything
            body.append(f"    elif {test}:")
            body.append(f"        return {fail}")
    body.append("    return None")
    namespace = {"_value_problem": _value_problem}
    exec("\n".join(body), namespace)  # noqa: S102 - our own rules, derived from our columns
    return namespace[label]


_check_generation_values = _checker(GENERATION_RULES, "_check_generation_values")
check_sample_values = _checker(SAMPLE_RULES, "check_sample_values")
_check_summary_values = _checker(SUMMARY_RULES, "_check_summary_values")


def _knob_value_problem(e: dict) -> str | None:
    # stored as text in a bounded column, whatever type the value had
    kv = e.get("knob_value")
    if kv is not None and len(str(kv)) > KNOB_VALUE_MAX:
        return f"knob_value is longer than {KNOB_VALUE_MAX} characters"
    return None


_ROLE = re.compile(MODEL_ROLE)


def models_problem(e: dict) -> str | None:
    """A lineup result's pair (events 1.3): roles, so the store can file it under its pair;
    or the draft-free method it speculated with."""
    method = e.get("method")
    if method is not None and method not in DRAFT_FREE_METHODS:
        return f"method {str(method)[:40]!r} is not one of {', '.join(DRAFT_FREE_METHODS)}"
    m = e.get("models")
    if m is None:
        return None
    if type(m) is not dict or set(m) - {"target", "draft"} or type(m.get("target")) is not str:
        return "models must be an object {target: role, draft: role}"
    for kind, role in m.items():
        if role is not None and (type(role) is not str or not _ROLE.fullmatch(role)
                                 or role_kind(role) != kind):
            return f"models.{kind} {str(role)[:40]!r} is not a {kind} role"
    return None


def _check_generation(e: dict) -> str | None:
    problem = models_problem(e)
    if problem:
        return problem
    cfg = e["config"]
    t = cfg.get("temperature")
    if type(t) is not float and type(t) is not int:
        return "config.temperature must be a number"
    text = e.get("output_text")
    if type(text) is str and "\x00" in text:
        # model output may hold anything: keep the event, store the text without the NUL
        # (PostgreSQL text cannot hold it); token_ids still carry the exact output
        e["output_text"] = text.replace("\x00", "\ufffd")
    problem = _check_generation_values(e) or _knob_value_problem(e)
    if problem:
        return problem
    for k in GENERATION_METRICS:  # readers and exports compute with each of them
        v = e.get(k)
        if v is not None and ((type(v) is not float and type(v) is not int) or v < 0):
            return f"{k} {v!r} is not a non-negative number"
    reasons = e.get("unreliable_reasons")
    if reasons is not None and (type(reasons) is not list or
                                any(type(r) is not str for r in reasons)):
        return "unreliable_reasons must be a list of strings"
    by_pos = e.get("acceptance_by_position")
    if by_pos is not None and any(
            type(p) is not dict or type(p.get("position")) is not int or p["position"] < 1
            or type(p.get("drafted")) is not int or type(p.get("accepted")) is not int
            for p in by_pos):
        return "acceptance_by_position must be objects with integer position, drafted, accepted"
    samples = e.get("telemetry")
    if samples is not None:
        if type(samples) is not list:
            return "telemetry must be a list"
        for s in samples:
            if type(s) is not dict:
                return "telemetry samples must be objects"
            problem = check_sample_values(s)
            if problem:
                return f"telemetry: {problem}"
    return None


def _check_summary(e: dict) -> str | None:
    problem = models_problem(e)
    if problem:
        return problem
    m = e["metrics"]
    for metric, keys in (("decode_tok_s", ("median", "p95", "cv")), ("acceptance_rate",
                                                                     ("median",))):
        d = m.get(metric)
        if type(d) is not dict:
            return f"metrics.{metric} must be an object"
        for k in keys:  # the store reads each of them: present, a number or null
            v = d.get(k)
            if k not in d or (v is not None and type(v) is not float and type(v) is not int):
                return f"metrics.{metric}.{k} must be a number or null"
    return _check_summary_values(e) or _knob_value_problem(e)


def _check_environment(e: dict) -> str | None:
    fp = e["fingerprints"]
    if "target" not in fp or "draft" not in fp:
        return "fingerprints must name the target and the draft"
    if len(fp) > MAX_ROLES or any(type(r) is not str or not _ROLE.fullmatch(r) for r in fp):
        return f"fingerprints: at most {MAX_ROLES} model roles (target, draft, draft-2 …)"
    for role, v in fp.items():
        if v is not None and (type(v) is not str or len(v) > 80):
            return f"fingerprints.{role} must be a string of at most 80 characters"
    for k, v in e["versions"].items():
        if v is not None and (type(v) is not str or len(v) > 32):
            return f"versions.{k} must be a version string"
    quant = e.get("quantization")  # events 1.2
    if quant is not None:
        if type(quant) is not dict:
            return "quantization must be an object"
        if len(quant) > MAX_ROLES or set(quant) - set(fp):
            return "quantization must name the roles of fingerprints"
        for role in quant:
            v = quant.get(role)
            if v is not None and (type(v) is not str or len(v) > QUANT_MAX or "\x00" in v):
                return f"quantization.{role} must be a string of at most {QUANT_MAX} characters"
    return None


_LOAD_COUNTS = ("requests", "completed", "errors", "good_requests", "output_tokens")
_LOAD_TEXTS = ("stop_reason", "error", "arrivals", "workload", "variant")
# read as numbers by the review (and cast by the PostgreSQL Grafana view, bytes to bigint)
_LOAD_NUMBERS = ("rss_peak_bytes", "swap_in_bytes", "acceptance_rate", "cpu_other_share",
                 "cpu_controller_share", "cpu_steal_share")


def _check_load_level(e: dict) -> str | None:
    """A load level feeds the review's throughput–latency tables: its numbers must be
    numbers, its counts counts."""
    if e["load"] not in LOADS:
        return f"load {e['load']!r} is not one of {', '.join(LOADS)}"
    if e["status"] not in ("ok", "saturated", "failed"):
        return f"status {e['status']!r} is not one of ok, saturated, failed"
    if not (0 < e["level"] <= 100_000) or not math.isfinite(e["level"]):
        return f"level {e['level']!r} is not a positive number"
    for k in _LOAD_COUNTS:
        v = e.get(k)
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_INT32):
            return f"{k} {v!r} is not a count"
    for k, v in e.items():
        if k.endswith(("_ms", "_s", "_rps", "_rps_at_most")) or "_ms_p" in k \
                or k.startswith("output_tok_s"):
            if v is not None and (type(v) not in (int, float) or not math.isfinite(v) or v < 0):
                return f"{k} {v!r} is not a non-negative number"
    for k in _LOAD_NUMBERS:
        v = e.get(k)
        if v is not None and (type(v) not in (int, float) or not 0 <= v < 2**63):
            return f"{k} {v!r} is not a non-negative number"
    for k in _LOAD_TEXTS:
        v = e.get(k)
        if v is not None and (type(v) is not str or len(v) > 2000 or "\x00" in v):
            return f"{k} must be a string of at most 2000 characters"
    slo = e.get("slo")
    if slo is not None and (type(slo) is not dict or any(
            type(v) not in (int, float) for v in slo.values())):
        return "slo must be an object of numbers"
    return _strings("unreliable_reasons")(e)


def _strings(*names: str):
    """Lists that readers join into a sentence ("; ".join): strings, or the join fails."""
    def check(e: dict) -> str | None:
        for name in names:
            v = e.get(name)
            if v is not None and (type(v) is not list or any(type(x) is not str for x in v)):
                return f"{name} must be a list of strings"
        return None
    return check


_PARITY = {"checked": (int,), "mismatches": (int,), "first_difference": (int, type(None)),
           "tool_mismatches": (int,)}


def _share(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and 0 <= v <= 10


def _contention_problem(e: dict) -> str | None:
    """A config's contention readings, as the review ranges them: fractions of the CPU."""
    c = e.get("contention")
    if c is None:
        return None
    if (type(c) is not dict or type(c.get("shares")) is not list or not c["shares"]
            or not all(_share(s) for s in c["shares"]) or not _share(c.get("limit"))):
        return "contention must be {shares: fractions of the CPU, limit: a fraction}"
    for cause, _ in CONTENTION_CAUSES:  # events 1.10: each trial's share by cause
        v = c.get(cause)
        if v is not None and (type(v) is not list or len(v) != len(c["shares"]) or not all(
                x is None or _share(x) for x in v)):
            return (f"contention.{cause} must be one fraction of the CPU (or null) per "
                    "contended trial")
    return None


def _spread_problem(e: dict) -> str | None:
    """The spread that set a config aside (events 1.9), as the pages word it: fractions."""
    c = e.get("spread")
    v = c.get("value") if type(c) is dict else None
    if c is not None and not (isinstance(v, (int, float)) and type(v) is not bool
                              and math.isfinite(v) and v >= 0 and _share(c.get("limit"))):
        return "spread must be {value: a fraction ≥ 0, limit: a fraction}"
    return None


def _parity_problem(e: dict) -> str | None:
    """An http engine's streaming parity, as the review sums it (agent/summary.py)."""
    p = e.get("parity")
    if p is None:
        return None
    if (type(p) is not dict or "checked" not in p or "mismatches" not in p
            or any(type(v) not in _PARITY.get(k, (type(v),)) for k, v in p.items())):
        return "parity must be {checked, mismatches: counts, first_difference, tool_mismatches}"
    return None


def _values_problem(e: dict) -> str | None:
    """Each metric's per-trial values, as the review takes medians of them."""
    v = e.get("values")
    if v is not None and any(x is not None and (type(x) is not list or any(
            y is not None and type(y) is not float and type(y) is not int for y in x))
            for x in v.values()):
        return "values must be an object of lists of numbers (or nulls)"
    return None


def _check_summary_and_reasons(e: dict) -> str | None:
    return (_check_summary(e) or _strings("unreliable_reasons")(e) or _parity_problem(e)
            or _contention_problem(e) or _spread_problem(e)
            or _values_problem(e))


DEEP_CHECKS = {"generation": _check_generation, "config_summary": _check_summary_and_reasons,
               "environment_checked": _check_environment, "load_level": _check_load_level,
               "job_finished": _strings("reasons"), "soak_result": _strings("reasons")}


def _json_name(t: type) -> str:
    return {type(None): "null", dict: "object", list: "array", str: "string",
            bool: "true/false", int: "integer", float: "number"}.get(t, t.__name__)


# per type: (name, types, required) for every declared field, in declaration order
FIELDS = {t: tuple((n, ts, True) for n, ts in d.required.items())
           + tuple((n, ts, False) for n, ts in d.optional.items()) for t, d in EVENTS.items()}
ABSENT = object()  # of no JSON type: a required field that is missing fails its check


def _nul_at(o: Any, path: str) -> str | None:
    """Where a NUL character is, in a key or a string value (None if nowhere)."""
    t = type(o)
    if t is str:
        return path if "\x00" in o else None
    if t is dict:
        for k, v in o.items():
            where = f"{path}.{k}" if path else str(k)
            if "\x00" in k:
                return f"a key of {path or 'the event'}"
            found = _nul_at(v, where)
            if found:
                return found
    elif t is list:
        for i, v in enumerate(o):
            found = _nul_at(v, f"{path}[{i}]")
            if found:
                return found
    return None


def seq_of(e: dict) -> int | None:
    """The event's seq when it is one (an integer in 1..2³¹−1), else None."""
    seq = e.get("seq")
    return seq if type(seq) is int and 0 < seq <= MAX_INT32 else None


def schema_problem(e: dict) -> str | None:
    schema = e.get("schema")
    if schema != EVENT_SCHEMA_MAJOR or type(schema) is not int:
        return (f"schema {schema!r} is not this stream's event schema (this controller "
                f"reads {EVENT_SCHEMA_MAJOR}.x)")
    return None


def seq_problem(e: dict) -> str | None:
    if seq_of(e) is None:
        return f"seq {e.get('seq')!r} is not an integer in 1..{MAX_INT32}"
    return None


def fields_problem(e: dict, text: str) -> str | None:
    """Why an object with a valid schema and seq is not a valid event (None when it is):
    its type, ts, the declared fields' types, depth, NUL characters and the per-type checks
    against the store's columns. ``text`` is the JSON it was parsed from. May replace a NUL
    in ``output_text`` (model output may hold anything)."""
    typ = e.get("type")
    fields = FIELDS.get(typ) if isinstance(typ, str) else None
    if fields is None:
        return f"unknown event type {typ!r}"
    ts = e.get("ts")
    if (type(ts) is not float and type(ts) is not int) or not math.isfinite(ts):
        return f"ts {ts!r} is not a number"
    if not 0 <= ts < MAX_TS:
        return f"ts {ts!r} is not a time between 1970 and 9999"
    for name, types, required in fields:
        v = e.get(name, ABSENT)
        if type(v) not in types and (required or v is not None and v is not ABSENT):
            got = "nothing" if v is ABSENT else _json_name(type(v))
            return (f"{typ}: field {name!r} must be "
                    f"{'/'.join(_json_name(t) for t in types)}, got {got}")
    # a flat line cannot be deep: count brackets (C speed) before walking
    if openings(text) > MAX_EVENT_DEPTH and too_deep(e, MAX_EVENT_DEPTH):
        return f"{typ}: nested deeper than {MAX_EVENT_DEPTH} levels"
    if "\\u0000" in text or "\x00" in text:
        # model output may hold anything (kept, the NUL replaced below); nothing else
        # may: PostgreSQL's text and JSON columns cannot hold it
        out = e.pop("output_text", None)
        where = _nul_at(e, "")
        if out is not None:
            e["output_text"] = out
        if where:
            return f"{typ}: {where} holds a NUL character"
    deep = DEEP_CHECKS.get(str(typ))
    if deep is not None:
        problem = deep(e)
        if problem:
            return f"{typ}: {problem}"
    return None


def event_problem(e: Any, text: str) -> str | None:
    """Why a parsed JSON value is not a valid event of this controller's schema, or None:
    what a stored event is read through (the boundary raises for another major version
    where this only words it)."""
    if type(e) is not dict:
        return f"an event must be a JSON object, got {type(e).__name__}"
    return schema_problem(e) or seq_problem(e) or fields_problem(e, text)
