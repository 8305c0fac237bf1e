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


# The series metrics a rule may name (the weekly review computes these, units in names): a
# rule naming another is refused at load with its line, since it would never fire.
METRICS: dict[str, str] = {
    "best_k": "draft width of the fastest reliable speculative config",
    "best_config": "the fastest config's key", "best_label": "the fastest config's label",
    "best_speedup": "its median speedup over the baseline of its settings",
    "best_acceptance": "its median acceptance rate",
    "acceptance_at_4": "median acceptance at draft width 4 (the best config's settings)",
    "widest_k": "widest draft width measured with the best config's settings",
    "swap_peak_bytes": "peak swap used by any reliable config",
    "swap_in_nights": "nights with swap-ins (most of any reliable config)",
    "mem_increase": "peak memory of the best config over its baseline's, minus 1",
    "mem_added_bytes": "peak memory of the best config minus its baseline's, in bytes",
    "decode_share": "share of a baseline generation's time spent decoding",
    "itl_spike": "the best config's ITL p99 over the baseline's ITL p95",
    "acceptance_cv": "coefficient of variation of the best config's acceptance",
    "candidates": "configs that pass every gate",
    "load_mem_growth": "runtime peak memory, last clean load level over the first, minus 1",
    "load_swap_levels": "load levels with swap-ins",
    "load_cap": "the last load level before saturation, errors, swap or a missed SLO",
    "load_saturated_at": "the first saturated load level",
    "busy_itl_p99_ratio": "ITL p99 beside a background profile over idle",
}
# metrics holding text: evidence and actions may show them, a condition cannot compare them
TEXT_METRICS = frozenset({"best_config", "best_label"})


@dataclass(frozen=True)
class Rule:
    id: str
    when: str
    action: str
    evidence: tuple[str, ...]
    tree: ast.Expression


def _check(node: ast.AST, where: str, path: Path, line: int | None) -> None:
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare,
               ast.Name, ast.Load, ast.Constant, ast.USub, *OPS)
    for n in ast.walk(node):
        # a sign belongs to a number only: load_mem_growth < -0.1 (memory shrank)
        signed = isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)
        if not isinstance(n, allowed) or signed and not isinstance(
                getattr(n, "operand", None), ast.Constant):
            raise ConfigError(f"rule {where}: only comparisons, and/or/not, names and numbers "
                              f"are allowed (found {type(n).__name__})", str(path), line)


def _known_metrics(r: dict, tree: ast.Expression, path: Path) -> None:
    """Every metric a rule names (in when, evidence, an action's braces) is one the review
    computes: a misspelt one would leave the rule silently never firing."""
    import re

    evidence = r.get("evidence") or []
    if not isinstance(evidence, list):
        raise ConfigError(f"rule {r['id']}: evidence must be a list of metric names",
                          str(path), line_of(r, "evidence"))
    named = [("when", n.id) for n in ast.walk(tree) if isinstance(n, ast.Name)]
    # a condition compares numbers: text there raises TypeError in the review, or never fires
    for n in ast.walk(tree):
        text = n.id if isinstance(n, ast.Name) and n.id in TEXT_METRICS else (
            repr(n.value) if isinstance(n, ast.Constant)
            and not isinstance(n.value, (int, float)) else None)
        if text is not None:
            raise ConfigError(f"rule {r['id']}: when compares numbers; {text} is not one "
                              f"(name {', '.join(sorted(TEXT_METRICS))} in evidence or the action)",
                              str(path), line_of(r, "when"))
    named += [("evidence", str(m)) for m in evidence]
    named += [("action", m) for m in re.findall(r"\{(\w+)\}", str(r["action"]))]
    for key, name in named:
        if name not in METRICS:
            raise ConfigError(f"rule {r['id']}: {key} names unknown metric {name!r}; known: "
                              f"{', '.join(METRICS)}", str(path), line_of(r, key))


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
        _known_metrics(r, tree, path)
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
        if isinstance(node.op, ast.USub):
            return -_eval(node.operand, metrics)
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
