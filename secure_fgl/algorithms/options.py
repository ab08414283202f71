"""Each algorithm's own settings, described for ``--help`` and checked before any work.

Kept apart from the algorithms (no torch import) so that ``secure-fgl --help`` is fast.
An algorithm names its Options class (and its cross-field check, if any) in its
:class:`~secure_fgl.algorithms.spec.AlgorithmSpec`; every field is a
:func:`~secure_fgl.validation.setting` with its help line, unit, choices and range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..privacy import dp_config, resolve_unit
from ..validation import ConfigError, setting

#: FedGCN's choices: pre-training hops, row-sum layouts, sparse row numberings, first-layer normalisations
HOPS = (0, 1, 2)
LAYOUTS = ("sparse", "dense")
ROW_ORDERS = ("given", "signature", "owner")
NORMS = ("row", "sym", "none")
#: GAP's default out-degree bound under node-level DP (each node's embedding enters at most this many sums)
NODE_MAX_DEGREE = 10
#: the DP-SGD steps' default learning rate, node- and sample-level (plain SGD on the noisy mean of per-node gradients
#: clipped to --dp-clip; chosen on Cora's, PubMed's and the built-in graph's validation nodes)
DPSGD_LR = 5.0


@dataclass
class NoOptions:
    """This algorithm has no settings of its own."""


@dataclass
class FedProxOptions:
    """FedProx (Li et al., MLSys 2020) settings."""

    mu: float = setting(0.01, min=0, help="proximal term weight mu (FedProx eq. 2)")


@dataclass
class FedGCNOptions:
    """FedGCN (Yao et al. 2023) pre-training exchange settings."""

    hops: int = setting(
        1,
        choices=(0, 1, 2),
        unit="hops",
        help="neighbour sums exchanged before training: 0 none (= FedAvg), 1 own rows, 2 also cross-edge endpoints",
    )
    layout: str = setting(
        "sparse",
        choices=("sparse", "dense"),
        help="encrypted row-sum layout: sparse (blocks a client touches) or dense (every block)",
    )
    row_order: str = setting(
        "given",
        choices=("given", "signature", "owner"),
        help="sparse row numbering: given (dataset ids), signature (fewer blocks; publishes "
        "a histogram) or owner (no block mixes recipients; see the fedgcn module doc)",
    )
    degree_cap: int = setting(
        254, min=1, unit="edges", help="public degree bound; 254 makes sums fit an 8-bit packed field"
    )
    dp_row_clip: float | None = setting(
        None,
        min=0,
        min_exclusive=True,
        unit="L2 norm",
        help="C, L2 bound of a node's term [x, 1] under DP (default: --dp-clip)",
    )
    norm: str = setting(
        "row",
        choices=("row", "sym", "none"),
        help="first-layer normalisation: row D^-1(A+I)X, sym D^-1/2(A+I)D^-1/2 X, none (A+I)X",
    )
    feature_bound: float = setting(
        10.0,
        min=0,
        min_exclusive=True,
        help="public bound on |x| for non-binary features (integer ones, e.g. counts: exact "
        "integer fields sized by its floor; others: the float encoding)",
    )
    center: bool = setting(
        False,
        help="the model sees its first-layer input minus the client's own mean (dense "
        "bag-of-words graphs such as Amazon Photo; see the fedgcn module doc)",
    )


def check_fedgcn(o: FedGCNOptions, cfg) -> None:
    """FedGCN's cross-field rules (and its choices, for options built in code)."""
    if o.hops not in HOPS:
        raise ConfigError(f"--hops must be 0, 1 or 2, got {o.hops}")
    if o.layout not in LAYOUTS:
        raise ConfigError(f"--layout must be 'sparse' or 'dense', got {o.layout!r}")
    if o.row_order not in ROW_ORDERS:
        raise ConfigError(f"--row-order must be one of {', '.join(ROW_ORDERS)}, got {o.row_order!r}")
    if o.row_order != "given" and o.layout != "sparse":
        raise ConfigError(
            f"--row-order {o.row_order} numbers rows for the sparse layout (the dense layout "
            "uploads every block anyway); use --layout sparse or --row-order given"
        )
    if o.norm not in NORMS:
        raise ConfigError(f"--norm must be one of {', '.join(NORMS)}, got {o.norm!r}")
    if o.degree_cap < 1:
        raise ConfigError(f"--degree-cap must be >= 1, got {o.degree_cap}")
    if o.dp_row_clip is not None:
        try:
            o.dp_row_clip = float(o.dp_row_clip)
        except (TypeError, ValueError):
            raise ConfigError(f"--dp-row-clip must be a number, got {o.dp_row_clip!r}") from None
    if not o.feature_bound > 0:
        raise ConfigError(f"--feature-bound must be > 0, got {o.feature_bound}")
    if o.hops > 0 and cfg.model.lower() != "gcn":
        raise ConfigError(
            f"FedGCN with --hops {o.hops} trains a GCN; use --model gcn "
            f"(or --hops 0 for FedAvg with --model {cfg.model})"
        )
    if o.hops > 0 and cfg.num_layers < 1:
        raise ConfigError(f"--num-layers must be >= 1, got {cfg.num_layers}")
    if cfg.dp_epsilon is not None:  # the DP settings FedGCN cannot run with, before any data is loaded
        dp_config(cfg)


