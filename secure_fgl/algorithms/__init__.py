"""Federated graph-learning algorithms, by name.

``ALGORITHMS`` maps a CLI name to ``"module:Class"``; classes are imported on use so
that an algorithm's dependencies load only when it runs.
"""
from __future__ import annotations

import importlib

from .base import FederatedAlgorithm, ModelAveraging

ALGORITHMS: dict[str, str] = {
    "fedavg": "fedavg:FedAvg",
    "fedprox": "fedavg:FedProx",
    "local": "local:Local",
    "centralized": "centralized:Centralized",
    "fedgcn": "fedgcn:FedGCN",
    "fedgcn-gap": "gap:FedGCNGAP",
    "fedomd": "fedomd:FedOMD",
    "fedspray": "fedspray:FedSpray",
}


def get_algorithm(name: str) -> type[FederatedAlgorithm]:
    from ..config import ConfigError
    key = name.lower()
    if key not in ALGORITHMS:
        raise ConfigError(f"unknown --algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    module, cls = ALGORITHMS[key].split(":")
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{module}":
            raise ConfigError(f"algorithm {name!r} is not available in this build") from None
        raise
    return getattr(mod, cls)


__all__ = ["ALGORITHMS", "get_algorithm", "FederatedAlgorithm", "ModelAveraging"]
