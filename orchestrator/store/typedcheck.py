"""The generation event's checks as one msgspec type: its validation runs in C.

A generation is nearly every line ingest reads; checking it value by value in Python was
most of the decode boundary's time per line. Here the same checks become one msgspec type,
derived from the same declarations ``eventcheck`` words its reasons from (the protocol's
fields, the store's column rules, the metrics), so there is no second definition: a column
added to the store is checked here without being named. ``msgspec.convert`` of the parsed
object into it either passes or raises; it builds no dict.

It is never more lenient than ``eventcheck`` (``tests/test_decode_fast_path.py``): where a
type cannot say a rule exactly it says a stricter one (a float column refuses ±inf as well
as NaN), and what a type cannot say at all (depth, NUL, ``knob_value``'s length as text, a
lineup's roles) ``fastcheck`` checks after it. Anything refused goes to ``eventcheck``.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from agent.protocol import EVENT_SCHEMA_MAJOR, GENERATION_METRICS

from .eventcheck import (
    ANY,
    BIG,
    BOOL,
    FIELDS,
    FLOAT,
    GENERATION_RULES,
    INT,
    MAX_INT32,
    MAX_INT64,
    MAX_TS,
    SAMPLE_RULES,
    STR,
)

_FINITE = sys.float_info.max  # msgspec bounds must be finite: NaN fails any bound


def _number(non_negative: bool) -> Any:
    """A JSON number, integer or float (each kept as it came); a float that compares (not
    NaN) and is finite, or with ``non_negative`` one of at least 0."""
    if non_negative:
        return Annotated[int, Meta(ge=0)] | Annotated[float, Meta(ge=0.0)]
    return int | Annotated[float, Meta(ge=-_FINITE, le=_FINITE)]


def _column(kind: int, size: int, metric: bool) -> Any:
    """The type of a value that fits a store column of this kind (and, for a metric, is
    not negative)."""
    if kind in (INT, BIG):
        top = MAX_INT32 if kind == INT else MAX_INT64
        return Annotated[int, Meta(ge=0 if metric else -top, le=top)]
    if kind == FLOAT:
        return _number(metric)
    if kind == BOOL:
        return bool
    if kind == STR:
        return Annotated[str, Meta(max_length=size)] if size else str
    assert kind == ANY
    return Any


_RULE_TYPES: dict[int, set[type]] = {INT: {int}, BIG: {int}, FLOAT: {int, float}, BOOL: {bool},
                                   STR: {str}}


def _narrower(name: str, kind: int, declared: tuple[tuple[type, ...], bool] | None) -> None:
    """A field both declared and stored takes its column's type: that must be no wider than
    the declaration, or this type would pass what ``eventcheck`` refuses."""
    if declared is not None and kind != ANY and not _RULE_TYPES[kind] <= set(declared[0]):
        raise TypeError(f"generation.{name}: its column takes {_RULE_TYPES[kind]}, the "
                        f"protocol declares {declared[0]}")


def _declared(types: tuple[type, ...]) -> Any:
    """The union of a protocol field's JSON types (``float`` is listed with ``int``)."""
    kinds = [t for t in types if t is not type(None)]
    out: Any = kinds[0]
    for t in kinds[1:]:
        out = out | t
    return out


def _struct(name: str, spec: list[tuple[str, Any, bool]]) -> type[msgspec.Struct]:
    """A struct of (field, type, required); an optional field may be null or absent.
    Unknown keys are ignored (a minor version adds fields; they are checked elsewhere)."""
    required = [(str(n), t) for n, t, req in spec if req]
    optional = [(str(n), t | None, None) for n, t, req in spec if not req]
    return msgspec.defstruct(name, [*required, *optional])


def _sample() -> type[msgspec.Struct]:
    return _struct("TelemetrySampleShape", [(n, _column(k, s, False), not null)
                                            for n, k, s, null in SAMPLE_RULES])


def _fields() -> list[tuple[str, Any, bool]]:
    """Every generation field a check names: its type, and whether it must be present and
    not null (required and nullable together: present, but may be null)."""
    rules = {n: (k, s, null) for n, k, s, null in GENERATION_RULES}
    declared = {n: (ts, req) for n, ts, req in FIELDS["generation"]}
    sample: Any = _sample()
    position: Any = msgspec.defstruct("PositionShape", [
        ("position", Annotated[int, Meta(ge=1)]), ("drafted", int), ("accepted", int)])
    special: dict[str, Any] = {  # eventcheck's own checks of these objects and lists
        "config": msgspec.defstruct("ConfigShape", [("temperature", int | float)]),
        "telemetry": list[sample], "acceptance_by_position": list[position],
        "unreliable_reasons": list[str],
    }
    ts: Any = Annotated[int, Meta(ge=0, lt=int(MAX_TS))] | Annotated[float, Meta(
        ge=0.0, lt=MAX_TS)]
    out: list[tuple[str, Any, bool]] = [
        ("schema", Literal[EVENT_SCHEMA_MAJOR], True),
        ("seq", Annotated[int, Meta(gt=0, le=MAX_INT32)], True),
        ("ts", ts, True)]
    for name in dict.fromkeys([*declared, *rules, *GENERATION_METRICS, *special]):
        metric = name in GENERATION_METRICS
        if name in special:
            t = special[name]
        elif name in rules:
            t = _column(rules[name][0], rules[name][1], metric)
            _narrower(name, rules[name][0], declared.get(name))
        elif metric:
            t = _number(True)
        else:
            t = _declared(declared[name][0])
        # present and not null: a column that holds no null; present: a required field
        not_null = name in rules and not rules[name][2]
        present = name in declared and declared[name][1]
        nullable = not not_null and (not present or type(None) in declared[name][0])
        out.append((name, t | None if present and nullable else t, present or not_null))
    return out


GenerationShape = _struct("GenerationShape", _fields())

