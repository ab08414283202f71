"""Run the attack suite on a finished experiment: ``run_attacks(names, algo=, protocol=, fed=, cfg=)``.

Called by :func:`secure_fgl.experiment.run_experiment` after training; returns the list stored
under ``result['attacks']``.  The first entry is the transcript audit (:mod:`attacks.audit`);
then one entry per attack: ``{name, observer, exchange, metric, value, chance, applicable,
reason?, at_chance?, seconds, ...extra metrics}``.

Each attack gets **only** its observer's :class:`~attacks.base.View` of the transcript and the
background knowledge it declares.  The runner builds that knowledge here.  What a party holds
is asked of that party through :mod:`attacks.parties` (``P``: the client's runtime, through the
executor);
declared side knowledge and the ground truth come from the driver's partitioned data (``fed``;
on Flower, where the driver loads none, from the parts the opted-in sites report,
:mod:`attacks.reported`: then ``aux_labelled`` is drawn from the reported nodes):

=================  ==========================================================================
knowledge          source (what a real party would hold)
=================  ==========================================================================
public             cfg + algorithm options + graph size/feature type (public protocol facts)
topology           ``fed.graph.edge_index`` + ``fed.owner`` (K2: a server that built the split)
own_data           ``P.own_data(k)``: the observer client's own data
received           ``P.received(k)``: the observer client's decoded FedGCN rows, every row of
                   every block it decrypted (its own legitimate output; more than the rows it
                   asked for where blocks mix recipients), keyed by node id
own_contributions  ``P.contributions(k)`` for each coalition member k: its last upload and the
                   aggregate it decoded of each dense exchange (what a colluding client
                   remembers; in secure modes the transcript holds neither in plaintext)
released_model     ``P.released_model()``: client 0's deployed model after the run (the global
                   model every client receives)
architecture       a deep copy of it (the public architecture)
victim_topology    the victim's local edge index / node count / train mask (declared K2)
posteriors         ``P.posteriors(k)`` for every k -- black-box answers of the deployed models
candidates         training (members) and test (non-members) node ids, balanced, with labels
query_api          ``P.query_api(t)``: client t's deployed model as an inference API on its own
                   subgraph (LinkTeller)
aux_labelled       K1: labels of a seeded 30 % node sample, read in its graph neighbourhood
hidden_fn          the released model's first hidden layer (FedOMD prototypes)
aux_graphs         K1, graph classification: each client's validation and test graphs (one
                   pool per source; never trained on) and the mean training-set size
coalition_keys     the protocol object (its transcript and public options) and
                   ``P.ckks_keys(C)``: the CKKS key ring a colluding client hands over
=================  ==========================================================================

Ground truth (``fed.graph``, ``fed.clients``) enters only :meth:`Attack.score`.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import time
import traceback
import warnings
from collections.abc import Callable

import numpy as np
import torch

from protocols.transcript import SERVER, client_party

from .audit import audit_protocol
from .base import Attack, AttackResult, GroundTruth, View, observer_parties
from .coalition import CoalitionAttack
from .fedgcn import ClientSubtraction, NeighbourSumInversion, NeighbourSumReadout
from .gcfl import SameDatasetInference
from .gin_inversion import GINUpdateInversion
from .gradient import AggregateGradientInversion, GradientInversion, IsolatedGradientInversion
from .graph_property import GraphPropertyInference
from .model import InfluenceLinkInference, MembershipInference, PosteriorLinkInference
from .ownership import OwnershipInference, RequestOwnership
from .parties import party_access
from .reported import reported_federation
from .statistics import MomentLabelDistribution, ProxyLabelDistribution
from .update_labels import UpdateLabelDistribution

ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls
    for cls in (
        NeighbourSumReadout,
        NeighbourSumInversion,
        ClientSubtraction,
        GradientInversion,
        AggregateGradientInversion,
        IsolatedGradientInversion,
        ProxyLabelDistribution,
        MomentLabelDistribution,
        UpdateLabelDistribution,
        MembershipInference,
        PosteriorLinkInference,
        InfluenceLinkInference,
        CoalitionAttack,
        OwnershipInference,
        RequestOwnership,
        SameDatasetInference,
        GINUpdateInversion,
        GraphPropertyInference,
    )
}


def applies_to(cls: type[Attack], algorithm: str, graph_level: bool = False) -> bool:
    """An attack that names no algorithm reads node-level runs only."""
    if cls.algorithms is None:
        return not graph_level
    return algorithm.lower() in cls.algorithms


def resolve_names(names, algorithm: str, graph_level: bool = False) -> list[str]:
    """``['all']`` -> every attack that targets ``algorithm``; otherwise the names as given."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(names or [])
    if any(n == "all" for n in names):
        return [n for n, cls in ATTACKS.items() if applies_to(cls, algorithm, graph_level)]
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown attack(s) {unknown}; known: {', '.join(ATTACKS)} or 'all'")
    return names


