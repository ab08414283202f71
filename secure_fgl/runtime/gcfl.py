"""GCFL and GCFL+ (Xie et al., NeurIPS 2021, sec. 4-5) as a client logic and a server strategy.

The server's decisions are :class:`~secure_fgl.algorithms.gcfl.GCFLServer`'s (clusters, eq. 4-5,
Stoer-Wagner cut, the cache behind ``test_acc_best_cached``); the strategy plays its hooks over
the executor, so the server sees only what the clients send:

* the cluster mean: :class:`~.graph_level.GraphStrategy`'s grid sum to the members only;
* ``delta_mean`` (eq. 4): the first member reports the norm of the mean it decoded
  (tag ``<algorithm>/mean_norm``); ``delta_max`` (eq. 5): every member reports ``||dW_i||``
  (``<algorithm>/update_norms``); GCFL+: every client reports its last gradient norm of the
  shared layers (``<algorithm>/grad_norms``).  Each report is one recorded client -> server
  message in the clear (the documented leak of the decision rule, :mod:`protocols.pairwise`);
* GCFL's cosine matrix (``<algorithm>/similarity``), only when eq. 4-5 fire:
  ``plain``: each member sends its update (recorded: in plain the server reads updates anyway);
  ``ckks``: the steps of :mod:`protocols.ckks.pairwise` with every party apart -- the decider
  (``--decider``) makes the key pair in its runtime (once per session, tag ``.../keys``), the
  server relays the public encryption context to the other clients, each member encrypts its
  normalised update in its runtime, the server evaluates the inner products with the
  evaluation context (no secret key), the decider decrypts only the pair results.

These messages are runtime frames (recorded with their length), not signed envelopes of a
protocol half: the pairwise exchange is not a stage of the backends' halves yet.
"""
from __future__ import annotations

import numpy as np

from protocols import SERVER, client_party
from protocols.pairwise import cosine_matrix

from ..algorithms.gcfl import GCFLPlusServer, GCFLServer
from ..algorithms.graph_level import last_round_metrics
from ..algorithms.options import GCFLOptions, GCFLPlusOptions
from .graph_level import GraphLogic, GraphStrategy
from .strategy import Strategy


def _bytes(frames: list[bytes]) -> dict:
    return {"data": np.frombuffer(b"".join(frames), dtype=np.uint8),
            "lengths": np.array([len(f) for f in frames], dtype=np.int64)}


def _frames(fields: dict) -> list[bytes]:
    data = fields["data"].tobytes()
    ends = np.cumsum(fields["lengths"])
    return [data[e - n:e] for e, n in zip(ends, fields["lengths"])]


