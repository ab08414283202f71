"""The public plan of one exchange, computed once by the server side and sent with it.

Every fact a client half needs to take part in an exchange, and nothing secret:

    tag, round, exchange number      which exchange (bound into every envelope)
    layout, num_blocks, block_len    how contributions are cut into blocks (protocols.base)
    contributors                     who uploads (mask: who masks toward whom)
    spec, dp_noise_std               the public bounds that fix the encoding
    encoding                         backend-specific public parameters (ring, scale, chain ...)
    requests                         recipient -> block ids it receives

Each client gets :meth:`ExchangePlan.for_client`: the common fields and only *its own*
request (which blocks another recipient asks for is not its business: in FedGCN that is
which rows a client needs).  The plan travels as the body of a signed ``metadata``
message (:meth:`to_payload` / :meth:`from_payload`, strict).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import MalformedMessageError, ShapeError
from .exchange import BlockTable, ValueSpec

_SPEC_FIELDS = ("max_abs", "integer", "sum_max", "tolerance", "owner_checked_sum", "float64_wire", "grid_bits")


@dataclass(frozen=True)
class ExchangePlan:
    """The public plan of one exchange, sent to every party before it runs.

    Attributes:
        tag: name of the quantity summed.
        round: training round.
        exchange: exchange number within the run.
        layout: ``"dense"`` (every client uploads every block) or ``"sparse"`` (each uploads the blocks it holds).
        num_blocks: blocks in the table.
        block_len: values per block.
        contributors: clients whose values are summed.
        requests: client -> the block ids it receives.
        spec: bounds and precision of the values.
        dp_noise_std: standard deviation of the DP noise already in the values (it widens the bounds).
        encoding: the backend's encoding parameters.
    """

    tag: str
    round: int
    exchange: int
    layout: str
    num_blocks: int
    block_len: int
    contributors: tuple[int, ...]
    requests: dict[int, np.ndarray]
    spec: ValueSpec = ValueSpec()
    dp_noise_std: float = 0.0
    encoding: dict[str, Any] = field(default_factory=dict)

    @property
    def parties(self) -> list[int]:
        """Every client taking part: contributors and recipients."""
        return sorted(set(self.contributors) | set(self.requests))

    def for_client(self, k: int) -> ExchangePlan:
        """What client ``k`` is told: its own request only."""
        return replace(self, requests={k: self.requests[k]} if k in self.requests else {})

    def dense_table(self, vector: np.ndarray) -> BlockTable:
        """A dense contribution (1-D, length <= num_blocks * block_len) as this plan's blocks."""
        flat = np.asarray(vector, dtype=np.float64).ravel()
        padded = np.zeros(self.num_blocks * self.block_len)
        padded[: flat.size] = flat
        return BlockTable(np.arange(self.num_blocks), padded.reshape(self.num_blocks, self.block_len))

    def check_table(self, table: BlockTable, client: int) -> None:
        """A client's own check of its contribution against the plan (before encoding)."""
        ids = np.asarray(table.ids, dtype=np.int64).ravel()
        vals = np.asarray(table.values)
        where: dict[str, Any] = dict(tag=self.tag, round=self.round, client=client)
        if vals.ndim != 2 or vals.shape != (ids.size, self.block_len):
            raise ShapeError(f"contribution blocks must be [{ids.size}, {self.block_len}], got {vals.shape}", **where)
        if ids.size and (np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= self.num_blocks):
            raise ShapeError(f"block ids must be sorted, unique and in [0, {self.num_blocks})", **where)
        if self.layout == "dense" and ids.size != self.num_blocks:
            raise ShapeError("the dense layout needs every block from every client", **where)

    # ------------------------------------------------------------------ wire
    def to_payload(self) -> dict[str, Any]:
        """The plan as a plain payload for the wire."""
        return {
            "tag": self.tag,
            "round": int(self.round),
            "exchange": int(self.exchange),
            "layout": self.layout,
            "num_blocks": int(self.num_blocks),
            "block_len": int(self.block_len),
            "contributors": np.asarray(self.contributors, dtype=np.int32),
            "requests": {int(k): np.asarray(v, dtype=np.int64) for k, v in self.requests.items()},
            "spec": {f: getattr(self.spec, f) for f in _SPEC_FIELDS},
            "dp_noise_std": float(self.dp_noise_std),
            "encoding": dict(self.encoding),
        }

    @classmethod
    def from_payload(cls, p: Any) -> ExchangePlan:
        """Strict inverse of :meth:`to_payload` (MalformedMessageError on anything else)."""
        try:
            spec = ValueSpec(**{f: p["spec"][f] for f in _SPEC_FIELDS})
            requests = {int(k): np.asarray(v, dtype=np.int64).ravel() for k, v in p["requests"].items()}
            plan = cls(
                str(p["tag"]),
                int(p["round"]),
                int(p["exchange"]),
                str(p["layout"]),
                int(p["num_blocks"]),
                int(p["block_len"]),
                tuple(int(c) for c in np.asarray(p["contributors"]).ravel()),
                requests,
                spec,
                float(p["dp_noise_std"]),
                dict(p["encoding"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedMessageError(f"malformed exchange plan ({type(e).__name__}: {e})") from None
        if plan.layout not in ("dense", "sparse") or plan.num_blocks < 1 or plan.block_len < 1:
            raise MalformedMessageError(
                f"exchange plan with layout {plan.layout!r}, {plan.num_blocks} blocks of {plan.block_len}"
            )
        for bids in requests.values():
            if bids.size and (bids.min() < 0 or bids.max() >= plan.num_blocks):
                raise MalformedMessageError(f"exchange plan requests blocks outside [0, {plan.num_blocks})")
        return plan
