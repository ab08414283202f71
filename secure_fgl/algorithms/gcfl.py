"""GCFL and GCFL+ (Xie et al., "Federated Graph Classification over Non-IID Graphs",
NeurIPS 2021, sec. 4-5; the authors' ``training.py`` / ``server.py`` for the details the
paper leaves open).

Clients train the GIN of :mod:`~secure_fgl.algorithms.graph_level`; only the GIN layers are
shared (the reference's ``serverGIN``), input, ``post`` and classifier layers stay local.
Clusters start as one.  Each round, for every cluster ``c`` of members ``i``:

1. the members' updates ``dW_i`` of the shared layers are averaged through the protocol's
   weighted mean (weights ``|G_i|``, FedAvg); the members learn ``mean_c`` and the first
   member reports ``delta_mean = ||mean_c||`` (eq. 4; the reference code averages without
   weights, the paper with ``|G_i|/|G|``: we follow the paper);
2. every member reports ``||dW_i||``; ``delta_max`` is their maximum (eq. 5);
3. when :func:`~secure_fgl.algorithms.clustering.should_split` holds (eq. 4-5, ``|c| > 2``,
   round > 20), the cluster is cut in two by Stoer-Wagner on a similarity matrix --
   GCFL: ``1 + cos(dW_i, dW_j)`` from the pairwise-statistics exchange
   (:mod:`protocols.pairwise`); GCFL+: ``max(D) - D`` with ``D`` the DTW distances of the
   members' last ``seq_length`` gradient norms (every client must have that many; all
   sequences restart after a split, as the reference) -- and each half is averaged on its
   own (two more weighted means) instead of ``mean_c``.

GCFL+'s sequences: each round every client reports the norm of the shared layers' gradient
at its last local step (the reference's ``convGradsNorm``).

Reported accuracy: the engine's ``test_acc`` is each client's own model (its cluster's
shared layers + its local layers).  ``test_acc_best_cached`` reproduces the reference
code's number: the model of a cluster is cached (with its members' test accuracies of the
previous round) before every split and at the end, and each client takes its *maximum* over
the cached entries it belongs to -- a selection on test data, reported only for comparison.
"""
from __future__ import annotations

import numpy as np
import torch

from protocols.pairwise import PAIRWISE_MODES, pairwise_cosine, report_scalars

from .clustering import bipartition, cut_margin, dtw_distances, dtw_similarity, should_split
from .graph_level import GraphFederated
from .options import GCFLOptions, GCFLPlusOptions

__all__ = ["GCFLOptions", "GCFLPlusOptions", "GCFL", "GCFLPlus"]


