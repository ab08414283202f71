"""A package's import graph, read statically (``ast``), and its cycles.

An edge ``a -> b`` for every ``import`` of module ``b`` of the package in module ``a``, at module
level or inside a function (a function-level import that closes a cycle only hides it until that
function runs).  Imports under ``if TYPE_CHECKING:`` are for annotations only and are left out.
With ``parents``, importing ``a.b.c`` also loads the packages ``a.b`` (its ``__init__``), as Python
does, except the importer's own parents (a module runs inside its package already).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _targets(module: str, is_package: bool, node: ast.AST, modules) -> list[str]:
    """The package's modules an import statement loads (``from x import y``: ``x.y`` if a module, else ``x``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
    return [n for n in names if n in modules]


def _with_parents(target: str, importer: str, modules) -> list[str]:
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [target] + [p for p in parents if p in modules and not importer.startswith(p + ".")]


def import_graph(package: str, *, parents: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (module docstring)."""
    modules = _modules(package)
    graph = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for stmt in tree.body
            if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test)
            for n in ast.walk(stmt)
        }
        graph[module] = {
            loaded
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only
            for target in _targets(module, is_package, node, modules)
            for loaded in (_with_parents(target, module, modules) if parents else [target])
            if loaded != module
        }
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
