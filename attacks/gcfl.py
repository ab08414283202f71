"""What GCFL's clustering statistics tell the server: which clients hold the same kind of data.

The server of GCFL decides the clusters, so it legitimately learns the cosine
similarities of every pair of members' updates (:mod:`protocols.similarity`).  This attack asks how much
that matrix reveals about the clients' *datasets*: for every pair of clients it guesses "same
dataset" from the similarity, scored by the rank AUC over pairs (chance 0.5; ground truth:
each client's dataset name).

What the server reads (its :class:`~attacks.base.View` only):

* ``plain``: the readable model uploads of the latest round (``<algorithm>/model``: each
  client's weighted update ``[Q(w_i dW_i / 4), F(w_i / 4)]``, weight slot dropped) -> cosine of
  every pair;
* ``ckks``: the uploads are ciphertexts; the latest decrypted similarity vector the decider
  returned (``<algorithm>/similarity``, kind plain) for the members of that split, in the
  order of their encrypted uploads.  No split, no matrix: the attack is not applicable.
"""

from __future__ import annotations

import numpy as np

from protocols.similarity import cosine_matrix
from protocols.transcript import SERVER, party_client

from .base import Attack, AttackResult, GroundTruth, View, dense_vector, roc_auc
from .gin_inversion import GRAPH_ALGORITHMS
from .significance import auc_estimate

__all__ = ["DOMAINS", "server_similarity", "same_dataset_auc", "SameDatasetInference"]

#: the data domain of every TU dataset of GCFL's groups (the paper's molecules / proteins / social
#: split); in the one-dataset-per-client groups the attack asks "same domain?"
DOMAINS = {
    **{n: "molecules" for n in ("MUTAG", "BZR", "COX2", "DHFR", "PTC_MR", "AIDS", "NCI1")},
    **{n: "bioinformatics" for n in ("ENZYMES", "DD", "PROTEINS")},
    **{n: "social" for n in ("COLLAB", "IMDB-BINARY", "IMDB-MULTI")},
}


def server_similarity(view: View, num_shared: int, algorithm: str = "gcfl") -> tuple[list[int], np.ndarray] | None:
    """``(clients, [m, m] cosine matrix)`` the server can read, or ``None``.

    ``num_shared``: the public number of shared parameters (the upload is ``[n_i dW_i, n_i]`` + padding).
    """
    model_tag, sim_tag = f"{algorithm}/model", f"{algorithm}/similarity"
    rnd = view.latest_round(model_tag, receiver=SERVER)
    if rnd is not None:
        ups = {}
        for m in view.select(model_tag, receiver=SERVER, round=rnd):  # a split round averages twice
            vec = dense_vector(view.payload(m), num_shared)
            if vec is not None and party_client(m.sender) not in ups:
                ups[party_client(m.sender)] = vec
        ups = list(ups.items())
        if len(ups) >= 2:
            return [k for k, _ in ups], cosine_matrix(np.stack([v for _, v in ups]))
    rnd = view.latest_round(sim_tag, receiver=SERVER)
    if rnd is None:
        return None
    members, values = [], None
    for msg in view.select(sim_tag, receiver=SERVER, round=rnd):  # uploads, then the decider's reply
        if msg.kind == "plain":
            values = view.payload(msg)
            if isinstance(values, dict):  # as the client runtimes record it
                values = values.get("values")
            if values is not None:
                last = (members, np.asarray(values, dtype=np.float64))
            members = []
        elif msg.kind == "ciphertext":  # the decider's key message is not an upload
            members.append(party_client(msg.sender))
    if values is None:
        return None
    members, values = last
    upper = np.zeros((len(members), len(members)))
    upper[np.triu_indices(len(members), 1)] = values
    return members, upper + upper.T + np.eye(len(members))


def same_dataset_pairs(
    clients: list[int], similarity: np.ndarray, datasets: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Scores and "same dataset" labels of all pairs of ``clients``."""
    i, j = np.triu_indices(len(clients), 1)
    labels = np.array([int(datasets[clients[a]] == datasets[clients[b]]) for a, b in zip(i, j)])
    return similarity[i, j], labels


def same_dataset_auc(clients: list[int], similarity: np.ndarray, datasets: list[str]) -> float:
    """Rank AUC of "same dataset" over all pairs of ``clients`` scored by ``similarity``.

    ``nan`` when every pair is same, or every pair different.
    """
    scores, labels = same_dataset_pairs(clients, similarity, datasets)
    if len(set(labels.tolist())) < 2:
        return float("nan")
    return roc_auc(scores, labels)


class SameDatasetInference(Attack):
    """The server guesses which clients hold the same dataset from the similarity it reads.

    The same domain, where each client holds its own dataset (``--attacks gcfl_same_dataset``; module docstring).
    """

    name = "gcfl_same_dataset"
    exchange = "*/model"
    algorithms = GRAPH_ALGORITHMS

    def run(self, view: View, knowledge) -> AttackResult:
        """Read the client-update similarity matrix the server sees (``None`` result when nothing is readable)."""
        pub = knowledge["public"]
        read = server_similarity(view, int(pub["num_shared"]), pub["algorithm"])
        if read is None:
            return self.not_applicable("no readable update or similarity reached the server")
        clients, sim = read
        return self.result(output=(clients, sim), metrics={"clients": len(clients)})

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """AUC of the similarity for telling same-dataset client pairs from the others."""
        clients, sim = res.output
        datasets = [c.dataset for c in truth.clients]
        if len(set(datasets)) == len(datasets):  # one dataset per client: ask for the domain
            datasets = [DOMAINS.get(d, d) for d in datasets]
        scores, labels = same_dataset_pairs(clients, sim, datasets)
        if len(set(labels.tolist())) < 2:
            return self.not_applicable("every pair read is the same dataset (or every pair differs): nothing to tell")
        return res.add(auc_estimate("auc", scores, labels), primary=True)
