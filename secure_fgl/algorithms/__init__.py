"""Federated graph-learning algorithms, by name.

:data:`SPECS` maps a CLI name to its :class:`~.spec.AlgorithmSpec` (:mod:`.specs`): options,
checks, modes, catalogue text and the client logic / server strategy that run it.  Nothing here
imports torch: the halves are imported on use, so ``--help`` stays fast.
"""

from __future__ import annotations

from ..validation import match_choice
from .spec import AlgorithmSpec, load
from .specs import SPECS


def algorithm_name(name: str) -> str:
    """The registered spelling of ``name`` (case-insensitive), or a ConfigError with a suggestion."""
    return match_choice("--algorithm", name, tuple(SPECS))


def get_spec(name: str) -> AlgorithmSpec:
    """The spec of algorithm ``name`` (a ConfigError with a suggestion for an unknown name)."""
    return SPECS[algorithm_name(name)]


def get_algorithm(name: str):
    """The in-process class behind ``--executor inline``."""
    return load(get_spec(name).inline)


def __getattr__(name: str):
    """``FederatedAlgorithm`` and ``ModelAveraging`` load torch, so only on first use."""
    if name in ("FederatedAlgorithm", "ModelAveraging"):
        from . import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = [
    "SPECS",
    "AlgorithmSpec",
    "get_spec",
    "get_algorithm",
    "algorithm_name",
    "FederatedAlgorithm",
    "ModelAveraging",
]
