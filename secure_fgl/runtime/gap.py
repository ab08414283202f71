"""FedGCN-GAP (Sajadmanesh et al., USENIX Security 2023) as a client logic and a server strategy.

The three stages of :mod:`secure_fgl.algorithms.gap` with every party apart:

1. **Encoder**: FedAvg of the feature-only MLP (tag ``fedgcn-gap/encoder/model``) for
   ``--encoder-rounds`` rounds; after each round the clients report their counts of the encoder
   (``eval/counts``) and, when the federation's validation accuracy improves, the server tells
   every client to keep its current encoder as the best (a one-bit control message).
2. **Noisy hops**: each client loads its best encoder, embeds its own nodes
   (``H_0 = E(x)/||E(x)||``), checks its degrees against ``--degree-cap``, and for hop ``h``
   contributes its partial sums ``P^{(k)} = sum_{j in V_k} Ã_vj H_{h-1,j}`` through the row-sum
   exchange (tag ``fedgcn-gap/hop/h``); under DP it adds its share of the edge-level noise itself
   (:mod:`.dp`) and the driver's accountant counts each hop as inline.  Each client receives the
   totals of its own nodes and row-normalises them into ``H_h``.
3. **Head**: FedAvg (tag ``fedgcn-gap/model``) of an MLP on ``[H_0, ..., H_K]``; evaluation picks
   the head or the encoder by the federation's validation accuracy (``--select val``), from one
   ``eval/counts`` message per client holding both models' counts.

``--dpsgd`` (DP-SGD of the encoder and the head, :mod:`secure_fgl.dpsgd`): before each round the
driver's one accountant counts that round's steps of the stage (``<stage>/dpsgd``, one release per
step for all clients: they hold disjoint nodes) and tells each sampled client the std of each step;
the client clips every per-node gradient of its own training nodes (Opacus) and adds the noise from
its own OS-keyed keystream (:class:`~.dp.ClientNoise`), as inline draws it from the run's engine.
A step is counted before any client trains (conservative: it counts even if the client is lost).
"""
from __future__ import annotations

import copy

import torch

from ..algorithms.base import ModelAveraging, accuracy_summary
from ..algorithms.fedgcn import partial_neighbour_sums
from ..algorithms.gap import (HOP_TAG, FedGCNGAP, check_degree_cap, check_gap_options, hop_spec, row_normalise)
from ..algorithms.options import GAPOptions
from ..config import ConfigError
from ..dpsgd import DPSGD, noise_contributors, stage_request
from ..models import build_model
from .exchange import keep_rows, rows_result, run_row_sum
from .logic import ModelAveragingLogic
from .strategy import EVAL_TAG, ModelAveragingStrategy

ENCODER_TAG = "fedgcn-gap/encoder/model"
#: server -> client control: "keep your current encoder, the best so far"
BEST_TAG = "fedgcn-gap/encoder/best"


