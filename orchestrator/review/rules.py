"""Signal → action rules: YAML, each with a small boolean expression over series metrics."""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..yamlfile import line_of, load_yaml

DEFAULT_RULES = Path(__file__).resolve().parents[1] / "rules" / "default.yml"
OPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
       ast.Eq: operator.eq, ast.NotEq: operator.ne}


@dataclass(frozen=True)
class Rule:
    id: str
    when: str
    action: str
    evidence: tuple[str, ...]
    tree: ast.Expression


def _check(node: ast.AST, where: str, path: Path, line: int | None) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare,
               ast.Name, ast.Load, ast.Constant, *OPS)
    for n in ast.walk(node):
        if not isinstance(n, allowed):
            raise ConfigError(f"rule {where}: only comparisons, and/or/not, names and numbers "
                              f"are allowed (found {type(n).__name__})", str(path), line)


def load_rules(path: Path = DEFAULT_RULES) -> list[Rule]:
    data = load_yaml(path)
    if not isinstance(data, list):
        raise ConfigError("rules file must be a list of rules", str(path))
    rules = []
    for i, r in enumerate(data):
        line = line_of(r)
        if not isinstance(r, dict) or {"id", "when", "action"} - set(r):
            raise ConfigError(f"rule {i}: needs id, when and action", str(path), line)
        unknown = set(r) - {"id", "when", "action", "evidence"}
        if unknown:
            raise ConfigError(f"rule {r['id']}: unknown key {sorted(unknown)[0]!r}", str(path),
                              line)
        try:
            tree = ast.parse(str(r["when"]), mode="eval")
        except SyntaxError as e:
            raise ConfigError(f"rule {r['id']}: cannot parse when: {e.msg}", str(path),
                              line_of(r, "when")) from None
        _check(tree, r["id"], path, line_of(r, "when"))
        rules.append(Rule(r["id"], str(r["when"]), str(r["action"]),
                          tuple(r.get("evidence") or ()), tree))
    return rules


def _eval(node: ast.AST, metrics: dict):
    if isinstance(node, ast.Expression):
        return _eval(node.body, metrics)
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v, metrics) for v in node.values]
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.UnaryOp):
        return not _eval(node.operand, metrics)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, metrics)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, metrics)
            if left is None or right is None or not OPS[type(op)](left, right):
                return False  # a metric we could not measure never fires a rule
            left = right
        return True
    if isinstance(node, ast.Name):
        return metrics.get(node.id)
    if isinstance(node, ast.Constant):
        return node.value
    raise ValueError(f"unsupported expression {ast.dump(node)[:60]}")


def _action(text: str, metrics: dict) -> str:
    """``{metric}`` in an action becomes its measured value ("cap at {load_cap} streams")."""
    import re

    def value(m):
        v = metrics.get(m.group(1))
        return m.group(0) if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    return re.sub(r"\{(\w+)\}", value, text)


def fire(rules: list[Rule], metrics: dict) -> list[dict]:
    """The rules whose condition holds, with the evidence that made them fire."""
    return [{"rule": r.id, "action": _action(r.action, metrics), "when": r.when,
             "evidence": {k: metrics.get(k) for k in r.evidence}}
            for r in rules if _eval(r.tree, metrics)]
