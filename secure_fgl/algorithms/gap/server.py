"""FedGCN-GAP (Sajadmanesh et al., USENIX Security 2023) as a client logic and a server strategy.

The three stages of :mod:`secure_fgl.algorithms.gap` with every party apart:

1. **Encoder**: FedAvg of the feature-only MLP (tag ``fedgcn-gap/encoder/model``) for
   ``--encoder-rounds`` rounds; after each round the clients report their counts of the encoder
   (``eval/counts``) and, when the federation's validation accuracy improves, the server tells
   every client to keep its current encoder as the best (a one-bit control message).
2. **Noisy hops**: each client loads its best encoder, embeds its own nodes
   (``H_0 = E(x)/||E(x)||``; with ``--center-embeddings`` first the weighted mean of the clients'
   mean unit embeddings, tag ``fedgcn-gap/encoder/mean``, is subtracted and the rows normalised
   again), checks its degrees against ``--degree-cap``, and for hop ``h``
   contributes its partial sums ``P^{(k)} = sum_{j in V_k} Ã_vj H_{h-1,j}`` through the row-sum
   exchange (tag ``fedgcn-gap/hop/h``); under DP it adds its share of the edge-level noise itself
   (:mod:`.dp`) and the driver's accountant counts each hop.  Each client receives the
   totals of its own nodes and row-normalises them into ``H_h``.
3. **Head**: FedAvg (tag ``fedgcn-gap/model``) of an MLP on ``[H_0, ..., H_K]``; evaluation picks
   the head or the encoder by the federation's validation accuracy (``--select val``), from one
   ``eval/counts`` message per client holding both models' counts.

``--dpsgd`` (DP-SGD of the encoder and the head, :mod:`secure_fgl.dpsgd`): before each round the
driver's one accountant counts that round's steps of the stage (``<stage>/dpsgd``, one release per
step for all clients: they hold disjoint nodes) and tells each sampled client the std of each step;
the client clips every per-node gradient of its own training nodes (Opacus) and adds the noise from
its own OS-keyed keystream (:class:`~.dp.ClientNoise`).
A step is counted before any client trains (conservative: it counts even if the client is lost).
"""

from __future__ import annotations

import dataclasses

from protocols.dp import node_level_sensitivity

from ...dpsgd import noise_contributors, stage_request
from ...privacy import resolve_unit
from ...runtime.exchange import run_row_sum
from ...runtime.messages import ContributeIns, EvaluateIns, FitIns, ReceiveIns
from ...runtime.strategy import EVAL_TAG
from ...validation import ConfigError
from ..base import accuracy_summary
from ..fedavg.server import ModelAveragingStrategy
from ..options import GAPOptions
from .ops import (
    BEST_TAG,
    ENCODER_TAG,
    HOP_TAG,
    MEAN_TAG,
    check_gap_options,
    hop_dp_request,
    hop_spec,
    release_dependencies_of,
)


