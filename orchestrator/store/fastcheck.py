"""The decode boundary's fast path: is this event valid, yes or no, in straight-line code.

``eventcheck`` words *why* an event is not valid, check by check; that is most of ingest's
time per line when nearly every line is valid. Here each event type gets one generated
function (from the same declaration and the same column rules) that answers only whether
the event passes every check. It is never more lenient than ``eventcheck``: anything it
does not pass (a NUL, deep nesting, any doubt) goes to ``eventcheck``, which decides and
says why (tests/test_decode_fast_path.py holds the two to each other on damaged journals).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.protocol import EVENT_SCHEMA_MAJOR, GENERATION_METRICS, MAX_EVENT_DEPTH

from .eventcheck import (
    ABSENT,
    BIG,
    DEEP_CHECKS,
    FIELDS,
    FLOAT,
    GENERATION_RULES,
    INT,
    KNOB_VALUE_MAX,
    MAX_INT32,
    MAX_TS,
    check_sample_values,
    column_test,
    models_problem,
    too_deep,
)

FastCheck = Callable[[dict, str], bool]


def _generation_source() -> list[str]:
    """The body of ``generation_ok``: every check of ``eventcheck._check_generation``."""
    body = ["def generation_ok(e):", "    get = e.get"]
    metrics = set(GENERATION_METRICS)
    for name, kind, size, nullable in GENERATION_RULES:
        body.append(f"    v = get({name!r})")
        if not nullable:
            body.append("    if v is None: return False")
        test = column_test(kind, size)
        if name in metrics and kind in (FLOAT, INT, BIG):
            test = f"({test}) or v < 0"  # a metric is a non-negative number too
        if test is not None:
            body.append(f"    if v is not None and ({test}): return False")
    for name in GENERATION_METRICS:
        if name not in {r[0] for r in GENERATION_RULES}:
            body += [f"    v = get({name!r})",
                     "    if v is not None and ((type(v) is not float and type(v) is not int)"
                     " or v < 0): return False"]
    body += [
        "    v = get('knob_value')",
        f"    if v is not None and len(str(v)) > {KNOB_VALUE_MAX}: return False",
        "    if (get('method') is not None or get('models') is not None) and models_problem(e):",
        "        return False",
        "    v = e['config'].get('temperature')",
        "    if type(v) is not float and type(v) is not int: return False",
        "    v = get('output_text')",
        "    if type(v) is str and NUL in v: return False",
        "    v = get('unreliable_reasons')",
        "    if v is not None and (type(v) is not list or any(type(x) is not str for x in v)):",
        "        return False",
        "    for p in get('acceptance_by_position') or ():",
        "        if type(p) is not dict: return False",
        "        v = p.get('position')",
        "        if type(v) is not int or v < 1 or type(p.get('drafted')) is not int \\",
        "                or type(p.get('accepted')) is not int: return False",
        "    v = get('telemetry')",
        "    if v is not None:",
        "        if type(v) is not list: return False",
        "        for s in v:",
        "            if type(s) is not dict or check_sample_values(s) is not None: return False",
        "    return True",
    ]
    return body


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
        "    if text.count('{') + text.count('[') > MAX_DEPTH and too_deep(e, MAX_DEPTH):",
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
            "too_deep": too_deep, "NUL": "\x00", "NUL_ESCAPED": "\\u0000",
            "models_problem": models_problem, "check_sample_values": check_sample_values}
    generation_ok = _compile(_generation_source(), "generation_ok", dict(base))
    out = {}
    for typ, fields in FIELDS.items():
        deep = generation_ok if typ == "generation" else _passes(DEEP_CHECKS.get(typ))
        namespace = {**base, "deep": deep, **{f"T{i}": f[1] for i, f in enumerate(fields)}}
        out[typ] = _compile(_type_source(typ, fields), "ok", namespace)
    return out


# event type → ``ok(event, text)``: True only for an event ``eventcheck`` would pass as is
FAST_CHECKS: dict[str, FastCheck] = _build()
