"""The layout keeps its promises: no import cycles in agent/ + orchestrator/, no private
name imported across modules (tests/test_agent_light.py keeps the agent's own imports to the
standard library, mlx, mlx-lm and psutil)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    out = {}
    for pkg in ("agent", "orchestrator"):
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def imports(mods: dict[str, Path]):
    """(importer, imported module, names) for every import, top level or inside a function."""
    for m, p in mods.items():
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = m.split(".") if is_pkg else m.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [a.name for a in node.names]
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
                if subs and len(subs) == len(names):  # `from . import a, b`: the submodules
                    for s in subs:
                        yield m, s, []
                else:
                    yield m, target, names
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield m, a.name, []


def test_no_import_cycles():
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, target, _ in imports(mods):
        if target in mods and target != m:
            edges[m].add(target)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in mods:
        if v not in index:
            visit(v)
    assert cycles == []


def test_no_private_name_is_imported_across_modules():
    mods = modules()
    bad = [(m, t, n) for m, t, names in imports(mods) if t in mods
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert bad == []
