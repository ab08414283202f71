"""FedGCN's server (Yao et al., NeurIPS 2023); the client is :mod:`.client`.

The pre-training exchange (:mod:`.ops`), with every party apart:

1. ``--row-order signature|owner`` only: each client publishes the histogram of its own nodes'
   touch sets, ``h[S, k]`` = #own nodes ``v`` with ``S(v) = S`` (tag ``fedgcn/row_order``,
   client -> server, recorded).  The server numbers the rows from ``h`` and the public rows per
   block alone (:func:`layout_from_histogram`) and sends each owner the row ids of
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
3. Training is FedAvg (:class:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy`) on those inputs.

Dropouts (``--simulate-dropouts``, a lost client): the backend's policy decides (mask: up to n - t, t-out-of-n
``ckks-mp``: up to n - t, plain and ``ckks``: any, n-out-of-n ``ckks-mp``: none, a DropoutError).  The sums then omit
the left-out clients' contributions, so each receiver's inputs are FedGCN's on the subgraph induced by the other
clients' nodes (exact for ``--norm row`` and ``none``; ``sym`` keeps each neighbour's full-graph ``d̃_j^{-1/2}``), and
every client without sums (left out, or silent at their delivery) sits out the run; ``result.json``'s
``pretrain_dropouts`` records both.
"""

from __future__ import annotations

import time

import numpy as np

from protocols import SERVER, BoundError, client_party
from protocols.errors import IntegrityError

from ...runtime import wire
from ...runtime.exchange import run_row_sum
from ...runtime.messages import ContributeIns, ContributeRes, ReceiveIns
from ..fedavg.server import ModelAveragingStrategy
from ..options import FedGCNOptions
from .ops import (
    IDS_TAG,
    ORDER_TAG,
    TAG,
    _inverse_gray,
    degree_cap_needed,
    dp_applies,
    dp_row_clip,
    exchange_dp_request,
    exchange_spec,
    pretrain_stats,
    release_dependencies_of,
    segment_blocks,
)


def layout_from_histogram(
    classes: list[tuple[int, int, int]], rpb: int, row_order: str, hops: int, num_nodes: int
) -> tuple[dict[tuple[int, int], np.ndarray], int]:
    """Row ids of every class ``(mask S, owner k, count)`` and the exchange's number of rows.

    ``signature``: classes in reflected-Gray order of ``S``, then owner; the sequence cut into
    blocks by :func:`segment_blocks` (a single block: the given numbering's row count).
    ``owner``: grouped by recipients (owner at 1 hop, ``S`` at 2 hops), each group starting a
    new block, Gray order of ``S`` then owner inside a group.
    """
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
    return {(int(masks[i]), int(owners[i])): pos[e - counts[i] : e] for i, e in zip(order, ends)}, num_rows


