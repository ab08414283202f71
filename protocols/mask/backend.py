"""Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017) as a protocol backend.

One exchange (:meth:`MaskServer.run` driving one :class:`MaskClient` per client over a
:class:`~protocols.link.ClientLink`, only bytes crossing) is one aggregation instance of the
protocol of Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and
Seth, "Practical Secure Aggregation for Privacy-Preserving Machine Learning"
(CCS 2017, §4, Fig. 4), with the consistency check of its active-adversary variant, over the
ring ``Z_{2^b}``:

0. *Local encoding* — every contributor quantises its blocks (:mod:`.quantize`; by
   default the smallest ring that carries the sum within the ValueSpec) and checks
   them against the public bound **before** anything is sent.
1. *Metadata* (sparse layout only) — each client tells the server which block ids it
   touches (the documented leak of this layout); the server returns to each client,
   per peer, the ids they have in common, so that masks of block ``b`` involve only
   the contributors of ``b``.
2. *AdvertiseKeys* — one X25519 mask key pair per client **per run** (:mod:`.keys`): a
   client's first exchange sends its public key; the server broadcasts to each participant
   the keys it has not sent it yet.  The secret key never leaves its client.
3. *ShareKeys* — each participant draws a batch of ``E`` fresh self-mask seeds
   ``b_k^(s)`` (os.urandom) for exchanges ``s = seq .. seq+E-1`` of the same contributor set
   and threshold, and Shamir-shares each (threshold ``t``, :mod:`.shamir`) with the other
   contributors in one channel message per peer; the share round runs only in the exchanges
   where a participant's batch does not cover ``seq``, or some participant holds no share of it
   (it was absent from that share round) (``E = 1``: every exchange).  Shares
   travel over the encrypted client-to-client channel relayed by the server
   (:mod:`protocols.channel`; recorded as ``ciphertext`` messages with ``relay='server'``): the
   server cannot read them.  If a contributor drops before uploading is planned (no key, no
   batch), the server sends the remaining participants their list.
4. *MaskedInputCollection* — client ``k`` uploads, per block it contributes (Bonawitz
   double masking, plus an output mask),

       y_k = q(x_k) + sum_{j>k} PRG(s_kj) - sum_{j<k} PRG(s_kj) + PRG(b_k^(seq)) + R_k     (mod 2^b)

   with ``j`` ranging over the other participants contributing to that block,
   ``s_kj = HKDF(X25519(k, j); run, exchange, tag, round, k, j)`` the pairwise seed of this
   exchange, ``b_k^(seq)`` its self-mask seed and ``R_k`` the output mask (default; absent
   with ``reveal_to_server=True``), see below.
5. *ConsistencyCheck* — the server sends every uploader the survivor set ``U``; each signs
   ``(run, session, exchange, tag, round, U, v)`` (:func:`survivor_statement`) with its identity
   key, ``v`` the digest of the broadcasts it trained on (:mod:`protocols.broadcast_view`; in an
   exchange the public schedule marks as a broadcast, every survivor must sign).
   The unmasking request carries ``U``, the dropped participants and those signatures; a client
   answers only a request that names the set it signed, with at least ``t`` valid signatures
   over it (:class:`~protocols.errors.ConsistencyError` otherwise), so the server cannot ask
   some clients about a survivor and others about a "dropped" client (``2t > n + c``).
   *Unmasking* — the server sums the uploads mod ``2^b``.  Pairwise masks cancel
   between survivors.  The server asks each uploader for its share of every survivor's
   ``b_u^(seq)`` **and**, for each client ``d`` that dropped before uploading, for the
   uploader's pairwise seed ``s_jd`` of this exchange — never both for one client; an honest
   client refuses a request naming one client in both lists
   (:class:`~protocols.errors.UnmaskingRefusedError`) and answers one unmasking round per
   exchange.  When every participant uploaded, the request names no dropped client: each
   uploader answers with its shares of every participant's ``b_u`` and no seed.  The server rebuilds each ``b_u`` from
   ``t`` shares and removes ``PRG(b_u)``, and removes the survivors' dangling masks toward
   each dropped client — the sum then covers the survivors only and recipients are told who
   was included.  Where Bonawitz et al. rebuild the dropped client's secret key from ``t``
   shares, here every survivor that shares blocks with it reveals its own seed: the server
   learns less (one exchange's seeds, not a key), which is what makes a key per run safe, but
   a survivor that also misses the unmasking round leaves a mask it cannot remove.  Too few
   responders (``< t``), a missing seed, recovery disabled, or DP noise placed 'distributed'
   (a survivors' sum would be short of noise): DropoutError.  Never a wrong sum.
6. *Delivery* — each recipient gets exactly the blocks it asked for, removes the
   output mask and decodes.

Every client->server and client->client message is signed (Ed25519) in the envelope of
:mod:`protocols.message`, with stages ``advertise_keys``, ``share_keys``, ``masked_upload``,
``consistency``, ``unmask`` (and ``block_ids`` in the sparse layout); the server and each recipient verify it
before use (:mod:`protocols.auth`).

**Individual inputs are protected by ``b_k``** (Bonawitz et al. §4): if a "dropped" client's
upload arrives late after the server removed its pairwise masks, the server (and any coalition
of fewer than ``t`` clients) still faces ``PRG(b_k^(seq))``, whose shares it never asked for in
that exchange.  Each ``b_k^(s)`` and each pairwise seed masks one exchange only (the exchange
number only grows, and a client answers one unmasking request per exchange), so what the
server learns in one exchange's recovery unmasks nothing in another.

**Output privacy (default).**  In Bonawitz et al. the server learns the sum.  Here the
recipients of every exchange are clients, so the server need not: every client holds
a 32-byte *group seed* ``G`` (drawn by client 0 and sent to every client over the relayed
encrypted channel before the first exchange, stage ``group_seed``).  With
``P_j = PRG(HKDF(G; exchange, j))`` for every client id ``j`` and ``P_K = 0`` (``K`` clients),
contributor ``k`` adds the *telescoped* output mask

    R_k = P_k - P_{k+1},    so that    sum_{k in S} R_k = sum_{maximal runs [a..c] of S} (P_a - P_{c+1})

to each of its blocks.  For any non-empty set ``S`` of included contributors the smallest
``m in S`` leaves ``P_m`` with coefficient 1 (``m - 1`` is not in ``S``), and ``P_m`` is
independent of every other term, so the server's sum ``sum q(x_k) + sum R_k`` is uniformly
random to it — with or without dropouts.  A recipient removes the sum of the included
contributors' ``R_k`` block by block (the server tells it who was included): two streams per
run of consecutive included ids, one when nobody dropped, instead of one stream per contributor.
``R_k`` hides only the aggregate: every client knows ``G``.  With ``reveal_to_server=True``
there is no output mask and downloads are recorded as ``plain`` (the server can read the
aggregate it sends).

**What still leaks.**  The server learns which clients took part and, in the sparse
layout, which block ids each client touches; a block with a single contributor is
that client's value in ``reveal_to_server`` mode.  Each client learns, per peer, the
block ids they share (needed to mask pairwise), and each recipient learns, per block
it receives, which clients contributed (needed to remove the output masks).  Clients
legitimately learn the aggregates they receive (docs/design.md, threat model).

**Collusion.**  Every client holds ``G``, so the server plus any one client sees the
aggregate (as in standard Bonawitz).  An individual input stays hidden from the server
plus ``c < t`` colluding clients (too few shares to rebuild the victim's ``b_k`` or mask key)
as long as at least one other honest client contributes the same block
(:mod:`attacks.coalition` measures it).  A server that lies about who dropped is stopped by the
consistency round; one that corrupts nothing but drops honest clients only shrinks the sum.

**Stages on the link** (one batch call each; a client whose answer is missing has dropped):
``group_seed`` (once per run, client 0 only: ``G`` for every other client), ``block_ids``
(sparse layout only: plan in, block ids out), ``advertise_keys`` (a client's first exchange:
public mask key out), ``share_keys`` (when a batch runs out: channel-encrypted shares for each
peer out, which the server forwards), ``masked_upload`` (set-up messages in, masked blocks
out), ``consistency`` (the survivor set in, its signature out), ``unmask`` (the server's request
with the survivors' signatures in, shares and seeds out), ``download`` (summed blocks,
who is included and, in the sparse layout with output masks, a per-block bitmap of
contributors).  The steady state of a dense exchange is ``masked_upload``, ``consistency``, ``unmask`` and
``download``.  A client that misses ``advertise_keys`` or ``share_keys`` is not a participant;
one that misses ``masked_upload`` is recovered (or the exchange refused) as in step 5.

**Dropout simulation.**  :meth:`MaskProtocol.drop_clients` makes clients leave the
*next* exchange at a given stage (their answers are lost on the in-process link):
``'keys'`` (silent from the set-up on: not a participant when the exchange has a key or share
round, else like ``'upload'``), ``'upload'`` (after the set-up, before uploading: needs
recovery), ``'unmask'`` (after uploading, does not answer the recovery round), ``'late'``
(like ``'upload'``, but its masked upload arrives after recovery: recorded, never aggregated).
A dropped client still receives its download (it reconnects for the result), so callers get
every recipient's result; :attr:`MaskProtocol.last_included` names the clients whose contributions the result covers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from ..errors import ConfigurationError, ShapeError
from ..exchange import ExchangeContext
from ..halves import HalvesProtocol
from .client import MaskClient, Participant
from .keys import ExchangeBinding
from .public import mask_fingerprint, shamir_threshold
from .quantize import RING_BITS, FixedPoint, choose_encoding
from .server import MaskServer

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
        **base_options,
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
        self.last_stats: dict | None = None
        #: attack simulations only: keep every client's secrets of the last exchange (its memory),
        #: so that a coalition attack can use what its colluding clients hold; off by default
        self.keep_client_state = False
        self.last_client_state: dict[int, Participant] = {}
        self.last_binding: ExchangeBinding | None = None

    def public_options(self) -> dict:
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
        return {k: c.group_seed for k, c in self.clients.items() if c.group_seed is not None}

    def block_capacity(self, spec) -> int:
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
    def plan_encoding(self, ctx: ExchangeContext) -> dict:
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
        distributed = (
            ctx.dp_noise_std > 0
            and self.dp is not None
            and getattr(getattr(self.dp, "config", None), "placement", "local") == "distributed"
        )
        # dropouts the distributed DP noise was over-provisioned for (protocols.dp.DPConfig.dropouts)
        return {
            "fixed_point": dataclasses.asdict(enc),
            "threshold": self.threshold_for(n0),
            "provisioned_dropouts": float(self.dp.config.dropouts) if distributed else math.inf,
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
        for k, stage in drops.items():
            self.link.mute(k, _SILENT_AT[stage])
        for half in self.clients.values():
            half.keep_input = self.keep_client_state
        self.last_client_state = {}
        try:
            result = super()._aggregate(ctx)
        finally:
            for k in drops:
                self.link.reconnect(k)
        plan = self.server.plan
        self.last_binding = ExchangeBinding(self.run_id, plan.exchange, ctx.tag, ctx.round)
        self.last_included = self.server.last_included
        self.last_dropped = {k: drops.get(k, stage) for k, stage in self.server.last_missing.items()}
        for k in sorted(drops):  # the upload of a 'late' client arrives after recovery: recorded only
            if drops[k] == "late":
                for msg in self.server.parse(self.link.lost.pop((k, "masked_upload")), self.server.where(k)):
                    self.server.record(dataclasses.replace(msg, note="late upload, not aggregated"))
        halves = {k: self.clients[k] for k in contributors}
        if self.keep_client_state:
            self.last_client_state = {k: h.state for k, h in halves.items() if h.state is not None}
        self._collect_stats(ctx, halves, plan)
        return result

    def _collect_stats(self, ctx, halves, plan) -> None:
        timing = {k: h.timing for k, h in halves.items()}
        up = {k: t.get("encode_s", 0.0) + t.get("mask_s", 0.0) for k, t in timing.items() if "mask_s" in t}
        down = {r: self.clients[r].timing.get("decode_s", 0.0) for r in plan.requests}
        encode = sum(t.get("encode_s", 0.0) for t in timing.values())
        setup = self.server.last_timing.get("setup_s", 0.0)
        self.last_timing = {
            "encode_s": encode,  # all clients, quantise + bound check
            "setup_s": setup,  # metadata, keys, shares (wall clock)
            "client_mask_s": float(np.mean([t.get("mask_s", 0.0) for t in timing.values()])) if timing else 0.0,
            "server_s": self.server.last_timing.get("server_s", 0.0),  # checks, sum, recovery
            "recipient_s": float(np.mean(list(down.values()))) if down else 0.0,
        }
        enc = self.last_encoding
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
