"""FedGCN's client.

Yao et al., NeurIPS 2023. The pre-training exchange from one client's side (its touch-set histogram, its row ids,
its partial neighbour sums and the totals it decodes; :mod:`.server` describes the exchange), then FedAvg's local
training on the received sums.
"""

from __future__ import annotations

import numpy as np
import torch

from protocols import client_party
from protocols.channel import ChannelKey, associated_data

from ...models.centring import centre_first_layer, own_mean
from ...runtime.exchange import keep_rows, rows_result
from ...runtime.messages import ContributeIns, ContributeRes, MessageError, ReceiveIns
from ..fedavg.client import ModelAveragingLogic
from ..options import FedGCNOptions
from .ops import (
    IDS_TAG,
    ORDER_TAG,
    RELAY_STAGE,
    TAG,
    FedGCNNet,
    PropGraph,
    _local_positions,
    denoise_with_own_data,
    local_degrees,
    narrow_integer_rows,
    neighbour_terms,
    normalise,
    partial_neighbour_sums,
    propagation_graph,
    requested_rows,
    without_clients,
)


def own_signatures(c, far_owner: torch.Tensor) -> np.ndarray:
    """The touch signature ``S(v)`` of every own node.

    ``S(v)`` (int64 bitmask) of every own node: the owner's bit plus the owner of the far end
    of each cross edge at ``v`` (:func:`~secure_fgl.algorithms.fedgcn.ops.touch_signatures`, one owner).
    """
    masks = np.full(c.num_nodes, np.int64(1) << c.client_id, dtype=np.int64)
    if c.cross_edges.numel():
        pos = _local_positions(c.global_ids, c.cross_edges[0]).cpu().numpy()
        np.bitwise_or.at(masks, pos, np.left_shift(np.int64(1), far_owner.cpu().numpy().astype(np.int64)))
    return masks


