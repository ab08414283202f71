"""Federated graph-learning algorithms, by name.

:data:`SPECS` maps a CLI name to its :class:`~.spec.AlgorithmSpec` (:mod:`.specs`): options,
checks, modes, catalogue text and the client logic / server strategy that run it.  Nothing here
imports torch: the halves are imported on use, so ``--help`` stays fast.
"""

from __future__ import annotations

from ..validation import match_choice
from .spec import AlgorithmSpec
from .specs import SPECS


def algorithm_name(name: str) -> str:
    """The registered spelling of ``name`` (case-insensitive), or a ConfigError with a suggestion."""
    return match_choice("--algorithm", name, tuple(SPECS))


def get_spec(name: str) -> AlgorithmSpec:
    """The spec of algorithm ``name`` (a ConfigError with a suggestion for an unknown name)."""
    return SPECS[algorithm_name(name)]


__all__ = [
    "SPECS",
    "AlgorithmSpec",
    "get_spec",
    "algorithm_name",
]
