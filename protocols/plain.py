"""The plaintext protocol: the baseline and the attack target.

Each client uploads its contribution as float32 (the wire format of a plaintext
system), or as float64 where the exchange's spec asks for more than float32 resolution
(``ValueSpec.float64_wire``: FedOMD's pooled statistics); the server reads every
contribution, sums them in float64 and sends each recipient the blocks it asked for, in
the same width.  Nothing is hidden: this is what the attack suite reads.
"""
from __future__ import annotations

import numpy as np

from .base import ExchangeContext, Protocol
from .errors import BoundError
from .transcript import SERVER, Message, client_party

#: values per transport block; only the layout granularity (no ciphertext here)
PLAIN_BLOCK = 4096


class PlainProtocol(Protocol):
    mode = "plain"
    upload_kind = "plain"

    def block_capacity(self, spec) -> int:
        return PLAIN_BLOCK

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        wire = np.float64 if ctx.spec.float64_wire else np.float32
        inbox = {}
        for k, table in ctx.contributions.items():
            payload = {"block_ids": table.ids.astype(np.int32), "values": table.values.astype(wire)}
            _check_wire_range(payload["values"], wire, ctx, k, "contribution")
            nbytes = payload["values"].nbytes + (payload["block_ids"].nbytes if ctx.layout == "sparse" else 0)
            inbox[k] = self._deliver(Message(ctx.round, ctx.tag, client_party(k), SERVER, "plain",
                                             table.values.shape, nbytes, self.mode, self.fingerprint, payload))
        totals: dict[int, np.ndarray] = {}
        for k, msg in inbox.items():
            self._check_envelope(msg, ctx, k)
            for bid, row in zip(msg.payload["block_ids"], msg.payload["values"]):
                bid = int(bid)
                if bid in totals:
                    totals[bid] += row.astype(np.float64)
                else:
                    totals[bid] = row.astype(np.float64)
        out = {}
        zero = np.zeros(ctx.block_len)
        for total in totals.values():
            _check_wire_range(total, wire, ctx, None, "sum")
        for r, bids in ctx.requests.items():
            blocks = {int(b): totals.get(int(b), zero).astype(wire) for b in bids}
            values = np.stack(list(blocks.values())) if blocks else np.zeros((0, ctx.block_len), wire)
            msg = self._download(Message(ctx.round, ctx.tag, SERVER, client_party(r), "plain", values.shape,
                                         values.nbytes, self.mode, self.fingerprint,
                                         {"block_ids": np.asarray(bids, np.int32), "values": values}))
            blocks = dict(zip((int(b) for b in msg.payload["block_ids"]), msg.payload["values"]))
            out[r] = {b: v.astype(np.float64) for b, v in blocks.items()}
        return out


def _check_wire_range(values: np.ndarray, wire, ctx: ExchangeContext, client: int | None, what: str) -> None:
    """Refuse values the wire format cannot carry: finite inputs (checked before) that the cast
    to ``wire`` turned into inf, or a float64 sum beyond the wire's range."""
    limit = float(np.finfo(wire).max)
    if values.size and not float(np.abs(values).max()) <= limit:
        raise BoundError(f"a {what} entry exceeds the {np.dtype(wire).name} wire range ({limit:.4g}); nothing was "
                         "aggregated. Fix: scale the values or declare a ValueSpec bound they respect",
                         tag=ctx.tag, round=ctx.round, client=client)
