"""Where an attack's party-held knowledge comes from: the party itself.

The runner (:mod:`attacks.runner`) builds each attack's declared knowledge.  What a *party*
holds after the run -- a client's own data, the rows it decoded, its deployed model and that
model's answers, a colluding client's keys -- is asked of that party: each client lives in its
own :class:`~secure_fgl.runtime.client.ClientRuntime`, so :class:`RuntimeParties` sends the
observer client an ``attack`` request through the executor and reads the bytes it answers
(:meth:`~secure_fgl.runtime.logic.ClientLogic.attack_state`).  These requests are the
evaluation's oracle access, after training: they are counted in the executor's statistics
(method ``attack``) but are not protocol messages, so the transcript (what ``comm``, the
audit and every view read) is that of the run.

What the *server* observer reads is the server half's transcript (the driver holds it).
Declared side knowledge that no single party holds (K1/K2: the global topology, the victim's
local topology, the labelled auxiliary sample, the membership candidates) and the
ground truth that *scores* an attack (:class:`~attacks.base.GroundTruth`) are the evaluator's:
the runner takes them from the driver's partitioned data (on Flower, where the driver holds
none, from the parts the opted-in sites report: :mod:`attacks.reported`), and ground truth
never enters an attack's ``run``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch


class RuntimeParties:
    """Party state asked of each client's runtime through the executor."""

    def __init__(self, strategy):
        self.strategy = strategy
        self._released = None

    def _ask(self, k: int, what: str, x: np.ndarray | None = None) -> dict:
        """Client ``k``'s view, asked of the runtime holding it (an :class:`~secure_fgl.runtime.messages.AttackIns`).

        The centralized reference: the one runtime, which answers for the nodes client ``k`` owns.
        """
        from secure_fgl.runtime import wire
        from secure_fgl.runtime.messages import AttackIns, StateRes, decode_reply, encode_request

        host = self.strategy.host_of(k)
        request = encode_request("attack", AttackIns(what, client=k, x=x))
        responses, lost = self.strategy.executor.call("attack", {host: wire.pack(request)}, label=what)
        if host not in responses:
            raise RuntimeError(f"client {k} cannot answer the attack suite: {lost.get(host, 'lost')}")
        reply = decode_reply("attack", wire.unpack(responses[host]))
        assert isinstance(reply, StateRes)  # decode_reply's class for "attack"
        return dict(reply.state)

    def own_data(self, k: int):
        """Client ``k``'s subgraph, as its runtime reports it."""
        from secure_fgl.data.federated import ClientSubgraph

        f = self._ask(k, "own_data")
        return ClientSubgraph(k, **{name: torch.from_numpy(a) for name, a in f.items()})

    def own_graphs(self, k: int) -> dict:
        """Graph client ``k``'s graphs as its runtime reports them.

        The arrays of :func:`~secure_fgl.runtime.graph_data.graph_fields`.
        """
        return self._ask(k, "own_data")

    def received(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``(node ids, totals)`` client ``k`` decrypted in its row exchanges, or None."""
        f = self._ask(k, "received")
        return (f["nodes"], f["totals"]) if f else None

    def contributions(self, k: int) -> dict:
        """Client ``k``'s memory of the dense exchanges.

        ``{tag: {"upload": (round, vector), "aggregate": (round, decoded result)}}``.
        """
        f = self._ask(k, "contributions")
        out: dict = {}
        for name, value in f.items():
            kind, tag = name.split(":", 1)
            if kind in ("upload", "aggregate"):
                out.setdefault(tag, {})[kind] = (int(f[f"{kind}_round:{tag}"]), np.asarray(value, np.float64))
        return out

    def released_model(self) -> torch.nn.Module | None:
        """The model the clients deploy: client 0's (the first alive client's) after the last round."""
        if self._released is None:
            alive = self.strategy.alive()
            self._released = self._model_of(alive[0]) if alive else None
        return self._released

    def victim_model(self, k: int) -> torch.nn.Module | None:
        """Client ``k``'s model after the run (graph classification: its own GIN shape)."""
        return self._model_of(k, client=k)

    def _model_of(self, k: int, **shape) -> torch.nn.Module | None:
        """Client ``k``'s deployed parameters loaded into the logic's public ``architecture``."""
        from secure_fgl.algorithms import get_spec

        s = self.strategy
        state = self._ask(k, "model")
        arch = getattr(get_spec(s.cfg.algorithm).logic_class(), "architecture", None)
        if not state or arch is None:
            return None
        with torch.random.fork_rng(devices=[]):  # building it must not move the driver's RNG
            model = arch(s.cfg, s.facts, s.opts, **shape)
        model.load_state_dict({n[len("param:") :]: torch.from_numpy(a) for n, a in state.items()})
        return model

    def posteriors(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(global ids, posteriors)`` of client ``k``'s nodes under its deployed model."""
        f = self._ask(k, "posteriors")
        return f["global_ids"], f["posteriors"][: f["global_ids"].size]

    def query_api(self, t: int) -> dict | None:
        """Query access to client ``t``'s model: features, node ids and a features -> log-posteriors function."""
        inputs = self._ask(t, "inputs")
        if not inputs:
            return None

        def query(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(self._ask(t, "query", x=x.detach().cpu().float().numpy())["log_posteriors"])

        return {
            "client": t,
            "features": torch.from_numpy(inputs["features"]),
            "query": query,
            "global_ids": inputs["global_ids"],
        }

    def ckks_keys(self, clients: list[int]):
        """The key ring the first colluding client hands the coalition (its secret contexts)."""
        if not clients or self.strategy.protocol.mode != "ckks":
            return None
        return _KeyRing(self._ask(clients[0], "keys"))


class _KeyRing:
    """Secret contexts a colluding client handed over, by public fingerprint.

    ``by_fingerprint`` as :class:`protocols.ckks.keys.ClientKeyRing`.
    """

    def __init__(self, secrets: dict):
        import tenseal as ts

        self._contexts = {fp: ts.context_from(raw.tobytes()) for fp, raw in secrets.items()}

    def by_fingerprint(self, fingerprint: str):
        ctx = self._contexts.get(fingerprint)
        return None if ctx is None else SimpleNamespace(context=ctx)


def party_access(strategy) -> RuntimeParties:
    """The party adapter of a finished run (its server strategy)."""
    return RuntimeParties(strategy)
