"""GCFL and GCFL+.

Xie et al., "Federated Graph Classification over Non-IID Graphs", NeurIPS 2021, sec. 4-5; the authors'
``training.py`` / ``server.py`` for the details the paper leaves open.

Clients train the GIN of :mod:`~secure_fgl.algorithms.graph_level`; only the GIN layers are
shared (the reference's ``serverGIN``), input, ``post`` and classifier layers stay local.
Clusters start as one.  Each round, for every cluster ``c`` of members ``i``:

1. the members' updates ``dW_i`` of the shared layers are averaged through the protocol's
   weighted mean (weights ``|G_i|``, FedAvg); the members learn ``mean_c``.  Eq. 4 takes the norm
   of this mean (the paper's ``|G_i|/|G|`` weights, the default); ``--mean-norm unweighted``
   takes it of the unweighted mean instead, as the reference's ``compute_mean_update_norm``
   does: one more secure mean per cluster (tag ``<algorithm>/criterion_mean``, equal weights),
   whose result only the members learn and which only eq. 4 reads;
2. once every cluster's mean is out, each client sends ONE clear-text report carrying its
   ``||dW_i||``, the norm of its cluster's mean and (GCFL+) its gradient norm (batch tag
   ``<algorithm>/norms``, :func:`protocols.batch.report_parts`; the transcript attributes its bytes
   to ``<algorithm>/update_norms``, ``/mean_norm``, ``/grad_norms``): ``delta_mean = ||mean_c||`` as
   the first member reports it (every member decoded the same mean), ``delta_max`` the members'
   largest ``||dW_i||`` (eq. 5);
3. when :func:`~secure_fgl.algorithms.clustering.should_split` holds (eq. 4-5, ``|c| > 2``,
   round > 20), the cluster is cut in two by Stoer-Wagner on a similarity matrix --
   GCFL: ``1 + cos(dW_i, dW_j)`` from the update-similarity exchange
   (the cosine matrix, :mod:`protocols.similarity`); GCFL+: ``max(D) - D`` with ``D`` the DTW distances of the
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

from ..clustering import bipartition, cut_margin, dtw_distances, dtw_similarity, should_split
from ..options import GCFLOptions, GCFLPlusOptions

__all__ = ["GCFLOptions", "GCFLPlusOptions", "GCFLServer", "GCFLPlusServer"]


class GCFLServer:
    """The server side of GCFL (a mixin).

    The clusters, eq. 4-5, the Stoer-Wagner cut and the cache behind ``test_acc_best_cached``. How a cluster's mean
    is exchanged and applied and how the clients' scalars and similarities reach the server are hooks, played by the
    server strategy (:mod:`secure_fgl.algorithms.gcfl.server`).
    """

    #: the norms each client reports per round, in one batched report (module docstring, step 2)
    norm_parts: tuple[str, ...] = ("update_norms", "mean_norm")

    def init_clusters(self, num_clients: int) -> None:
        """Start with one cluster of every client, an empty cache and no splits."""
        self.clusters: list[list[int]] = [list(range(num_clients))]
        #: (members, their test accuracies) cached before each split and at the end
        self.cache: list[tuple[list[int], list[float]]] = []
        self.splits: list[dict] = []
        self.last_eval = None
        #: what the current round records beside its metrics (:meth:`split_clusters`)
        self.round_info: dict = {}

    # ------------------------------------------------------------------ hooks
    def exchange_mean(self, rnd: int, members: list[int]):
        """Run the weighted mean of the members' updates; the members receive it (a handle to it)."""
        raise NotImplementedError

    def apply_mean(self, members: list[int], mean) -> None:
        """The members restart from their anchor plus the mean ``exchange_mean`` returned."""
        raise NotImplementedError

    def exchange_unweighted_mean(self, rnd: int, members: list[int]):
        """The members' unweighted mean update (``--mean-norm unweighted``).

        ``--mean-norm unweighted``: the members' unweighted mean update (tag
        ``<algorithm>/criterion_mean``), received by the members (a handle to it).
        """
        raise NotImplementedError

    def round_norms(self, rnd: int, clusters: list[list[int]], means: list) -> dict[str, dict[int, float]]:
        """The norms the clients of every cluster reported, per part.

        Part (:attr:`norm_parts`) -> client -> the norm it reported, from one report per client of
        every cluster (module docstring, step 2); ``means``: the means whose norm eq. 4 reads.
        """
        raise NotImplementedError

    def note_norms(self, norms: dict[str, dict[int, float]]) -> None:
        """Hook: GCFL+ extends its gradient-norm sequences."""

    def update_similarity(self, rnd: int, members: list[int]) -> np.ndarray:
        """The members' cosine similarity matrix of their updates (:mod:`protocols.similarity`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ decisions
    def similarity(self, rnd: int, members: list[int]) -> np.ndarray:
        """``1 + cos`` of the members' updates (the reference's ``pairwise_angles``)."""
        return 1.0 + self.update_similarity(rnd, members)

    def ready_to_split(self) -> bool:
        """Whether a cluster may split this round (GCFL: always)."""
        return True

    def min_cluster_size(self) -> int:
        """The fewest members a cluster may have.

        The run's minimum contributors (every mode, so every mode makes the same clusters). A split round sums the
        cluster, then each half: a half below the minimum would be a sum the clients refuse
        (:mod:`protocols.plan_policy`), so the cut is the lightest one that leaves both halves at least this large.
        """
        cfg = self.cfg
        return int(cfg.min_contributors if cfg.min_contributors is not None else cfg.max_colluders + 2)

    def after_split(self) -> None:
        """Hook: GCFL+ restarts its sequences."""

    def split_clusters(self, rnd: int, updated: list[int]) -> None:
        """One round of clustered FedAvg over the clients in ``updated`` (module docstring)."""
        clusters = [m for m in ([k for k in members if k in updated] for members in self.clusters) if m]
        means = [self.exchange_mean(rnd, members) for members in clusters]
        eq4_means = (
            means
            if self.opts.mean_norm == "weighted"
            else [self.exchange_unweighted_mean(rnd, members) for members in clusters]
        )
        norms = self.round_norms(rnd, clusters, eq4_means) if clusters else {}
        self.note_norms(norms)
        new_clusters = []
        #: eq. 4-5 of every cluster this round, ``[delta_mean, delta_max]`` (in the round's record)
        self.round_info["split_criteria"] = criteria = []
        for members, mean in zip(clusters, means):
            delta_mean = norms["mean_norm"][members[0]]
            delta_max = max(norms["update_norms"][k] for k in members)
            criteria.append([float(delta_mean), float(delta_max)])
            halves = None
            if (
                should_split(delta_mean, delta_max, len(members), rnd, self.opts.eps1, self.opts.eps2)
                and self.ready_to_split()
            ):
                sim = self.similarity(rnd, members)
                # a cluster below the minimum would have its mean, beside the whole one's, reveal its inputs
                halves = bipartition(sim, members, min_side=self.min_cluster_size())
            if halves is not None:
                self.cache_cluster(members)
                self.splits.append(
                    {
                        "round": rnd,
                        "cluster": members,
                        "into": [list(h) for h in halves],
                        "delta_mean": delta_mean,
                        "delta_max": delta_max,
                        "cut_margin": cut_margin(sim),
                        "similarity": sim[np.triu_indices(len(members), 1)].tolist(),
                    }
                )
                self.after_split()
                for half in halves:
                    self.apply_mean(half, self.exchange_mean(rnd, half))
                new_clusters += [list(h) for h in halves]
            else:
                self.apply_mean(members, mean)
                new_clusters.append(members)
        self.clusters = new_clusters

    # ------------------------------------------------------------------ reporting
    def cache_cluster(self, members: list[int]) -> None:
        """Cache the members' last test accuracies before their cluster splits."""
        accs = [self.last_eval[k]["test_acc"] for k in members] if self.last_eval is not None else [0.0] * len(members)
        self.cache.append((list(members), accs))

    def best_cached(self, num_clients: int) -> dict:
        """The reference code's accuracy: the best over the cached and final clusters.

        The reference code's accuracy: per client, the best over the cached cluster entries
        and the final clusters (:attr:`last_eval` must be the last round's evaluation).
        """
        entries = self.cache + [(c, [self.last_eval[k]["test_acc"] for k in c]) for c in self.clusters]
        best = np.zeros(num_clients)
        for members, accs in entries:
            for k, a in zip(members, accs):
                best[k] = max(best[k], a)
        return {
            "test_acc_best_cached": float(best.mean()),
            "test_acc_best_cached_note": "reference-code metric: per client, max test accuracy over "
            "cached cluster models (selected on test data)",
            "per_client_test_acc_best_cached": best.tolist(),
            "splits": self.splits,
        }

    def cluster_state(self) -> dict:
        """Clusters, cache, splits and last evaluation (for checkpoints)."""
        return {"clusters": self.clusters, "cache": self.cache, "splits": self.splits, "last_eval": self.last_eval}

    def load_cluster_state(self, state: dict) -> None:
        """Restore the state written by :meth:`cluster_state`."""
        self.clusters = [list(c) for c in state["clusters"]]
        self.cache, self.splits, self.last_eval = state["cache"], state["splits"], state["last_eval"]