class GAPEncoderLogic(ModelAveragingLogic):
    """Stage 1 on the client: the feature-only MLP of ``--algorithm fedavg --model mlp``, no edges."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        self.model_tag = ENCODER_TAG
        self.no_edges = torch.empty(2, 0, dtype=torch.long, device=runtime.device)

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        return build_model("mlp", facts.num_features, cfg.hidden, facts.num_classes, num_layers=cfg.num_layers,
                           dropout=cfg.dropout)

    def inputs(self):
        return self.data.x, self.no_edges


class GAPLogic(ModelAveragingLogic):
    """FedGCN-GAP's client: the encoder (:class:`GAPEncoderLogic`), the hops, the head (module docstring)."""

    def __init__(self, runtime, options: dict):
        self.gopts = GAPOptions(**options)
        super().__init__(runtime, options)
        self.encoder = GAPEncoderLogic(runtime, options)
        self.encoder.pending, self.encoder.noise = self.pending, self.noise   # one protocol half, one noise source
        self.best_encoder: dict | None = None
        self.hops: list[torch.Tensor] = []
        self._inputs: torch.Tensor | None = None
        #: ``--dpsgd``: per-node clipping to ``--dp-clip``, noise from this client's own keystream
        self.sgd = DPSGD(self.cfg.dp_clip) if self.gopts.dpsgd else None

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The head: an MLP on ``[H_0, ..., H_K]``."""
        return build_model("mlp", (GAPOptions(**options).hops + 1) * cfg.hidden, cfg.hidden, facts.num_classes,
                           num_layers=cfg.num_layers, dropout=cfg.dropout)

    def inputs(self):
        if self._inputs is None:
            raise RuntimeError("fedgcn-gap's encoder and noisy hops must run before the head trains")
        return self._inputs, self.encoder.no_edges

    def local_update(self, req: dict) -> dict:
        stage = self.encoder if req.get("model") == ENCODER_TAG else self
        if "dpsgd_std" not in req:
            return self.encoder.local_update(req) if stage is self.encoder else super().local_update(req)
        if self.sgd is None:
            raise ValueError(f"client {self.rt.client_id} trains by DP-SGD only in a run with --dpsgd")
        c, rnd = self.data, int(req["round"])
        if not bool(c.train_mask.any()):
            return {"trained": False, "loss": 0.0}
        noises = [lambda size, std=std: self.noise.gaussian(std, size, req["dpsgd_tag"], rnd)
                  for std in req["dpsgd_std"]]
        x, edge_index = stage.inputs()
        loss = self.sgd.train(stage.model, stage.optimizer, x, edge_index, c.y, c.train_mask, seed=self.cfg.seed,
                              rnd=rnd, client=self.rt.client_id, noises=noises)
        return {"trained": True, "loss": loss}

    def contribute(self, req: dict) -> dict:
        tag = req["tag"]
        if tag == ENCODER_TAG:
            return self.encoder.contribute(req)
        if not tag.startswith(HOP_TAG + "/"):
            return super().contribute(req)
        c = self.data
        if int(req["hop"]) == 1:                 # H_0 from the best encoder
            check_degree_cap(c, self.gopts.degree_cap, self.rt.client_id)
            if self.best_encoder is not None:
                self.encoder.model.load_state_dict(self.best_encoder)
            self.encoder.model.eval()
            with torch.no_grad():
                self.hops = [row_normalise(self.encoder.model.embed(c.x, self.encoder.no_edges).to(torch.float64))]
        ids, rows = partial_neighbour_sums(c, self.hops[-1])
        return keep_rows(self, tag, ids.cpu().numpy(), rows.cpu().numpy(), c.global_ids.cpu().numpy(), req)

    def receive(self, req: dict) -> dict:
        tag = req["tag"]
        if tag == ENCODER_TAG:
            return self.encoder.receive(req)
        if tag == BEST_TAG:
            self.best_encoder = copy.deepcopy(self.encoder.model.state_dict())
            return {}
        if not tag.startswith(HOP_TAG + "/"):
            return super().receive(req)
        totals = rows_result(self.rt.half, self.data.global_ids.cpu().numpy(), int(req["rpb"]),
                             self.cfg.hidden)
        self.hops.append(row_normalise(torch.as_tensor(totals, dtype=torch.float64, device=self.rt.device)))
        if len(self.hops) == self.gopts.hops + 1:
            self._inputs = torch.cat(self.hops, dim=1).to(torch.float32)
        return {}

    @torch.no_grad()
    def evaluate(self, req: dict) -> dict:
        if req.get("model") == ENCODER_TAG or self._inputs is None:
            return self.encoder.evaluate(req)
        return {"head": super().evaluate(req), "encoder": self.encoder.evaluate(req)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "encoder": self.encoder.state_dict(), "best_encoder": self.best_encoder,
                "inputs": self._inputs}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.encoder.load_state_dict(state["encoder"])
        self.best_encoder, self._inputs = state["best_encoder"], state["inputs"]


class GAPStrategy(ModelAveragingStrategy):
    """FedGCN-GAP's server (module docstring)."""

    #: the data each release touches (:mod:`secure_fgl.privacy`), as the in-process algorithm states it
    release_dependencies = FedGCNGAP.release_dependencies
    #: the hop sums' edge-level DP request (as inline)
    hop_request = FedGCNGAP.hop_request
    dpsgd_secure_mean = FedGCNGAP.dpsgd_secure_mean

    def __init__(self, executor, protocol, cfg, facts, options):
        self.gopts = GAPOptions(**options)
        check_gap_options(self.gopts, cfg)
        if self.gopts.dpsgd and protocol.dp is None:
            raise ConfigError("fedgcn-gap --dpsgd needs --dp-epsilon (the run's total budget)")
        super().__init__(executor, protocol, cfg, facts, options)
        if not self.split:
            raise ConfigError(f"fedgcn-gap with --executor {cfg.executor} runs its hop sums in the clients' protocol "
                              f"halves; mode {protocol.mode} is not split into halves yet: use --executor inline")
        self.encoder_val_acc, self.uses_head = 0.0, True
        self.hop_tags = [f"{HOP_TAG}/{h}" for h in range(1, self.gopts.hops + 1)]
        #: ``--dpsgd``: model tag of a training stage -> (its DP tag, its request), as inline names them
        self.dpsgd = {}
        if self.gopts.dpsgd:
            epochs, enc_rounds = cfg.local_epochs, self.gopts.encoder_rounds or cfg.rounds
            self.dpsgd = {ENCODER_TAG: (f"{self.name}/encoder/dpsgd", stage_request(cfg.dp_clip, enc_rounds, epochs)),
                          f"{self.name}/model": (f"{self.name}/dpsgd", stage_request(cfg.dp_clip, cfg.rounds, epochs))}
        if protocol.dp is not None and protocol.dp.config.split is None:
            protocol.dp.declare(*self.hop_tags, *(t for t, _ in self.dpsgd.values()))   # even split (as inline)

    def release_units(self) -> dict[str, str]:
        """DP-SGD steps protect a training node (a sample), as inline."""
        return {t: "sample" for t, _ in self.dpsgd.values()}

    def local_update_request(self, rnd: int, tag: str | None) -> dict:
        """With ``--dpsgd``: count this round's steps of the stage and tell the clients each step's std."""
        ask = super().local_update_request(rnd, tag)
        stage = self.dpsgd.get(tag or f"{self.name}/model")
        if stage is None:
            return ask
        dp_tag, request = stage
        epochs, dp = self.cfg.local_epochs, self.protocol.dp
        n = noise_contributors(self.cfg, dp.config.placement, self.facts.num_trainers,
                               self.model_dp_request(tag or f"{self.name}/model") is not None)
        std = [dp.local_release(dp_tag, rnd * epochs + s, request, contributors=n) for s in range(epochs)]
        return {**ask, "dpsgd_tag": dp_tag, "dpsgd_std": std}

    def model_dp_request(self, tag: str):
        """Edge-level: the model exchanges touch no edge, so they carry no noise (as inline)."""
        from ..privacy import resolve_unit
        if self.protocol.dp is None or resolve_unit(self.cfg) == "edge":
            return None
        return ModelAveraging.model_dp_request(self, tag)

    def setup(self) -> None:
        """Stage 1 (the encoder's best round by the federation's validation accuracy), then stage 2."""
        for r in range(self.gopts.encoder_rounds or self.cfg.rounds):
            self.train_round(r, ENCODER_TAG)
            val = self._encoder_summary()["val_acc"]
            if r == 0 or val > self.encoder_val_acc:
                self.encoder_val_acc = val
                self.tell("receive", {k: {"tag": BEST_TAG, "round": r} for k in self.alive()})
        self._noisy_hops()

    def _noisy_hops(self) -> None:
        K, N, dim, o = self.num_clients, self.facts.num_nodes, self.cfg.hidden, self.gopts
        for h, tag in enumerate(self.hop_tags, start=1):
            dp = self.hop_request(h) if self.protocol.dp is not None and self.protocol.dp.config.in_scope(tag) else None
            spec = self.protocol.release_spec(hop_spec(o), dp)             # as inline's row_sum, per hop
            rpb = self.protocol.rows_per_block(spec, dim, N, o.layout)
            ask = {"tag": tag, "round": 0, "hop": h, "rpb": rpb, "num_blocks": -(-N // rpb), "layout": o.layout,
                   "dp_clip": float(dp.clip) if dp else None}
            sent = self.ask("contribute", {k: ask for k in range(K)})
            self.check_lost(range(K), f"the hop exchange {tag}")
            run_row_sum(self, tag, 0, sent, N, dim, o.layout, spec, rpb, dp)
            self.tell("receive", {k: {"tag": tag, "round": 0, "rpb": rpb} for k in range(K)})
            self.check_lost(range(K), f"the delivery of {tag}")

    def _encoder_summary(self) -> dict:
        counts = self.ask("evaluate", {k: {"model": ENCODER_TAG} for k in self.alive()}, record=(EVAL_TAG, "plain"))
        return accuracy_summary(counts)

    def evaluate(self) -> dict:
        """Metrics of the head or the encoder, whichever scores higher on all validation nodes (as inline)."""
        counts = self.ask("evaluate", {k: {} for k in self.alive()}, record=(EVAL_TAG, "plain"))
        head = accuracy_summary({k: r["head"] for k, r in counts.items()})
        self.uses_head = self.gopts.select != "val" or head["val_acc"] >= self.encoder_val_acc
        return head if self.uses_head else accuracy_summary({k: r["encoder"] for k, r in counts.items()})

    def final_metrics(self) -> dict:
        enc = self._encoder_summary()
        return {**super().final_metrics(), "hops": self.gopts.hops, "uses_head": self.uses_head,
                "encoder_test_acc": enc["test_acc"], "encoder_val_acc": enc["val_acc"]}

    def server_state(self) -> dict:
        return {"encoder_val_acc": self.encoder_val_acc, "uses_head": self.uses_head}

    def load_server_state(self, state: dict) -> None:
        self.encoder_val_acc, self.uses_head = float(state["encoder_val_acc"]), bool(state["uses_head"])
