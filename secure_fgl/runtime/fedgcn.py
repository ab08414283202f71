"""FedGCN (Yao et al., NeurIPS 2023) as a client logic and a server strategy.

The pre-training exchange of :mod:`secure_fgl.algorithms.fedgcn`, with every party apart:

1. ``--row-order signature|owner`` only: each client publishes the histogram of its own nodes'
   touch sets, ``h[S, k]`` = #own nodes ``v`` with ``S(v) = S`` (tag ``fedgcn/row_order``,
   client -> server, recorded).  The server numbers the rows from ``h`` and the public rows per
   block alone (:func:`layout_from_histogram`: the order and block cuts of
   :func:`~secure_fgl.algorithms.fedgcn.exchange_numbering` /
   :func:`~secure_fgl.algorithms.fedgcn.recipient_numbering`) and sends each owner the row ids of
   its classes (server -> client); the owner numbers its own nodes of a class in its private
   order (global id), then tells each other client ``j`` of ``S(v)`` the row id of ``v``
   (tag ``fedgcn/row_ids``, client -> client, relayed by the server and recorded) over the
   encrypted client-to-client channel (:mod:`protocols.channel`: X25519 + HKDF +
   ChaCha20-Poly1305; each client makes its channel key from the OS CSPRNG and publishes it with
   its histogram; the server hands every client the others' keys with its row ids), so the
   server relays only ciphertext: it learns how many id pairs each client sends each other
   client (what the histogram already tells it), not which nodes or rows.
2. Each client checks its own degrees (and feature bound) against the public caps and sends its
   partial neighbour sums ``P^{(k)}`` and the rows it requests; the server runs the protocol's
   ``row_sum`` (tag ``fedgcn/neighbour_sums``) and each client receives the totals of its rows,
   checks the degrees of its own nodes, normalises and builds its propagation graph.
3. Training is FedAvg (:class:`~.strategy.ModelAveragingStrategy`) on those inputs.

A lost client stops the pre-training (its rows would be missing): DropoutError naming it.
"""
from __future__ import annotations

import numpy as np
import torch

from protocols import SERVER, BoundError, client_party
from protocols.channel import ChannelKey, associated_data
from protocols.errors import IntegrityError

from ..algorithms.fedgcn import (TAG, FedGCN, FedGCNNet, PropGraph, _inverse_gray, _local_positions,
                                 degree_cap_needed, denoise_with_own_data, dp_applies, dp_row_clip,
                                 exchange_dp_request, exchange_spec, local_degrees, narrow_integer_rows, neighbour_terms,
                                 normalise,
                                 partial_neighbour_sums, propagation_graph, pretrain_stats, requested_rows,
                                 segment_blocks)
from ..algorithms.options import FedGCNOptions
from ..models.centring import centre_first_layer, own_mean
from .exchange import keep_rows, rows_result, run_row_sum
from .logic import ModelAveragingLogic
from .strategy import ModelAveragingStrategy

ORDER_TAG = "fedgcn/row_order"
IDS_TAG = "fedgcn/row_ids"
#: the channel stage the relayed row ids are bound to (associated data)
RELAY_STAGE = "relay"


def own_signatures(c, far_owner: torch.Tensor) -> np.ndarray:
    """``S(v)`` (int64 bitmask) of every own node: the owner's bit plus the owner of the far end
    of each cross edge at ``v`` (:func:`~secure_fgl.algorithms.fedgcn.touch_signatures`, one owner)."""
    masks = np.full(c.num_nodes, np.int64(1) << c.client_id, dtype=np.int64)
    if c.cross_edges.numel():
        pos = _local_positions(c.global_ids, c.cross_edges[0]).cpu().numpy()
        np.bitwise_or.at(masks, pos, np.left_shift(np.int64(1), far_owner.cpu().numpy().astype(np.int64)))
    return masks


