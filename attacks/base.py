"""The attack interface: a party's view of the transcript + declared knowledge -> metrics.

An :class:`Attack` names

* ``exchange`` -- the tag pattern it reads (``fnmatch`` glob, e.g. ``"fedgcn/*"``);
* ``observer`` -- who runs it: ``"server"``, ``"client:3"``, ``"coalition:[0,1]"`` (or
  ``"client:each"``: every client on its own view, results pooled for reporting);
* ``knowledge`` -- the background knowledge it declares (names of :data:`KNOWLEDGE`).

``run(view, knowledge) -> AttackResult`` sees **only** the observer's :class:`View` (messages it
sent or received, payloads readable only where its keys allow) and the declared knowledge; the
result carries the attack's *output* (its guess).  ``score(result, truth) -> AttackResult`` is
separate: it compares the output with the ground truth (:class:`GroundTruth`, built from the
federated graph) and fills ``metric``/``value``/``chance`` and extra metrics.  Ground truth never
enters ``run`` (the Breaching separation of case and attack).

If every message an attack needs is ciphertext/masked to its observer, ``run`` returns
``applicable=False`` with the reason; the runner then reports it and, in secure modes, calls it
"at chance" only when the transcript audit (:mod:`attacks.audit`) passed.

Metric helpers (rank AUC, membership advantage, TPR at low FPR, total variation, bit F1) are
pure numpy functions at the bottom of this module.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from protocols.transcript import READABLE_KINDS, SERVER, Message, client_party

#: background knowledge an attack may declare (the runner provides exactly what is declared)
KNOWLEDGE: dict[str, str] = {
    "public": "public run facts: N, d, C, K, feature type, protocol mode, DP settings, algorithm "
    "hyperparameters (architecture, lr, local epochs) -- everything a protocol participant is told",
    "topology": "K2: the global edge index and the partition map owner[v] (e.g. a server that built the split)",
    "own_data": "the observer client's own subgraph: its nodes' global ids, features, labels, local and cross edges",
    "received": "the observer client's own decoded results of an exchange (what it legitimately receives)",
    "own_contributions": "the plaintext of what the observer (or coalition members) uploaded",
    "released_model": "the released/global model: an nn.Module copy with the final parameters",
    "architecture": "a factory returning a fresh model of the public architecture",
    "victim_topology": "K2: the victim client's local edge index, node count and training mask",
    "posteriors": "black-box query access: the deployed model's class posteriors on the candidate nodes",
    "candidates": "a candidate node set (ids and labels) for membership inference, membership unknown",
    "query_api": "LinkTeller: query access to a client's inference API with attacker-chosen features "
    "(it answers log-probabilities)",
    "aux_labelled": "K1: a labelled auxiliary sample from the same distribution (ids, features, labels, edges)",
    "hidden_fn": "the released model's hidden-feature map, applicable to auxiliary data",
    "coalition_keys": "the colluding clients' own protocol secrets (CKKS key ring; mask seeds, shares, group seed)",
    "victim_graphs": "K2, graph classification: the structure (edges, node counts) of the victim's training graphs",
    "aux_graphs": "K1, graph classification: auxiliary graphs from the clients' distribution (shadow data)",
    "victim_model": "K3, graph classification: the victim's model after the run, its private layers included",
}


def attack_device() -> torch.device:
    """Attacks run on CUDA when present."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------- observers
def observer_parties(observer: str, num_clients: int | None = None) -> list[str]:
    """Party names behind an observer string.

    ``"server"`` -> ``["server"]``; ``"client:3"`` -> ``["client3"]``;
    ``"coalition:[0,1]"`` -> ``["client0", "client1"]`` (``"server"`` may appear in the list:
    ``"coalition:[server,2]"``).
    """
    if observer == SERVER:
        return [SERVER]
    if observer.startswith("client:"):
        return [client_party(int(observer.split(":", 1)[1]))]
    if re.fullmatch(r"client\d+", observer):  # a party name is accepted as is
        return [observer]
    if observer.startswith("coalition:"):
        inner = observer.split(":", 1)[1].strip().strip("[]")
        out = []
        for tok in re.split(r"[,\s]+", inner):
            if not tok:
                continue
            out.append(SERVER if tok == SERVER else client_party(int(tok)))
        if not out:
            raise ValueError(f"empty coalition in observer {observer!r}")
        return out
    raise ValueError(f"unknown observer {observer!r}: use 'server', 'client:k' or 'coalition:[i,j,...]'")


