"""Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017) as a protocol backend.

One exchange (:meth:`MaskServer.run` driving one :class:`MaskClient` per client over a
:class:`~protocols.link.ClientLink`, only bytes crossing) is one aggregation instance of Bonawitz,
Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and Seth, "Practical Secure Aggregation
for Privacy-Preserving Machine Learning" (CCS 2017, §4, Fig. 4), with the consistency check of its
active-adversary variant, over the ring ``Z_{2^b}``.  Client ``k`` uploads, per block it contributes,

    y_k = q(x_k) + sum_{j>k} PRG(s_kj) - sum_{j<k} PRG(s_kj) + PRG(b_k^(seq)) + R_k     (mod 2^b)

with ``j`` over the other participants contributing to that block,
``s_kj = HKDF(X25519(k, j); run, exchange, tag, round, k, j)`` the pairwise seed of this exchange
(one mask key pair per client per run, :mod:`.keys`), ``b_k^(seq)`` a fresh self-mask seed
Shamir-shared with threshold ``t`` (:mod:`.shamir`) and ``R_k`` the output mask.  Stages:
``group_seed``, ``block_ids`` (sparse layout), ``advertise_keys``, ``share_keys``, ``masked_upload``,
``consistency`` (the survivors sign the survivor set), ``unmask`` (shares of the survivors' ``b_u``,
pairwise seeds toward clients that dropped before uploading, never both for one client),
``download``.  Too few responders raise :class:`~protocols.errors.DropoutError`: never a wrong sum.

Output privacy (default): with ``P_j = PRG(HKDF(G; exchange, j))`` from the clients' group seed
``G`` and ``P_K = 0``,

    R_k = P_k - P_{k+1},    so that    sum_{k in S} R_k = sum_{maximal runs [a..c] of S} (P_a - P_{c+1})

and the smallest included contributor's ``P_m`` keeps the server's sum uniformly random to it;
recipients remove the included contributors' ``R_k``.  ``reveal_to_server=True`` drops ``R_k``.

The steps, the security argument, what leaks, collusion and the dropout simulation
(:meth:`MaskProtocol.drop_clients`): docs/mask.md; how the protocol differs from Bonawitz et al.:
docs/security.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import ConfigurationError, ShapeError
from ..exchange import ExchangeContext, ValueSpec
from ..halves import HalvesProtocol
from ..link import InProcessLink
from .client import MaskClient, Participant
from .keys import ExchangeBinding
from .public import mask_fingerprint, shamir_threshold
from .quantize import RING_BITS, FixedPoint, choose_encoding
from .server import MaskServer

if TYPE_CHECKING:
    from ..plan import ExchangePlan

#: values per transport block (the layout granularity of the sparse leak)
MASK_BLOCK = 4096
DROP_STAGES = ("keys", "upload", "unmask", "late")
#: link stages at which a client dropped at each simulated stage goes silent
_SILENT_AT = {
    "keys": ("block_ids", "advertise_keys", "share_keys", "masked_upload", "unmask"),
    "upload": ("masked_upload", "unmask"),
    "late": ("masked_upload", "unmask"),
    "unmask": ("unmask",),
}


class MaskProtocol(HalvesProtocol):
    """Pairwise-mask secure aggregation over ``Z_{2^ring_bits}``.

    Parameters (besides those of :class:`~protocols.base.Protocol`)
    ----------
    ring_bits:         b, the ring ``Z_{2^b}``: a whole number of bytes, 8 to 64, or ``'auto'``
                       (default): per exchange the smallest ring that carries the K-way sum
                       within the ValueSpec (public bounds only), e.g. 8 bits for binary-feature
                       counts, 24 or 32 for floats at a 1e-4 tolerance and moderate bounds.
    frac_bits:         fixed-point fractional bits; ``None`` picks the most that the
                       public bounds allow (see :func:`.quantize.choose_encoding`).
    reveal_to_server:  ``False`` (default): output mask, the server learns nothing;
                       ``True``: standard Bonawitz, the server learns the sums.
    dropout_recovery:  recover a client that drops after the exchange's set-up (the
                       survivors reveal this exchange's pairwise seeds with it);
                       ``False`` aborts on any such dropout.
    threshold:         Shamir threshold t (>= 2), public, never taken from a plan; default
                       ``floor((n + c) / 2) + 1`` for an exchange of n contributors and
                       ``max_colluders`` c (an honest majority when c = 0); capped at n.
    block_size:        values per transport block (default 4096).
    self_mask_batch:   E, the self-mask seeds a client Shamir-shares at once (default 64):
                       one share round covers E exchanges of the same contributor set and
                       threshold; 1 shares a fresh seed in every exchange.
    """

    mode = "mask"
    upload_kind = "masked"
    client_half = MaskClient
    server_half = MaskServer

    def __init__(
        self,
        num_clients: int,
        *,
        ring_bits: int | str = "auto",
        frac_bits: int | None = None,
        reveal_to_server: bool = False,
        dropout_recovery: bool = True,
        threshold: int | None = None,
        block_size: int = MASK_BLOCK,
        self_mask_batch: int = 64,
        **base_options: Any,
    ):
        if ring_bits != "auto" and ring_bits not in RING_BITS:
            raise ConfigurationError(
                f"ring_bits must be one of {', '.join(map(str, RING_BITS))} or 'auto', got {ring_bits!r}"
            )
        if threshold is not None and int(threshold) < 2:
            raise ConfigurationError(
                "threshold must be >= 2: with t=1 every share is the secret itself, so "
                "each client would hold every other client's mask key"
            )
        if int(block_size) < 1:
            raise ConfigurationError(f"block_size must be >= 1, got {block_size}")
        if not 1 <= int(self_mask_batch) <= 1024:
            raise ConfigurationError(f"self_mask_batch must be 1 to 1024, got {self_mask_batch}")
        self.ring_bits = ring_bits if ring_bits == "auto" else int(ring_bits)
        self.frac_bits = frac_bits
        self.reveal_to_server = bool(reveal_to_server)
        self.dropout_recovery = bool(dropout_recovery)
        self.threshold = None if threshold is None else int(threshold)
        self.block_size = int(block_size)
        self.self_mask_batch = int(self_mask_batch)
        super().__init__(num_clients, **base_options)
        self._pending_drops: dict[int, str] = {}
        #: clients whose contributions the last result covers, and who dropped (client -> stage)
        self.last_included: tuple[int, ...] = ()
        self.last_dropped: dict[int, str] = {}
        #: public encoding of the last exchange, and wall-clock seconds per role
        self.last_encoding: FixedPoint | None = None
        self.last_timing: dict[str, float] = {}
        self.last_stats: dict[str, Any] | None = None
        #: attack simulations only: keep every client's secrets of the last exchange (its memory),
        #: so that a coalition attack can use what its colluding clients hold; off by default
        self.keep_client_state = False
        self.last_client_state: dict[int, Participant] = {}
        self.last_binding: ExchangeBinding | None = None

    def public_options(self) -> dict[str, Any]:
        """Ring and fixed-point sizes, reveal and dropout switches, Shamir threshold, block size, self-mask batch."""
        return {
            "ring_bits": self.ring_bits,
            "frac_bits": self.frac_bits,
            "reveal_to_server": self.reveal_to_server,
            "dropout_recovery": self.dropout_recovery,
            "threshold": self.threshold,
            "block_size": self.block_size,
            "self_mask_batch": self.self_mask_batch,
        }

    # ------------------------------------------------------------------ public knobs
    @property
    def fingerprint(self) -> str:
        """Hash of the client count and the public options."""
        return mask_fingerprint(self.num_clients, self.public_options())

    @property
    def _group_seed(self) -> dict[int, bytes]:
        """Each in-process client's copy of the output-mask group seed (what a colluding client holds)."""
        halves = cast(dict[int, MaskClient], self.clients)
        return {k: c.group_seed for k, c in halves.items() if c.group_seed is not None}

    def block_capacity(self, spec: ValueSpec) -> int:
        """Values per block: the configured ``block_size``."""
        return self.block_size

    def drop_clients(self, clients: Iterable[int], stage: str = "upload") -> None:
        """Simulate ``clients`` leaving the next exchange at ``stage`` ('keys' | 'upload' | 'unmask' | 'late')."""
        if stage not in DROP_STAGES:
            raise ConfigurationError(f"stage must be one of {', '.join(DROP_STAGES)}, got {stage!r}")
        for c in clients:
            c = int(c)
            if not 0 <= c < self.num_clients:
                raise ConfigurationError(f"unknown client id {c} (clients are 0..{self.num_clients - 1})")
            self._pending_drops[c] = stage

    def threshold_for(self, n: int) -> int:
        """Shamir threshold for an exchange with ``n`` contributors (:func:`shamir_threshold`)."""
        return shamir_threshold(n, self.threshold, self.collusion.max_colluders)

    # ------------------------------------------------------------------ one exchange
    def plan_encoding(self, ctx: ExchangeContext) -> dict[str, Any]:
        """Fixed-point encoding, Shamir threshold and the dropouts distributed DP noise was provisioned for."""
        n0 = len(ctx.contributions)
        enc = choose_encoding(
            max_abs=ctx.spec.max_abs,
            integer=ctx.spec.integer,
            tolerance=ctx.spec.tolerance,
            num_contributors=n0,
            ring_bits=self.ring_bits,
            dp_noise_std=ctx.dp_noise_std,
            frac_bits=self.frac_bits,
            tag=ctx.tag,
            round=ctx.round,
        )
        self.last_encoding = enc  # public; set before any message (test hooks read it)
        return {
            "fixed_point": dataclasses.asdict(enc),
            "threshold": self.threshold_for(n0),
            "provisioned_dropouts": self.provisioned_dropouts(ctx),
        }

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        drops, self._pending_drops = self._pending_drops, {}
        contributors = sorted(int(k) for k in ctx.contributions)
        if not contributors:
            raise ShapeError("no contributions", tag=ctx.tag, round=ctx.round)
        stray = sorted(set(drops) - set(contributors))
        if stray:
            raise ConfigurationError(
                f"drop_clients named {stray}, which do not contribute to this exchange", tag=ctx.tag, round=ctx.round
            )
        link, server = cast(InProcessLink, self.link), cast(MaskServer, self.server)  # drops: in-process runs only
        clients = cast(dict[int, MaskClient], self.clients)
        for k, stage in drops.items():
            link.mute(k, _SILENT_AT[stage])
        for half in clients.values():
            half.keep_input = self.keep_client_state
        self.last_client_state = {}
        try:
            result = super()._aggregate(ctx)
        finally:
            for k in drops:
                link.reconnect(k)
        plan = cast("ExchangePlan", server.plan)
        self.last_binding = ExchangeBinding(self.run_id, plan.exchange, ctx.tag, ctx.round)
        self.last_included = server.last_included
        self.last_dropped = {k: drops.get(k, stage) for k, stage in server.last_missing.items()}
        for k in sorted(drops):  # the upload of a 'late' client arrives after recovery: recorded only
            if drops[k] == "late":
                for msg in server.parse(link.lost.pop((k, "masked_upload")), server.where(k)):
                    server.record(dataclasses.replace(msg, note="late upload, not aggregated"))
        halves = {k: clients[k] for k in contributors}
        if self.keep_client_state:
            self.last_client_state = {k: h.state for k, h in halves.items() if h.state is not None}
        self._collect_stats(ctx, halves, plan)
        return result

    def _collect_stats(self, ctx: ExchangeContext, halves: dict[int, MaskClient], plan: ExchangePlan) -> None:
        clients, server = cast(dict[int, MaskClient], self.clients), cast(MaskServer, self.server)
        timing = {k: h.timing for k, h in halves.items()}
        up = {k: t.get("encode_s", 0.0) + t.get("mask_s", 0.0) for k, t in timing.items() if "mask_s" in t}
        down = {r: clients[r].timing.get("decode_s", 0.0) for r in plan.requests}
        encode = sum(t.get("encode_s", 0.0) for t in timing.values())
        setup = server.last_timing.get("setup_s", 0.0)
        self.last_timing = {
            "encode_s": encode,  # all clients, quantise + bound check
            "setup_s": setup,  # metadata, keys, shares (wall clock)
            "client_mask_s": float(np.mean([t.get("mask_s", 0.0) for t in timing.values()])) if timing else 0.0,
            "server_s": server.last_timing.get("server_s", 0.0),  # checks, sum, recovery
            "recipient_s": float(np.mean(list(down.values()))) if down else 0.0,
        }
        enc = cast(FixedPoint, self.last_encoding)  # set by plan_encoding
        self.last_stats = {
            "tag": ctx.tag,
            "round": ctx.round,
            "client_upload_s": up,
            "client_download_s": down,
            "server_s": self.last_timing["server_s"],
            "setup_s": setup,
            "params": {
                "ring_bits": enc.ring_bits,
                "frac_bits": enc.frac_bits,
                "threshold": int(plan.encoding["threshold"]),
                "output_mask": not self.reveal_to_server,
                "error_bound": enc.error_bound,
            },
        }