def layout_from_histogram(classes: list[tuple[int, int, int]], rpb: int, row_order: str, hops: int,
                          num_nodes: int) -> tuple[dict[tuple[int, int], np.ndarray], int]:
    """Row ids of every class ``(mask S, owner k, count)`` and the exchange's number of rows.

    ``signature``: classes in reflected-Gray order of ``S``, then owner; the sequence cut into
    blocks by :func:`segment_blocks` (a single block: the given numbering's row count).
    ``owner``: grouped by recipients (owner at 1 hop, ``S`` at 2 hops), each group starting a
    new block, Gray order of ``S`` then owner inside a group."""
    masks = np.array([m for m, _, _ in classes], dtype=np.int64)
    owners = np.array([k for _, k, _ in classes], dtype=np.int64)
    counts = np.array([n for _, _, n in classes], dtype=np.int64)
    gray = _inverse_gray(masks)
    if row_order == "signature":
        order = np.lexsort((owners, gray))
        seq = np.repeat(masks[order], counts[order])
        pos = segment_blocks(seq, rpb) if rpb < num_nodes else np.arange(seq.size, dtype=np.int64)
        num_rows = int(pos.max()) + 1 if pos.size else 0
    else:
        group = owners if hops <= 1 else masks
        order = np.lexsort((owners, gray, group))
        g = np.repeat(group[order], counts[order])
        n = g.size
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if n else np.zeros(0, np.int64)
        sizes = np.diff(np.r_[starts, n])
        padded = -(-sizes // rpb) * rpb
        pos = np.repeat(np.r_[0, np.cumsum(padded)[:-1]] - starts, sizes) + np.arange(n)
        num_rows = int(padded.sum())
    ends = np.cumsum(counts[order])
    return {(int(masks[i]), int(owners[i])): pos[e - counts[i]:e] for i, e in zip(order, ends)}, num_rows


class FedGCNLogic(ModelAveragingLogic):
    """FedGCN's client: the pre-training stages (module docstring), then FedAvg's client."""

    def __init__(self, runtime, options: dict):
        self.fopts = FedGCNOptions(**options)
        super().__init__(runtime, options)
        c = self.data
        self._inputs = None
        if self.fopts.hops == 0:
            self._set_inputs(c.x, c.edge_index)
        self.row_of = {}                        # global id -> exchange row id (own nodes and known remote ones)
        self.sent_own = None                    # DP: the clipped own rows it sent
        #: with --attacks: (node id, total) of every row of the blocks this client decoded
        self.decoded: tuple[np.ndarray, np.ndarray] | None = None

    @staticmethod
    def architecture(cfg, facts, options: dict):
        if FedGCNOptions(**options).hops == 0:
            return ModelAveragingLogic.architecture(cfg, facts, options)
        return FedGCNNet(facts.num_features, cfg.hidden, facts.num_classes, num_layers=cfg.num_layers,
                         dropout=cfg.dropout)

    def inputs(self):
        if self._inputs is None:
            raise RuntimeError("FedGCN's pre-training exchange must run before training")
        return self._inputs

    def _set_inputs(self, z: torch.Tensor, graph) -> None:
        """The first-layer input and graph; ``--center``: the model sees ``z`` minus the mean of the
        own rows (:func:`~secure_fgl.models.centring.centre_first_layer`, no centred copy)."""
        self._inputs = (z, graph)
        if self.fopts.center:
            centre_first_layer(self.model, own_mean(z, self.data.num_nodes))

    def _rows(self, gids: torch.Tensor) -> torch.Tensor:
        if not self.row_of:
            return gids.cpu()
        return torch.as_tensor([self.row_of[int(v)] for v in gids.tolist()], dtype=torch.long)

    def contribute(self, req: dict) -> dict:
        c, o, tag = self.data, self.fopts, req["tag"]
        if tag == ORDER_TAG:                    # the histogram h[., k] of the own nodes' touch sets
            self.signatures = own_signatures(c, self.rt.far_owner)
            self.channel = ChannelKey(client_party(self.rt.client_id))      # X25519 key from the OS CSPRNG
            masks, counts = np.unique(self.signatures, return_counts=True)
            return {"masks": masks, "counts": counts.astype(np.int64),
                    "channel_key": np.frombuffer(self.channel.public_bytes, dtype=np.uint8)}
        if tag == IDS_TAG:                      # number own nodes; tell each toucher their row ids
            order = np.argsort(c.global_ids.cpu().numpy(), kind="stable")
            rows = np.empty(c.num_nodes, dtype=np.int64)
            for m, ids in zip(req["masks"].tolist(), np.split(req["rows"], np.cumsum(req["counts"])[:-1])):
                rows[order[self.signatures[order] == m]] = ids
            gids = c.global_ids.cpu().numpy()
            self.row_of = dict(zip(gids.tolist(), rows.tolist()))
            self._relay = {"keys": req["channel_keys"], "run_id": req["run_id"].tobytes(),
                           "session": req["session"].tobytes()}
            return self._seal_row_ids(gids, rows)
        if tag != TAG:
            return super().contribute(req)
        refusal = self._check_bounds(req)
        if refusal:
            return refusal
        clip = req.get("dp_clip")               # DP: every term [x_j, 1] clipped to C (protocols.dp)
        ids, rows = partial_neighbour_sums(c, neighbour_terms(c, o.norm, clip, binary=self.facts.binary_features,
                                                              seed=self.cfg.seed))
        self.sent_own = rows[:c.num_nodes] if clip is not None else None     # for the DP post-processing
        if clip is None:                        # counts of binary features: int16, not float64 (as inline)
            rows = narrow_integer_rows(rows)
        ids, rows, request = self._rows(ids).numpy(), rows.cpu().numpy(), self._rows(requested_rows(c, o.hops)).numpy()
        if not req.get("split"):
            return {"ids": ids, "rows": rows, "request": request}
        self.request_rows = request
        return keep_rows(self, tag, ids, rows, request, req,     # the half uploads it; public facts leave here
                         whole_blocks=self.cfg.attacks)           # --attacks: it keeps every decoded row

    def _row_ids_channel(self, sender: int, receiver: int) -> tuple[str, bytes, bytes, bytes]:
        """(peer, its channel key, run id, associated data) of the row ids ``sender`` -> ``receiver``."""
        r, me = self._relay, self.rt.client_id
        peer = receiver if sender == me else sender
        ad = associated_data(r["run_id"], r["session"], 0, 0, IDS_TAG, RELAY_STAGE, client_party(sender),
                             client_party(receiver))
        return client_party(peer), r["keys"][peer].tobytes(), r["run_id"], ad

    def _seal_row_ids(self, gids: np.ndarray, rows: np.ndarray) -> dict:
        """For each other client j touching own nodes: their ``(global id, row id)`` pairs, sealed for j."""
        me, dest, sealed = self.rt.client_id, [], []
        for j in range(self.facts.num_clients):
            hit = np.flatnonzero((self.signatures >> j) & 1)
            if j == me or not hit.size:
                continue
            pairs = np.stack([gids[hit], rows[hit]], axis=1).astype("<i8").tobytes()
            peer, key, run_id, ad = self._row_ids_channel(me, j)
            sealed.append(self.channel.seal(peer, key, run_id, pairs, ad))
            dest.append(j)
        return {"dest": np.asarray(dest, dtype=np.int64), "lengths": np.asarray([len(b) for b in sealed], np.int64),
                "sealed": np.frombuffer(b"".join(sealed), dtype=np.uint8)}

    def _open_row_ids(self, req: dict) -> None:
        """Open the row ids each sender sealed for this client (IntegrityError if one does not authenticate)."""
        me = self.rt.client_id
        for k, blob in zip(req["senders"].tolist(), np.split(req["sealed"], np.cumsum(req["lengths"])[:-1])):
            peer, key, run_id, ad = self._row_ids_channel(k, me)
            pairs = self.channel.open(peer, key, run_id, blob.tobytes(), ad, dict(tag=IDS_TAG, round=0, client=k))
            pairs = np.frombuffer(pairs, dtype="<i8").reshape(-1, 2)
            self.row_of.update(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()))

    def _check_bounds(self, req: dict) -> dict | None:
        """The owner's check of its own nodes against the public caps (before anything is sent)."""
        c, o = self.data, self.fopts
        if req["check_degree"]:
            deg = local_degrees(c) - 1
            over = deg[deg > o.degree_cap]
            if over.numel():
                return {"refused": "degree", "count": int(over.numel()), "largest": int(over.max())}
        if not (self.facts.binary_features or req.get("dp_clip") is not None):    # DP clips the terms instead
            m = float(c.x.abs().max()) if c.x.numel() else 0.0
            if m > o.feature_bound:
                return {"refused": "feature", "largest": m}
        return None

    def receive(self, req: dict) -> dict:
        tag = req["tag"]
        if tag == IDS_TAG:
            self._open_row_ids(req)
            return {}
        if tag != TAG:
            return super().receive(req)
        c, o = self.data, self.fopts
        if "totals" in req:
            totals = req["totals"]
        else:                                   # this client's own decoded blocks
            half, rpb = self.rt.half, int(req["rpb"])
            if self.cfg.attacks:
                self.decoded = self._block_rows(half.result(), rpb)
            totals = rows_result(half, self.request_rows, rpb, self.facts.num_features + 1)
        totals = torch.as_tensor(totals, dtype=torch.float64, device=self.rt.device)
        own_deg = local_degrees(c)
        if self.sent_own is not None:           # DP: post-processing with the client's own data
            totals = denoise_with_own_data(c, totals, self.sent_own.to(totals), o.norm,
                                           noise_std=float(req["noise_std"]))
            counts = totals[:, -1]
        else:
            counts = totals[:, -1].round()
            if not torch.equal(counts[:c.num_nodes], own_deg):
                raise RuntimeError(f"client {self.rt.client_id}: received degrees of its own nodes differ from its "
                                   "local degrees -- a contribution is missing or corrupted")
        degrees = torch.cat([own_deg, counts[c.num_nodes:].clamp_min(1.0)])
        z = normalise(totals, degrees, o.norm).to(torch.float32)
        self._set_inputs(z, propagation_graph(c, o.hops, degrees))
        return {}

    def _block_rows(self, blocks: dict, rpb: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row of the decoded ``blocks`` as (node id, total), float32 as the in-process
        algorithm keeps them; a row whose node this client cannot name (another client's node
        under ``--row-order signature|owner``) or a padding row gets node id -1."""
        dim = self.facts.num_features + 1
        bids = np.array(sorted(blocks), dtype=np.int64)
        rows = (bids[:, None] * rpb + np.arange(rpb)[None, :]).ravel()
        totals = np.stack([blocks[int(b)] for b in bids]).reshape(rows.size, dim) if bids.size else np.zeros((0, dim))
        if self.row_of:
            node_of = {r: g for g, r in self.row_of.items()}
            nodes = np.array([node_of.get(int(r), -1) for r in rows], dtype=np.int64)
        else:                                   # the given order: row id = node id
            nodes = np.where(rows < self.facts.num_nodes, rows, -1)
        return nodes, totals.astype(np.float32)

    def decoded_rows(self) -> dict:
        if self.decoded is None:
            return {}
        return {"nodes": self.decoded[0], "totals": self.decoded[1]}

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.fopts.hops > 0 and self._inputs is not None:
            z, g = self._inputs
            state["inputs"] = {"z": z.cpu(), "edge_index": g.edge_index.cpu(), "edge_weight": g.edge_weight.cpu(),
                               "num_out": g.num_out}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "inputs" in state:
            s, dev = state["inputs"], self.rt.device
            self._set_inputs(s["z"].to(dev), PropGraph(s["edge_index"].to(dev), s["edge_weight"].to(dev),
                                                       int(s["num_out"])))


class FedGCNStrategy(ModelAveragingStrategy):
    """FedGCN's server: the pre-training stages (module docstring), then FedAvg."""

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedGCNOptions(**options)
        self.pretrain: dict = {}
        self.exchange_rows = facts.num_nodes
        self.dp_on = self.fopts.hops > 0 and dp_applies(cfg, protocol)
        if protocol.dp is not None and cfg.dp_epsilon and self.fopts.hops > 0 and protocol.dp.config.split is None:
            protocol.dp.declare(TAG, f"{self.name}/model")    # even split of the run's budget (as inline)

    #: the data each release touches (:mod:`secure_fgl.privacy`), as the in-process FedGCN states it
    release_dependencies = FedGCN.release_dependencies

    def setup(self) -> None:
        import time
        o, f, K = self.fopts, self.facts, self.num_clients
        if o.hops == 0:
            self.pretrain = {"pretrain_bytes_up": 0, "pretrain_bytes_down": 0, "pretrain_plaintext_equiv_bytes_up": 0,
                             "pretrain_plaintext_equiv_bytes_down": 0, "pretrain_time": 0.0}
            return
        t0 = time.perf_counter()
        dp = exchange_dp_request(o, self.cfg, f.binary_features) if self.dp_on else None
        spec = exchange_spec(o, f.binary_features, dp_row_clip(o, self.cfg) if dp else None,
                             counts=f.count_features)
        num_rows = f.num_nodes
        if o.row_order != "given" and o.layout == "sparse":
            num_rows = self._number_rows(self.protocol.rows_per_block(spec, f.num_features + 1, f.num_nodes, "sparse"))
        dim = f.num_features + 1
        spec = self.protocol.release_spec(spec, dp)       # a DP sum's public grid (protocols.dp.release_spec)
        rpb = self.protocol.rows_per_block(spec, dim, num_rows, o.layout)
        ask = {"tag": TAG, "round": 0, "check_degree": degree_cap_needed(self.cfg, self.protocol.mode, self.dp_on),
               "split": self.split, "rpb": rpb, "num_blocks": -(-num_rows // rpb), "layout": o.layout,
               "dp_clip": dp_row_clip(o, self.cfg) if dp else None}
        sent = self.ask("contribute", {k: ask for k in range(K)})
        self.check_lost(range(K), f"the pre-training exchange {TAG}")
        self._refuse(sent)
        if self.split:                          # the clients' halves run the exchange
            rows_up = {k: int(r["rows_up"]) for k, r in sent.items()}
            rows_down = {k: int(r["rows_down"]) for k, r in sent.items()}
            noise_std = run_row_sum(self, TAG, 0, sent, num_rows, dim, o.layout, spec, rpb, dp)
            self.tell("receive", {k: {"tag": TAG, "round": 0, "rpb": rpb, "noise_std": noise_std} for k in range(K)})
        else:
            contributions = {k: (torch.as_tensor(r["ids"]), torch.as_tensor(r["rows"])) for k, r in sent.items()}
            requests = {k: torch.as_tensor(r["request"]) for k, r in sent.items()}
            rows_up = {k: int(r["ids"].size) for k, r in sent.items()}
            rows_down = {k: int(r["request"].size) for k, r in sent.items()}
            received = self.protocol.row_sum(TAG, 0, contributions, requests, num_rows=num_rows, layout=o.layout,
                                             spec=spec)
            self.tell("receive", {k: {"tag": TAG, "round": 0, "totals": received[k]} for k in range(K)})
        self.check_lost(range(K), f"the delivery of {TAG}")
        self.exchange_rows = num_rows
        self.pretrain = self._pretrain_stats(rows_up, rows_down)
        self.pretrain["pretrain_time"] = time.perf_counter() - t0

    def _number_rows(self, rpb: int) -> int:
        """Stage 1 of the module docstring; returns the exchange's number of rows."""
        K = self.num_clients
        hist = self.ask("contribute", {k: {"tag": ORDER_TAG, "round": 0} for k in range(K)},
                        record=(ORDER_TAG, "metadata"))
        self.check_lost(range(K), "the row numbering")
        classes = [(int(m), k, int(n)) for k in range(K) for m, n in zip(hist[k]["masks"], hist[k]["counts"])]
        rows, num_rows = layout_from_histogram(classes, rpb, self.fopts.row_order, self.fopts.hops,
                                               self.facts.num_nodes)
        channel = {"channel_keys": np.stack([hist[k]["channel_key"] for k in range(K)]).astype(np.uint8),
                   "run_id": np.frombuffer(self.protocol.run_id, dtype=np.uint8),
                   "session": np.frombuffer(self.protocol.session, dtype=np.uint8)}
        mine = {k: {"tag": IDS_TAG, "round": 0, "masks": hist[k]["masks"], "counts": hist[k]["counts"],
                    "rows": np.concatenate([rows[(int(m), k)] for m in hist[k]["masks"]]), **channel}
                for k in range(K)}
        for k, r in mine.items():
            self.record(ORDER_TAG, SERVER, client_party(k), "metadata", len(_frame(r)))
        told = self.ask("contribute", mine)
        self.check_lost(range(K), "the row numbering")
        inbox: dict[int, list] = {j: [] for j in range(K)}
        for k, r in told.items():               # the server relays ciphertext it cannot open
            dest, lengths = r["dest"].tolist(), r["lengths"]
            if len(dest) != lengths.size or int(lengths.sum()) != r["sealed"].size or \
                    any(j == k or not 0 <= j < K for j in dest):
                raise IntegrityError("malformed sealed row ids", tag=IDS_TAG, round=0, client=k)
            for j, blob in zip(dest, np.split(r["sealed"], np.cumsum(lengths)[:-1])):
                self.record(IDS_TAG, client_party(k), client_party(j), "ciphertext", blob.size,
                            note="row ids of the owner's nodes the receiver touches (channel-encrypted, relayed)",
                            relay=SERVER)
                inbox[j].append((k, blob))
        self.tell("receive", {j: {"tag": IDS_TAG, "round": 0, "senders": np.asarray([k for k, _ in parts], np.int64),
                                  "lengths": np.asarray([b.size for _, b in parts], np.int64),
                                  "sealed": np.concatenate([b for _, b in parts] or [np.zeros(0, np.uint8)])}
                              for j, parts in inbox.items()})
        return num_rows

    def _refuse(self, sent: dict) -> None:
        """BoundError naming the worst client when an owner refused its own nodes' bounds."""
        refused = {k: r for k, r in sent.items() if "refused" in r}
        if not refused:
            return
        worst = max(refused, key=lambda k: refused[k]["largest"])
        r, o = refused[worst], self.fopts
        if r["refused"] == "degree":
            n = sum(x.get("count", 0) for x in refused.values() if x["refused"] == "degree")
            raise BoundError(f"{n} node(s) on {len(refused)} client(s) have degree above --degree-cap "
                             f"{o.degree_cap} (largest {r['largest']}, on client {worst}); {self.protocol.mode} sums "
                             f"sized to it would wrap. Raise --degree-cap to at least {r['largest']} (it is a public "
                             "bound)", tag=TAG, round=0, client=worst)
        raise BoundError(f"a feature has |x| = {r['largest']:.4g} above --feature-bound {o.feature_bound}; raise "
                         "--feature-bound (a public bound) or scale the features", tag=TAG, round=0, client=worst)

    def _pretrain_stats(self, rows_up: dict, rows_down: dict) -> dict:
        """The in-process FedGCN's figures (:func:`secure_fgl.algorithms.fedgcn.pretrain_stats`) from
        the server half's transcript, plus the bytes of the row numbering."""
        tr = self.protocol.transcript
        return {**pretrain_stats(tr, rows_up, rows_down, self.facts.num_features + 1, self.exchange_rows,
                                 self.fopts.layout, self.fopts.row_order),
                "pretrain_order_bytes": sum(m.nbytes for m in tr.messages if m.tag in (ORDER_TAG, IDS_TAG))}

    def final_metrics(self) -> dict:
        tr, tag = self.protocol.transcript, f"{self.name}/model"
        rounds = len({m.round for m in tr.messages if m.tag == tag}) or 1
        return {**super().final_metrics(), "hops": self.fopts.hops, "norm": self.fopts.norm,
                "layout": self.fopts.layout,
                "model_bytes_up_per_round": sum(m.nbytes for m in tr.select(tag=tag, receiver=SERVER)) / rounds,
                "model_bytes_down_per_round": sum(m.nbytes for m in tr.select(tag=tag, sender=SERVER)) / rounds,
                **self.pretrain}

    def server_state(self) -> dict:
        return {"pretrain": self.pretrain, "exchange_rows": self.exchange_rows}

    def load_server_state(self, state: dict) -> None:
        self.pretrain, self.exchange_rows = state["pretrain"], state["exchange_rows"]


def _frame(fields: dict) -> bytes:
    from . import wire
    return wire.pack(fields)