@dataclass
class FedOMDOptions:
    """FedOMD settings (defaults: FedOMD sec. 4.5 / 5.1; readings in the fedomd module doc)."""

    ortho_weight: float = setting(0.0005, min=0, help="alpha, weight of the orthogonality loss (eq. 12)")
    cmd_weight: float = setting(10.0, min=0, help="beta, weight of the CMD loss (eq. 12; 0: no statistics exchange)")
    ortho_layers: int = setting(1, min=1, unit="layers", help="OrthoConv hidden layers (Table 1)")
    orthogonal: bool = setting(True, help="false: plain GCNConv hidden layers and no L_ortho (Table 6)")
    newton_steps: int = setting(
        5, min=0, unit="iterations", help="ONI Newton iterations; 0 = W / ||W||_F (eq. 8 literally)"
    )
    ortho_propagate: bool = setting(True, help="OrthoConv propagates with S~ (false: eq. 8 literally)")
    cmd_order: int = setting(5, min=1, help="highest central moment order J (Algorithm 1: 5)")
    act_low: float = setting(0.0, help="a, lower activation bound of eq. 11")
    act_high: float = setting(1.0, help="b, upper activation bound of eq. 11")
    stats_nodes: str = setting(
        "all", choices=("all", "train", "train_vs_all"), help="node set of the exchanged statistics"
    )
    stats_pass: str = setting(
        "eval", choices=("eval", "train"), help="statistics from dropout-free (eval) or training passes"
    )
    dp_rows: int = setting(1, min=1, unit="rows", help="DP unit: hidden rows it can change (1: one row; N: a client)")
    batch_stats: bool = setting(
        True,
        help="all hidden layers' statistics in two uploads per client per round "
        "(protocols.batch; not with DP); false: two per layer",
    )
    raw_moments: bool = setting(
        False,
        help="with batch_stats: one upload per round (raw moments, central ones "
        "by binomial expansion; error up to 2^J x the two-stage one)",
    )


@dataclass
class FedSprayOptions:
    """FedSpray settings (defaults: Fu et al. 2024, sec. 5.1.3)."""

    backbone: str = setting("gcn", choices=("gcn", "sgc", "sage"), help="personalized GNN")
    gnn_hidden: int = setting(64, min=1, unit="units", help="hidden size of the 2-layer GNN")
    gnn_dropout: float = setting(
        0.0, min=0, max=0.99, unit="probability", help="GNN dropout (not used in the paper / reference code)"
    )
    proxy_dim: int = setting(64, min=1, unit="units", help="d_s, proxy size, also the embedding size of g_e")
    model_lr: float = setting(0.003, min=0, min_exclusive=True, help="Adam lr of the GNN and of the encoder")
    proxy_lr: float = setting(0.02, min=0, min_exclusive=True, help="Adam lr of the structure proxies")
    lambda1: float = setting(5.0, min=0, help="KD weight in the GNN loss (eq. 7)")
    lambda2: float = setting(1.0, min=0, help="KD weight in the encoder loss (eq. 11)")
    phase_epochs: int = setting(5, min=1, unit="epochs", help="E: epochs of each of the two local phases")
    kd_threshold: float = setting(
        0.0,
        min=0,
        max=1,
        unit="probability",
        help="unlabelled nodes enter eq. 6 only if max q > this (reference code: 0.7)",
    )
    proxy_weighting: str = setting(
        "ratio", choices=("ratio", "count"), help="eq. 15 weights: class ratio (paper) or class count"
    )
    ablate_proxy: bool = setting(False, help="Table 3 ablation: S = 0")
    batch_exchanges: bool = setting(
        True,
        help="encoder and proxies in one upload per client per round (protocols.batch; not with DP, nor where "
        "--update-bound puts the encoder mean on another grid than the proxies, e.g. 1 on the model grid)",
    )


