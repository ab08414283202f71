"""What each algorithm is, for ``secure-fgl algorithms [NAME]`` (no torch import).

An algorithm missing here is still listed: its class docstring's first line stands in for
``summary``.  Presets (``secure_fgl/configs/*.toml``) name their algorithm and are found by it.
"""
from __future__ import annotations

from dataclasses import dataclass

from protocols.registry import graph_level_modes, modes, pairwise_modes


@dataclass(frozen=True)
class About:
    summary: str
    paper: str
    exchanges: str                      # what crosses the wire, by exchange tag
    modes: tuple[str, ...] = modes()
    task: str = "node"                  # node | graph classification


#: the graph-level algorithms do not run in ckks-mp yet
GRAPH_MODES = graph_level_modes()
GCFL_PAPER = "Xie, Ma, Liu & Yang, Federated Graph Classification over Non-IID Graphs, NeurIPS 2021"

ABOUT: dict[str, About] = {
    "fedavg": About("clients train a GNN on their own subgraph; the server averages the weights "
                    "(cross-client edges ignored)",
                    "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized "
                    "Data, AISTATS 2017",
                    "fedavg/model: weighted mean of model updates, every round"),
    "fedprox": About("FedAvg with a proximal term mu/2 ||w - w_global||^2 in the local loss",
                     "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020",
                     "fedprox/model: weighted mean of model updates, every round"),
    "local": About("each client trains alone on its subgraph; nothing is exchanged (lower reference)",
                   "-", "none"),
    "centralized": About("one model on the whole graph (upper reference); accuracy reported per client",
                         "Kipf & Welling, Semi-Supervised Classification with GCNs, ICLR 2017", "none"),
    "fedgcn": About("one pre-training exchange of neighbour-feature sums (0/1/2 hops), then FedAvg of a GCN",
                    "Yao, Jin, Ravi & Joe-Wong, FedGCN: Convergence-Communication Tradeoffs in Federated "
                    "Training of Graph Convolutional Networks, NeurIPS 2023",
                    "fedgcn/neighbour_sums: row sums [A~X, degree] once before training; fedgcn/model: "
                    "weighted mean of model updates, every round"),
    "fedomd": About("orthogonal GCN layers and a central-moment (CMD) loss against pooled hidden statistics",
                    "Federated Graph Learning with Center Moment Constraints for Node Classification (FedOMD)",
                    "fedomd/hidden<l>/mean and /moments: pooled mean and central moments of hidden "
                    "features, every round; fedomd/model: weighted mean of model updates"),
    "fedspray": About("personalized GNNs distilled from a global feature-structure encoder with class-wise "
                      "structure proxies",
                      "Fu, Chen, Ding & Li, Federated Graph Learning with Structure Proxy Alignment, KDD 2024",
                      "fedspray/encoder: weighted mean of encoder updates; fedspray/proxies: class-wise "
                      "weighted mean of structure proxies (weights stay secret), every round (one upload per client: "
                      "fedspray/batch, without DP)"),
    "gc-selftrain": About("graph classification: each client trains its GIN alone on its graphs; nothing is "
                          "exchanged (GCFL's self-train baseline)", GCFL_PAPER, "none", GRAPH_MODES, task="graph"),
    "gc-fedavg": About("graph classification: FedAvg of the shared GIN layers; input and classifier layers "
                       "stay local (GCFL's FedAvg baseline)", GCFL_PAPER,
                       "gc-fedavg/model: weighted mean of shared-layer updates, every round", GRAPH_MODES,
                       task="graph"),
    "gc-fedprox": About("graph classification: gc-fedavg with a proximal term on the shared GIN layers "
                        "(GCFL's FedProx baseline)", GCFL_PAPER,
                        "gc-fedprox/model: weighted mean of shared-layer updates, every round", GRAPH_MODES,
                        task="graph"),
    "gcfl": About("graph classification: clients are split into clusters (Stoer-Wagner on the cosine "
                  "similarity of their updates) when the cluster's mean update is small and one is large; "
                  "shared GIN layers averaged per cluster", GCFL_PAPER,
                  "gcfl/model: weighted mean of shared-layer updates per cluster, every round "
                  "(--mean-norm unweighted: also gcfl/criterion_mean, their unweighted mean); "
                  "gcfl/mean_norm and gcfl/update_norms: norms reported in clear (one report: gcfl/norms); "
                  "gcfl/similarity: pairwise "
                  "cosine matrix of updates (ckks: decrypted by the --decider client), at a split",
                  modes=pairwise_modes(), task="graph"),
    "gcflplus": About("graph classification: GCFL whose split compares sequences of gradient norms by DTW "
                      "(no inner products of updates)", GCFL_PAPER,
                      "gcflplus/model: weighted mean of shared-layer updates per cluster, every round "
                      "(--mean-norm unweighted: also gcflplus/criterion_mean); "
                      "gcflplus/grad_norms, gcflplus/mean_norm and gcflplus/update_norms: norms reported in "
                      "clear (one report: gcflplus/norms), every round", GRAPH_MODES, task="graph"),
    "fgssl": About("node-level semantic contrast with the received global model (FNSC) and neighbour-"
                   "similarity distillation (FGSD) in each client's loss; FedAvg server",
                   "Huang, Ye, Wang, Du & Ye, Federated Graph Semantic and Structural Learning, IJCAI 2023",
                   "fgssl/model: weighted mean of model updates, every round"),
    "fedgcn-gap": About("edge-level DP FedGCN by aggregation perturbation: an edge-free encoder, noisy "
                        "row-normalised neighbour sums of its embeddings, an MLP head (no exact edge enters "
                        "a model)",
                        "Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, GAP: Differentially Private Graph "
                        "Neural Networks with Aggregation Perturbation, USENIX Security 2023",
                        "fedgcn-gap/encoder: weighted mean of encoder updates; fedgcn-gap/hop/<h>: noisy "
                        "row sums of embeddings, once per hop; fedgcn-gap/model: weighted mean of head updates"),
}