class GAPStrategy(ModelAveragingStrategy):
    """FedGCN-GAP's server (module docstring)."""

    #: in ckks/mask, one DP-SGD step's noise is split over the clients inside the secure model mean
    dpsgd_secure_mean = True

    def release_dependencies(self) -> dict[str, set[str]]:
        """The data each release touches (:mod:`secure_fgl.privacy`)."""
        return release_dependencies_of(self.name, dpsgd=self.gopts.dpsgd)

    def hop_request(self, hop: int):
        """The hop sums' DP request (None without DP): edge level, or node level under the out-degree bound."""
        node = resolve_unit(self.cfg) == "node"
        return hop_dp_request(self.protocol.dp, self.gopts.degree_bound(self.cfg) if node else None)

    def degree_bound(self) -> dict | None:
        """The out-degree bound in force and who enforces it (``result.json["privacy"]["degree_bound"]``)."""
        bound = self.gopts.degree_bound(self.cfg)
        if bound is None:
            return None
        return {
            "max_out_degree": bound,
            "enforced_by": "the owner of each node: its embedding enters its own row and at most this many "
            "uniformly sampled neighbours' hop sums (local and cross-client edges)",
            "hop_sensitivity": node_level_sensitivity(1.0, bound),
        }

    def __init__(self, executor, protocol, cfg, facts, options):
        self.gopts = GAPOptions(**options)
        check_gap_options(self.gopts, cfg)
        if self.gopts.dpsgd and protocol.dp is None:
            raise ConfigError("fedgcn-gap --dpsgd needs --dp-epsilon (the run's total budget)")
        super().__init__(executor, protocol, cfg, facts, options)
        self.encoder_val_acc, self.uses_head = 0.0, True
        self.hop_tags = [f"{HOP_TAG}/{h}" for h in range(1, self.gopts.hops + 1)]
        #: ``--dpsgd``: model tag of a training stage -> (its DP tag, its request)
        self.dpsgd = {}
        if self.gopts.dpsgd:
            epochs, enc_rounds = cfg.local_epochs, self.gopts.encoder_rounds or cfg.rounds
            self.dpsgd = {
                ENCODER_TAG: (f"{self.name}/encoder/dpsgd", stage_request(cfg.dp_clip, enc_rounds, epochs)),
                f"{self.name}/model": (f"{self.name}/dpsgd", stage_request(cfg.dp_clip, cfg.rounds, epochs)),
            }
        if protocol.dp is not None and protocol.dp.config.budget_shares is None:
            protocol.dp.declare(*self.hop_tags, *(t for t, _ in self.dpsgd.values()))  # equal budget shares

    def release_units(self) -> dict[str, str]:
        """DP-SGD steps protect a training node: a sample, or the node itself at node level.

        At node level a node's per-node gradient reads its own features, label and hop rows only.
        """
        unit = "node" if self.protocol.dp is not None and resolve_unit(self.cfg) == "node" else "sample"
        return {t: unit for t, _ in self.dpsgd.values()}

    def local_update_request(self, rnd: int, tag: str | None) -> FitIns:
        """With ``--dpsgd``: count this round's steps of the stage and tell the clients each step's std."""
        ask = super().local_update_request(rnd, tag)
        stage = self.dpsgd.get(tag or f"{self.name}/model")
        if stage is None:
            return ask
        dp_tag, request = stage
        epochs, dp = self.cfg.local_epochs, self.protocol.dp
        n = noise_contributors(
            self.gopts.dpsgd_settings(self.cfg),
            dp.config.placement,
            self.facts.num_trainers,
            self.model_dp_request(tag or f"{self.name}/model") is not None,
        )
        q = self.gopts.dp_sample_rate
        std = [
            dp.local_release(dp_tag, rnd * epochs + s, request, contributors=n, sample_rate=q) for s in range(epochs)
        ]
        return dataclasses.replace(ask, dpsgd_tag=dp_tag, dpsgd_std=std)

    def model_dp_request(self, tag: str):
        """No noise on the model exchanges at edge level (they touch no edge) or with ``--dpsgd``.

        With DP-SGD they are post-processing of the noisy steps.
        """
        if self.protocol.dp is None or resolve_unit(self.cfg) == "edge" or self.gopts.dpsgd:
            return None
        return super().model_dp_request(tag)

    def setup(self) -> None:
        """Stage 1 (the encoder's best round by the federation's validation accuracy), then stage 2."""
        for r in range(self.gopts.encoder_rounds or self.cfg.rounds):
            self.train_round(r, ENCODER_TAG)
            val = self._encoder_summary()["val_acc"]
            if r == 0 or val > self.encoder_val_acc:
                self.encoder_val_acc = val
                self.tell("receive", {k: ReceiveIns(BEST_TAG, r) for k in self.alive()})
        if self.gopts.center_embeddings:  # the weighted mean of the clients' mean unit embeddings
            self.aggregate(0, self.alive(), MEAN_TAG)
        self._noisy_hops()

    def _noisy_hops(self) -> None:
        K, N, dim, o = self.num_clients, self.facts.num_nodes, self.cfg.hidden, self.gopts
        for h, tag in enumerate(self.hop_tags, start=1):
            dp = self.hop_request(h) if self.protocol.dp is not None and self.protocol.dp.config.in_scope(tag) else None
            spec = self.protocol.release_spec(hop_spec(o), dp)  # a DP row sum's public grid, per hop
            rpb = self.protocol.rows_per_block(spec, dim, N, o.layout)
            ask = ContributeIns(
                tag,
                0,
                dp_clip=float(dp.clip) if dp else None,
                rpb=rpb,
                num_blocks=-(-N // rpb),
                layout=o.layout,
                config={"hop": h},
            )
            sent = self.ask("contribute", {k: ask for k in range(K)})
            self.check_lost(range(K), f"the hop exchange {tag}")
            run_row_sum(self, tag, 0, sent, N, dim, o.layout, spec, rpb, dp)
            self.tell("receive", {k: ReceiveIns(tag, 0, rpb=rpb) for k in range(K)})
            self.check_lost(range(K), f"the delivery of {tag}")

    def _encoder_summary(self) -> dict:
        ask = EvaluateIns(model=ENCODER_TAG)
        counts = self.ask("evaluate", {k: ask for k in self.alive()}, record=(EVAL_TAG, "plain"))
        return accuracy_summary({k: r.counts for k, r in counts.items()})

    def evaluate(self) -> dict:
        """Metrics of the head or the encoder, whichever scores higher on all validation nodes."""
        counts = self.ask("evaluate", {k: EvaluateIns() for k in self.alive()}, record=(EVAL_TAG, "plain"))
        head = accuracy_summary({k: r.counts["head"] for k, r in counts.items()})
        self.uses_head = self.gopts.select != "val" or head["val_acc"] >= self.encoder_val_acc
        return head if self.uses_head else accuracy_summary({k: r.counts["encoder"] for k, r in counts.items()})

    def final_metrics(self) -> dict:
        """Base metrics plus hops, whether the head is used and the encoder's accuracies."""
        enc = self._encoder_summary()
        return {
            **super().final_metrics(),
            "hops": self.gopts.hops,
            "uses_head": self.uses_head,
            "encoder_test_acc": enc["test_acc"],
            "encoder_val_acc": enc["val_acc"],
        }

    def server_state(self) -> dict:
        """The encoder's validation accuracy and whether the head is used."""
        return {"encoder_val_acc": self.encoder_val_acc, "uses_head": self.uses_head}

    def load_server_state(self, state: dict) -> None:
        """Restore the state written by :meth:`server_state`."""
        self.encoder_val_acc, self.uses_head = float(state["encoder_val_acc"]), bool(state["uses_head"])