@dataclass
class GraphOptions:
    """Graph-classification baselines' settings (GCFL, Xie et al. NeurIPS 2021, sec. 6.1)."""

    batch_size: int = setting(128, min=1, unit="graphs", help="graphs per mini-batch of local training")
    dpsgd: bool = setting(
        False,
        help="train by per-graph DP-SGD (a training graph is a record; clip --dp-clip, "
        "budget --dp-epsilon; secure_fgl/dpsgd.py)",
    )


@dataclass
class GraphProxOptions(GraphOptions):
    """gc-fedprox: FedProx on the shared GIN layers only (GCFL sec. 6.1)."""

    mu: float = setting(0.01, min=0, help="proximal weight mu on the shared GIN layers (FedProx eq. 2)")


@dataclass
class GCFLOptions(GraphOptions):
    """GCFL cluster-split thresholds (Xie et al. NeurIPS 2021, eq. 4-5; reference defaults)."""

    eps1: float = setting(
        0.05, min=0, help="split a cluster when the norm of its weighted mean update is below eps1 (eq. 4) ..."
    )
    eps2: float = setting(0.1, min=0, help="... and the largest member update norm is above eps2 (eq. 5)")
    decider: int = setting(
        0, min=0, unit="client", help="ckks: the client that holds the similarity key and decrypts the matrix"
    )
    mean_norm: str = setting(
        "weighted",
        choices=("weighted", "unweighted"),
        help="eq. 4's delta_mean: the norm of the |G_i|-weighted mean update (the paper) or "
        "of the unweighted mean (the authors' server.compute_mean_update_norm; one more "
        "secure mean per cluster and round)",
    )


@dataclass
class GCFLPlusOptions(GCFLOptions):
    """GCFL+: DTW over gradient-norm sequences (paper sec. 5)."""

    seq_length: int = setting(5, min=1, unit="rounds", help="gradient norms per client compared by DTW")
    standardize: bool = setting(False, help="divide each gradient-norm sequence by its std before DTW")


@dataclass
class CentralizedOptions:
    """Centralized (one model on the whole graph) settings."""

    center: bool = setting(False, help="subtract the mean of every node's features (as FedGCN's --center)")


@dataclass
class FGSSLOptions:
    """FGSSL settings.

    Huang et al., IJCAI 2023; the paper states no lambdas: ours are the best of a grid on Cora's validation split,
    see docs/fgssl.md.
    """

    lambda_c: float = setting(
        0.5, min=0, help="weight of FNSC (eq. 12); released-code variant: of the local InfoNCE (the code uses 3)"
    )
    lambda_d: float = setting(0.5, min=0, help="weight of FGSD (eq. 12)")
    tau: float = setting(0.1, min=0, min_exclusive=True, help="contrast temperature (eq. 7)")
    omega: float = setting(5.0, min=0, min_exclusive=True, help="distillation temperature (eq. 9-10)")
    weak_edge_drop: float = setting(0.3, min=0, max=1, unit="probability", help="weak view: edge removing")
    weak_feature_mask: float = setting(0.3, min=0, max=1, unit="probability", help="weak view: feature masking")
    strong_edge_drop: float = setting(0.8, min=0, max=1, unit="probability", help="strong view: edge removing")
    strong_feature_mask: float = setting(0.5, min=0, max=1, unit="probability", help="strong view: feature masking")
    variant: str = setting(
        "paper",
        choices=("paper", "released-code"),
        help="objective: the paper's eq. 12 or the released code's CE + lambda_c * InfoNCE",
    )


