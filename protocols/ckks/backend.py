"""The CKKS backend: clients encrypt, the server only adds, recipients decrypt.

One exchange (:meth:`CKKSProtocol._aggregate`), in order:

1. **Plan** (public): from the exchange's :class:`~protocols.base.ValueSpec`, K and the DP
   noise std, :mod:`protocols.ckks.params` picks a one-data-prime chain, the scale and
   float or packed integer encoding, and checks the error bound (BoundError otherwise).
2. **Client-side validation, before anything is encrypted**: shapes, finiteness, every
   value inside the public range of the encoding (BoundError / PackingOverflowError
   naming the client), and — integer exchanges only — a simulation-side audit that the
   K-way sum respects the public sum bound (no party could check this in a deployment;
   there the bound must be enforced where the data is made, e.g. by a degree cap).
3. **Keys**: on first use of a chain, client 0 makes the key pair and the server
   receives the public context (:mod:`protocols.ckks.keys`).
4. **Upload, streamed in chunks of blocks**: each client encrypts its blocks (one
   ciphertext per block piece; rows stay aligned to ciphertexts because the base lays
   rows out in blocks of :meth:`block_capacity` values) and sends framed bytes
   (:mod:`protocols.ckks.wire`).  For each chunk the server checks the envelope
   (context fingerprint of this exchange's chain, round, tag), the shape and every
   ciphertext's bytes, scale and level of ALL clients before it adds any of them.
   Chunks bound memory to ``chunk_bytes`` of ciphertexts, so a 1e6-node FedGCN never
   holds the full N x d ciphertext array.  An exchange that fits one chunk (the default
   budget is 64 MiB) is validated completely before anything is summed.  In a larger
   one a bad ciphertext in a later chunk aborts the exchange after earlier chunks were
   summed; those partial sums are discarded — nothing is returned and no download is
   recorded (a real server would spool; this simulation just drops them).
5. **Server adds** per block id the ciphertexts of the clients that uploaded it (no
   plaintext multiply, no rotation: no Galois or relinearisation keys) and sends each
   recipient only the blocks it requested (FedGCN scoped return).
6. **Recipients decrypt** and decode (round + unpack for integers).  All clients share the
   key, so the simulation decrypts each summed block once and hands the same array to
   every recipient that asked for it; the time is charged to each of them.

Transcript: per client per exchange one upload Message (kind ``ciphertext``; payload =
the list of framed serialized ciphertexts, kept only when <= ``keep_payload_bytes``
and the exchange was one chunk — larger payloads are stripped before recording and the
note says so; ``nbytes`` is always the real byte count).  In the sparse layout each
client also sends its block ids as a ``metadata`` message (the documented sparse-layout
leak).  Each recipient gets one download Message (kind ``ciphertext``).  The test hook
``self.intercept`` sees every client->server message before the server reads it (in a
streamed exchange: each chunk's part of a client's upload); the key set-up messages of
``ckks/keys`` are recorded directly (they precede the exchange and are not the server's
input to it).  Every ciphertext has a fixed padded size per chain, so every message size is
a function of public shapes only.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import tenseal as ts

from ..base import ExchangeContext, Protocol, ValueSpec
from ..errors import (BoundError, ConfigurationError, IntegrityError, PackingOverflowError,
                      ProtocolError, ShapeError)
from ..fixed_point import rounding_rng
from ..transcript import SERVER, Message, client_party
from ..validate import first_out_of_range
from . import wire
from .fixed_point import DEFAULT_FIELD_BITS, FixedPointLayout, plan_fixed_point, server_load
from .keys import ClientKey, ClientKeyRing, ServerContext
from .params import (ADD_ONLY_CHAINS, NAMED_CHAINS, REFERENCE_SCALE_BITS, ChainParams, EncodingPlan,
                     check_security, choose_chain, per_client_limits, plan_float, plan_packed)

KEYS_TAG = "ckks/keys"
#: sparse row_sum: a smaller ring is preferred when its bytes per value are at most this much
#: above the cheapest plan's (packed counts: N=4096 costs 0.15 % more per value than N=8192)
SPARSE_RING_TOLERANCE = 0.01


class CKKSProtocol(Protocol):
    """TenSEAL CKKS secure aggregation.

    Options (``make_protocol('ckks', K, ...)``):

    packing:            ``True`` (default): integer exchanges (``ValueSpec.integer``) use the
                        packed codec; ``False``: one value per slot for every exchange.
    params:             ``None``/``'auto'``: the one-data-prime chains of
                        :data:`~protocols.ckks.params.ADD_ONLY_CHAINS` (N=8192/4096, 60/50/40-bit
                        data prime), chosen per exchange; a chain name (``'n8192'``, ``'n4096'``,
                        ``'n8192-q50'``, ...) forces one;
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
    """

    mode = "ckks"
    upload_kind = "ciphertext"

    def __init__(self, num_clients: int, *, transcript=None, dp=None, seed: int = 0, packing=True,
                 params=None, encryption: str = "symmetric", chunk_bytes: int = 64 << 20,
                 keep_payload_bytes: int = 8 << 20, audit_sum_bound: bool = False,
                 fixed_point_bits: int | None = None):
        super().__init__(num_clients, transcript=transcript, dp=dp, seed=seed)
        if packing not in (True, False):
            raise ConfigurationError(f"packing must be True or False, got {packing!r} "
                                     "(BFV packing is not implemented)")
        self.packing = bool(packing)
        self.encryption = encryption
        self._candidates, self._fixed_scale = self._resolve_params(params)
        self._keys = ClientKeyRing(encryption)            # client side
        self._servers: dict[str, ServerContext] = {}      # server side: public contexts only
        self._active: ChainParams | None = None
        self.chunk_bytes = int(chunk_bytes)
        self.keep_payload_bytes = int(keep_payload_bytes)
        self.audit_sum_bound = bool(audit_sum_bound)
        if fixed_point_bits is not None and (isinstance(fixed_point_bits, bool) or not isinstance(fixed_point_bits, int)
                                             or not 2 <= fixed_point_bits <= 52):
            raise ConfigurationError(f"fixed_point_bits must be an integer in [2, 52] or None, got {fixed_point_bits!r} "
                                     f"(e.g. {DEFAULT_FIELD_BITS})")
        self.fixed_point_bits = fixed_point_bits
        #: statistics of the last exchange (bytes, seconds per party, plan) — for benchmarks
        self.last_stats: dict | None = None

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _resolve_params(params) -> tuple[tuple[ChainParams, ...], int | None]:
        if params is None or params == "auto":
            return ADD_ONLY_CHAINS, None
        if isinstance(params, str):
            if params not in NAMED_CHAINS:
                raise ConfigurationError(f"unknown CKKS parameter set {params!r}; use 'auto', "
                                         f"{', '.join(repr(n) for n in NAMED_CHAINS)} or a ChainParams")
            chain = NAMED_CHAINS[params]
        elif isinstance(params, ChainParams):
            chain = params
        else:
            raise ConfigurationError(f"params must be a name or ChainParams, got {type(params).__name__}")
        check_security(chain)
        return (chain,), (None if chain.data_primes == 1 else REFERENCE_SCALE_BITS)

    def _plans(self, spec: ValueSpec, dp_std: float, tag=None, rnd=None) -> dict[str, EncodingPlan]:
        """Feasible plans per candidate chain; the first candidate's error if none is."""
        plans, first_error = {}, None
        for chain in self._candidates:
            try:
                if spec.integer and self.packing and chain.data_primes == 1:
                    if self.fixed_point_bits:       # exact signed fields in both halves of each slot
                        plans[chain.name + "/fixed"] = plan_fixed_point(chain, spec, self.num_clients, dp_std,
                                                                        self.encryption, self.fixed_point_bits,
                                                                        tag=tag, round=rnd)
                    plans[chain.name] = plan_packed(chain, spec, self.num_clients, dp_std, self.encryption,
                                                    tag=tag, round=rnd)
                elif not spec.integer and self.fixed_point_bits and chain.data_primes == 1:
                    # both encodings compete: fixed point where it saves ciphertexts, float (within
                    # the spec's tolerance) where it costs no more bytes (params.choose_chain)
                    plans[chain.name + "/fixed"] = plan_fixed_point(chain, spec, self.num_clients, dp_std,
                                                                    self.encryption, self.fixed_point_bits,
                                                                    tag=tag, round=rnd)
                    plans[chain.name] = plan_float(chain, spec, self.num_clients, dp_std, self.encryption,
                                                   tag=tag, round=rnd)
                else:
                    plans[chain.name] = plan_float(
                        chain, spec, self.num_clients, dp_std, self.encryption,
                        fixed_scale_bits=None if chain.data_primes == 1 else self._fixed_scale, tag=tag, round=rnd)
            except ProtocolError as exc:
                first_error = first_error or exc
        if not plans:
            raise first_error
        return plans

    def plan(self, spec: ValueSpec, block_len: int | None = None, dp_std: float = 0.0) -> EncodingPlan:
        """The public encoding plan of an exchange with ``spec`` (and blocks of ``block_len``)."""
        return choose_chain(self._plans(spec, dp_std), block_len)

    def _dp_std_hint(self) -> float:
        # the base calls block_capacity right after privatising the current exchange, so this
        # is usually that exchange's std; a stale value only costs padding (blocks then span
        # several ciphertexts), never correctness: _aggregate re-plans from ctx.dp_noise_std
        return float(getattr(self.dp, "last_std", 0.0) or 0.0) if self.dp is not None else 0.0

    def block_capacity(self, spec: ValueSpec) -> int:
        try:
            return self.plan(spec, dp_std=self._dp_std_hint()).values_per_ciphertext
        except ProtocolError:
            return self._candidates[0].slots   # _aggregate raises the error with the exchange named

    def vector_block_capacity(self, spec: ValueSpec, length: int) -> int:
        """The capacity of the plan with the fewest bytes for ``length`` values (whole
        ciphertexts: a 8,068-value model fits one N=4096 ciphertext at half the bytes)."""
        try:
            return choose_chain(self._plans(spec, self._dp_std_hint()), length).values_per_ciphertext
        except ProtocolError:
            return self._candidates[0].slots

    def row_block_capacity(self, spec: ValueSpec, layout: str = "dense") -> int:
        """Sparse layout: the smallest ring among the plans whose bytes per value are within
        :data:`SPARSE_RING_TOLERANCE` of the cheapest.  A client pays for every block it
        touches, so half-size blocks (N=4096 instead of 8192: same 6.4 B per packed count)
        halve the untouched rows it pays for; ``_aggregate`` then picks the same chain for
        the resulting block length.  Dense layout: :meth:`block_capacity`."""
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

    # ------------------------------------------------------------------ keys
    def _ensure_keys(self, chain: ChainParams, rnd: int) -> ClientKey:
        if chain in self._keys:
            return self._keys.get(chain)
        key = self._keys.create(chain)                 # client 0 makes the key pair
        note = f"CKKS {chain.describe()}, {self.encryption} encryption"
        secret = key.context.serialize(save_public_key=False, save_secret_key=True, save_galois_keys=False,
                                       save_relin_keys=False)
        secret += bytes(max(0, key.secret_nbytes - len(secret)))   # padded: sizes are public
        for k in range(1, self.num_clients):
            # the secret context travels over the encrypted channel, relayed by the server; the
            # simulation's clients then share client 0's context object (same bytes)
            self._relay(rnd, KEYS_TAG, 0, k, "key_setup", secret, f"secret context ({note})",
                        fingerprint=key.fingerprint, keep_payload=len(secret) <= self.keep_payload_bytes, part=len(self._servers))
        msg = self._deliver(Message(rnd, KEYS_TAG, client_party(0), SERVER, "public_key", (), len(key.public_bytes),
                                    self.mode, key.fingerprint, key.public_bytes,
                                    note=f"public context without secret/Galois/relin keys ({note})"),
                            "key_setup", len(self._servers))
        self._servers[chain.name] = ServerContext(msg.payload, chain)   # server: public bytes only
        return key

    @property
    def fingerprint(self) -> str:
        """sha256 of the public context of the current exchange's chain (keys made on demand)."""
        chain = self._active or self._candidates[0]
        if chain not in self._keys:
            self._ensure_keys(chain, 0)
        return self._keys.get(chain).fingerprint

    def fingerprint_for(self, chain: ChainParams | str) -> str:
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        return self._ensure_keys(chain, 0).fingerprint

    def server_context(self, chain: ChainParams | str | None = None) -> ts.Context:
        """The TenSEAL context the server holds (public; for tests and audits)."""
        chain = chain or self._active or self._candidates[0]
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        self._ensure_keys(chain, 0)
        return self._servers[chain.name].context

    # ------------------------------------------------------------------ client side
    def _validate(self, ctx: ExchangeContext, plan: EncodingPlan, chunks: list[tuple[int, int]]) -> None:
        """Every client's contribution against the public plan; raises before any encryption."""
        spec = ctx.spec
        lo, hi, offset = per_client_limits(spec, ctx.dp_noise_std, self.num_clients)
        packed = plan.layout is not None
        audit = spec.integer and self.audit_sum_bound and not isinstance(plan.layout, FixedPointLayout)
        bad = first_out_of_range(ctx, self.num_clients, lo, hi)
        if bad is not None:
            k, block, entry, v, why = bad
            err = PackingOverflowError if (packed and "range" in why) else BoundError
            raise err(f"entry {entry} of block {block} is {v:g}, which "
                      f"{why} of this exchange's {plan.describe()} encoding (ValueSpec max_abs={spec.max_abs:g}, "
                      f"sum_max={spec.sum_max}, integer={spec.integer}"
                      + (f", DP offset {offset}" if offset else "") + "). Nothing was encrypted. Fix: clip the "
                      "values or declare a larger public bound", tag=ctx.tag, round=ctx.round, client=k)
        if not audit:
            return
        if packed:
            top = (1 << plan.layout.width) - 1 - self.num_clients * offset
            bottom = -self.num_clients * offset
        else:
            top, bottom = plan.sum_bound, -plan.sum_bound
        for b0, b1 in chunks:                       # chunk-wise: memory stays bounded
            total = np.zeros((b1 - b0, ctx.block_len))
            for table in ctx.contributions.values():
                i0, i1 = np.searchsorted(table.ids, [b0, b1])
                total[np.asarray(table.ids[i0:i1]) - b0] += table.values[i0:i1]
            bad = np.nonzero((total > top) | (total < bottom))
            if bad[0].size:
                b, j = int(bad[0][0]), int(bad[1][0])
                b += b0
                err = PackingOverflowError if packed else BoundError
                raise err(f"the {len(ctx.contributions)}-client sum of entry {j} of block {b} is {total[b - b0, j]:g}, "
                          f"outside [{bottom:g}, {top:g}] that the public bound sum_max={spec.sum_max} allows"
                          + (f": its {plan.layout.width}-bit packed field would carry into the next one" if packed
                             else "") + ". Nothing was encrypted. Fix: declare the true bound (e.g. degree cap + 1) "
                          "in ValueSpec.sum_max", tag=ctx.tag, round=ctx.round)

    @staticmethod
    def _encrypt(context: ts.Context, plan: EncodingPlan, values: np.ndarray) -> bytes:
        fixed = isinstance(plan.layout, FixedPointLayout)
        slots = None if fixed else (plan.layout.pack(values) if plan.layout is not None else values).tolist()
        size = plan.chain.padded_ciphertext_bytes
        for _ in range(8):          # a fresh encryption's size is independent of the data (wire doc)
            ct = (plan.layout.encrypt(context, plan, values) if fixed
                  else ts.ckks_vector(context, slots, plan.scale).serialize())
            if len(ct) <= size:
                return wire.frame(ct, size)
        raise ConfigurationError(f"ciphertexts of {plan.chain.describe()} exceed the padded size {size}; "
                                 "update PADDED_CT_BYTES for this TenSEAL version")

    @staticmethod
    def _decrypt(context: ts.Context, plan: EncodingPlan, frame: bytes, n: int, ctx: ExchangeContext) -> np.ndarray:
        if isinstance(plan.layout, FixedPointLayout):
            vals, residual, in_range = plan.layout.decrypt(context, plan, wire.unframe(frame), n)
        else:
            dec = np.asarray(ts.ckks_vector_from(context, wire.unframe(frame)).decrypt(), dtype=np.float64)
            if plan.layout is None:
                return np.rint(dec) if plan.exact else dec
            vals, residual, in_range = plan.layout.unpack(dec, n)
        if residual > 0.25 or not in_range:
            raise BoundError(f"decoded packed slots are off their integers by {residual:.3g} (bound "
                             f"{plan.error_bound:.3g}) or out of range: the CKKS noise model or the public sum "
                             "bound was violated; the result was refused", tag=ctx.tag, round=ctx.round)
        return vals

    # ------------------------------------------------------------------ server side
    def _load(self, server: ServerContext, plan: EncodingPlan, frame, length: int, ctx: ExchangeContext,
              client: int, index: int):
        where = dict(tag=ctx.tag, round=ctx.round, client=client)
        expected = server.chain.padded_ciphertext_bytes + wire.HEADER_BYTES
        if not isinstance(frame, (bytes, bytearray)) or len(frame) != expected:
            size = len(frame) if isinstance(frame, (bytes, bytearray)) else type(frame).__name__
            raise IntegrityError(f"ciphertext {index} is {size} bytes, expected {expected}: truncated, corrupted "
                                 f"or not made with this exchange's parameters ({server.chain.describe()})", **where)
        try:
            body = wire.unframe(frame)
        except ValueError as exc:
            raise IntegrityError(f"ciphertext {index}: {exc}", **where) from exc
        if isinstance(plan.layout, FixedPointLayout):
            try:
                return server_load(server.chain, body, plan.scale)
            except ValueError as exc:
                raise IntegrityError(f"ciphertext {index} {exc}", **where) from exc
        try:
            vec = ts.ckks_vector_from(server.context, body)
        except Exception as exc:  # noqa: BLE001 - TenSEAL raises ValueError/RuntimeError
            raise IntegrityError(f"ciphertext {index} does not deserialize under this exchange's public context "
                                 f"({server.chain.describe()}): {exc}", **where) from exc
        if vec.size() != length:
            raise ShapeError(f"ciphertext {index} carries {vec.size()} slots, expected {length}", **where)
        cts = vec.ciphertext()
        ct = cts[0] if len(cts) == 1 else None
        if ct is None or ct.size() != 2 or list(ct.parms_id()) != server.parms_id \
                or not math.isclose(ct.scale, plan.scale, rel_tol=1e-9):
            raise IntegrityError(f"ciphertext {index} was not encrypted with this exchange's parameters "
                                 f"({plan.describe()})", **where)
        return vec

    # ------------------------------------------------------------------ the exchange
    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        t_setup = time.perf_counter()
        plan = choose_chain(self._plans(ctx.spec, ctx.dp_noise_std, ctx.tag, ctx.round), ctx.block_len)
        chain = plan.chain
        per_ct = plan.values_per_ciphertext
        n_pieces = math.ceil(ctx.block_len / per_ct)
        bounds = [(j * per_ct, min(ctx.block_len, (j + 1) * per_ct)) for j in range(n_pieces)]
        vec_lens = [(plan.layout.slots_for(b - a) if plan.layout is not None else b - a) for a, b in bounds]
        for r, bids in ctx.requests.items():
            bids = np.asarray(bids)
            if not 0 <= int(r) < self.num_clients or (bids.size and (bids.min() < 0 or bids.max() >= ctx.num_blocks)):
                raise ShapeError(f"recipient {r} requests blocks outside [0, {ctx.num_blocks})",
                                 tag=ctx.tag, round=ctx.round, client=r)

        contributors = sorted(ctx.contributions)
        blocks_per_chunk = max(1, self.chunk_bytes // max(1, len(contributors) * n_pieces * chain.ciphertext_bytes))
        chunks = [(b0, min(ctx.num_blocks, b0 + blocks_per_chunk)) for b0 in range(0, ctx.num_blocks, blocks_per_chunk)]
        self._validate(ctx, plan, chunks)               # clients: nothing encrypted before this passes
        rounding = ({k: rounding_rng(self.seed, ctx.tag, ctx.round, k) for k in ctx.contributions}
                    if isinstance(plan.layout, FixedPointLayout) else None)
        key = self._ensure_keys(chain, ctx.round)
        server = self._servers[chain.name]
        self._active = chain
        fp = key.fingerprint
        setup_s = time.perf_counter() - t_setup

        where = lambda k: dict(tag=ctx.tag, round=ctx.round, client=k)  # noqa: E731
        K = self.num_clients
        client_up_s = {k: 0.0 for k in contributors}
        server_s = 0.0

        # sparse layout: block ids travel in the clear (documented leak), checked by the server
        server_ids: dict[int, np.ndarray] = {}
        for k in contributors:
            ids = np.asarray(ctx.contributions[k].ids, dtype=np.int64)
            if ctx.layout == "sparse":
                msg = self._deliver(Message(ctx.round, ctx.tag, client_party(k), SERVER, "metadata", (ids.size,),
                                            4 * ids.size, self.mode, fp, {"block_ids": ids.astype(np.int32)},
                                            note="block ids of the sparse layout"), "block_ids")
                t = time.perf_counter()
                self._check_envelope(msg, ctx, k)
                got = np.asarray((msg.payload or {}).get("block_ids", []), dtype=np.int64).ravel()
                if got.size and (got.min() < 0 or got.max() >= ctx.num_blocks or (np.diff(got) <= 0).any()):
                    raise ShapeError(f"block ids must be increasing in [0, {ctx.num_blocks})", **where(k))
                server_ids[k] = got
                server_s += time.perf_counter() - t
            else:
                server_ids[k] = np.arange(ctx.num_blocks)

        needed = np.zeros(ctx.num_blocks, dtype=bool)
        for bids in ctx.requests.values():
            needed[np.asarray(bids, dtype=np.int64)] = True

        decoded: dict[int, np.ndarray] = {}
        decode_s: dict[int, float] = {}
        sent: dict[int, list[Message]] = {k: [] for k in contributors}
        got: dict[int, list[Message]] = {r: [] for r in ctx.requests}
        try:
            for part, (b0, b1) in enumerate(chunks):
                parts = {}
                for k in contributors:                      # clients encrypt their blocks of this chunk
                    table = ctx.contributions[k]
                    i0, i1 = np.searchsorted(table.ids, [b0, b1])
                    t = time.perf_counter()
                    rows = table.values[i0:i1]
                    if rounding is not None:                # packed fixed point: quantise this chunk
                        rows = plan.layout.quantize(rows, rounding[k], ctx.dp_noise_std > 0)
                    frames = [self._encrypt(key.context, plan, row[a:b]) for row in rows for a, b in bounds]
                    client_up_s[k] += time.perf_counter() - t
                    msg = Message(ctx.round, ctx.tag, client_party(k), SERVER, "ciphertext",
                                  (int(i1 - i0), ctx.block_len), sum(len(f) for f in frames), self.mode, fp, frames,
                                  note=f"{plan.describe()}")
                    try:       # signed; the server verifies it before reading (recorded below)
                        msg = self._deliver(msg, "upload", part, record=False)
                    except ProtocolError:
                        sent[k].append(msg)
                        raise
                    sent[k].append(msg)
                    self._drop_streamed_payloads(sent[k])
                    parts[k] = msg
                t = time.perf_counter()
                loaded = {}
                for k, msg in parts.items():                # server: check ALL uploads of the chunk first
                    self._check_envelope(msg, ctx, k)
                    ids = server_ids[k]
                    sel = ids[(ids >= b0) & (ids < b1)]
                    if tuple(msg.shape) != (sel.size, ctx.block_len) or not isinstance(msg.payload, (list, tuple)) \
                            or len(msg.payload) != sel.size * n_pieces:
                        n = len(msg.payload) if isinstance(msg.payload, (list, tuple)) else None
                        raise ShapeError(f"upload of shape {tuple(msg.shape)} with {n} ciphertexts; expected shape "
                                         f"{(sel.size, ctx.block_len)} in {sel.size * n_pieces} ciphertexts",
                                         **where(k))
                    vecs = [self._load(server, plan, f, vec_lens[i % n_pieces], ctx, k, i)
                            for i, f in enumerate(msg.payload)]
                    loaded[k] = (sel, vecs)
                sums: dict[int, list] = {}
                counts: dict[int, int] = {}
                for k in contributors:                      # then add, per block id
                    sel, vecs = loaded[k]
                    for i, bid in enumerate(sel.tolist()):
                        if not needed[bid]:
                            continue
                        pieces = vecs[i * n_pieces:(i + 1) * n_pieces]
                        if bid in sums:
                            for acc, v in zip(sums[bid], pieces):
                                acc.add_(v)
                        else:
                            sums[bid] = pieces
                        counts[bid] = counts.get(bid, 0) + 1
                if plan.layout is not None and plan.layout.offset:
                    for bid, c in counts.items():           # pad missing clients' DP offsets (public)
                        if c < K:
                            const = plan.layout.offset_constant(K - c)
                            for acc, n in zip(sums[bid], vec_lens):
                                acc.add_([const] * n)
                size = chain.padded_ciphertext_bytes
                out_frames = {bid: [wire.frame(acc.serialize(), size, allow_larger=True) for acc in accs]
                              for bid, accs in sums.items()}
                del loaded, sums, parts
                server_s += time.perf_counter() - t
                for r, bids in ctx.requests.items():         # signed download of this chunk's blocks
                    mine = [int(b) for b in np.asarray(bids).ravel() if b0 <= int(b) < b1]
                    frames = [f for b in mine for f in out_frames.get(b, [wire.EMPTY] * n_pieces)]
                    msg = Message(ctx.round, ctx.tag, SERVER, client_party(r), "ciphertext", (len(mine), ctx.block_len),
                                  sum(len(f) for f in frames), self.mode, fp, frames,
                                  note=plan.describe())
                    try:       # the recipient verifies it before decrypting (recorded below)
                        msg = self._download(msg, "download", part, record=False)
                    finally:
                        got[r].append(msg)
                        self._drop_streamed_payloads(got[r])
                    for i, bid in enumerate(mine):           # decrypt once per block (shared key)
                        if bid in out_frames and bid not in decoded:
                            t = time.perf_counter()
                            delivered = msg.payload[i * n_pieces:(i + 1) * n_pieces]
                            decoded[bid] = np.concatenate([self._decrypt(key.context, plan, f, b - a, ctx)
                                                           for f, (a, b) in zip(delivered, bounds)])
                            decode_s[bid] = time.perf_counter() - t
        finally:
            self._record_streamed(sent, ctx)
            self._record_streamed(got, ctx)

        zero = np.zeros(ctx.block_len)
        out: dict[int, dict[int, np.ndarray]] = {}
        bytes_down, client_down_s = {}, {}
        for r, bids in ctx.requests.items():
            bids = [int(b) for b in np.asarray(bids).ravel()]
            nbytes = sum(m.nbytes for m in got[r])
            out[r] = {b: decoded.get(b, zero) for b in bids}
            bytes_down[r] = nbytes
            client_down_s[r] = sum(decode_s.get(b, 0.0) for b in bids)
        self.last_stats = {
            "tag": ctx.tag, "round": ctx.round, "params": plan.describe(), "chain": chain.name,
            "encoding": plan.encoding, "scale_bits": plan.scale_bits, "error_bound": plan.error_bound,
            "fields_per_slot": plan.layout.fields if plan.layout else 1,
            "field_bits": plan.layout.width if plan.layout else None,
            "ciphertexts_per_block": n_pieces, "chunks": len(chunks),
            "bytes_up": {k: sum(m.nbytes for m in sent[k]) for k in contributors},
            "bytes_down": bytes_down, "client_upload_s": client_up_s, "client_download_s": client_down_s,
            "server_s": server_s, "setup_s": setup_s,
        }
        return out

    def _drop_streamed_payloads(self, msgs: list[Message]) -> None:
        """A client's messages of one exchange, once streamed (several chunks) or large, are
        recorded without payloads (:meth:`_record_streamed`): drop the ciphertexts as soon as
        they are sent instead of holding every chunk of every client until the exchange ends."""
        if len(msgs) > 1 or (msgs and msgs[-1].nbytes > self.keep_payload_bytes):
            msgs[:] = [m.without_payload() for m in msgs]

    def _record_streamed(self, sent: dict[int, list[Message]], ctx: ExchangeContext) -> None:
        """One upload (download) Message per client per exchange; large or streamed payloads are stripped."""
        for k, msgs in sent.items():
            if not msgs:
                continue
            if len(msgs) == 1:
                msg = msgs[0]
                if msg.nbytes > self.keep_payload_bytes:
                    msg = replace(msg, payload=None, note=msg.note + "; payload not kept (size)")
            else:
                last = msgs[-1]
                try:
                    shape = (sum(int(m.shape[0]) for m in msgs), ctx.block_len)
                except (TypeError, ValueError, IndexError):   # a tampered shape: record it as sent
                    shape = last.shape
                msg = replace(last, shape=shape, nbytes=sum(int(m.nbytes) for m in msgs), payload=None,
                              note=last.note + f"; streamed in {len(msgs)} chunks, payload not kept")
            self.transcript.record(msg)