class GCFL(GraphFederated):
    name = "gcfl"
    Options = GCFLOptions
    supported_modes = PAIRWISE_MODES

    def __init__(self, fed, protocol, cfg, device, options=None):
        super().__init__(fed, protocol, cfg, device, options)
        #: (members, their test accuracies) cached before each split and at the end
        self.cache: list[tuple[list[int], list[float]]] = []
        self.splits: list[dict] = []
        self.last_eval = None

    @classmethod
    def mode_refusal(cls, mode: str) -> str:
        return (f"{cls.name} needs inner products of client updates, which --mode {mode} cannot compute: "
                f"use --mode ckks (or plain)")

    # ------------------------------------------------------------------ server decisions
    def similarity(self, rnd: int, members: list[int], updates: dict[int, torch.Tensor]) -> np.ndarray:
        """``1 + cos`` of the members' updates (the reference's ``pairwise_angles``)."""
        cos = pairwise_cosine(self.protocol, f"{self.name}/similarity", rnd, {k: updates[k] for k in members},
                              decider=self.opts.decider)
        return 1.0 + cos

    def ready_to_split(self) -> bool:
        return True

    def after_split(self) -> None:
        """Hook: GCFL+ restarts its sequences."""

    def cluster_round(self, rnd: int, updates: dict[int, torch.Tensor]) -> None:
        new_clusters = []
        for members in self.clusters:
            members = [k for k in members if k in updates]
            if not members:
                continue
            mean = self.cluster_mean(rnd, members, updates)
            delta_mean = report_scalars(self.protocol, f"{self.name}/mean_norm", rnd,
                                        {members[0]: float(np.linalg.norm(mean))})[members[0]]
            norms = report_scalars(self.protocol, f"{self.name}/update_norms", rnd,
                                   {k: float(updates[k].norm()) for k in members})
            delta_max = max(norms.values())
            if should_split(delta_mean, delta_max, len(members), rnd, self.opts.eps1, self.opts.eps2) \
                    and self.ready_to_split():
                self.cache_cluster(members)
                sim = self.similarity(rnd, members, updates)
                halves = bipartition(sim, members)
                self.splits.append({"round": rnd, "cluster": members, "into": [list(h) for h in halves],
                                    "delta_mean": delta_mean, "delta_max": delta_max, "cut_margin": cut_margin(sim),
                                    "similarity": sim[np.triu_indices(len(members), 1)].tolist()})
                self.after_split()
                for half in halves:
                    self.apply_mean(half, self.cluster_mean(rnd, half, updates))
                new_clusters += [list(h) for h in halves]
            else:
                self.apply_mean(members, mean)
                new_clusters.append(members)
        self.clusters = new_clusters

    # ------------------------------------------------------------------ reporting
    def cache_cluster(self, members: list[int]) -> None:
        accs = [self.last_eval[k]["test_acc"] for k in members] if self.last_eval is not None \
            else [0.0] * len(members)
        self.cache.append((list(members), accs))

    def final_metrics(self) -> dict:
        out = super().final_metrics()
        entries = self.cache + [(c, [self.last_eval[k]["test_acc"] for k in c]) for c in self.clusters]
        best = np.zeros(len(self.clients))
        for members, accs in entries:
            for k, a in zip(members, accs):
                best[k] = max(best[k], a)
        out.update({"test_acc_best_cached": float(best.mean()),
                    "test_acc_best_cached_note": "reference-code metric: per client, max test accuracy over "
                                                 "cached cluster models (selected on test data)",
                    "per_client_test_acc_best_cached": best.tolist(), "splits": self.splits})
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "cache": self.cache, "splits": self.splits, "last_eval": self.last_eval}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cache, self.splits, self.last_eval = state["cache"], state["splits"], state["last_eval"]


class GCFLPlus(GCFL):
    """GCFL+: the cut uses DTW distances of gradient-norm sequences (paper sec. 5)."""

    name = "gcflplus"
    Options = GCFLPlusOptions
    #: no inner products: the weighted means and the reported norms run in every mode
    supported_modes = ("plain", "ckks", "mask")

    def __init__(self, fed, protocol, cfg, device, options=None):
        super().__init__(fed, protocol, cfg, device, options)
        self.sequences: list[list[float]] = [[] for _ in self.clients]

    def cluster_round(self, rnd: int, updates: dict[int, torch.Tensor]) -> None:
        reported = report_scalars(self.protocol, f"{self.name}/grad_norms", rnd,
                                  {k: float(self.grad_norms[k]) for k in updates})
        for k, v in reported.items():
            self.sequences[k].append(v)
        super().cluster_round(rnd, updates)

    def ready_to_split(self) -> bool:
        return all(len(s) >= self.opts.seq_length for s in self.sequences)

    def similarity(self, rnd: int, members: list[int], updates: dict[int, torch.Tensor]) -> np.ndarray:
        seqs = [self.sequences[k][-self.opts.seq_length:] for k in members]
        return dtw_similarity(dtw_distances(seqs, self.opts.standardize))

    def after_split(self) -> None:
        self.sequences = [[] for _ in self.clients]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sequences": self.sequences}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sequences = state["sequences"]