class GCFLPlusServer(GCFLServer):
    """GCFL+'s server: the cut uses DTW distances of gradient-norm sequences (paper sec. 5)."""

    def init_clusters(self, num_clients: int) -> None:
        """GCFL's start plus one empty gradient-norm sequence per client."""
        super().init_clusters(num_clients)
        self.sequences: list[list[float]] = [[] for _ in range(num_clients)]

    norm_parts = GCFLServer.norm_parts + ("grad_norms",)

    def note_norms(self, norms: dict[str, dict[int, float]]) -> None:
        """Append each client's gradient norm to its sequence."""
        for k, v in norms.get("grad_norms", {}).items():
            self.sequences[k].append(v)

    def ready_to_split(self) -> bool:
        """Whether every sequence holds ``seq_length`` norms."""
        return all(len(s) >= self.opts.seq_length for s in self.sequences)

    def similarity(self, rnd: int, members: list[int]) -> np.ndarray:
        """DTW similarity of the members' last ``seq_length`` gradient norms (GCFL+, Xie et al., NeurIPS 2021)."""
        seqs = [self.sequences[k][-self.opts.seq_length :] for k in members]
        return dtw_similarity(dtw_distances(seqs, self.opts.standardize))

    def after_split(self) -> None:
        """Restart every sequence."""
        self.sequences = [[] for _ in self.sequences]

    def cluster_state(self) -> dict:
        """GCFL's state plus the sequences."""
        return {**super().cluster_state(), "sequences": self.sequences}

    def load_cluster_state(self, state: dict) -> None:
        """Restore the state written by :meth:`cluster_state`."""
        super().load_cluster_state(state)
        self.sequences = state["sequences"]
