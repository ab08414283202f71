"""Federated graph-learning algorithms, by name.

``ALGORITHMS`` maps a CLI name to ``"module:Class"``; classes are imported on use so
that an algorithm's dependencies load only when it runs.  ``OPTIONS`` maps a name to its
Options dataclass in a module without torch (``--help`` reads it; an algorithm missing here
has its class's ``Options`` read on use), and :mod:`.catalog` describes each for
``secure-fgl algorithms``.
"""
from __future__ import annotations

import importlib

ALGORITHMS: dict[str, str] = {
    "fedavg": "fedavg:FedAvg",
    "fedprox": "fedavg:FedProx",
    "local": "local:Local",
    "centralized": "centralized:Centralized",
    "fedgcn": "fedgcn:FedGCN",
    "fedgcn-gap": "gap:FedGCNGAP",
    "fedomd": "fedomd:FedOMD",
    "fedspray": "fedspray:FedSpray",
    "gc-selftrain": "graph_level:GraphSelfTrain",
    "gc-fedavg": "graph_level:GraphFedAvg",
    "gc-fedprox": "graph_level:GraphFedProx",
    "gcfl": "gcfl:GCFL",
    "gcflplus": "gcfl:GCFLPlus",
    "fgssl": "fgssl:FGSSL",
}

OPTIONS: dict[str, str] = {
    "fedavg": "options:NoOptions",
    "local": "options:NoOptions",
    "fedprox": "options:FedProxOptions",
    "fedgcn": "options:FedGCNOptions",
    "fedomd": "options:FedOMDOptions",
    "fedspray": "options:FedSprayOptions",
    "gc-selftrain": "options:GraphOptions",
    "gc-fedavg": "options:GraphOptions",
    "gc-fedprox": "options:GraphProxOptions",
    "gcfl": "options:GCFLOptions",
    "gcflplus": "options:GCFLPlusOptions",
    "centralized": "options:CentralizedOptions",
    "fgssl": "options:FGSSLOptions",
    "fedgcn-gap": "options:GAPOptions",
}


def _load(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def algorithm_name(name: str) -> str:
    """The registered spelling of ``name`` (case-insensitive), or a ConfigError with a suggestion."""
    from ..validation import match_choice
    return match_choice("--algorithm", name, tuple(ALGORITHMS))


def get_options_class(name: str) -> type:
    """The Options dataclass of algorithm ``name`` (from :data:`OPTIONS`, else its class)."""
    key = algorithm_name(name)
    return _load(OPTIONS[key]) if key in OPTIONS else get_algorithm(key).Options


def get_algorithm(name: str) -> type[FederatedAlgorithm]:
    from ..config import ConfigError
    key = algorithm_name(name)
    module, cls = ALGORITHMS[key].split(":")
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"{__name__}.{module}":
            raise ConfigError(f"algorithm {name!r} is not available in this build") from None
        raise
    return getattr(mod, cls)


def __getattr__(name: str):
    """``FederatedAlgorithm`` and ``ModelAveraging`` load torch, so only on first use."""
    if name in ("FederatedAlgorithm", "ModelAveraging"):
        from . import base
        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["ALGORITHMS", "OPTIONS", "get_algorithm", "get_options_class", "algorithm_name",
           "FederatedAlgorithm", "ModelAveraging"]
