"""The decode boundary's fast path: is this event valid, yes or no, in straight-line code.

``eventcheck`` words *why* an event is not valid, check by check; that is most of ingest's
time per line when nearly every line is valid. Here each event type gets one generated
function (from the same declaration and the same column rules) that answers only whether
the event passes every check; a generation, nearly every line, is checked as one msgspec
type (``typedcheck``), in C. It is never more lenient than ``eventcheck``: anything it
does not pass (a NUL, deep nesting, any doubt) goes to ``eventcheck``, which decides and
says why (tests/test_decode_fast_path.py holds the two to each other on damaged journals).
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec import ValidationError, convert

from agent.protocol import EVENT_SCHEMA_MAJOR, MAX_EVENT_DEPTH

from .eventcheck import (
    ABSENT,
    DEEP_CHECKS,
    FIELDS,
    KNOB_VALUE_MAX,
    MAX_INT32,
    MAX_TS,
    models_problem,
)
from .jsondepth import openings, too_deep
from .typedcheck import GenerationShape

FastCheck = Callable[[dict, str], bool]


def _generation_ok(e: dict, text: str) -> bool:
    """A generation's whole check: its typed shape (``typedcheck``: schema, seq, ts, every
    declared field, every column and metric, config, telemetry, positions, reasons, in C),
    then what a type cannot say."""
    try:
        convert(e, GenerationShape)
    except ValidationError:
        return False
    if openings(text) > MAX_EVENT_DEPTH and too_deep(e, MAX_EVENT_DEPTH):
        return False
    if "\\u0000" in text or "\x00" in text:
        return False  # a NUL in model output is kept, replaced: eventcheck's to do
    v = e.get("knob_value")
    if v is not None and len(str(v)) > KNOB_VALUE_MAX:
        return False
    return (e.get("method") is None and e.get("models") is None) or models_problem(e) is None


def _type_source(typ: str, fields: tuple) -> list[str]:
    """The body of one type's check: schema, seq, ts, declared fields, depth, NUL, and the
    type's own checks (``deep``)."""
    body = [
        "def ok(e, text):", "    get = e.get", "    v = get('schema')",
        f"    if type(v) is not int or v != {EVENT_SCHEMA_MAJOR}: return False",
        "    v = get('seq')",
        f"    if type(v) is not int or not 0 < v <= {MAX_INT32}: return False",
        "    v = get('ts')",
        "    if (type(v) is not float and type(v) is not int) or not 0 <= v < MAX_TS: return False",
    ]
    for i, (name, _types, required) in enumerate(fields):
        if required:
            body.append(f"    if type(get({name!r}, ABSENT)) not in T{i}: return False")
        else:
            body += [f"    v = get({name!r})",
                     f"    if v is not None and type(v) not in T{i}: return False"]
    body += [
        "    if openings(text) > MAX_DEPTH and too_deep(e, MAX_DEPTH):",
        "        return False",
        "    if NUL_ESCAPED in text or NUL in text: return False",
        "    return deep(e)",
    ]
    return body


def _compile(body: list[str], name: str, namespace: dict):
    exec("\n".join(body), namespace)  # noqa: S102 - our own fields and rules, not input
    return namespace[name]


def _passes(check: Callable[[dict], str | None] | None) -> Callable[[dict], bool]:
    """A type's worded check as yes/no (rare types: not worth a fast copy)."""
    if check is None:
        return lambda e: True
    return lambda e: check(e) is None


def _build() -> dict[str, FastCheck]:
    base = {"ABSENT": ABSENT, "MAX_TS": MAX_TS, "MAX_DEPTH": MAX_EVENT_DEPTH,
            "too_deep": too_deep, "openings": openings, "NUL": "\x00",
            "NUL_ESCAPED": "\\u0000"}
    out: dict[str, FastCheck] = {}
    for typ, fields in FIELDS.items():
        namespace = {**base, "deep": _passes(DEEP_CHECKS.get(typ)),
                     **{f"T{i}": f[1] for i, f in enumerate(fields)}}
        out[typ] = _compile(_type_source(typ, fields), "ok", namespace)
    out["generation"] = _generation_ok  # nearly every line: typed, in C
    return out


# event type → ``ok(event, text)``: True only for an event ``eventcheck`` would pass as is
FAST_CHECKS: dict[str, FastCheck] = _build()
