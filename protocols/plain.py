"""The plaintext protocol: the baseline and the attack target.

Each client uploads its contribution as float32 (the wire format of a plaintext
system), or as float64 where the exchange's spec asks for more than float32 resolution
(``ValueSpec.float64_wire``: FedOMD's pooled statistics); the server reads every
contribution, sums them in float64 and sends each recipient the blocks it asked for, in
the same width.  Nothing is hidden: this is what the attack suite reads.

Stages (:mod:`protocols.party`): ``upload`` — the server sends each party its plan, each
contributor answers with its blocks; ``download`` — the server sends each recipient its
summed blocks, which the recipient's half decodes.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .errors import BoundError, DropoutError, IntegrityError, ShapeError
from .halves import HalvesProtocol
from .link import stream_groups
from .party import ClientHalf, ServerHalf
from .plan import ExchangePlan
from .transcript import SERVER, Message

if TYPE_CHECKING:
    from .exchange import ValueSpec
    from .link import ClientLink

#: values per transport block; only the layout granularity (no ciphertext here)
PLAIN_BLOCK = 4096


def plain_fingerprint(num_clients: int) -> str:
    """Fingerprint of a plain run with ``num_clients`` clients (there are no keys)."""
    return hashlib.sha256(f"plain:{num_clients}".encode()).hexdigest()[:16]


class PlainClient(ClientHalf):
    """A client of the plaintext protocol: uploads float32 blocks, reads its summed blocks."""

    mode = "plain"
    checks_plans = False  # the server reads every contribution: no sum to protect

    def on_stage(self, stage: str, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Upload this client's blocks unencrypted, then check and deliver the downloaded sums.

        Raises:
            IntegrityError: the download is malformed.
            ShapeError: the download has the wrong shape.
        """
        fp = plain_fingerprint(self.setup.num_clients)
        if stage == "upload":
            if self.id not in cast(ExchangePlan, self.plan).contributors:
                return []
            table = self.contribution(dense=False)  # lazy row blocks are built in the wire's width
            wire = np.float64 if cast(ExchangePlan, self.plan).spec.float64_wire else np.float32
            payload: dict[str, np.ndarray] = {
                "block_ids": table.ids.astype(np.int32),
                "values": np.asarray(table.values, dtype=wire),
            }
            _check_wire_range(payload["values"], wire, "contribution", self.where())
            return [self.seal(self.message(SERVER, "plain", table.values.shape, payload, fp), "upload")]
        if stage == "download":
            for msg in inbox:
                self.check(msg, SERVER, "download", 0, self.where())
                p = msg.payload
                try:
                    ids, values = np.asarray(p["block_ids"], dtype=np.int64), np.asarray(p["values"])
                except (KeyError, TypeError) as e:
                    raise IntegrityError(f"malformed download ({e})", **self.where()) from None
                if values.shape != (ids.size, cast(ExchangePlan, self.plan).block_len):
                    raise ShapeError(f"download of shape {values.shape}", **self.where())
                self.deliver({int(b): v.astype(np.float64) for b, v in zip(ids, values)})
        return []


class PlainServer(ServerHalf):
    """The plaintext server: reads and sums every upload."""

    mode = "plain"

    def run(self, plan: ExchangePlan, link: ClientLink) -> tuple[int, ...]:
        """Run the plain exchange, streaming uploads and downloads client by client.

        Uploads are folded into the float64 totals as they arrive and downloads are sent as they
        are built, client by client over a sequential link (:func:`~protocols.link.stream_groups`):
        the server holds the totals and one client's blocks, not every upload and download at once.
        """
        fp = plain_fingerprint(self.setup.num_clients)
        self.begin(plan, link, fp)
        contributors = set(plan.contributors)
        order = list(plan.contributors) + [k for k in plan.parties if k not in contributors]
        totals: dict[int, np.ndarray] = {}
        missing = []
        for group in stream_groups(link, order):
            got = self.call(link, "upload", {k: [] for k in group})
            for k in (k for k in group if k in contributors):
                msg = self.responses(got, k, "upload", "plain")
                if msg is None:
                    missing.append(k)
                    continue
                self.check_envelope(msg, fp, k)
                try:
                    ids, values = msg.payload["block_ids"], msg.payload["values"]
                except (KeyError, TypeError) as e:
                    raise IntegrityError(f"malformed upload ({e})", **self.where(k)) from None
                for bid, row in zip(ids, values):
                    bid = int(bid)
                    if bid in totals:
                        totals[bid] += row.astype(np.float64)
                    else:
                        totals[bid] = row.astype(np.float64)
            del got
        if missing and (plan.dp_noise_std > 0 or len(missing) == len(contributors)):
            why = (
                "every contributor dropped"
                if len(missing) == len(contributors)
                else "each contributor adds a share of the DP noise, so a survivors' sum would be short of noise"
            )
            err = DropoutError(
                f"client(s) {', '.join(map(str, missing))} did not upload ({why}); nothing was aggregated",
                **self.where(missing[0]),
            )
            err.clients = tuple(missing)
            raise err
        wire = np.float64 if plan.spec.float64_wire else np.float32
        for total in totals.values():
            _check_wire_range(total, wire, "sum", self.where())
        zero = np.zeros(plan.block_len)
        for group in stream_groups(link, plan.requests):
            downloads = {}
            for r in group:
                bids = plan.requests[r]
                values = (
                    np.stack([totals.get(int(b), zero) for b in bids]).astype(wire)
                    if bids.size
                    else np.zeros((0, plan.block_len), wire)
                )
                downloads[r] = [
                    (
                        self.message(
                            r, "plain", values.shape, {"block_ids": np.asarray(bids, np.int32), "values": values}, fp
                        ),
                        0,
                    )
                ]
            self.call(link, "download", downloads)
        return tuple(k for k in plan.contributors if k not in missing)  # the clients that uploaded


class PlainProtocol(HalvesProtocol):
    """Insecure reference: clients send values in the clear and the server adds them (no privacy)."""

    mode = "plain"
    upload_kind = "plain"
    client_half = PlainClient
    server_half = PlainServer

    def block_capacity(self, spec: ValueSpec) -> int:
        """Values per block of the plain transport."""
        return PLAIN_BLOCK


def _check_wire_range(values: np.ndarray, wire: type[np.floating[Any]], what: str, where: dict[str, Any]) -> None:
    """Refuse values the wire format cannot carry.

    Finite inputs (checked before) that the cast to ``wire`` turned into inf, or a float64 sum beyond the wire's
    range.
    """
    limit = float(np.finfo(wire).max)
    if values.size and not float(np.abs(values).max()) <= limit:
        raise BoundError(
            f"a {what} entry exceeds the {np.dtype(wire).name} wire range ({limit:.4g}); nothing was "
            "aggregated. Fix: scale the values or declare a ValueSpec bound they respect",
            **where,
        )
