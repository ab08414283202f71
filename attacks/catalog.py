"""The attack registry read from source, without importing torch: ``attack_catalog()``.

``secure-fgl attacks`` lists every attack's name, exchange, target algorithms and the first
paragraph of its docstring.  Importing the attack classes would import torch (seconds), so this
module reads the same facts from the source files with :mod:`ast`: the order of
``attacks.runner.ATTACKS``, each class's ``name``, ``exchange`` and ``algorithms`` (looking
through base classes and module constants such as ``EXCHANGE``) and its docstring.  The classes
stay the only place these facts are written.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FIELDS = ("name", "exchange", "algorithms")


@dataclass(frozen=True)
class AttackEntry:
    """What ``secure-fgl attacks`` lists of one attack: name, exchange, target algorithms and docstring."""

    name: str
    exchange: str
    algorithms: tuple[str, ...] | None
    doc: str


@cache
def _module(name: str) -> ast.Module:
    return ast.parse((Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8"))


def _where(module: str, symbol: str) -> tuple[str, ast.AST]:
    """The module and node that define ``symbol`` as seen from ``module`` (following ``from .x import``)."""
    for node in _module(module).body:
        if isinstance(node, ast.ClassDef) and node.name == symbol:
            return module, node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == symbol for t in node.targets):
            return module, node.value
        if isinstance(node, ast.ImportFrom) and node.module and (node.level == 1 or node.module.startswith("attacks.")):
            if any((alias.asname or alias.name) == symbol for alias in node.names):
                return _where(node.module.removeprefix("attacks."), symbol)
    raise LookupError(f"{symbol} is not defined in attacks/{module}.py")


def _value(module: str, node: ast.AST):
    if isinstance(node, ast.Name):
        return _value(*_where(module, node.id))
    return ast.literal_eval(node)


def _attributes(module: str, cls: ast.ClassDef) -> dict:
    """The class's ``FIELDS``, its own assignments over those of its bases."""
    found: dict = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found.update(_attributes(*_where(module, base.id)))
    for node in cls.body:
        target, value = (
            (node.targets[0], node.value)
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            else (node.target, node.value)
            if isinstance(node, ast.AnnAssign)
            else (None, None)
        )
        if isinstance(target, ast.Name) and target.id in FIELDS and value is not None:
            found[target.id] = _value(module, value)
    return found


@cache
def attack_catalog() -> tuple[AttackEntry, ...]:
    """Every attack of ``attacks.runner.ATTACKS``, in its order."""
    registry = next(
        node.value
        for node in _module("runner").body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "ATTACKS"
    )
    classes = next(n for n in ast.walk(registry) if isinstance(n, ast.Tuple)).elts
    entries = []
    for cls_name in (c.id for c in classes):
        module, cls = _where("runner", cls_name)
        fields = _attributes(module, cls)
        entries.append(
            AttackEntry(fields["name"], fields["exchange"], fields["algorithms"], ast.get_docstring(cls) or "")
        )
    return tuple(entries)
