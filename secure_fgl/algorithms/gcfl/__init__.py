"""GCFL and GCFL+ (Xie, Ma, Liu & Yang, NeurIPS 2021): clustered federated graph classification.

GCFL splits a cluster (Stoer-Wagner on the cosine similarity of the updates) when its mean update
is small and one is large; GCFL+ compares sequences of gradient norms by DTW instead.

* :mod:`.ops`: the clustering decisions (eq. 4-5, the split, DTW) the server makes;
* :mod:`.client`: :class:`~.client.GCFLLogic`; :mod:`.server`: :class:`~.server.GCFLStrategy`,
  :class:`~.server.GCFLPlusStrategy`.
"""

from __future__ import annotations

from protocols.registry import graph_level_modes, similarity_modes

from ..graph_level import GCFL_PAPER, cluster_broadcast
from ..options import GCFLOptions, GCFLPlusOptions
from ..spec import AlgorithmSpec, every_round


def schedule(cfg) -> dict[str, tuple[int, int]]:
    """Every round: the cluster means, the norm report and (GCFL) the update similarity at a split."""
    name = cfg.algorithm
    opts = (GCFLOptions if name == "gcfl" else GCFLPlusOptions)(**cfg.options)
    tags = [f"{name}/model", f"{name}/norms"]
    tags += [f"{name}/criterion_mean"] if opts.mean_norm == "unweighted" else []
    tags += [f"{name}/similarity"] if name == "gcfl" else []
    return every_round(cfg, *tags)


SPECS = [
    AlgorithmSpec(
        "gcfl",
        "graph classification: clients are split into clusters (Stoer-Wagner on the cosine "
        "similarity of their updates) when the cluster's mean update is small and one is large; "
        "shared GIN layers averaged per cluster",
        GCFL_PAPER,
        "gcfl/model: weighted mean of shared-layer updates per cluster, every round "
        "(--mean-norm unweighted: also gcfl/criterion_mean, their unweighted mean); "
        "gcfl/mean_norm and gcfl/update_norms: norms reported in clear (one report: gcfl/norms); "
        "gcfl/similarity: cosine "
        "similarity matrix of updates (ckks: decrypted by the --decider client), at a split",
        options=GCFLOptions,
        logic=f"{__name__}.client:GCFLLogic",
        strategy=f"{__name__}.server:GCFLStrategy",
        schedule=schedule,
        broadcasts=cluster_broadcast,
        modes=similarity_modes(),
        task="graph",
        mode_note="needs inner products of client updates, which --mode {mode} cannot compute: use --mode "
        "ckks (or plain)",
    ),
    AlgorithmSpec(
        "gcflplus",
        "graph classification: GCFL whose split compares sequences of gradient norms by DTW "
        "(no inner products of updates)",
        GCFL_PAPER,
        "gcflplus/model: weighted mean of shared-layer updates per cluster, every round "
        "(--mean-norm unweighted: also gcflplus/criterion_mean); "
        "gcflplus/grad_norms, gcflplus/mean_norm and gcflplus/update_norms: norms reported in "
        "clear (one report: gcflplus/norms), every round",
        options=GCFLPlusOptions,
        logic=f"{__name__}.client:GCFLLogic",
        strategy=f"{__name__}.server:GCFLPlusStrategy",
        schedule=schedule,
        broadcasts=cluster_broadcast,
        modes=graph_level_modes(),
        task="graph",
    ),
]