# ----------------------------------------------------------------------------- knowledge
class RunContext:
    """Builds declared knowledge from a finished run (see the module docstring)."""

    def __init__(self, algo, protocol, fed, cfg):
        self.algo, self.protocol, self.fed, self.cfg = algo, protocol, fed, cfg
        self.parties = party_access(algo)
        self._posteriors = None
        self.seed = int(getattr(cfg, "seed", 0))

    # -- helpers
    def _options(self) -> dict:
        o = getattr(self.algo, "opts", None)
        if o is not None and dataclasses.is_dataclass(o):
            return dataclasses.asdict(o)
        if isinstance(o, dict):  # a server strategy's options
            return dict(o)
        return dict(getattr(self.cfg, "options", {}) or {})

    def _global_model(self):
        return self.parties.released_model()

    # -- providers
    def public(self, **_) -> dict:
        """Public facts of the run: sizes, mode, algorithm, its public options and training hyper-parameters."""
        cfg, fed = self.cfg, self.fed
        algo_name = getattr(self.algo, "name", cfg.algorithm)
        if not hasattr(fed, "graph"):  # graph classification: per-client models
            from secure_fgl.algorithms.graph_level.ops import initial_shared

            return {
                "num_clients": int(fed.num_clients),
                "mode": cfg.mode,
                "algorithm": algo_name,
                "options": self._options(),
                "lr": cfg.lr,
                "hidden": cfg.hidden,
                "num_layers": cfg.num_layers,
                "local_epochs": cfg.local_epochs,
                "num_shared": int(initial_shared(cfg).numel()),
                "seed": cfg.seed,
                "dropout": cfg.dropout,
                "weight_decay": cfg.weight_decay,
                "num_classes": max(c.num_classes for c in fed.clients),
            }
        d = int(fed.num_features)
        opts = self._options()
        return {
            "num_nodes": int(fed.graph.num_nodes),
            "num_features": d,
            "num_classes": int(fed.num_classes),
            "num_clients": int(fed.num_clients),
            "binary_features": bool(fed.binary_features),
            "mode": cfg.mode,
            "algorithm": algo_name,
            "options": opts,
            "dp_epsilon": cfg.dp_epsilon,
            "dp_clip": cfg.dp_clip,
            "lr": cfg.lr,
            "weight_decay": cfg.weight_decay,
            "local_epochs": cfg.local_epochs,
            "model": cfg.model,
            "hidden": cfg.hidden,
            "num_layers": cfg.num_layers,
            "dropout": cfg.dropout,
            "rounds": cfg.rounds,
            "optimizer": str(getattr(cfg, "optimizer", "adam")),
            "momentum": float(getattr(cfg, "momentum", 0.0)),
            # FedGCN rows are [sum x_j, count]: the ones column is part of the public protocol
            "row_width": d + 1 if algo_name == "fedgcn" else None,
        }

    def topology(self, **_) -> dict:
        """The global edge index and node owners (knowledge K2)."""
        return {"edge_index": self.fed.graph.edge_index.cpu().numpy(), "owner": self.fed.owner.cpu().numpy()}

    def own_data(self, observer: str, **_):
        """The subgraph of the observing client, or of each client of a coalition."""
        ks = [int(p[6:]) for p in observer_parties(observer) if p.startswith("client")]
        if len(ks) == 1:
            return self.parties.own_data(ks[0])
        return {k: self.parties.own_data(k) for k in ks}

    def received(self, observer: str, **_):
        """FedGCN totals of every row the observer client decrypted, keyed by node id.

        The whole blocks it received, not only the rows it asked for.
        """
        if getattr(self.algo, "name", "") != "fedgcn":
            return None
        parties = observer_parties(observer)
        if len(parties) != 1 or not parties[0].startswith("client"):
            return None
        got = self.parties.received(int(parties[0][6:]))
        if got is None:
            return None
        nodes, rows = got
        from .fedgcn import EXCHANGE

        tag = "fedgcn/neighbour_sums"
        tags = [
            m.tag
            for m in self.protocol.transcript.messages
            if fnmatch.fnmatchcase(m.tag, EXCHANGE) and not m.tag.endswith("/model")
        ]
        if tags:
            tag = tags[0]
        real = nodes >= 0  # padding rows hold no node
        return {tag: (nodes[real], rows[real].astype(np.float64))}

    def own_contributions(self, observer: str, **_) -> dict:
        """What the observer's clients uploaded and decoded (each client's own memory of the exchanges).

        ``{"uploads": {tag: {round: {k: vector}}}, "aggregates": {tag: {round: vector}}}``.
        """
        uploads: dict = {}
        aggregates: dict = {}
        for p in observer_parties(observer):
            if not p.startswith("client"):
                continue
            k = int(p[6:])
            for tag, got in self.parties.contributions(k).items():
                if "upload" in got:
                    rnd, vec = got["upload"]
                    uploads.setdefault(tag, {}).setdefault(rnd, {})[k] = vec
                if "aggregate" in got:
                    rnd, vec = got["aggregate"]
                    aggregates.setdefault(tag, {})[rnd] = vec
        return {"uploads": uploads, "aggregates": aggregates}

    def released_model(self, **_):
        """A CPU copy of the released global model, or None."""
        m = self._global_model()
        return None if m is None else copy.deepcopy(m).cpu()

    def architecture(self, **_):
        """A factory of fresh copies of the global model's architecture, or None."""
        m = self._global_model()
        if m is None:
            return None
        template = copy.deepcopy(m).cpu()
        return lambda: copy.deepcopy(template)

    def victim_topology(self, attack: Attack, **_):
        """The victim client's node count, edges and training mask."""
        v = int(attack.opts.get("victim", 0))
        c = self.fed.clients[v]
        return {
            "client": v,
            "num_nodes": c.num_nodes,
            "edge_index": c.edge_index.cpu(),
            "train_mask": c.train_mask.cpu(),
        }

    def victim_graphs(self, attack: Attack, **_) -> dict:
        """K2 (graph classification): the structure of the victim's training graphs, no features or labels."""
        c = self.fed.clients[int(attack.opts.get("victim", 0))]
        return {
            "client": c.client_id,
            "structure": [(g.edge_index.cpu(), int(g.num_nodes)) for g in c.train],
            "num_features": c.num_features,
            "num_classes": c.num_classes,
        }

    def aux_graphs(self, **_) -> dict | None:
        """K1 (graph classification).

        Graphs from the clients' distribution that no client trains on (each client's validation and test graphs: one
        pool per client), and the mean training-set size.
        """
        if hasattr(self.fed, "graph"):
            return None
        clients = self.fed.clients
        return {
            "pools": [[*c.val, *c.test] for c in clients],
            "graphs_per_client": max(1, round(float(np.mean([len(c.train) for c in clients])))),
        }

    def victim_model(self, attack: Attack, **_):
        """K3 (graph classification): a copy of the victim's model (private layers included) after the run."""
        return copy.deepcopy(self.parties.victim_model(int(attack.opts.get("victim", 0)))).cpu()

    def posteriors(self, **_):
        """The deployed posteriors of every node (rows of unowned nodes NaN), cached."""
        if self._posteriors is None:
            N, C = int(self.fed.graph.num_nodes), int(self.fed.num_classes)
            P = np.full((N, C), np.nan)
            with torch.no_grad():
                for k in range(self.fed.num_clients):
                    ids, p = self.parties.posteriors(k)
                    P[ids] = p
            self._posteriors = P
        return self._posteriors

    def candidates(self, **_):
        """Up to 1,000 training and 1,000 test nodes, shuffled, with their labels (membership candidates)."""
        g = self.fed.graph
        rng = np.random.default_rng([self.seed, 77])
        kept = self.fed.owner.cpu().numpy() >= 0
        tr = np.flatnonzero(g.train_mask.cpu().numpy() & kept)
        te = np.flatnonzero(g.test_mask.cpu().numpy() & kept)
        m = min(tr.size, te.size, 1000)
        ids = np.concatenate([rng.choice(tr, m, replace=False), rng.choice(te, m, replace=False)])
        rng.shuffle(ids)
        return {"ids": ids, "labels": g.y.cpu().numpy()[ids]}

    def query_api(self, attack: Attack, observer: str, **_):
        """Query access to a target client's model (another client when the observer is the target)."""
        t = int(attack.opts.get("target_client", 0)) if "target_client" in attack.opts else 0
        if observer_parties(observer) == [client_party(t)]:
            t = 1 if self.fed.num_clients > 1 else 0
        return self.parties.query_api(t)

    def aux_labelled(self, **_):
        """K1 shadow data.

        A seeded 30 % of the nodes (of the nodes some client owns, from the sites' reports) with labels, read in
        their neighbourhood (features and edges of the graph they live in; only their labels are 'extra').
        """
        g = self.fed.graph
        pool = getattr(self.fed, "reported_nodes", None)  # sites' reports: only the nodes some client owns
        n = int(g.num_nodes) if pool is None else int(pool.numel())
        rng = np.random.default_rng([self.seed, 99])
        ids = np.sort(rng.choice(n if pool is None else pool.numpy(), max(1, int(0.3 * n)), replace=False))
        return {"ids": ids, "x": g.x, "y": g.y.cpu().numpy()[ids], "edge_index": g.edge_index}

    def hidden_fn(self, **_):
        """A function (x, edge_index) -> the global model's first hidden layer, clamped to the activation bounds.

        For FedOMD the mean of 8 training-mode passes, matching how it computes its statistics.
        """
        m = self._global_model()
        if m is None:
            return None
        model = copy.deepcopy(m)
        dev = next(model.parameters()).device
        opts = self._options()
        lo, hi = opts.get("act_low"), opts.get("act_high")

        # FedOMD computes its statistics in a training-mode pass (dropout on): average a few
        train_mode = getattr(self.algo, "name", "") == "fedomd"

        def fn(x, edge_index):
            model.train(train_mode)
            outs = []
            with torch.no_grad():
                x, edge_index = x.to(dev), edge_index.to(dev)
                for _ in range(8 if train_mode else 1):
                    try:
                        _, hidden = model(x, edge_index, return_hidden=True)
                        h = hidden[0]
                    except TypeError:
                        h = model.embed(x, edge_index)
                    if lo is not None and hi is not None:
                        h = h.clamp(float(lo), float(hi))
                    outs.append(h)
            model.eval()
            return torch.stack(outs).mean(0).cpu().numpy()

        return fn

    def coalition_keys(self, observer: str, **_) -> dict:
        """The colluding clients' own protocol secrets (simulated client memory)."""
        clients = [int(p[6:]) for p in observer_parties(observer) if p.startswith("client")]
        return {"protocol": self.protocol, "clients": clients, "ckks_keys": self.parties.ckks_keys(sorted(clients))}

    def knowledge_for(self, attack: Attack, observer: str) -> dict:
        """The knowledge ``attack`` declares, each from the provider method of that name (absent if none)."""
        out = {}
        for name in attack.knowledge:
            provider: Callable | None = getattr(self, name, None)
            if provider is None:
                continue
            val = provider(attack=attack, observer=observer)
            if val is not None or name in ("received", "own_contributions"):
                out[name] = val
        return out

    def opener(self):
        """The protocol's ``open_for`` (decrypts with a party's keys), or None."""
        return getattr(self.protocol, "open_for", None)