def coalition(clients: Iterable[int | str]) -> str:
    """Observer string of a coalition (``coalition([0, 2]) == 'coalition:[0,2]'``)."""
    return "coalition:[" + ",".join(str(c) for c in clients) + "]"


# ----------------------------------------------------------------------------- the view
@dataclass
class View:
    """What ``parties`` can read of a transcript.

    ``messages``: every message one of the parties sent or received (``Transcript.view``).
    A payload is readable when its kind is in :data:`READABLE_KINDS` (plain, public key,
    metadata); ciphertext/masked payloads are readable only through ``opener`` -- a callable
    ``(party, message) -> plain payload | None`` that stands for the party's own keys (a
    client decrypting a CKKS result addressed to it).  No opener: ciphertext stays opaque.
    """

    parties: tuple[str, ...]
    messages: list[Message]
    opener: Callable[[str, Message], Any] | None = None

    @classmethod
    def of(cls, transcript, observer: str, *, opener=None, num_clients: int | None = None) -> View:
        """The view of ``observer`` (a party or a coalition): the messages its parties sent or received."""
        parties = tuple(observer_parties(observer, num_clients))
        ps = set(parties)
        msgs = [m for m in transcript.messages if m.sender in ps or m.receiver in ps]
        return cls(parties, msgs, opener)

    # -- selection
    def select(
        self,
        pattern: str | None = None,
        *,
        sender: str | None = None,
        receiver: str | None = None,
        round: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> list[Message]:
        """Messages whose tag matches the glob ``pattern`` and that match every other given filter."""
        kinds = set(kinds) if kinds is not None else None
        return [
            m
            for m in self.messages
            if (pattern is None or fnmatch.fnmatchcase(m.tag, pattern))
            and (sender is None or m.sender == sender)
            and (receiver is None or m.receiver == receiver)
            and (round is None or m.round == round)
            and (kinds is None or m.kind in kinds)
        ]

    def tags(self, pattern: str | None = None) -> list[str]:
        """Sorted distinct tags of the view, optionally only those matching the glob ``pattern``."""
        return sorted({m.tag for m in self.messages if pattern is None or fnmatch.fnmatchcase(m.tag, pattern)})

    def latest_round(self, tag: str, **kw) -> int | None:
        """Latest round of ``tag`` whose payloads are still stored and readable (None if none)."""
        rounds = [m.round for m in self.select(tag, **kw) if self.readable(m)]
        return max(rounds) if rounds else None

    # -- reading
    def readable(self, m: Message) -> bool:
        """Whether one of the view's parties can read ``m``'s payload (a readable kind, or opened with its keys)."""
        if m.payload is None:
            return False
        if m.kind in READABLE_KINDS:
            return True
        if self.opener is None:
            return False
        return any(self._open(p, m) is not None for p in self.parties if p in (m.sender, m.receiver))

    def payload(self, m: Message) -> Any:
        """The readable payload of ``m`` (plain format), or ``None``."""
        if m.payload is None:
            return None
        if m.kind in READABLE_KINDS:
            return m.payload
        if self.opener is None:
            return None
        for p in self.parties:
            if p in (m.sender, m.receiver):
                out = self._open(p, m)
                if out is not None:
                    return out
        return None

    def _open(self, party: str, m: Message) -> Any:
        try:
            return self.opener(party, m)
        except Exception:  # an opener that cannot open is "not readable", never a crash
            return None

    def summary(self) -> dict:
        """Message counts and bytes per kind (for reports)."""
        out: dict[str, dict[str, int]] = {}
        for m in self.messages:
            s = out.setdefault(m.kind, {"messages": 0, "bytes": 0, "readable": 0})
            s["messages"] += 1
            s["bytes"] += int(m.nbytes)
            s["readable"] += int(self.readable(m))
        return out


# ----------------------------------------------------------------------------- payload decoding
def payload_blocks(payload: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(block_ids [n], values [n, L])`` of a plain block payload, else ``None``.

    Accepts the plain backend's ``{"block_ids", "values"}`` and ``{"block_ids", "data"}``
    (the layout the mask backend uses when ``reveal_to_server`` makes downloads plain).
    """
    if not isinstance(payload, Mapping) or "block_ids" not in payload:
        return None
    vals = payload.get("values", payload.get("data"))
    if vals is None:
        return None
    vals = np.asarray(vals)
    if vals.dtype.kind not in "fc":
        return None  # ring elements etc.: not plaintext values
    ids = np.asarray(payload["block_ids"], dtype=np.int64).ravel()
    vals = vals.astype(np.float64).reshape(ids.size, -1) if ids.size else vals.reshape(0, -1).astype(np.float64)
    return ids, vals


def dense_vector(payload: Any, length: int | None = None) -> np.ndarray | None:
    """A dense exchange's flat vector (blocks in id order).

    Without ``length`` trailing padding is kept; pass the public length to cut it.
    """
    blocks = payload_blocks(payload)
    if blocks is None:
        return None
    ids, vals = blocks
    if ids.size == 0:
        return np.zeros(0)
    order = np.argsort(ids)
    vec = vals[order].ravel()
    return vec if length is None else vec[:length]


def row_blocks_to_rows(payload: Any, dim: int, num_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Row-keyed payload (``Protocol.row_sum``) -> ``(global row ids, rows [m, dim])``.

    Block ``b`` holds global rows ``[b R, (b+1) R)`` with ``R = block_len // dim``; rows past
    ``num_rows`` are padding and dropped.  All rows of the blocks are returned (zero rows too).
    """
    blocks = payload_blocks(payload)
    if blocks is None:
        return None
    ids, vals = blocks
    if ids.size == 0:
        return np.zeros(0, np.int64), np.zeros((0, dim))
    if vals.shape[1] % dim:
        return None
    rpb = vals.shape[1] // dim
    rows = vals.reshape(ids.size * rpb, dim)
    gids = (ids[:, None] * rpb + np.arange(rpb)[None, :]).ravel()
    keep = gids < num_rows
    return gids[keep], rows[keep]


# ----------------------------------------------------------------------------- results
@dataclass
class AttackResult:
    """One attack's outcome on one run.

    ``metric``/``value``/``chance``: the primary metric, its value and its chance/baseline
    level (filled by ``score``).  ``applicable=False`` with a ``reason`` when the observer
    could read nothing the attack needs.  ``output``: the attack's guess (never serialised).
    ``metrics``: extra metrics (serialised flat next to the primary ones).  ``estimate``: the
    primary metric's chance level, 95 % interval and sample size (:mod:`attacks.significance`);
    :meth:`add` records it, or a secondary metric's under ``metrics['significance']``.
    """

    name: str
    observer: str
    exchange: str
    metric: str = ""
    value: float | None = None
    chance: float | None = None
    applicable: bool = True
    reason: str = ""
    higher_is_leakier: bool = True
    knowledge: tuple[str, ...] = ()
    output: Any = None
    metrics: dict = field(default_factory=dict)
    estimate: Any = None

    def add(self, est, primary: bool = False) -> AttackResult:
        """Record an :class:`~attacks.significance.Estimate`.

        As the primary metric (metric, value, chance, interval) or as a secondary one (its value flat in ``metrics`` and
        its chance and interval under ``metrics['significance'][name]``).
        """
        if primary:
            self.metric, self.value, self.chance = est.metric, est.value, est.chance
            self.higher_is_leakier, self.estimate = est.higher_is_leakier, est
        self.metrics[est.metric] = est.value
        self.metrics.setdefault("significance", {})[est.metric] = est.to_dict()
        return self

    def to_dict(self) -> dict:
        """JSON-ready summary: the primary metric, its chance level and interval, the other metrics (not ``output``)."""
        d = {
            "name": self.name,
            "observer": self.observer,
            "exchange": self.exchange,
            "metric": self.metric,
            "value": _num(self.value),
            "chance": _num(self.chance),
            "applicable": bool(self.applicable),
            "higher_is_leakier": self.higher_is_leakier,
            "knowledge": list(self.knowledge),
        }
        if self.reason:
            d["reason"] = self.reason
        if self.estimate is not None:
            e = self.estimate.to_dict()
            for k in ("ci", "samples", "chance_method", "ci_method", "at_chance", "below_chance", "null_q95"):
                if k in e:
                    d[k] = e[k]
        for k, v in self.metrics.items():
            if k not in d:
                d[k] = _jsonable(v)
        return d


def _num(v):
    if v is None:
        return None
    v = float(v)
    return v if np.isfinite(v) else None


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return _num(v)
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if torch.is_tensor(v):
        return _jsonable(v.tolist())
    return v


# ----------------------------------------------------------------------------- ground truth
@dataclass
class GroundTruth:
    """Everything scoring may compare with; built from the federated graph, never given to ``run``."""

    x: np.ndarray  # [N, d] float
    y: np.ndarray  # [N]
    edge_index: np.ndarray  # [2, E] both directions
    owner: np.ndarray  # [N] client id (-1 dropped)
    train_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    binary: bool
    clients: list = field(default_factory=list)  # ClientSubgraph list (cpu)
    extra: dict = field(default_factory=dict)  # run-specific truth (e.g. the clients' model inputs)

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the global graph."""
        return int(self.x.shape[0])

    @classmethod
    def from_fed(cls, fed) -> GroundTruth:
        """The ground truth of a federated graph: features, labels, edges, owners, masks and the client subgraphs."""
        g = fed.graph
        return cls(
            x=g.x.detach().cpu().numpy().astype(np.float64),
            y=g.y.detach().cpu().numpy().astype(np.int64),
            edge_index=g.edge_index.detach().cpu().numpy().astype(np.int64),
            owner=fed.owner.detach().cpu().numpy().astype(np.int64),
            train_mask=g.train_mask.detach().cpu().numpy().astype(bool),
            test_mask=g.test_mask.detach().cpu().numpy().astype(bool),
            num_classes=int(fed.num_classes),
            binary=bool(getattr(fed, "binary_features", False) or _is_binary(g.x)),
            clients=list(fed.clients),
        )

    @classmethod
    def from_graph_fed(cls, fed) -> GroundTruth:
        """Graph classification: no global node arrays; ``clients`` holds every client's graphs."""
        return cls(
            x=np.zeros((0, 0)),
            y=np.zeros(0, np.int64),
            edge_index=np.zeros((2, 0), np.int64),
            owner=np.zeros(0, np.int64),
            train_mask=np.zeros(0, bool),
            test_mask=np.zeros(0, bool),
            num_classes=max(c.num_classes for c in fed.clients),
            binary=False,
            clients=list(fed.clients),
            extra={"task": "graph"},
        )

    def adjacency(self, self_loops: bool = False):
        """The symmetric 0/1 adjacency as a CSR matrix (no self loops unless ``self_loops``)."""
        import scipy.sparse as sp

        n = self.num_nodes
        ei = self.edge_index
        a = sp.csr_matrix((np.ones(ei.shape[1]), (ei[0], ei[1])), shape=(n, n))
        a.data[:] = 1.0
        a.setdiag(0)
        a.eliminate_zeros()
        if self_loops:
            a = a + sp.identity(n, format="csr")
        return a.tocsr()


def _is_binary(x) -> bool:
    x = x.detach() if torch.is_tensor(x) else torch.as_tensor(x)
    return bool(((x == 0) | (x == 1)).all())


# ----------------------------------------------------------------------------- the attack base
class Attack:
    """Base class.  Subclasses set the class attributes and implement ``run`` and ``score``.

    Instances may override ``observer`` (e.g. pick another client) and take options as
    keyword arguments (``Attack(observer='client:2', max_iter=50)``); unknown options fail.
    """

    name: ClassVar[str] = ""
    exchange: ClassVar[str] = "*"
    default_observer: ClassVar[str] = SERVER
    knowledge: ClassVar[tuple[str, ...]] = ("public",)
    #: algorithms whose transcript this attack reads (None: any run that has the exchange)
    algorithms: ClassVar[tuple[str, ...] | None] = None
    #: False when the attack reads no transcript exchange (model-release attacks)
    needs_exchange: ClassVar[bool] = True
    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, observer: str | None = None, **options):
        self.observer = observer or self.default_observer
        unknown = set(options) - set(self.options)
        if unknown:
            raise TypeError(
                f"attack {self.name!r} has no option(s) {sorted(unknown)}; its options are {sorted(self.options)}"
            )
        self.opts = {**self.options, **options}

    def result(self, **kw) -> AttackResult:
        """A result of this attack and observer; ``kw`` are :class:`AttackResult` fields."""
        return AttackResult(
            name=self.name, observer=self.observer, exchange=self.exchange, knowledge=tuple(self.knowledge), **kw
        )

    def not_applicable(self, reason: str, **kw) -> AttackResult:
        """A result that says why the attack cannot run (``applicable=False``, the ``reason`` shown to users)."""
        return self.result(applicable=False, reason=reason, **kw)

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Attack what the observer reads.

        Args:
            view: The messages the observer sent or received, readable through its keys only.
            knowledge: The declared background knowledge (``self.knowledge``) by name.

        Returns:
            The attack's raw output (``output``), not yet scored; or a not-applicable result.
        """
        raise NotImplementedError

    def score(self, result: AttackResult, truth: GroundTruth) -> AttackResult:
        """Score ``result`` against the ground truth.

        Args:
            result: The output of :meth:`run`.
            truth: The run's ground truth (labels, owners, features), never shown to :meth:`run`.

        Returns:
            ``result`` with its metric, chance level, interval and ``at_chance``.
        """
        raise NotImplementedError

    def __call__(self, view: View, knowledge: Mapping[str, Any], truth: GroundTruth | None = None) -> AttackResult:
        """``run`` then (with ``truth``) ``score``.

        Args:
            view: The observer's view of the transcript.
            knowledge: Background knowledge by name; cut to what the attack declares.
            truth: The ground truth; ``None`` leaves the result unscored.

        Returns:
            The (scored) result; not applicable when declared knowledge is missing.
        """
        missing = [k for k in self.knowledge if k not in knowledge]
        if missing:
            return self.not_applicable(f"background knowledge not available: {', '.join(missing)}")
        declared = {k: knowledge[k] for k in self.knowledge}
        res = self.run(view, declared)
        if truth is not None and res.applicable:
            res = self.score(res, truth)
        return res


# ----------------------------------------------------------------------------- metrics
def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve (Mann-Whitney, ties count 1/2); nan if one class is empty."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    s = np.nan_to_num(s, nan=-np.inf)
    r = rankdata(s)
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def roc_curve(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) at every threshold, from (0,0) to (1,1)."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    distinct = np.r_[np.flatnonzero(np.diff(s)), y.size - 1]
    tps = np.cumsum(y)[distinct]
    fps = (distinct + 1) - tps
    tpr = np.r_[0.0, tps / max(1, y.sum())]
    fpr = np.r_[0.0, fps / max(1, (~y).sum())]
    return fpr, tpr


def advantage(scores, labels) -> float:
    """Membership advantage max_t (TPR - FPR) (Yeom et al., CSF 2018)."""
    fpr, tpr = roc_curve(scores, labels)
    return float(np.max(tpr - fpr))


def tpr_at_fpr(scores, labels, fpr_level: float = 0.01) -> float:
    """Largest TPR at FPR <= ``fpr_level`` (Carlini et al., S&P 2022)."""
    fpr, tpr = roc_curve(scores, labels)
    ok = fpr <= fpr_level + 1e-12
    return float(tpr[ok].max()) if ok.any() else 0.0


def tv_distance(p, q) -> float:
    """Total variation distance of two distributions (normalised first)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0, None)
    q = np.clip(np.asarray(q, dtype=np.float64), 0, None)
    p = p / p.sum() if p.sum() > 0 else np.full_like(p, 1.0 / p.size)
    q = q / q.sum() if q.sum() > 0 else np.full_like(q, 1.0 / q.size)
    return float(0.5 * np.abs(p - q).sum())