class GCFLLogic(GraphLogic):
    """A GCFL/GCFL+ client: :class:`~.graph_level.GraphLogic` plus the scalars it reports and
    its side of the pairwise exchange (the decider's secret key stays here)."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        self.pairwise_secret = None        # the decider's secret context (ckks)
        self.pairwise_public = None        # the encryption context (public key only)

    def contribute(self, req: dict) -> dict:
        tag, name = req["tag"], self.cfg.algorithm
        if tag == f"{name}/mean_norm":
            return {"value": float(np.linalg.norm(self.mean))}
        if tag == f"{name}/update_norms":
            return {"value": float(self.learner.update().norm())}
        if tag == f"{name}/grad_norms":
            return {"value": float(self.learner.grad_norm)}
        if tag == f"{name}/similarity/keys":
            from protocols.ckks.pairwise import make_key_pair, public_context
            self.pairwise_secret, evaluation, encryption = make_key_pair()
            self.pairwise_public = public_context(encryption)
            return {"evaluation": np.frombuffer(evaluation, np.uint8), "encryption": np.frombuffer(encryption, np.uint8)}
        if tag == f"{name}/similarity":
            update = self.learner.update().cpu().numpy()
            if self.cfg.mode == "plain":
                return {"update": update}
            from protocols.ckks.pairwise import encrypt_unit
            frames, nonzero = encrypt_unit(self.pairwise_public, update, tag=tag, rnd=int(req["round"]),
                                           client=self.rt.client_id)
            return {**_bytes(frames), "nonzero": bool(nonzero)}
        if tag == f"{name}/similarity/decrypt":
            from protocols.ckks.pairwise import decrypt_pairs
            return {"values": decrypt_pairs(self.pairwise_secret, _frames(req))}
        return super().contribute(req)

    def receive(self, req: dict) -> dict:
        if req["tag"] == f"{self.cfg.algorithm}/similarity/keys":      # the decider's public key
            from protocols.ckks.pairwise import public_context
            self.pairwise_public = public_context(req["encryption"].tobytes(), req["tag"], int(req["round"]))
            return {}
        return super().receive(req)


class GCFLStrategy(GraphStrategy, GCFLServer):
    """GCFL's server over the executor (module docstring)."""

    options_class = GCFLOptions

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.opts = self.options_class(**options)
        self.init_clusters(facts.num_clients)
        self.pairwise_evaluation = None      # the server's evaluation context (ckks), per session

    def cluster_round(self, rnd: int, updated: list[int]) -> None:
        self.split_clusters(rnd, updated)

    def reported(self, tag: str, rnd: int, clients: list[int]) -> dict[int, float]:
        """One scalar from each client, recorded as its message."""
        got = self.ask("contribute", {k: {"tag": tag, "round": rnd} for k in clients}, record=(tag, "plain"))
        return {k: float(r["value"]) for k, r in got.items()}

    # ------------------------------------------------------------------ GCFLServer's hooks
    def mean_norm(self, rnd: int, members: list[int], mean=None) -> float:
        return self.reported(f"{self.name}/mean_norm", rnd, members[:1])[members[0]]

    def update_norms(self, rnd: int, members: list[int]) -> dict[int, float]:
        return self.reported(f"{self.name}/update_norms", rnd, members)

    def cosine(self, rnd: int, members: list[int]) -> np.ndarray:
        tag = f"{self.name}/similarity"
        if self.protocol.mode == "plain":
            got = self.ask("contribute", {k: {"tag": tag, "round": rnd} for k in members}, record=(tag, "plain"))
            self.check_lost(members, tag)
            return cosine_matrix(np.stack([np.asarray(got[k]["update"], dtype=np.float64) for k in members]))
        return self.encrypted_cosine(tag, rnd, members)

    def encrypted_cosine(self, tag: str, rnd: int, members: list[int]) -> np.ndarray:
        """:mod:`protocols.ckks.pairwise` with the decider, the members and the server apart."""
        from protocols.ckks.pairwise import cosine_from_pairs, inner_products, public_context
        decider = int(self.opts.decider)
        self.check_lost([decider], f"{tag} (the decider holds the pairwise key)")
        if self.pairwise_evaluation is None:            # keys: once per session
            keys = self.ask("contribute", {decider: {"tag": f"{tag}/keys", "round": rnd}})[decider]
            self.pairwise_evaluation = public_context(keys["evaluation"].tobytes(), tag, rnd)
            self.record(f"{tag}/keys", client_party(decider), SERVER, "public_key", keys["evaluation"].size)
            others = {k: {"tag": f"{tag}/keys", "round": rnd, "encryption": keys["encryption"]}
                      for k in range(self.num_clients) if k != decider}
            for k in others:
                self.record(f"{tag}/keys", client_party(decider), client_party(k), "public_key",
                            keys["encryption"].size, relay=SERVER)
            self.tell("receive", others)
        up = self.ask("contribute", {k: {"tag": tag, "round": rnd} for k in members}, record=(tag, "ciphertext"))
        self.check_lost(members, tag)
        results = inner_products(self.pairwise_evaluation, [_frames(up[k]) for k in members], tag=tag, rnd=rnd)
        request = {"tag": f"{tag}/decrypt", "round": rnd, **_bytes(results)}
        self.record(tag, SERVER, client_party(decider), "ciphertext", request["data"].size)
        values = self.ask("contribute", {decider: request}, record=(tag, "plain"))[decider]["values"]
        return cosine_from_pairs(values, [bool(up[k]["nonzero"]) for k in members])

    # ------------------------------------------------------------------ reporting, checkpoints
    def final_metrics(self) -> dict:
        last = self.evaluate()["per_client"]
        return {**Strategy.final_metrics(self), **last_round_metrics(last, self.clusters),
                **self.best_cached(self.num_clients)}

    def server_state(self) -> dict:
        return self.cluster_state()

    def load_server_state(self, state: dict) -> None:
        self.load_cluster_state(state)


class GCFLPlusStrategy(GCFLStrategy, GCFLPlusServer):
    """GCFL+'s server: the cut on DTW of the reported gradient-norm sequences."""

    options_class = GCFLPlusOptions

    def grad_norms(self, rnd: int, clients: list[int]) -> dict[int, float]:
        return self.reported(f"{self.name}/grad_norms", rnd, clients)
