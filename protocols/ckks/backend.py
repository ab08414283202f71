"""The CKKS backend (``--mode ckks``): clients encrypt, the server only adds, recipients decrypt.

The backend is split along the privacy boundary (:mod:`protocols.party`): one
:class:`~.client.CKKSClient` per client (it holds the secret context) and one
:class:`~.server.CKKSServer` (public contexts and ciphertexts only), exchanging signed messages
as bytes over a :class:`~protocols.link.ClientLink` in the stages ``key_setup`` (first use of a
chain), ``block_ids`` (sparse layout), ``upload`` and ``download`` (both streamed in chunks of
blocks, ``chunk_bytes`` of ciphertexts at a time).  The stages are described in :mod:`.client`
and :mod:`.server`.  This facade plans each exchange:

1. **Plan** (public): from the exchange's :class:`~protocols.base.ValueSpec`, K and the DP
   noise std, :mod:`protocols.ckks.params` picks a one-data-prime chain, the scale and float,
   packed integer or packed fixed-point encoding (:mod:`protocols.ckks.fixed_point`), and checks
   the error bound (BoundError otherwise).  Where ``c0`` travels at the prime's bit width (dense
   layout, symmetric encryption), a packed plan's data prime is then narrowed to what its fields
   need (:mod:`.data_prime`).  The plan travels to every party in the exchange's
   ``plan`` message (:mod:`.plan_message`); a client re-checks the chain's security before
   using it.
2. **Client-side validation, before anything is encrypted** (in each client half); integer
   exchanges played through this facade can also audit the K-way sum against the public sum
   bound (``audit_sum_bound``, a simulation-side check no party could make in a deployment).
3. **Keys**: client 0 makes the key pair of a chain on first use (:mod:`.keys`).
4. **Upload**, **add**, **download**: each client encrypts its blocks (one ciphertext per block
   piece, rows aligned to ciphertexts because the base lays rows out in blocks of
   :meth:`~CKKSProtocol.block_capacity` values); the server checks every ciphertext of a chunk
   before adding any, adds per block id and sends each recipient only the blocks it requested
   (FedGCN scoped return); recipients decrypt and decode their own blocks.

Transcript: per client per exchange one upload Message (kind ``ciphertext``), in the sparse
layout also its block ids (kind ``metadata``, the documented sparse-layout leak), and one
download Message per recipient.  The test hook ``self.intercept`` sees every client->server
message before the server reads it and every download.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tenseal as ts

from ..errors import BoundError, ConfigurationError, PackingOverflowError, ProtocolError
from ..exchange import ExchangeContext, ValueSpec
from ..halves import HalvesProtocol
from ..validate import first_out_of_range
from .client import CKKSClient
from .data_prime import fit_data_prime
from .fixed_point import DEFAULT_FIELD_BITS, FixedPointLayout, plan_fixed_point
from .keys import ClientKey, ClientKeyRing
from .params import (
    ADD_ONLY_CHAINS,
    NAMED_CHAINS,
    REFERENCE_SCALE_BITS,
    ChainParams,
    EncodingPlan,
    check_security,
    choose_chain,
    per_client_limits,
    plan_float,
    plan_packed,
    release_step,
)
from .plan_message import chunks, plan_to_payload
from .seeded import uses_seeded_download
from .server import CKKSServer

if TYPE_CHECKING:
    from ..dp import DPConfig
    from ..link import ClientLink
    from ..plan import ExchangePlan
    from ..transcript import Transcript

#: sparse row_sum: a smaller ring is preferred when its bytes per value are at most this much
#: above the cheapest plan's (packed counts: N=4096 costs 0.15 % more per value than N=8192)
SPARSE_RING_TOLERANCE = 0.01


class _KeyView:
    """What one client half holds of the CKKS keys (the attack suite reads a colluding client's)."""

    def __init__(self, half: CKKSClient):
        self._ring = half.keys

    def __contains__(self, chain: ChainParams) -> bool:
        return chain in self._ring

    def get(self, chain: ChainParams) -> ClientKey:
        return self._ring.get(chain)

    def by_fingerprint(self, fingerprint: str) -> ClientKey | None:
        return self._ring.by_fingerprint(fingerprint)


# ====================================================================== the algorithms' facade
class CKKSProtocol(HalvesProtocol):
    """TenSEAL CKKS secure aggregation.

    Options (``make_protocol('ckks', K, ...)``):

    packing:            ``True`` (default): integer exchanges (``ValueSpec.integer``) use the
                        packed codec; ``False``: one value per slot for every exchange.
    params:             ``None``/``'auto'``: the one-data-prime chains of
                        :data:`~protocols.ckks.params.ADD_ONLY_CHAINS` (N=8192/4096, 60/50/40-bit
                        data prime), chosen per exchange, the data prime of a packed dense
                        exchange narrowed to its fields (:mod:`.data_prime`); a chain name
                        (``'n8192'``, ``'n4096'``, ``'n8192-q50'``, ...) forces one;
                        ``'default'``: the common N=8192 [60,40,40,60] context, scale 2^40,
                        float encoding (benchmark reference); or a
                        :class:`~protocols.ckks.params.ChainParams`.
    encryption:         ``'symmetric'`` (default) or ``'asymmetric'`` (see :mod:`.keys`).
    chunk_bytes:        ciphertext bytes (all clients together) processed per streaming chunk.
    keep_payload_bytes: largest message payload kept in the transcript.
    audit_sum_bound:    test aid (default off): recompute the K-way sums in the clear and check
                        them against the plan's bound, which a real server cannot do.  Not
                        needed for safety: the plan sizes fields from bounds each client
                        checks alone (:func:`.params.integer_sum_range`).
    fixed_point_bits:   ``None`` (default): float exchanges use one real per slot; an integer
                        b (e.g. 20): float exchanges travel as packed fixed point, fields of
                        at least b bits in both parts of every complex slot, quantum from the
                        public bounds (:mod:`protocols.ckks.fixed_point`; error ``K Delta``
                        per summed entry instead of the spec's tolerance).
    exact_fields:       ``True`` (default): exchanges whose sums are exact integers -- integer
                        exchanges, and float exchanges on a public grid (``ValueSpec.grid_bits``,
                        integers of quantum ``2^-f``) -- may travel as signed integer fields in
                        both parts of every complex slot where that saves ciphertexts (the
                        same sums, bit for bit, as the real-slot encodings); ``False``: real
                        slots only (unsigned packed fields for integers, one float per slot on
                        a grid).
    """

    mode = "ckks"
    upload_kind = "ciphertext"
    client_half = CKKSClient
    server_half = CKKSServer

    def __init__(
        self,
        num_clients: int,
        *,
        transcript: Transcript | None = None,
        dp: DPConfig | None = None,
        seed: int = 0,
        packing: bool = True,
        params: str | ChainParams | None = None,
        encryption: str = "symmetric",
        chunk_bytes: int = 16 << 20,
        keep_payload_bytes: int = 8 << 20,
        audit_sum_bound: bool = False,
        fixed_point_bits: int | None = None,
        exact_fields: bool = True,
        link: ClientLink | None = None,
        schedule: str = "",
        **collusion: Any,
    ):
        if packing not in (True, False):
            raise ConfigurationError(f"packing must be True or False, got {packing!r} (BFV packing is not implemented)")
        ClientKeyRing(encryption)  # validates the encryption type
        self.packing = bool(packing)
        self.encryption = encryption
        self._candidates, self._fixed_scale = self._resolve_params(params)
        self._fit_prime = params is None or params == "auto"  # a chain the caller names is used as named
        self._active: ChainParams | None = None
        self.chunk_bytes = int(chunk_bytes)
        self.keep_payload_bytes = int(keep_payload_bytes)
        self.audit_sum_bound = bool(audit_sum_bound)
        if fixed_point_bits is not None and (
            isinstance(fixed_point_bits, bool)
            or not isinstance(fixed_point_bits, int)
            or not 2 <= fixed_point_bits <= 52
        ):
            raise ConfigurationError(
                f"fixed_point_bits must be an integer in [2, 52] or None, got {fixed_point_bits!r} "
                f"(e.g. {DEFAULT_FIELD_BITS})"
            )
        self.fixed_point_bits = fixed_point_bits
        self.exact_fields = bool(exact_fields)
        super().__init__(
            num_clients, transcript=transcript, dp=dp, seed=seed, link=link, schedule=schedule, **collusion
        )
        #: statistics of the last exchange (bytes, seconds per party, plan) — for benchmarks
        self.last_stats: dict[str, Any] | None = None

    def public_options(self) -> dict[str, Any]:
        """Encryption mode (symmetric or asymmetric), transcript payload limit and the public rounding seed."""
        return {
            "encryption": self.encryption,
            "keep_payload_bytes": self.keep_payload_bytes,
            "rounding_seed": int(self.seed),
        }

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _resolve_params(params: object) -> tuple[tuple[ChainParams, ...], int | None]:
        if params is None or params == "auto":
            return ADD_ONLY_CHAINS, None
        if isinstance(params, str):
            if params not in NAMED_CHAINS:
                raise ConfigurationError(
                    f"unknown CKKS parameter set {params!r}; use 'auto', "
                    f"{', '.join(repr(n) for n in NAMED_CHAINS)} or a ChainParams"
                )
            chain = NAMED_CHAINS[params]
        elif isinstance(params, ChainParams):
            chain = params
        else:
            raise ConfigurationError(f"params must be a name or ChainParams, got {type(params).__name__}")
        check_security(chain)
        return (chain,), (None if chain.data_primes == 1 else REFERENCE_SCALE_BITS)

    def _plans(
        self, spec: ValueSpec, dp_std: float, tag: str | None = None, rnd: int | None = None
    ) -> dict[str, EncodingPlan]:
        """Feasible plans per candidate chain; the first candidate's error if none is."""
        plans: dict[str, EncodingPlan] = {}
        first_error: ProtocolError | None = None
        for chain in self._candidates:
            try:
                if spec.integer and self.packing and chain.data_primes == 1:
                    if self.fixed_point_bits or self.exact_fields:  # exact signed fields in both halves
                        plans[chain.name + "/fixed"] = plan_fixed_point(
                            chain,
                            spec,
                            self.num_clients,
                            dp_std,
                            self.encryption,
                            self.fixed_point_bits or DEFAULT_FIELD_BITS,
                            tag=tag,
                            round=rnd,
                        )
                    plans[chain.name] = plan_packed(
                        chain, spec, self.num_clients, dp_std, self.encryption, tag=tag, round=rnd
                    )
                elif (
                    not spec.integer
                    and chain.data_primes == 1
                    and (self.fixed_point_bits or (self.exact_fields and spec.grid_bits is not None))
                ):
                    # both encodings compete: fixed point where it saves ciphertexts, float (within
                    # the spec's tolerance) where it costs no more bytes (params.choose_chain); on a
                    # public grid the fields are exact and the float plan comes first: a grid too
                    # fine for exact fields keeps it
                    bits = self.fixed_point_bits or DEFAULT_FIELD_BITS  # (grid fields take their own width)
                    build = {
                        chain.name + "/fixed": lambda: plan_fixed_point(
                            chain, spec, self.num_clients, dp_std, self.encryption, bits, tag=tag, round=rnd
                        ),
                        chain.name: lambda: plan_float(
                            chain, spec, self.num_clients, dp_std, self.encryption, tag=tag, round=rnd
                        ),
                    }
                    for name in sorted(build) if spec.grid_bits is not None else sorted(build, reverse=True):
                        plans[name] = build[name]()
                else:
                    plans[chain.name] = plan_float(
                        chain,
                        spec,
                        self.num_clients,
                        dp_std,
                        self.encryption,
                        fixed_scale_bits=None if chain.data_primes == 1 else self._fixed_scale,
                        tag=tag,
                        round=rnd,
                    )
            except ProtocolError as exc:
                first_error = first_error or exc
        if not plans:
            raise cast(ProtocolError, first_error)  # every candidate failed
        return plans

    def plan(self, spec: ValueSpec, block_len: int | None = None, dp_std: float = 0.0) -> EncodingPlan:
        """The public encoding plan of an exchange with ``spec`` (and blocks of ``block_len``)."""
        return choose_chain(self._plans(spec, dp_std), block_len)

    def _dp_std_hint(self) -> float:
        # the base calls block_capacity right after privatising the current exchange, so this
        # is usually that exchange's std; a stale value only costs padding (blocks then span
        # several ciphertexts), never correctness: the plan is re-made from ctx.dp_noise_std
        return float(getattr(self.dp, "last_std", 0.0) or 0.0) if self.dp is not None else 0.0

    def block_capacity(self, spec: ValueSpec) -> int:
        """Values one ciphertext of the planned chain carries for ``spec`` (packed fixed-point fields or real slots)."""
        try:
            return self.plan(spec, dp_std=self._dp_std_hint()).values_per_ciphertext
        except ProtocolError:
            return self._candidates[0].slots  # the exchange raises the error with the exchange named

    def vector_block_capacity(self, spec: ValueSpec, length: int) -> int:
        """The capacity of the plan with the fewest bytes for ``length`` values.

        Whole ciphertexts: a 8,068-value model fits one N=4096 ciphertext at half the bytes.
        """
        try:
            return choose_chain(self._plans(spec, self._dp_std_hint()), length).values_per_ciphertext
        except ProtocolError:
            return self._candidates[0].slots

    def row_block_capacity(self, spec: ValueSpec, layout: str = "dense") -> int:
        """The block capacity of the sparse (row) layout.

        Sparse layout: the smallest ring among the plans whose bytes per value are within
        :data:`SPARSE_RING_TOLERANCE` of the cheapest.  A client pays for every block it
        touches, so half-size blocks (N=4096 instead of 8192: same 6.4 B per packed count)
        halve the untouched rows it pays for; the exchange then picks the same chain for
        the resulting block length.  Dense layout: :meth:`block_capacity`.
        """
        if layout != "sparse":
            return self.block_capacity(spec)
        try:
            plans = self._plans(spec, self._dp_std_hint())
        except ProtocolError:
            return self._candidates[0].slots
        per_value = {n: p.chain.ciphertext_bytes / p.values_per_ciphertext for n, p in plans.items()}
        best = min(per_value.values())
        near = [n for n in plans if per_value[n] <= best * (1.0 + SPARSE_RING_TOLERANCE)]
        return plans[min(near, key=lambda n: (plans[n].values_per_ciphertext, per_value[n]))].values_per_ciphertext

    # ------------------------------------------------------------------ keys (facade view)
    @property
    def _keys(self) -> _KeyView:
        """Client 0's key ring (every client holds the same keys; the coalition attack reads it)."""
        return _KeyView(cast(CKKSClient, self.clients[0]))

    @property
    def fingerprint(self) -> str:
        """sha256 of the public context of the current exchange's chain (keys made on demand)."""
        return self.fingerprint_for(self._active or self._candidates[0])

    def fingerprint_for(self, chain: ChainParams | str) -> str:
        """Fingerprint of ``chain``'s public context (a chain or a name in ``NAMED_CHAINS``); keys made on first use."""
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        return cast(CKKSServer, self.server).ensure_keys(chain, self.link, 0).fingerprint

    def server_context(self, chain: ChainParams | str | None = None) -> ts.Context:
        """The TenSEAL context the server holds (public; for tests and audits)."""
        chain = chain or self._active or self._candidates[0]
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        return cast(CKKSServer, self.server).ensure_keys(chain, self.link, 0).context

    # ------------------------------------------------------------------ one exchange
    def plan_encoding(self, ctx: ExchangeContext) -> dict[str, Any]:
        """Choose the coefficient-modulus chain and encoding for the exchange and the number of blocks per upload chunk.

        With ``audit_sum_bound`` the declared sum bound is checked against the contributions first.
        """
        ctx.check_requests(self.num_clients)
        ep = choose_chain(self._plans(ctx.spec, ctx.dp_noise_std, ctx.tag, ctx.round), ctx.block_len)
        if self._fit_prime and uses_seeded_download(ctx.layout, self.encryption):
            ep = fit_data_prime(ep)  # c0 travels at the prime's width: no unused bits
        n_pieces = math.ceil(ctx.block_len / ep.values_per_ciphertext)
        per_chunk = max(1, self.chunk_bytes // max(1, len(ctx.contributions) * n_pieces * ep.chain.ciphertext_bytes))
        if self.audit_sum_bound:
            self._audit(ctx, ep, chunks(ctx.num_blocks, per_chunk))
        self._active = ep.chain
        self._last_plan = ep
        return {"plan": plan_to_payload(ep), "blocks_per_chunk": per_chunk}

    def _audit(self, ctx: ExchangeContext, plan: EncodingPlan, chunks: list[tuple[int, int]]) -> None:
        """Test aid: check every contribution and the K-way sums in the clear.

        Test aid: every contribution in range, then the K-way sums in the clear against the
        plan's bound (no party could do this in a deployment).
        """
        spec = ctx.spec
        lo, hi, offset = per_client_limits(spec, ctx.dp_noise_std, self.num_clients)
        layout = plan.layout
        packed = layout is not None
        bad = first_out_of_range(ctx, self.num_clients, lo, hi)
        if bad is not None:
            k, block, entry, v, why = bad
            err = PackingOverflowError if (packed and "range" in why) else BoundError
            raise err(
                f"entry {entry} of block {block} is {v:g}, which "
                f"{why} of this exchange's {plan.describe()} encoding (ValueSpec max_abs={spec.max_abs:g}, "
                f"sum_max={spec.sum_max}, integer={spec.integer}"
                + (f", DP offset {offset}" if offset else "")
                + "). Nothing was encrypted. Fix: clip the "
                "values or declare a larger public bound",
                tag=ctx.tag,
                round=ctx.round,
                client=k,
            )
        if not spec.integer or isinstance(plan.layout, FixedPointLayout):
            return
        top: float
        bottom: float
        if layout is not None:
            top = (1 << layout.width) - 1 - self.num_clients * offset
            bottom = -self.num_clients * offset
        else:
            top, bottom = plan.sum_bound, -plan.sum_bound
        for b0, b1 in chunks:  # chunk-wise: memory stays bounded
            total = np.zeros((b1 - b0, ctx.block_len))
            for table in ctx.contributions.values():
                i0, i1 = np.searchsorted(table.ids, [b0, b1])
                total[np.asarray(table.ids[i0:i1]) - b0] += table.values[i0:i1]
            outside = np.nonzero((total > top) | (total < bottom))
            if outside[0].size:
                b, j = int(outside[0][0]), int(outside[1][0])
                b += b0
                err = PackingOverflowError if packed else BoundError
                raise err(
                    f"the {len(ctx.contributions)}-client sum of entry {j} of block {b} is {total[b - b0, j]:g}, "
                    f"outside [{bottom:g}, {top:g}] that the public bound sum_max={spec.sum_max} allows"
                    + (f": its {layout.width}-bit packed field would carry into the next one" if layout else "")
                    + ". Nothing was encrypted. Fix: declare the true bound (e.g. degree cap + 1) "
                    "in ValueSpec.sum_max",
                    tag=ctx.tag,
                    round=ctx.round,
                )

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        out = super()._aggregate(ctx)
        server, clients = cast(CKKSServer, self.server), cast(dict[int, CKKSClient], self.clients)
        plan, ep, srv = cast("ExchangePlan", server.plan), self._last_plan, server.last_stats
        timing = {k: clients[k].timing for k in plan.parties}
        step = release_step(ep, ctx.spec)  # the clients' rounding of released float sums
        self.last_stats = {
            "tag": ctx.tag,
            "round": ctx.round,
            "params": ep.describe(),
            "chain": ep.chain.name,
            "encoding": ep.encoding,
            "scale_bits": ep.scale_bits,
            "error_bound": ep.error_bound + (step / 2 if step else 0.0),
            "fields_per_slot": ep.layout.fields if ep.layout else 1,
            "field_bits": ep.layout.width if ep.layout else None,
            "ciphertexts_per_block": srv["ciphertexts_per_block"],
            "chunks": srv["chunks"],
            "bytes_up": srv["bytes_up"],
            "bytes_down": srv["bytes_down"],
            "client_upload_s": {
                k: timing[k].get("encode_s", 0.0) + timing[k].get("upload_s", 0.0) for k in plan.contributors
            },
            "client_download_s": {r: timing[r].get("download_s", 0.0) for r in plan.requests},
            "server_s": srv["server_s"],
            "setup_s": srv["setup_s"],
        }
        return out