class FedGCNStrategy(ModelAveragingStrategy):
    """FedGCN's server: the pre-training stages (module docstring), then FedAvg."""

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedGCNOptions(**options)
        self.pretrain: dict = {}
        self.exchange_rows = facts.num_nodes
        self.dp_on = self.fopts.hops > 0 and dp_applies(cfg, protocol)
        if protocol.dp is not None and cfg.dp_epsilon and self.fopts.hops > 0 and not protocol.dp.config.budget_shares:
            protocol.dp.declare(TAG, f"{self.name}/model")  # equal shares of the run's budget

    def release_dependencies(self) -> dict[str, set[str]]:
        """The data each release touches (:mod:`secure_fgl.privacy`)."""
        return release_dependencies_of(self.name)

    def setup(self) -> None:
        """Run the pre-training neighbour-sum exchange once (nothing at 0 hops) and record its bytes and time."""
        o, f, K = self.fopts, self.facts, self.num_clients
        if o.hops == 0:
            self.pretrain = {
                "pretrain_bytes_up": 0,
                "pretrain_bytes_down": 0,
                "pretrain_plaintext_equiv_bytes_up": 0,
                "pretrain_plaintext_equiv_bytes_down": 0,
                "pretrain_time": 0.0,
            }
            return
        t0 = time.perf_counter()
        dp = exchange_dp_request(o, self.cfg, f.binary_features) if self.dp_on else None
        spec = exchange_spec(o, f.binary_features, dp_row_clip(o, self.cfg) if dp else None, counts=f.count_features)
        num_rows = f.num_nodes
        if o.row_order != "given" and o.layout == "sparse":
            num_rows = self._number_rows(self.protocol.rows_per_block(spec, f.num_features + 1, f.num_nodes, "sparse"))
        dim = f.num_features + 1
        spec = self.protocol.release_spec(spec, dp)  # a DP sum's public grid (protocols.dp.release_spec)
        rpb = self.protocol.rows_per_block(spec, dim, num_rows, o.layout)
        ask = ContributeIns(
            TAG,
            0,
            dp_clip=dp_row_clip(o, self.cfg) if dp else None,
            rpb=rpb,
            num_blocks=-(-num_rows // rpb),
            layout=o.layout,
            config={"check_degree": degree_cap_needed(self.cfg, self.protocol.mode, self.dp_on)},
        )
        sent = self.ask("contribute", {k: ask for k in self.alive(range(K))})
        self._refuse(sent)
        rows_up = {k: int(r.rows_up) for k, r in sent.items()}
        rows_down = {k: int(r.rows_down) for k, r in sent.items()}
        noise_std = run_row_sum(self, TAG, 0, sent, num_rows, dim, o.layout, spec, rpb, dp)
        left_out = sorted(set(range(K)) - set(self.protocol.last_included))
        no_inputs = sorted(set(left_out) | set(self.protocol.server.last_undelivered) | set(self.lost))
        config = {"left_out": np.asarray(left_out, dtype=np.int64)} if left_out else {}
        done = ReceiveIns(TAG, 0, rpb=rpb, noise_std=noise_std, config=config)
        self.tell("receive", {k: done for k in range(K) if k not in no_inputs})
        self.exchange_rows = num_rows
        self.pretrain = self._pretrain_stats(rows_up, rows_down)
        self.pretrain["pretrain_time"] = time.perf_counter() - t0
        if no_inputs:
            self._sit_out(left_out, no_inputs)

    def _sit_out(self, left_out: list[int], no_inputs: list[int]) -> None:
        """After dropouts in the pre-training exchange: record them, and the clients without inputs sit out the run.

        The sums left out the contributions of ``left_out``: each receiver's inputs are FedGCN's on the subgraph
        induced by the other clients' nodes (:func:`~.ops.without_clients`).  The clients ``no_inputs`` (left out,
        or without their sums) have nothing to train on: lost for the run.
        """
        K = self.num_clients
        self.pretrain["pretrain_dropouts"] = {
            "left_out": left_out,
            "without_inputs": no_inputs,
            "graph": f"induced by the nodes of clients {[k for k in range(K) if k not in left_out]}",
        }
        why = "no FedGCN pre-training sums (a dropout in that exchange): nothing to train on"
        self.lose({k: why for k in no_inputs if k not in self.lost}, f"the delivery of {TAG}")

    def _number_rows(self, rpb: int) -> int:
        """Stage 1 of the module docstring; returns the exchange's number of rows."""
        K = self.num_clients
        hist = {
            k: r.public
            for k, r in self.ask(
                "contribute", {k: ContributeIns(ORDER_TAG, 0) for k in range(K)}, record=(ORDER_TAG, "metadata")
            ).items()
        }
        self.check_lost(range(K), "the row numbering")
        classes = [(int(m), k, int(n)) for k in range(K) for m, n in zip(hist[k]["masks"], hist[k]["counts"])]
        rows, num_rows = layout_from_histogram(
            classes, rpb, self.fopts.row_order, self.fopts.hops, self.facts.num_nodes
        )
        channel = {
            "channel_keys": np.stack([hist[k]["channel_key"] for k in range(K)]).astype(np.uint8),
            "run_id": np.frombuffer(self.protocol.run_id, dtype=np.uint8),
            "session": np.frombuffer(self.protocol.session, dtype=np.uint8),
        }
        mine = {
            k: ContributeIns(
                IDS_TAG,
                0,
                config={
                    "masks": hist[k]["masks"],
                    "counts": hist[k]["counts"],
                    "rows": np.concatenate([rows[(int(m), k)] for m in hist[k]["masks"]]),
                    **channel,
                },
            )
            for k in range(K)
        }
        for k, r in mine.items():
            self.record(ORDER_TAG, SERVER, client_party(k), "metadata", len(wire.pack(r.to_fields())))
        told = {k: r.public for k, r in self.ask("contribute", mine).items()}
        self.check_lost(range(K), "the row numbering")
        inbox: dict[int, list] = {j: [] for j in range(K)}
        for k, r in told.items():  # the server relays ciphertext it cannot open
            dest, lengths = r["dest"].tolist(), r["lengths"]
            if (
                len(dest) != lengths.size
                or int(lengths.sum()) != r["sealed"].size
                or any(j == k or not 0 <= j < K for j in dest)
            ):
                raise IntegrityError("malformed sealed row ids", tag=IDS_TAG, round=0, client=k)
            for j, blob in zip(dest, np.split(r["sealed"], np.cumsum(lengths)[:-1])):
                self.record(
                    IDS_TAG,
                    client_party(k),
                    client_party(j),
                    "ciphertext",
                    blob.size,
                    note="row ids of the owner's nodes the receiver touches (channel-encrypted, relayed)",
                    relay=SERVER,
                )
                inbox[j].append((k, blob))
        self.tell(
            "receive",
            {
                j: ReceiveIns(
                    IDS_TAG,
                    0,
                    config={
                        "senders": np.asarray([k for k, _ in parts], np.int64),
                        "lengths": np.asarray([b.size for _, b in parts], np.int64),
                        "sealed": np.concatenate([b for _, b in parts] or [np.zeros(0, np.uint8)]),
                    },
                )
                for j, parts in inbox.items()
            },
        )
        return num_rows

    def _refuse(self, sent: dict[int, ContributeRes]) -> None:
        """BoundError naming the worst client when an owner refused its own nodes' bounds."""
        refused = {k: r.public for k, r in sent.items() if "refused" in r.public}
        if not refused:
            return
        worst = max(refused, key=lambda k: refused[k]["largest"])
        r, o = refused[worst], self.fopts
        if r["refused"] == "degree":
            n = sum(x.get("count", 0) for x in refused.values() if x["refused"] == "degree")
            mode = self.protocol.mode
            why = (
                "node-level DP's sensitivity sqrt(cap + 1) * C would not hold"
                if mode == "plain"
                else f"{mode} sums sized to it would wrap"
            )
            raise BoundError(
                f"{n} node(s) on {len(refused)} client(s) have degree above --degree-cap "
                f"{o.degree_cap} (largest {r['largest']}, on client {worst}); {why}. "
                f"Raise --degree-cap to at least {r['largest']} (it is a public bound)",
                tag=TAG,
                round=0,
                client=worst,
            )
        raise BoundError(
            f"a feature has |x| = {r['largest']:.4g} above --feature-bound {o.feature_bound}; raise "
            "--feature-bound (a public bound) or scale the features",
            tag=TAG,
            round=0,
            client=worst,
        )

    def _pretrain_stats(self, rows_up: dict, rows_down: dict) -> dict:
        """The pre-training exchange's figures from the server half's transcript.

        The pre-training exchange's figures (:func:`secure_fgl.algorithms.fedgcn.ops.pretrain_stats`)
        from the server half's transcript, plus the bytes of the row numbering.
        """
        tr = self.protocol.transcript
        return {
            **pretrain_stats(
                tr,
                rows_up,
                rows_down,
                self.facts.num_features + 1,
                self.exchange_rows,
                self.fopts.layout,
                self.fopts.row_order,
            ),
            "pretrain_order_bytes": sum(m.nbytes for m in tr.messages if m.tag in (ORDER_TAG, IDS_TAG)),
        }

    def final_metrics(self) -> dict:
        """Base metrics plus hops, normalisation, layout, per-round model bytes and the pre-training cost."""
        tr, tag = self.protocol.transcript, f"{self.name}/model"
        rounds = len({m.round for m in tr.messages if m.tag == tag}) or 1
        return {
            **super().final_metrics(),
            "hops": self.fopts.hops,
            "norm": self.fopts.norm,
            "layout": self.fopts.layout,
            "model_bytes_up_per_round": sum(m.nbytes for m in tr.select(tag=tag, receiver=SERVER)) / rounds,
            "model_bytes_down_per_round": sum(m.nbytes for m in tr.select(tag=tag, sender=SERVER)) / rounds,
            **self.pretrain,
        }

    def server_state(self) -> dict:
        """Pre-training cost and exchanged row counts."""
        return {"pretrain": self.pretrain, "exchange_rows": self.exchange_rows}

    def load_server_state(self, state: dict) -> None:
        """Restore the state written by :meth:`server_state`."""
        self.pretrain, self.exchange_rows = state["pretrain"], state["exchange_rows"]
