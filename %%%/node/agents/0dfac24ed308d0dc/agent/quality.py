"""Task checks for JSON and tool-call outputs: a config must not lose task quality.

A task is ``{"id", "prompt", "max_tokens", "response_prefix"?, "check": {...}}``; the
checked text is ``response_prefix + output`` (the prompt may open the JSON).
Checks: ``{"type": "json", "schema": S}`` or
``{"type": "tool_call", "tool": NAME, "schema": S}`` where S is a small JSON-schema
subset (type, properties, required, enum, items).
"""

from __future__ import annotations

import json

TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
    "boolean": bool, "null": type(None)}


def first_json(text: str):
    """The first JSON value that starts at a ``{`` or ``[`` in the text, or raise ValueError."""
    dec = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "{[":
            try:
                return dec.raw_decode(text, i)[0]
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON value found")


def validate(value, schema: dict, where: str = "$") -> list[str]:
    errors = []
    t = schema.get("type")
    if t:
        ok = isinstance(value, TYPES[t]) and not (t in ("integer", "number")
                                                   and isinstance(value, bool))
        if not ok:
            return [f"{where}: expected {t}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{where}: missing {key!r}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += validate(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{where}[{i}]")
    return errors


def check(task: dict, output: str) -> dict:
    """Pass/fail with the reason, for one task output."""
    text = task.get("response_prefix", "") + output
    spec = task["check"]
    try:
        value = first_json(text)
    except ValueError as e:
        return {"task": task["id"], "passed": False, "reason": str(e)}
    if spec["type"] == "tool_call":
        if not isinstance(value, dict) or value.get("name") != spec["tool"]:
            got = value.get("name") if isinstance(value, dict) else type(value).__name__
            return {"task": task["id"], "passed": False,
                    "reason": f"called {got!r}, expected {spec['tool']!r}"}
        value = value.get("arguments")
    errors = validate(value, spec.get("schema", {}))
    return {"task": task["id"], "passed": not errors, "reason": "; ".join(errors) or None}
