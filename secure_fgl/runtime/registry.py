"""Which algorithms run as client runtimes: name -> (client logic, server strategy).

Each entry names the two halves of an algorithm as ``"module:Class"`` (imported on use, so a
client process imports only its logic).  An algorithm missing here runs with
``--executor inline`` only.  To convert one, write its :class:`~.logic.ClientLogic` and
:class:`~.strategy.Strategy` (one module per algorithm, like :mod:`.fedgcn`) and add one line.
"""
from __future__ import annotations

import importlib

RUNTIMES: dict[str, tuple[str, str]] = {
    "fedavg": ("secure_fgl.runtime.logic:ModelAveragingLogic", "secure_fgl.runtime.strategy:ModelAveragingStrategy"),
    "fedprox": ("secure_fgl.runtime.logic:ModelAveragingLogic", "secure_fgl.runtime.strategy:ModelAveragingStrategy"),
    "local": ("secure_fgl.runtime.logic:ModelAveragingLogic", "secure_fgl.runtime.strategy:ModelAveragingStrategy"),
    "fedgcn": ("secure_fgl.runtime.fedgcn:FedGCNLogic", "secure_fgl.runtime.fedgcn:FedGCNStrategy"),
    "fgssl": ("secure_fgl.runtime.fgssl:FGSSLLogic", "secure_fgl.runtime.strategy:ModelAveragingStrategy"),
    "fedgcn-gap": ("secure_fgl.runtime.gap:GAPLogic", "secure_fgl.runtime.gap:GAPStrategy"),
    "centralized": ("secure_fgl.runtime.centralized:CentralizedLogic",
                    "secure_fgl.runtime.centralized:CentralizedStrategy"),
    "fedomd": ("secure_fgl.runtime.fedomd:FedOMDLogic", "secure_fgl.runtime.fedomd:FedOMDStrategy"),
    "fedspray": ("secure_fgl.runtime.fedspray:FedSprayLogic", "secure_fgl.runtime.fedspray:FedSprayStrategy"),
    "gc-selftrain": ("secure_fgl.runtime.graph_level:GraphLogic", "secure_fgl.runtime.graph_level:GraphStrategy"),
    "gc-fedavg": ("secure_fgl.runtime.graph_level:GraphLogic", "secure_fgl.runtime.graph_level:GraphStrategy"),
    "gc-fedprox": ("secure_fgl.runtime.graph_level:GraphLogic", "secure_fgl.runtime.graph_level:GraphStrategy"),
    "gcfl": ("secure_fgl.runtime.gcfl:GCFLLogic", "secure_fgl.runtime.gcfl:GCFLStrategy"),
    "gcflplus": ("secure_fgl.runtime.gcfl:GCFLLogic", "secure_fgl.runtime.gcfl:GCFLPlusStrategy"),
}


def converted() -> tuple[str, ...]:
    """The algorithms that run on ``--executor local|ray``."""
    return tuple(RUNTIMES)


def _load(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def logic_class(algorithm: str):
    if algorithm not in RUNTIMES:
        raise ValueError(f"algorithm {algorithm!r} has no client logic for the runtime "
                         f"(converted: {', '.join(RUNTIMES)})")
    return _load(RUNTIMES[algorithm][0])


def strategy_class(algorithm: str):
    if algorithm not in RUNTIMES:
        raise ValueError(f"algorithm {algorithm!r} has no server strategy for the runtime "
                         f"(converted: {', '.join(RUNTIMES)})")
    return _load(RUNTIMES[algorithm][1])
