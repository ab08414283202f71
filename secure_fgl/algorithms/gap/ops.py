r"""FedGCN-GAP: edge-level differentially private FedGCN by aggregation perturbation.

Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, *GAP: Differentially Private Graph Neural
Networks with Aggregation Perturbation*, USENIX Security 2023, sec. 4 (encoder, aggregation
and classification modules), run federated: the neighbour sums go through FedGCN's
``row_sum`` exchange (Yao et al., NeurIPS 2023) instead of a central server's graph.

Three stages, the only edge-dependent values being noisy sums:

1. **Encoder** (edge-free).  FedAvg (tag ``fedgcn-gap/encoder/model``) trains the run's
   feature-only MLP ``logits = W_L relu(... relu(W_1 x))`` (``--hidden``, ``--num-layers``; the
   same model, initialisation and training as ``--algorithm fedavg --model mlp``) on each
   client's features and labels; the weights of its best round by the federation's validation
   accuracy are kept.  ``E(x)`` is its last hidden layer.  No edge enters, so under edge-level
   DP it costs no budget.
2. **Aggregation** (the private part).  ``H_0 = E(x) / ||E(x)||`` (row-normalised: every row
   has norm 1).  For hop ``h = 1..K``, client ``k`` contributes for every node ``v`` it knows
   ``P^{(k)}_v = sum_{j in V_k} Ã_vj H_{h-1, j}`` (:func:`~secure_fgl.algorithms.fedgcn.ops.partial_neighbour_sums`,
   ``Ã = A + I``), the protocol adds them with edge-level Gaussian noise
   (tag ``fedgcn-gap/hop/h``, one release each, composed by the run's accountant):

   .. math::  \tilde S_{h,v} = \sum_{j} Ã_{vj} H_{h-1,j} + N(0, \sigma_h^2 I),
              \qquad H_{h,v} = \tilde S_{h,v} / \|\tilde S_{h,v}\|

   Adding or removing one edge ``{u, v}`` changes row ``u`` by ``H_{h-1,v}`` and row ``v`` by
   ``H_{h-1,u}``, both of norm 1: L2 sensitivity ``sqrt(2)``
   (:func:`protocols.dp.edge_level_sensitivity` with C = 1).  ``H_{h-1}`` is itself a
   post-processing of the earlier noisy hops, so the composition is adaptive Gaussian.
3. **Head** (edge-free given the noisy sums).  FedAvg (tag ``fedgcn-gap/model``) trains an
   MLP on ``[H_0, H_1, ..., H_K]`` -- post-processing of the DP sums and of edge-free data.

Model selection (``select='val'``, post-processing): at every evaluation the federation uses
the head or the encoder, whichever has the higher validation accuracy over all clients' validation
nodes -- the same aggregate the run already uses to pick its best round.  At small epsilon
the noisy hops carry little signal and the encoder, i.e. the feature-only MLP, is kept, so the
pipeline does not fall below it by more than the noise of that choice.

What it protects: edge-level DP (one edge added or removed anywhere in the federated
graph) for everything the clients release, with the reported ``(epsilon, delta)``.  No exact
edge reaches a model: no GCN layer over local edges, no denoising with own edges.  It does
*not* protect a node's features or labels (the encoder and head exchanges are exact, unless
``dpsgd`` is on, see :mod:`secure_fgl.dpsgd`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from protocols import BoundError, DPRequest, ValueSpec
from protocols.dp import edge_level_sensitivity

from ...config import ConfigError
from ...dpsgd import EngineDPSGD
from ...models import build_model
from ..base import ModelAveraging
from ..fedgcn.ops import local_degrees, partial_neighbour_sums
from ..options import GAPOptions

HOP_TAG = "fedgcn-gap/hop"
#: the encoder's FedAvg exchange
ENCODER_TAG = "fedgcn-gap/encoder/model"
#: server -> client control: "keep your current encoder, the best so far"
BEST_TAG = "fedgcn-gap/encoder/best"
SELECT = ("val", "head")


def release_dependencies_of(name: str) -> dict[str, set[str]]:
    """The data each release touches (:mod:`secure_fgl.privacy`): the hop sums read embeddings over
    edges; the encoder and head touch no exact edge."""
    return {
        HOP_TAG: {"features", "labels", "edges"},
        ENCODER_TAG: {"features", "labels"},  # gap (central) runs fedgcn-gap's exchanges under its own name
        f"{name}/encoder": {"features", "labels"},
        f"{name}/model": {"features", "labels"},
        f"{name}/dpsgd": {"features", "labels"},
    }


def hop_dp_request(dp) -> DPRequest | None:
    """A hop sum's edge-level DP request (rows of unit norm: an edge changes one term by at most 1);
    None without DP (``dp``: the protocol's engine)."""
    return (
        None
        if dp is None
        else DPRequest(clip=float("inf"), per_row=True, sensitivity=edge_level_sensitivity(1.0), releases=1)
    )


def row_normalise(h: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit L2 norm (a zero row stays zero)."""
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-12)


def check_degree_cap(c, cap: int, client: int) -> None:
    """The owner's check of its own nodes' degrees against the public cap (bounds the sums)."""
    deg = local_degrees(c) - 1
    if c.num_nodes and int(deg.max()) > cap:
        raise BoundError(
            f"a node has degree {int(deg.max())} above --degree-cap {cap}; raise --degree-cap (a public bound)",
            tag=HOP_TAG,
            round=0,
            client=client,
        )


def hop_spec(opts: GAPOptions) -> ValueSpec:
    """Public bounds of a hop sum: at most ``cap + 1`` unit-norm rows per total."""
    return ValueSpec(max_abs=float(opts.degree_cap + 1))


def check_gap_options(opts: GAPOptions, cfg) -> None:
    """ConfigError naming the first setting fedgcn-gap cannot run with."""
    if opts.hops < 1:
        raise ConfigError(f"fedgcn-gap needs --hops >= 1 noisy aggregation hops, got {opts.hops}")
    if opts.select not in SELECT:
        raise ConfigError(f"--select must be one of {', '.join(SELECT)}, got {opts.select!r}")
    if opts.degree_cap < 1:
        raise ConfigError("--degree-cap must be >= 1")
    if cfg.num_layers < 2:
        raise ConfigError("fedgcn-gap embeds nodes with the encoder MLP's last hidden layer: --num-layers >= 2")


class _EncoderTraining(ModelAveraging):
    """Stage 1: FedAvg of the encoder on features and labels (no edges)."""

    name = "fedgcn-gap/encoder"

    def __init__(self, parent: FedGCNGAP):
        self.parent = parent
        super().__init__(parent.fed, parent.protocol, parent.cfg, parent.device, parent.opts)

    def build_model(self) -> nn.Module:
        """The feature-only MLP of ``--algorithm fedavg --model mlp`` (same shape, seed and init)."""
        cfg, f = self.cfg, self.parent.fed
        return build_model(
            "mlp", f.num_features, cfg.hidden, f.num_classes, num_layers=cfg.num_layers, dropout=cfg.dropout
        )

    def client_inputs(self, k: int):
        return self.clients[k].x, self.parent.no_edges

    def model_dp_request(self, tag: str) -> DPRequest | None:
        return self.parent.model_dp_request(tag)

    def local_update(self, k: int) -> float:
        sgd = self.parent.dpsgd.get(self.name)
        return sgd.local_update(self, k) if sgd else super().local_update(k)


class FedGCNGAP(ModelAveraging):
    """Edge-level DP FedGCN by aggregation perturbation (module docstring)."""

    name = "fedgcn-gap"
    Options = GAPOptions
    #: a one-SGD-step round lets the secure model mean carry DP-SGD's noise
    #: (:func:`~secure_fgl.dpsgd.noise_contributors`)
    dpsgd_secure_mean = True

    def __init__(self, fed, protocol, cfg, device, options=None):
        opts = options if options is not None else GAPOptions()
        check_gap_options(opts, cfg)
        self.opts = opts
        super().__init__(fed, protocol, cfg, device, opts)
        self.no_edges = torch.empty(2, 0, dtype=torch.long, device=device)
        self.encoder = _EncoderTraining(self)
        self._inputs: list[torch.Tensor] | None = None
        self.encoder_val_acc = 0.0
        self.uses_head = True
        dp = self.protocol.dp
        #: DP-SGD per training stage (``--dpsgd``): encoder and head, a training node as a record
        self.dpsgd: dict[str, EngineDPSGD] = {}
        if opts.dpsgd:
            if dp is None:
                raise ConfigError("fedgcn-gap --dpsgd needs --dp-epsilon (the run's total budget)")
            epochs, enc_rounds = cfg.local_epochs, opts.encoder_rounds or cfg.rounds
            self.dpsgd = {
                stage: EngineDPSGD(dp, f"{stage}/dpsgd", cfg.dp_clip, rounds, epochs, opts.dp_sample_rate)
                for stage, rounds in ((self.encoder.name, enc_rounds), (self.name, cfg.rounds))
            }
        if dp is not None and dp.config.split is None:
            dp.declare(*self.hop_tags(), *(s.tag for s in self.dpsgd.values()))  # even split

    def hop_tags(self) -> list[str]:
        return [f"{HOP_TAG}/{h}" for h in range(1, self.opts.hops + 1)]

    def release_dependencies(self) -> dict[str, set[str]]:
        return release_dependencies_of(self.name)

    def release_units(self) -> dict[str, str]:
        """Units of the DP releases other than the hop sums: DP-SGD steps protect a training node."""
        return {s.tag: "sample" for s in self.dpsgd.values()}

    def local_update(self, k: int) -> float:
        sgd = self.dpsgd.get(self.name)
        return sgd.local_update(self, k) if sgd else super().local_update(k)

    def build_model(self) -> nn.Module:
        cfg = self.cfg
        return build_model(
            "mlp",
            (self.opts.hops + 1) * cfg.hidden,
            cfg.hidden,
            self.fed.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
        )

    def model_dp_request(self, tag: str) -> DPRequest | None:
        """Edge-level: the model exchanges touch no edge, so they carry no noise."""
        from ...privacy import resolve_unit

        if self.protocol.dp is None or resolve_unit(self.cfg) == "edge":
            return None
        return super().model_dp_request(tag)

    # -- stage 1 and 2
    def embeddings(self, k: int) -> torch.Tensor:
        """``H_0`` of client k's own nodes: the encoder's row-normalised embeddings (float64)."""
        model = self.encoder.models[k]
        model.eval()
        with torch.no_grad():
            return row_normalise(model.embed(self.clients[k].x, self.no_edges).to(torch.float64))

    def hop_request(self, hop: int) -> DPRequest | None:
        return hop_dp_request(self.protocol.dp)

    def aggregate_hops(self, h0: list[torch.Tensor]) -> list[torch.Tensor]:
        """Stage 2: ``[H_0, H_1, ..., H_K]`` concatenated per client (own nodes, float32)."""
        for k, c in enumerate(self.clients):
            check_degree_cap(c, self.opts.degree_cap, k)
        spec = hop_spec(self.opts)
        hops, prev = [h0], h0
        for h, tag in enumerate(self.hop_tags(), start=1):
            contributions = {
                k: tuple(t.cpu() for t in partial_neighbour_sums(c, prev[k])) for k, c in enumerate(self.clients)
            }
            requests = {k: c.global_ids.cpu() for k, c in enumerate(self.clients)}
            received = self.protocol.row_sum(
                tag,
                0,
                contributions,
                requests,
                num_rows=self.fed.graph.num_nodes,
                layout=self.opts.layout,
                spec=spec,
                dp=self.hop_request(h),
            )
            prev = [
                row_normalise(torch.as_tensor(received[k], dtype=torch.float64, device=self.device))
                for k in range(len(self.clients))
            ]
            hops.append(prev)
        return [torch.cat([hop[k] for hop in hops], dim=1).to(torch.float32) for k in range(len(self.clients))]

    def setup(self) -> None:
        """Stage 1 (the encoder's best round by validation accuracy is kept), then stage 2."""
        rounds = self.opts.encoder_rounds or self.cfg.rounds
        best = None
        for r in range(rounds):
            self.encoder.train_round(r)
            val = self.encoder.evaluate()["val_acc"]
            if best is None or val > self.encoder_val_acc:
                self.encoder_val_acc, best = val, [copy.deepcopy(m.state_dict()) for m in self.encoder.models]
        for m, s in zip(self.encoder.models, best):
            m.load_state_dict(s)
        self._inputs = self.aggregate_hops([self.embeddings(k) for k in range(len(self.clients))])

    # -- stage 3
    def client_inputs(self, k: int):
        if self._inputs is None:
            raise RuntimeError("FedGCNGAP.setup() (encoder and noisy hops) must run before training")
        return self._inputs[k], self.no_edges

    @torch.no_grad()
    def client_logits(self, k: int) -> torch.Tensor:
        return super().client_logits(k) if self.uses_head else self.encoder.client_logits(k)

    def evaluate(self) -> dict:
        """Metrics of the head or the encoder, whichever scores higher on all validation nodes."""
        if self.opts.select == "val":
            self.uses_head = True
            head = super().evaluate()
            if head["val_acc"] >= self.encoder_val_acc:
                return head
            self.uses_head = False
        return super().evaluate()

    def final_metrics(self) -> dict:
        """Also the test accuracy of the encoder's own classifier: the feature-only MLP reference."""
        enc = self.encoder.evaluate()
        return {
            "hops": self.opts.hops,
            "uses_head": self.uses_head,
            "encoder_test_acc": enc["test_acc"],
            "encoder_val_acc": enc["val_acc"],
        }

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["gap"] = {
            "encoder": self.encoder.state_dict(),
            "encoder_val_acc": self.encoder_val_acc,
            "inputs": [z.cpu() for z in self._inputs] if self._inputs is not None else None,
        }
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.encoder.load_state_dict(state["gap"]["encoder"])
        self.encoder_val_acc = float(state["gap"]["encoder_val_acc"])
        saved = state["gap"]["inputs"]
        self._inputs = None if saved is None else [z.to(self.device) for z in saved]