@dataclass
class GAPOptions:
    """FedGCN-GAP settings (Sajadmanesh et al., USENIX Security 2023; GAP's defaults: 16-dim embeddings, 2 hops).

    The encoder is the run's feature-only MLP (``--hidden``, ``--num-layers``):
    the embeddings are its last hidden layer (``--hidden`` wide).
    """

    hops: int = setting(2, min=1, unit="hops", help="noisy aggregation hops (each a separate DP release)")
    encoder_rounds: int | None = setting(
        None, min=1, unit="rounds", help="FedAvg rounds of the encoder (default: --rounds)"
    )
    encoder_mu: float = setting(
        0.0,
        min=0,
        unit="weight",
        help="FedProx proximal term (mu/2) ||w - w_global||^2 on the encoder's local training "
        "(Li et al., MLSys 2020, eq. 2; for skewed clients); 0: FedAvg",
    )
    head_local_epochs: int | None = setting(
        None,
        min=1,
        unit="epochs",
        help="local epochs of each head round (default: --local-epochs); with --rounds R the head "
        "is checked on validation R times",
    )
    center_embeddings: bool = setting(
        False,
        help="subtract the mean of the row-normalised embeddings over all nodes of the graph (a secure "
        "weighted mean of the clients' own means: features only, no edge-level budget) and "
        "row-normalise again before the noisy hops; edge level only",
    )
    layout: str = setting("sparse", choices=("sparse", "dense"), help="row-sum layout of the hop exchanges")
    degree_cap: int = setting(254, min=1, unit="edges", help="public degree bound (bounds the sums' values)")
    select: str = setting(
        "val",
        choices=("val", "head"),
        help="head or encoder by the federation's validation accuracy (val), or always the head",
    )
    dpsgd: bool = setting(
        False,
        help="train the encoder and the head by DP-SGD (a training node is a record; "
        "clip --dp-clip; shares --dp-epsilon with the hops; plain SGD at --dpsgd-lr); in ckks/mask with "
        "--local-epochs 1 each step's noise is split over the clients inside the secure model mean",
    )
    dp_sample_rate: float = setting(
        1.0,
        min=0,
        max=1,
        min_exclusive=True,
        unit="probability",
        help="--dpsgd with Poisson sampling: each step trains on every training node with this "
        "probability, drawn secretly by its client (amplified accounting, Renyi DP); 1: full batch",
    )
    max_degree: int | None = setting(
        None,
        min=1,
        unit="edges",
        help="bound each node's out-degree by sampling: its embedding enters at most this many "
        "neighbours' hop sums, chosen by its owner (default under --dp-unit node: "
        f"{NODE_MAX_DEGREE}; off otherwise)",
    )

    dpsgd_lr: float | None = setting(
        None,
        min=0,
        min_exclusive=True,
        help="--dpsgd: learning rate of the DP-SGD steps, plain SGD on the noisy mean of gradients "
        "clipped to --dp-clip, whatever --optimizer and --lr say (a step moves at most lr x --dp-clip "
        f"before noise; default {DPSGD_LR:g})",
    )

    def dpsgd_settings(self, cfg):
        """The run's settings as its DP-SGD steps use them: plain SGD at ``--dpsgd-lr`` (default ``DPSGD_LR``).

        ``cfg`` itself without ``--dpsgd``.
        """
        if not self.dpsgd:
            return cfg
        lr = DPSGD_LR if self.dpsgd_lr is None else self.dpsgd_lr
        return dataclasses.replace(cfg, optimizer="sgd", lr=float(lr), momentum=0.0)

    def degree_bound(self, cfg) -> int | None:
        """The out-degree bound D in force: ``--max-degree``, else the default under ``--dp-unit node``."""
        if self.max_degree is not None:
            return self.max_degree
        return NODE_MAX_DEGREE if cfg.dp_unit == "node" else None


def check_gap(o: GAPOptions, cfg) -> None:
    """GAP's cross-field rules that need no data (the rest: ``gap.ops.check_gap_options``)."""
    if o.encoder_mu > 0 and o.dpsgd:
        raise ConfigError("--encoder-mu adds FedProx's term to the encoder's plain training: drop it with --dpsgd")
    if o.center_embeddings and (o.dpsgd or (cfg.dp_epsilon is not None and resolve_unit(cfg) != "edge")):
        raise ConfigError(
            "--center-embeddings releases the mean embedding of all nodes exactly (it reads node features): "
            "edge-level DP only; drop it with --dpsgd or --dp-unit node|client|sample"
        )
    if o.dpsgd_lr is not None and not o.dpsgd:
        raise ConfigError("--dpsgd-lr is the learning rate of DP-SGD's steps: add --dpsgd (or drop --dpsgd-lr)")
    if o.head_local_epochs is not None and o.dpsgd:
        raise ConfigError("--head-local-epochs sets the head's plain training: drop it with --dpsgd (--local-epochs)")
    if o.dp_sample_rate < 1 and not o.dpsgd:
        raise ConfigError("--dp-sample-rate samples DP-SGD's batches: add --dpsgd (or drop --dp-sample-rate)")
    if cfg.dp_unit == "node" and not o.dpsgd:
        raise ConfigError(
            f"{cfg.algorithm} --dp-unit node trains the encoder and the head by DP-SGD with per-node "
            "gradients: add --dpsgd"
        )
    if cfg.dp_unit == "node" and cfg.mode == "plain" and cfg.clients > 1:
        raise ConfigError(
            f"{cfg.algorithm} --dp-unit node needs the hop sums added securely: in --mode plain the server "
            "reads each client's partial sum of a node's row, which holds that node's incoming edges; use "
            "--mode mask|ckks|ckks-mp, or --algorithm gap (one party)"
        )
