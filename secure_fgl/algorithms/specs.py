"""Every algorithm's :class:`~.spec.AlgorithmSpec`, by ``--algorithm`` name (no torch import):
an algorithm package's ``__init__`` holds its specs (:mod:`.fedavg`, :mod:`.fedgcn`, ...), the rest are
listed here.

``secure-fgl algorithms [NAME]`` prints the catalogue text; presets (``secure_fgl/configs/*.toml``)
name their algorithm and are found by it.
"""
from __future__ import annotations

from protocols.registry import graph_level_modes, modes, pairwise_modes

from . import centralized, fedavg, fedgcn, fedomd, fedspray, fgssl, gap
from . import options as o
from .spec import AlgorithmSpec

#: the graph-level algorithms do not run in ckks-mp yet
GRAPH_MODES = graph_level_modes()
GCFL_PAPER = "Xie, Ma, Liu & Yang, Federated Graph Classification over Non-IID Graphs, NeurIPS 2021"
RT = "secure_fgl.runtime"
#: the graph-classification baselines' two halves
GRAPH = dict(logic=f"{RT}.graph_level:GraphLogic", strategy=f"{RT}.graph_level:GraphStrategy", modes=GRAPH_MODES,
             task="graph")
INLINE = "secure_fgl.algorithms"


def _spec(name: str, summary: str, paper: str, exchanges: str, **kw) -> AlgorithmSpec:
    return AlgorithmSpec(name, summary, paper, exchanges, **{"modes": modes(), **kw})


SPECS: dict[str, AlgorithmSpec] = {s.name: s for s in [
    *fedavg.SPECS,
    *centralized.SPECS,
    *fedgcn.SPECS,
    *fedomd.SPECS,
    *fedspray.SPECS,
    _spec("gc-selftrain", "graph classification: each client trains its GIN alone on its graphs; nothing is "
          "exchanged (GCFL's self-train baseline)", GCFL_PAPER, "none",
          options=o.GraphOptions, **GRAPH, inline=f"{INLINE}.graph_level:GraphSelfTrain"),
    _spec("gc-fedavg", "graph classification: FedAvg of the shared GIN layers; input and classifier layers "
          "stay local (GCFL's FedAvg baseline)", GCFL_PAPER,
          "gc-fedavg/model: weighted mean of shared-layer updates, every round",
          options=o.GraphOptions, **GRAPH, inline=f"{INLINE}.graph_level:GraphFedAvg"),
    _spec("gc-fedprox", "graph classification: gc-fedavg with a proximal term on the shared GIN layers "
          "(GCFL's FedProx baseline)", GCFL_PAPER,
          "gc-fedprox/model: weighted mean of shared-layer updates, every round",
          options=o.GraphProxOptions, **GRAPH, inline=f"{INLINE}.graph_level:GraphFedProx"),
    _spec("gcfl", "graph classification: clients are split into clusters (Stoer-Wagner on the cosine "
          "similarity of their updates) when the cluster's mean update is small and one is large; "
          "shared GIN layers averaged per cluster", GCFL_PAPER,
          "gcfl/model: weighted mean of shared-layer updates per cluster, every round "
          "(--mean-norm unweighted: also gcfl/criterion_mean, their unweighted mean); "
          "gcfl/mean_norm and gcfl/update_norms: norms reported in clear (one report: gcfl/norms); "
          "gcfl/similarity: pairwise "
          "cosine matrix of updates (ckks: decrypted by the --decider client), at a split",
          options=o.GCFLOptions, logic=f"{RT}.gcfl:GCFLLogic", strategy=f"{RT}.gcfl:GCFLStrategy",
          modes=pairwise_modes(), task="graph", inline=f"{INLINE}.gcfl:GCFL",
          mode_note="needs inner products of client updates, which --mode {mode} cannot compute: use --mode ckks "
                    "(or plain)"),
    _spec("gcflplus", "graph classification: GCFL whose split compares sequences of gradient norms by DTW "
          "(no inner products of updates)", GCFL_PAPER,
          "gcflplus/model: weighted mean of shared-layer updates per cluster, every round "
          "(--mean-norm unweighted: also gcflplus/criterion_mean); "
          "gcflplus/grad_norms, gcflplus/mean_norm and gcflplus/update_norms: norms reported in "
          "clear (one report: gcflplus/norms), every round",
          options=o.GCFLPlusOptions, logic=f"{RT}.gcfl:GCFLLogic", strategy=f"{RT}.gcfl:GCFLPlusStrategy",
          modes=GRAPH_MODES, task="graph", inline=f"{INLINE}.gcfl:GCFLPlus"),
    *fgssl.SPECS,
    *gap.SPECS,
]}