# ----------------------------------------------------------------------------- running
def _observers(attack: Attack, num_clients: int) -> list[str]:
    obs = attack.observer
    if obs == "client:each":
        return [f"client:{k}" for k in range(num_clients)]
    if obs == "coalition:others":
        v = int(attack.opts.get("victim", 0))
        others = [k for k in range(num_clients) if k != v]
        return ["coalition:[" + ",".join(map(str, others)) + "]"] if others else []
    return [obs]


def _exchange_present(cls: type[Attack], tags: list[str]) -> bool:
    if not cls.needs_exchange:
        return True
    return any(
        fnmatch.fnmatchcase(t, cls.exchange) and not (cls.exchange.endswith("/*") and t.endswith("/model"))
        for t in tags
    )


def _entry(res: AttackResult, seconds: float, *, secure: bool, audit_passed: bool) -> dict:
    res.metrics.pop("exposed_mask", None)
    d = res.to_dict()
    d["seconds"] = round(seconds, 3)
    if secure:
        d["audit_passed"] = audit_passed
        if not res.applicable and res.observer == SERVER:
            d["at_chance"] = bool(audit_passed)
    return d


def run_attacks(names, *, algo, protocol, fed, cfg, options: dict[str, dict] | None = None) -> list[dict]:
    """Run ``names`` (or ``['all']``) on a finished run.

    Args:
        names (list[str]): Attack names, or ``['all']`` for every attack that targets the run's algorithm.
        algo (object): The finished run's algorithm (server strategy or in-process algorithm).
        protocol (protocols.base.Protocol): Its protocol (transcript, keys).
        fed (object): Its federation (ground truth for scoring), or the public facts the sites described
            (:class:`~secure_fgl.runtime.flower_executor.SiteFederation`): the ground truth is then what the
            sites report (:mod:`attacks.reported`).
        cfg (secure_fgl.config.RunConfig): Its configuration.
        options: Per-attack keyword options, e.g. ``{'gradient_inversion': {'iterations': 50}}``.

    Returns:
        JSON-ready entries: the transcript audit, then one entry per attack (not-applicable ones with the reason;
        an attack that fails becomes an entry with its error).
    """
    algorithm = getattr(algo, "name", cfg.algorithm)
    if hasattr(fed, "digests"):  # the sites hold the data: the ground truth is what they report
        fed = reported_federation(fed, party_access(algo), cfg.dataset)
    unreported = sorted(getattr(fed, "unreported", {}))
    if unreported:  # why each site reported nothing (not opted in, lost, or its error)
        why = "; ".join(f"client {k}: {fed.unreported[k]}" for k in unreported)
        warnings.warn(f"the attack suite has no ground truth for client(s) {unreported}: {why}", stacklevel=2)
    graph_level = not hasattr(fed, "graph")
    selected = resolve_names(names, algorithm, graph_level)
    options = dict(options or {})
    ctx = RunContext(algo, protocol, fed, cfg)
    truth = GroundTruth.from_graph_fed(fed) if graph_level else GroundTruth.from_fed(fed)
    audit = audit_protocol(protocol)
    secure = audit.secure
    entries = [
        {
            "name": "transcript_audit",
            "observer": SERVER,
            "exchange": "*",
            "metric": "passed",
            "value": 1.0 if audit.passed else 0.0,
            "chance": None,
            "applicable": True,
            "secure": secure,
            "failures": audit.failures[:20],
            "num_failures": len(audit.failures),
            "warnings": audit.warnings[:20],
            "num_warnings": len(audit.warnings),
            "exchanges": audit.exchanges,
        }
    ]
    tags = protocol.transcript.tags()
    opener = ctx.opener()
    for name in selected:
        cls = ATTACKS[name]
        attack = cls(**options.get(name, {}))
        t0 = time.perf_counter()
        if not applies_to(cls, algorithm, graph_level):
            entries.append(
                _entry(
                    attack.not_applicable(
                        f"targets {', '.join(cls.algorithms or ('node-level runs',))}, not {algorithm}"
                    ),
                    0.0,
                    secure=secure,
                    audit_passed=audit.passed,
                )
            )
            continue
        if unreported:
            entries.append(
                _entry(
                    attack.not_applicable(
                        f"its ground truth needs the data of client(s) {unreported}, whose site(s) reported none "
                        "(start them with --allow-attack-simulation)"
                    ),
                    0.0,
                    secure=secure,
                    audit_passed=audit.passed,
                )
            )
            continue
        if not _exchange_present(cls, tags):
            entries.append(
                _entry(
                    attack.not_applicable(f"exchange {cls.exchange} absent from the transcript"),
                    0.0,
                    secure=secure,
                    audit_passed=audit.passed,
                )
            )
            continue
        observers = _observers(attack, fed.num_clients)
        results = []
        try:
            for obs in observers:
                a = cls(observer=obs, **options.get(name, {}))
                view = View.of(protocol.transcript, obs, opener=opener)
                results.append(a(view, ctx.knowledge_for(a, obs), truth))
        except Exception as e:  # one attack failing must not lose the run
            warnings.warn(f"attack {name} failed: {e!r}")
            res = attack.not_applicable(f"error: {type(e).__name__}: {e}")
            d = _entry(res, time.perf_counter() - t0, secure=secure, audit_passed=audit.passed)
            d["error"] = traceback.format_exc(limit=3)[-2000:]
            entries.append(d)
            continue
        seconds = time.perf_counter() - t0
        if not results:
            entries.append(
                _entry(
                    attack.not_applicable("no observer for this attack in this run"),
                    seconds,
                    secure=secure,
                    audit_passed=audit.passed,
                )
            )
            continue
        if len(results) == 1:
            entries.append(_entry(results[0], seconds, secure=secure, audit_passed=audit.passed))
            continue
        # several observers (client:each): pool
        ok = [r for r in results if r.applicable]
        if not ok:
            res = results[0]
            res.observer = attack.observer
            entries.append(_entry(res, seconds, secure=secure, audit_passed=audit.passed))
            continue
        pooled = cls.pool(ok, truth) if hasattr(cls, "pool") else {}
        estimate = pooled.pop("estimate", None)
        res = attack.result(metric=ok[0].metric, chance=ok[0].chance, higher_is_leakier=ok[0].higher_is_leakier)
        res.observer = attack.observer
        res.value = pooled.get(res.metric, float(np.mean([r.value for r in ok if r.value is not None])))
        res.metrics.update(pooled)
        if estimate is not None:
            res.add(estimate, primary=True)
        res.metrics["observers"] = len(ok)
        entries.append(_entry(res, seconds, secure=secure, audit_passed=audit.passed))
    return entries
