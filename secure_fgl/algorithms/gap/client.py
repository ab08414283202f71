"""FedGCN-GAP's client.

Sajadmanesh et al., USENIX Security 2023. Its edge-free encoder, its noisy row sums of embeddings per hop, its MLP
head; :mod:`.server` describes the three stages.
"""

from __future__ import annotations

import copy

import torch

from ...dpsgd import DPSGD
from ...models import build_model
from ...runtime.exchange import keep_rows, rows_result
from ...runtime.messages import (
    ContributeIns,
    ContributeRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MessageError,
    ReceiveIns,
)
from ...runtime.sums import mean_vector, summed
from ..fedavg.client import ModelAveragingLogic
from ..fedgcn.ops import partial_neighbour_sums
from ..options import GAPOptions
from .ops import (
    BEST_TAG,
    ENCODER_TAG,
    HOP_TAG,
    MEAN_TAG,
    bound_out_degree,
    check_degree_cap,
    degree_generator,
    row_normalise,
)


class DPSGDOptimizer(ModelAveragingLogic):
    """A stage's optimiser: plain SGD at the DP-SGD learning rate when one is in force, else ``--optimizer``."""

    def make_optimizer(self) -> torch.optim.Optimizer:
        """``SGD(lr, weight_decay)`` of :meth:`GAPOptions.dpsgd_settings`, or the run's optimiser."""
        cfg = GAPOptions(**self.opts).dpsgd_settings(self.cfg)
        if cfg is self.cfg:
            return super().make_optimizer()
        return torch.optim.SGD(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


class GAPEncoderLogic(DPSGDOptimizer):
    """Stage 1 on the client: the feature-only MLP of ``--algorithm fedavg --model mlp``, no edges."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        self.model_tag = ENCODER_TAG
        self.prox_mu = GAPOptions(**options).encoder_mu  # FedProx's (mu/2) ||w - w_global||^2, 0: FedAvg
        self.no_edges = torch.empty(2, 0, dtype=torch.long, device=runtime.device)

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The MLP encoder trained before the aggregation hops."""
        return build_model(
            "mlp", facts.num_features, cfg.hidden, facts.num_classes, num_layers=cfg.num_layers, dropout=cfg.dropout
        )

    def inputs(self):
        """Features without edges (the encoder sees no structure)."""
        return self.data.x, self.no_edges


class GAPLogic(DPSGDOptimizer):
    """FedGCN-GAP's client: the encoder (:class:`GAPEncoderLogic`), the hops, the head (module docstring)."""

    def __init__(self, runtime, options: dict):
        self.gopts = GAPOptions(**options)
        super().__init__(runtime, options)
        self.encoder = GAPEncoderLogic(runtime, options)
        self.encoder.pending, self.encoder.noise = self.pending, self.noise  # one protocol half, one noise source
        self.best_encoder: dict | None = None
        self.hops: list[torch.Tensor] = []
        #: ``--center-embeddings``: the mean unit embedding over all nodes, subtracted before the hops
        self.embedding_mean: torch.Tensor | None = None
        self._inputs: torch.Tensor | None = None
        #: the graph the hops sum over: the client's own, or its out-degree-bounded sample (node level)
        self.graph = self.data
        #: ``--dpsgd``: per-node clipping to ``--dp-clip``, noise from this client's own keystream
        self.sgd = DPSGD(self.cfg.dp_clip, self.gopts.dp_sample_rate) if self.gopts.dpsgd else None

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The head: an MLP on ``[H_0, ..., H_K]``."""
        return build_model(
            "mlp",
            (GAPOptions(**options).hops + 1) * cfg.hidden,
            cfg.hidden,
            facts.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
        )

    def local_epochs(self) -> int:
        """The head's local epochs per round: ``--head-local-epochs``, else ``--local-epochs``."""
        return self.gopts.head_local_epochs or self.cfg.local_epochs

    def inputs(self):
        """The concatenated normalised hops, the head's input.

        Raises:
            RuntimeError: the encoder and the noisy hops have not run.
        """
        if self._inputs is None:
            raise RuntimeError("fedgcn-gap's encoder and noisy hops must run before the head trains")
        return self._inputs, self.encoder.no_edges

    def local_update(self, req: FitIns) -> FitRes:
        """Train the encoder or the head; by DP-SGD with this client's noise when the request carries its std.

        Raises:
            ValueError: DP-SGD is asked of a run without ``--dpsgd``.
        """
        stage = self.encoder if req.model == ENCODER_TAG else self
        if req.dpsgd_std is None:
            return self.encoder.local_update(req) if stage is self.encoder else super().local_update(req)
        if self.sgd is None:
            raise ValueError(f"client {self.rt.client_id} trains by DP-SGD only in a run with --dpsgd")
        c, rnd, dp_tag = self.data, int(req.round), str(req.dpsgd_tag)
        if not bool(c.train_mask.any()):
            return FitRes(trained=False, loss=0.0)
        noises = [lambda size, std=std: self.noise.gaussian(std, size, dp_tag, rnd) for std in req.dpsgd_std]
        x, edge_index = stage.inputs()
        self.sgd.train(
            stage.model,
            stage.optimizer,
            x,
            edge_index,
            c.y,
            c.train_mask,
            seed=self.cfg.seed,
            rnd=rnd,
            client=self.rt.client_id,
            noises=noises,
            uniform=self.noise.rng.uniform,
        )
        return FitRes(trained=True)  # the loss is computed from un-noised gradients: it stays here

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Encoder updates, or the partial neighbour sums of the current hop (hop 1 starts from the best encoder)."""
        tag = req.tag
        if tag == ENCODER_TAG:
            return self.encoder.contribute(req)
        if tag == MEAN_TAG:  # [w_k m_k, w_k]: this client's mean unit embedding, weight n_k / N
            units = self.unit_embeddings()
            self.keep(tag, mean_vector(units.mean(0).cpu().numpy(), self.data.num_nodes / self.facts.num_nodes))
            return ContributeRes(length=units.shape[1] + 1)
        if not tag.startswith(HOP_TAG + "/"):
            return super().contribute(req)
        c = self.data
        if int(req.entry("hop")) == 1:  # H_0 from the best encoder
            check_degree_cap(c, self.gopts.degree_cap, self.rt.client_id)
            bound = self.gopts.degree_bound(self.cfg)
            if bound is not None:  # node level: every own node's term goes to at most D neighbours
                self.graph = bound_out_degree(c, bound, degree_generator(self.cfg.seed, self.rt.client_id))
            units = self.unit_embeddings()
            self.hops = [units if self.embedding_mean is None else row_normalise(units - self.embedding_mean)]
        ids, rows = partial_neighbour_sums(self.graph, self.hops[-1])
        return keep_rows(self, tag, ids.cpu().numpy(), rows.cpu().numpy(), c.global_ids.cpu().numpy(), req)

    def receive(self, req: ReceiveIns) -> None:
        """Take the encoder mean, the best-encoder mark, or a row-normalised aggregated hop."""
        tag = req.tag
        if tag == ENCODER_TAG:
            return self.encoder.receive(req)
        if tag == BEST_TAG:
            self.best_encoder = copy.deepcopy(self.encoder.model.state_dict())
            return None
        if tag == MEAN_TAG:  # m = sum_k w_k m_k / sum_k w_k
            total = summed(self, req)
            self.embedding_mean = torch.as_tensor(total[:-1] / total[-1], dtype=torch.float64, device=self.rt.device)
            return None
        if not tag.startswith(HOP_TAG + "/"):
            return super().receive(req)
        if req.rpb is None:
            raise MessageError(f"the result of {tag!r} delivered without its rows per block (rpb)")
        totals = rows_result(self.rt.half, self.data.global_ids.cpu().numpy(), int(req.rpb), self.cfg.hidden)
        self.hops.append(row_normalise(torch.as_tensor(totals, dtype=torch.float64, device=self.rt.device)))
        if len(self.hops) == self.gopts.hops + 1:
            self._inputs = torch.cat(self.hops, dim=1).to(torch.float32)
        return None

    @torch.no_grad()
    def unit_embeddings(self) -> torch.Tensor:
        """``E(x) / ||E(x)||`` of this client's nodes by the best encoder (loaded first)."""
        if self.best_encoder is not None:
            self.encoder.model.load_state_dict(self.best_encoder)
        self.encoder.model.eval()
        return row_normalise(self.encoder.model.embed(self.data.x, self.encoder.no_edges).to(torch.float64))

    @torch.no_grad()
    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """Counts of the encoder, or of the head and the encoder once the head has inputs."""
        if req.model == ENCODER_TAG or self._inputs is None:
            return self.encoder.evaluate(req)
        return EvaluateRes({"head": super().evaluate(req).counts, "encoder": self.encoder.evaluate(req).counts})

    def state_dict(self) -> dict:
        """Head state plus the encoder, the best encoder and the hop inputs."""
        return {
            **super().state_dict(),
            "encoder": self.encoder.state_dict(),
            "best_encoder": self.best_encoder,
            "embedding_mean": self.embedding_mean,
            "inputs": self._inputs,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        super().load_state_dict(state)
        self.encoder.load_state_dict(state["encoder"])
        self.best_encoder, self._inputs = state["best_encoder"], state["inputs"]
        self.embedding_mean = state.get("embedding_mean")