def bit_f1(pred, true) -> float:
    """F1 of the 1-bits of ``pred`` against ``true`` (both boolean arrays)."""
    pred = np.asarray(pred).astype(bool)
    true = np.asarray(true).astype(bool)
    tp = float((pred & true).sum())
    denom = float(pred.sum() + true.sum())
    return 2 * tp / denom if denom else 1.0


def nearest_is_true(recovered: np.ndarray, candidates_x: np.ndarray, true_index: np.ndarray) -> np.ndarray:
    """Whether each recovered row's cosine nearest neighbour is the true row.

    A hit: the nearest neighbour among ``candidates_x`` has the same features as row ``true_index``
    (duplicates of the true row count as hits).

    This is node identifiability precision (NIP, after Breaching's IIP).
    """
    if recovered.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    dev = attack_device()
    X = torch.as_tensor(candidates_x, dtype=torch.float32, device=dev)
    Xn = X / X.norm(dim=1, keepdim=True).clamp_min(1e-12)
    out = []
    for lo in range(0, recovered.shape[0], 1024):
        R = torch.as_tensor(recovered[lo : lo + 1024], dtype=torch.float32, device=dev)
        Rn = R / R.norm(dim=1, keepdim=True).clamp_min(1e-12)
        nn_idx = (Rn @ Xn.T).argmax(dim=1)
        t = torch.as_tensor(true_index[lo : lo + 1024], device=dev)
        out.append((X[nn_idx] == X[t]).all(dim=1).cpu().numpy())
    return np.concatenate(out)


def dumps(results: Iterable[AttackResult]) -> str:
    """The results as an indented JSON list."""
    return json.dumps([r.to_dict() for r in results], indent=2)