class FedGCNLogic(ModelAveragingLogic):
    """FedGCN's client: the pre-training stages (module docstring), then FedAvg's client."""

    def __init__(self, runtime, options: dict):
        self.fopts = FedGCNOptions(**options)
        super().__init__(runtime, options)
        c = self.data
        self._inputs = None
        if self.fopts.hops == 0:
            self._set_inputs(c.x, c.edge_index)
        self.row_of = {}  # global id -> exchange row id (own nodes and known remote ones)
        self.sent_own = None  # DP: the clipped own rows it sent
        #: with --attacks: (node id, total) of every row of the blocks this client decoded
        self.decoded: tuple[np.ndarray, np.ndarray] | None = None

    @staticmethod
    def architecture(cfg, facts, options: dict):
        """The FedGCN network on pre-aggregated inputs, or FedAvg's model at 0 hops."""
        if FedGCNOptions(**options).hops == 0:
            return ModelAveragingLogic.architecture(cfg, facts, options)
        return FedGCNNet(
            facts.num_features, cfg.hidden, facts.num_classes, num_layers=cfg.num_layers, dropout=cfg.dropout
        )

    def inputs(self):
        """The pre-aggregated features and propagation graph.

        Raises:
            RuntimeError: the pre-training exchange has not run.
        """
        if self._inputs is None:
            raise RuntimeError("FedGCN's pre-training exchange must run before training")
        return self._inputs

    def _set_inputs(self, z: torch.Tensor, graph) -> None:
        """Set the first-layer input and graph.

        The first-layer input and graph; ``--center``: the model sees ``z`` minus the mean of the
        own rows (:func:`~secure_fgl.models.centring.centre_first_layer`, no centred copy).
        """
        self._inputs = (z, graph)
        if self.fopts.center:
            centre_first_layer(self.model, own_mean(z, self.data.num_nodes))

    def _rows(self, gids: torch.Tensor) -> torch.Tensor:
        if not self.row_of:
            return gids.cpu()
        return torch.as_tensor([self.row_of[int(v)] for v in gids.tolist()], dtype=torch.long)

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """FedGCN's pre-training contributions: row-order histogram, row ids, then the partial neighbour sums.

        The neighbour-sum rows are sum_{j in N(i), j owned here} [x_j, 1] (Yao et al., NeurIPS 2023), clipped
        per term under DP.
        """
        c, o, tag = self.data, self.fopts, req.tag
        if tag == ORDER_TAG:  # the histogram h[., k] of the own nodes' touch sets
            self.signatures = own_signatures(c, self.rt.far_owner)
            self.channel = ChannelKey(client_party(self.rt.client_id))  # X25519 key from the OS CSPRNG
            masks, counts = np.unique(self.signatures, return_counts=True)
            return ContributeRes(
                public={
                    "masks": masks,
                    "counts": counts.astype(np.int64),
                    "channel_key": np.frombuffer(self.channel.public_bytes, dtype=np.uint8),
                }
            )
        if tag == IDS_TAG:  # number own nodes; tell each toucher their row ids
            order = np.argsort(c.global_ids.cpu().numpy(), kind="stable")
            rows = np.empty(c.num_nodes, dtype=np.int64)
            counts = req.entry("counts")
            for m, ids in zip(req.entry("masks").tolist(), np.split(req.entry("rows"), np.cumsum(counts)[:-1])):
                rows[order[self.signatures[order] == m]] = ids
            gids = c.global_ids.cpu().numpy()
            self.row_of = dict(zip(gids.tolist(), rows.tolist()))
            self._relay = {
                "keys": req.entry("channel_keys"),
                "run_id": req.entry("run_id").tobytes(),
                "session": req.entry("session").tobytes(),
            }
            return self._seal_row_ids(gids, rows)
        if tag != TAG:
            return super().contribute(req)
        refusal = self._check_bounds(req)
        if refusal:
            return refusal
        clip = req.dp_clip  # DP: every term [x_j, 1] clipped to C (protocols.dp)
        ids, rows = partial_neighbour_sums(
            c, neighbour_terms(c, o.norm, clip, binary=self.facts.binary_features, seed=self.cfg.seed)
        )
        self.sent_own = rows[: c.num_nodes] if clip is not None else None  # for the DP post-processing
        if clip is None:  # counts of binary features: int16, not float64
            rows = narrow_integer_rows(rows)
        ids, rows, request = self._rows(ids).numpy(), rows.cpu().numpy(), self._rows(requested_rows(c, o.hops)).numpy()
        self.request_rows = request
        return keep_rows(
            self,
            tag,
            ids,
            rows,
            request,
            req,  # the half uploads it; public facts leave here
            whole_blocks=self.cfg.attacks,
        )  # --attacks: it keeps every decoded row

    def _row_ids_channel(self, sender: int, receiver: int) -> tuple[str, bytes, bytes, bytes]:
        """(peer, its channel key, run id, associated data) of the row ids ``sender`` -> ``receiver``."""
        r, me = self._relay, self.rt.client_id
        peer = receiver if sender == me else sender
        ad = associated_data(
            r["run_id"], r["session"], 0, 0, IDS_TAG, RELAY_STAGE, client_party(sender), client_party(receiver)
        )
        return client_party(peer), r["keys"][peer].tobytes(), r["run_id"], ad

    def _seal_row_ids(self, gids: np.ndarray, rows: np.ndarray) -> ContributeRes:
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
        return ContributeRes(
            public={
                "dest": np.asarray(dest, dtype=np.int64),
                "lengths": np.asarray([len(b) for b in sealed], np.int64),
                "sealed": np.frombuffer(b"".join(sealed), dtype=np.uint8),
            }
        )

    def _open_row_ids(self, req: ReceiveIns) -> None:
        """Open the row ids each sender sealed for this client (IntegrityError if one does not authenticate)."""
        me, sealed = self.rt.client_id, req.entry("sealed")
        for k, blob in zip(req.entry("senders").tolist(), np.split(sealed, np.cumsum(req.entry("lengths"))[:-1])):
            peer, key, run_id, ad = self._row_ids_channel(k, me)
            pairs = self.channel.open(peer, key, run_id, blob.tobytes(), ad, dict(tag=IDS_TAG, round=0, client=k))
            pairs = np.frombuffer(pairs, dtype="<i8").reshape(-1, 2)
            self.row_of.update(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()))

    def _check_bounds(self, req: ContributeIns) -> ContributeRes | None:
        """The owner's check of its own nodes against the public caps (before anything is sent)."""
        c, o = self.data, self.fopts
        if req.entry("check_degree"):
            deg = local_degrees(c) - 1
            over = deg[deg > o.degree_cap]
            if over.numel():
                return ContributeRes(
                    public={"refused": "degree", "count": int(over.numel()), "largest": int(over.max())}
                )
        if not (self.facts.binary_features or req.dp_clip is not None):  # DP clips the terms instead
            m = float(c.x.abs().max()) if c.x.numel() else 0.0
            if m > o.feature_bound:
                return ContributeRes(public={"refused": "feature", "largest": m})
        return None

    def receive(self, req: ReceiveIns) -> None:
        """Take the decoded neighbour sums (or row ids) and build the training inputs from them."""
        tag = req.tag
        if tag == IDS_TAG:
            self._open_row_ids(req)
            return None
        if tag != TAG:
            return super().receive(req)
        if req.rpb is None or req.noise_std is None:
            raise MessageError(f"the result of {tag!r} delivered without its rpb and noise_std")
        c, o = self.data, self.fopts
        half, rpb = self.rt.half, int(req.rpb)  # this client's own decoded blocks
        if self.cfg.attacks:
            self.decoded = self._block_rows(half.result(), rpb)
        totals = rows_result(half, self.request_rows, rpb, self.facts.num_features + 1)
        totals = torch.as_tensor(totals, dtype=torch.float64, device=self.rt.device)
        left_out = req.config.get("left_out", ()) if req.config else ()
        if len(left_out):  # dropouts: the sums of the graph without the left-out clients' nodes
            c, kept = without_clients(c, self.rt.far_owner, np.asarray(left_out).tolist())
            totals = totals[kept[: totals.size(0)].to(totals.device)]
        own_deg = local_degrees(c)
        if self.sent_own is not None:  # DP: post-processing with the client's own data
            totals = denoise_with_own_data(c, totals, self.sent_own.to(totals), o.norm, noise_std=float(req.noise_std))
            counts = totals[:, -1]
        else:
            counts = totals[:, -1].round()
            if not torch.equal(counts[: c.num_nodes], own_deg):
                raise RuntimeError(
                    f"client {self.rt.client_id}: received degrees of its own nodes differ from its "
                    "local degrees"
                    + (f" without clients {list(left_out)}" if len(left_out) else "")
                    + " -- a contribution is missing or corrupted"
                )
        degrees = torch.cat([own_deg, counts[c.num_nodes :].clamp_min(1.0)])
        z = normalise(totals, degrees, o.norm).to(torch.float32)
        self._set_inputs(z, propagation_graph(c, o.hops, degrees))
        return None

    def _block_rows(self, blocks: dict, rpb: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row of the decoded ``blocks`` as (node id, total), float32.

        A row whose node this client cannot name (another client's node under ``--row-order signature|owner``) or a
        padding row gets node id -1.
        """
        dim = self.facts.num_features + 1
        bids = np.array(sorted(blocks), dtype=np.int64)
        rows = (bids[:, None] * rpb + np.arange(rpb)[None, :]).ravel()
        totals = np.stack([blocks[int(b)] for b in bids]).reshape(rows.size, dim) if bids.size else np.zeros((0, dim))
        if self.row_of:
            node_of = {r: g for g, r in self.row_of.items()}
            nodes = np.array([node_of.get(int(r), -1) for r in rows], dtype=np.int64)
        else:  # the given order: row id = node id
            nodes = np.where(rows < self.facts.num_nodes, rows, -1)
        return nodes, totals.astype(np.float32)

    def decoded_rows(self) -> dict:
        """Node ids and totals of the blocks this client decoded (kept with ``--attacks``)."""
        if self.decoded is None:
            return {}
        return {"nodes": self.decoded[0], "totals": self.decoded[1]}

    def state_dict(self) -> dict:
        """The model state plus the pre-aggregated inputs (so a resumed run skips pre-training)."""
        state = super().state_dict()
        if self.fopts.hops > 0 and self._inputs is not None:
            z, g = self._inputs
            state["inputs"] = {
                "z": z.cpu(),
                "edge_index": g.edge_index.cpu(),
                "edge_weight": g.edge_weight.cpu(),
                "num_out": g.num_out,
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore the model state and the pre-aggregated inputs."""
        super().load_state_dict(state)
        if "inputs" in state:
            s, dev = state["inputs"], self.rt.device
            self._set_inputs(
                s["z"].to(dev), PropGraph(s["edge_index"].to(dev), s["edge_weight"].to(dev), int(s["num_out"]))
            )
