"""The multiparty CKKS backend (``--mode ckks-mp``): no party ever holds the whole secret key.

Scheme: Mouchet, Troncoso-Pastoriza, Bossuat, Hubaux, "Multiparty Homomorphic Encryption
from Ring-Learning-with-Errors", PoPETs 2021 — collective key generation (Protocol 1),
encryption under the collective public key, and collective public-key switching (PCKS,
Protocol 5) of each aggregate block to its recipient's own key, n-out-of-n.

Why our own RNS arithmetic (option B) and not SEAL through TenSEAL's ``sealapi``: sealapi
reads key and ciphertext coefficients but cannot write them and exposes no NTT, so every
collective key, share and switched ciphertext would have to be forged as a SEAL-4
serialization (an undocumented, version-pinned layout) — and OpenFHE, which has the scheme,
does not load on this Python.  The protocols need only four ring operations (add, negate,
NTT-domain product, NTT); :mod:`.ring` implements them in ~150 lines of int64 numpy with
primes below 2^31, testable against a schoolbook convolution.  The add-only workload needs
no slots: values are packed as fixed-point integer fields into coefficients
(:mod:`.encoding`), which doubles the values per ciphertext over the canonical embedding,
makes packed integers exact with a worst-case (not statistical) noise bound, and lets the
recipient detect a corrupted share.  Relinearisation and rotation keys (needed only for
slot-wise products) are not built.

One exchange (:meth:`CKKSMPProtocol._aggregate`):

1. **Plan** (public): :func:`.params.plan_exchange` — primes ``L``, scale ``2^D`` above the
   worst-case key-switching noise, field width from the public bounds, fields per
   coefficient; BoundError if the tolerance or the sum range does not fit.
2. **Client-side validation before encryption**: shapes, finiteness, every value in the
   public range (BoundError / PackingOverflowError naming the client); integer exchanges
   also audit the K-way sum against the public sum bound (a simulation-side check, as in
   ``ckks``).
3. **Keys** (first exchange; tag ``ckks-mp/keys``): the server publishes a fresh random
   32-byte CRS seed; every client expands ``a``, sends ``p_i`` and its recipient key
   ``p_R`` (kind ``public_key``); the server adds the ``p_i`` and broadcasts ``p``.  Client 0
   also makes the clients' common broadcast key pair ``(s_B, p_B)`` and sends ``s_B`` to each
   other client encrypted under that client's ``p_R`` and again over the signed client-to-client
   channel (:mod:`protocols.channel`; relayed by the server, which cannot open it; the server plus any client learns only what that client receives anyway).
   On ``--resume`` a new protocol object runs the key generation again.
4. **Upload**: each client sends its blocks encrypted under ``p`` (kind ``ciphertext``;
   sparse layout: its block ids as ``metadata``).  The server checks the envelope and every
   residue of every upload, then adds per block and pads blocks that fewer than K clients
   uploaded with the missing public offsets.
5. **Key switch, scoped per recipient**: the server sends every client the ``c1`` of the
   requested blocks (kind ``ciphertext``); every client sends, for every recipient, its
   PCKS shares of that recipient's blocks (kind ``share``) — or, when every client receives
   the same blocks (weighted means), one set of shares to the broadcast key ``p_B``, which
   saves a factor K in share bytes; a missing share aborts with
   DropoutError naming the client, a malformed one with IntegrityError.  The server adds
   the K shares and sends each recipient only its blocks, now under its own key.
6. **Recipients decrypt** with their own secret; a residual above the worst-case noise
   bound or a field out of range raises IntegrityError (a corrupted share or ciphertext).

Semi-honest server: clients key-switch the ``c1`` the server says is the aggregate; a
malicious server could ask them to switch a single upload instead (not defended here: the
server's signature authenticates the request, it does not prove the ``c1`` is the aggregate).
Every message is signed and verified before use (:mod:`protocols.auth`): client->server through
``_deliver``, server->client through ``_download``, stages ``STAGES['ckks-mp']`` of
:mod:`protocols.message` (key_setup, block_ids, upload, keyswitch, download).  Transcript payloads
larger than ``keep_payload_bytes`` are dropped before recording (the note says so);
``nbytes`` is always the real size.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import replace
from functools import lru_cache

import numpy as np

from ..base import ExchangeContext, Protocol, ValueSpec
from ..ckks.params import per_client_limits
from ..errors import (BoundError, DropoutError, IntegrityError, PackingOverflowError,
                      ShapeError)
from ..fixed_point import grid_sums, to_grid
from ..transcript import SERVER, Message, client_party
from ..validate import first_out_of_range
from . import encoding, encryption
from .keys import collective_public_key
from .keyswitch import combine_shares
from .params import MPParams, Plan, check_security, plan_exchange, smudging_bits
from .party import MPClient
from .ring import RNSRing
from .sampling import common_polynomial

KEYS_TAG = "ckks-mp/keys"
#: how the broadcast secret s_B travels: coefficients + 1 in {0, 1, 2}, one client's key
_KEY_SPEC = ValueSpec(integer=True, max_abs=2, sum_max=2)


@lru_cache(maxsize=4)
def _ring(params: MPParams) -> RNSRing:
    return RNSRing(params.n, params.primes)


class CKKSMPProtocol(Protocol):
    """Multiparty RLWE (CKKS-style fixed point) secure aggregation, n-out-of-n.

    Options (``make_protocol('ckks-mp', K, ...)``):

    params:             an :class:`~.params.MPParams` (default N=8192, 7 x 31-bit primes,
                        eta=21, smudging 2^-40 per key switch); checked against the HE standard.
    keep_payload_bytes: largest message payload kept in the transcript.
    audit_sum_bound:    check integer K-way sums against the public bound before encrypting.
    """

    mode = "ckks-mp"
    upload_kind = "ciphertext"

    def __init__(self, num_clients: int, *, transcript=None, dp=None, seed: int = 0,
                 params: MPParams | None = None, keep_payload_bytes: int = 8 << 20, audit_sum_bound: bool = True):
        super().__init__(num_clients, transcript=transcript, dp=dp, seed=seed)
        self.params = params or MPParams()
        check_security(self.params)
        self.ring = _ring(self.params)
        self.keep_payload_bytes = int(keep_payload_bytes)
        self.audit_sum_bound = bool(audit_sum_bound)
        self._clients: dict[int, MPClient] = {}            # client side (secrets live here only)
        self._collective_pk: np.ndarray | None = None      # server side: public
        self._recipient_pks: dict[int, np.ndarray] = {}    # server side: public
        self._broadcast_pk: np.ndarray | None = None       # server side: public
        self._a_hat: np.ndarray | None = None
        self._fingerprint: str | None = None
        #: statistics of the key set-up and of the last exchange (bytes, seconds) — for benchmarks
        self.setup_stats: dict | None = None
        self.last_stats: dict | None = None

    # ------------------------------------------------------------------ plan
    def plan(self, spec, block_len: int | None = None, dp_std: float = 0.0) -> Plan:
        return plan_exchange(self.params, spec, self.num_clients, dp_std, block_len)

    def block_capacity(self, spec) -> int:
        dp_std = float(getattr(self.dp, "last_std", 0.0) or 0.0) if self.dp is not None else 0.0
        try:
            return self.plan(spec, dp_std=dp_std).capacity
        except BoundError:
            return self.params.n          # _aggregate raises the error with the exchange named

    # ------------------------------------------------------------------ keys
    def _record_message(self, msg: Message) -> None:
        """Recorded with its payload if small."""
        if msg.payload is not None and msg.nbytes > self.keep_payload_bytes:
            msg = replace(msg, payload=None, note=msg.note + "; payload not kept (size)")
        self.transcript.record(msg)

    def _ensure_keys(self, rnd: int) -> None:
        if self._collective_pk is not None:
            return
        t0 = time.perf_counter()
        seed = os.urandom(32)                                  # public CRS seed, chosen by the server
        level = self.params.num_primes
        poly_bytes = level * self.params.n * 4
        seeds = {k: self._download(Message(rnd, KEYS_TAG, SERVER, client_party(k), "metadata", (32,), 32, self.mode,
                                           "", seed, note="public seed of the common random polynomial a"),
                                   "key_setup").payload
                 for k in range(self.num_clients)}
        server_s = time.perf_counter() - t0
        client_s, shares = {}, []
        for k in range(self.num_clients):
            t = time.perf_counter()
            a_hat = common_polynomial(seeds[k], self.params.primes, self.params.n)
            client = MPClient(k, self.ring, self.params, a_hat)
            self._clients[k] = client
            msgs = [Message(rnd, KEYS_TAG, client_party(k), SERVER, "public_key", (level, self.params.n),
                            poly_bytes, self.mode, "", data, note=note)
                    for data, note in ((client.public_share, "collective public key share p_i = -a s_i + e_i"),
                                       (client.recipient_public_key, "recipient public key p_R = -a s_R + e_R"))]
            client_s[k] = time.perf_counter() - t
            delivered = [self._deliver(m, "key_setup", part) for part, m in enumerate(msgs)]
            t = time.perf_counter()
            if any(m is None for m in delivered):
                raise DropoutError("a client's public key share is missing: the collective key cannot be "
                                   "formed (n-out-of-n); rerun the key set-up with every client", client=k)
            try:
                p_i, p_r = (encryption.from_bytes(self.ring, m.payload, (level, self.params.n)) for m in delivered)
            except ValueError as exc:
                raise IntegrityError(f"malformed public key: {exc}", tag=KEYS_TAG, client=k) from exc
            shares.append(p_i)
            self._recipient_pks[k] = p_r
            server_s += time.perf_counter() - t
        t = time.perf_counter()
        self._a_hat = common_polynomial(seed, self.params.primes, self.params.n)
        self._collective_pk = collective_public_key(self.ring, shares)
        server_s += time.perf_counter() - t
        self._deal_broadcast_key(rnd, client_s)
        t = time.perf_counter()
        pk_bytes = encryption.to_bytes(self._collective_pk)
        self._fingerprint = hashlib.sha256(self.mode.encode() + self.params.describe().encode() + seed
                                           + pk_bytes).hexdigest()[:16]
        server_s += time.perf_counter() - t
        for k, client in self._clients.items():
            msg = self._download(Message(rnd, KEYS_TAG, SERVER, client_party(k), "public_key", (level, self.params.n),
                                         len(pk_bytes), self.mode, self._fingerprint, pk_bytes,
                                         note="collective public key p = sum_i p_i"), "key_setup", 1)
            client.collective_pk = encryption.from_bytes(self.ring, msg.payload, (level, self.params.n))
        comm = self.transcript.comm()["per_tag"][KEYS_TAG]
        self.setup_stats = {"client_s": client_s, "server_s": server_s,
                            "bytes_up_per_client": comm["bytes_up"] / self.num_clients,
                            "bytes_down_per_client": comm["bytes_down"] / self.num_clients,
                            "params": self.params.describe()}

    def _deal_broadcast_key(self, rnd: int, client_s: dict[int, float]) -> None:
        """Client 0 makes the broadcast key pair, publishes ``p_B`` and sends ``s_B`` to every other
        client encrypted under that client's recipient key, through the signed, encrypted
        client-to-client channel (relayed by the server, which cannot open it).  Adds the clients' seconds to ``client_s``."""
        level, n = self.params.num_primes, self.params.n
        dealer = self._clients[0]
        t = time.perf_counter()
        p_b = dealer.make_broadcast_key()
        plan = plan_exchange(self.params, _KEY_SPEC, 1)
        sealed = {j: dealer.seal_broadcast_key(plan, self._recipient_pks[j]) for j in range(1, self.num_clients)}
        client_s[0] += time.perf_counter() - t
        msg = self._deliver(Message(rnd, KEYS_TAG, client_party(0), SERVER, "public_key", (level, n), len(p_b),
                                    self.mode, "", p_b, note="broadcast public key p_B = -a s_B + e_B"), "key_setup", 2)
        if msg is None:
            raise DropoutError("the broadcast public key is missing; rerun the key set-up", tag=KEYS_TAG, client=0)
        try:
            self._broadcast_pk = encryption.from_bytes(self.ring, msg.payload, (level, n))
        except ValueError as exc:
            raise IntegrityError(f"malformed broadcast public key: {exc}", tag=KEYS_TAG, client=0) from exc
        for j, data in sealed.items():
            opened = self._relay(rnd, KEYS_TAG, 0, j, "key_setup", data,
                                 f"broadcast secret s_B encrypted to client {j}'s recipient key", fingerprint="",
                                 keep_payload=len(data) <= self.keep_payload_bytes)
            t = time.perf_counter()
            try:
                ct = encryption.from_bytes(self.ring, opened, (1, 2, plan.level, n))
            except ValueError as exc:
                raise IntegrityError(f"sealed broadcast key rejected: {exc}", tag=KEYS_TAG, client=0) from exc
            residual, ok = self._clients[j].open_broadcast_key(plan, ct, self._broadcast_pk)
            client_s[j] += time.perf_counter() - t
            if residual > plan.noise_bound or not ok:
                raise IntegrityError(f"client {j} could not open the sealed broadcast key (corrupted)",
                                     tag=KEYS_TAG, client=0)

    @property
    def fingerprint(self) -> str:
        """sha256 of the public context: parameters, CRS seed and collective public key."""
        self._ensure_keys(0)
        return self._fingerprint

    # ------------------------------------------------------------------ client side
    def _validate(self, ctx: ExchangeContext, plan: Plan) -> None:
        """Every contribution against the public plan; raises before anything is encrypted."""
        spec = ctx.spec
        lo, hi, offset = per_client_limits(spec, ctx.dp_noise_std, self.num_clients)
        bad = first_out_of_range(ctx, self.num_clients, lo, hi)
        if bad is not None:
            k, block, entry, v, why = bad
            raise BoundError(f"entry {entry} of block {block} is {v:g}, which {why} of this exchange "
                             f"({plan.describe()}; ValueSpec max_abs={spec.max_abs:g}, sum_max={spec.sum_max}). "
                             "Nothing was encrypted. Fix: clip the values or declare a larger public bound",
                             tag=ctx.tag, round=ctx.round, client=k)
        if spec.integer and self.audit_sum_bound:
            top, bottom = (1 << plan.width) - 1 - self.num_clients * offset, -self.num_clients * offset
            total = np.zeros((ctx.num_blocks, ctx.block_len))
            for table in ctx.contributions.values():
                total[np.asarray(table.ids, dtype=np.int64)] += table.values
            bad = np.nonzero((total > top) | (total < bottom))
            if bad[0].size:
                b, j = int(bad[0][0]), int(bad[1][0])
                raise PackingOverflowError(
                    f"the {len(ctx.contributions)}-client sum of entry {j} of block {b} is {total[b, j]:g}, outside "
                    f"[{bottom}, {top}] that the public bound sum_max={spec.sum_max} allows: its {plan.width}-bit "
                    "field would carry into the next one. Nothing was encrypted. Fix: declare the true bound "
                    "(e.g. degree cap + 1) in ValueSpec.sum_max", tag=ctx.tag, round=ctx.round)

    # ------------------------------------------------------------------ the exchange
    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        plan = plan_exchange(self.params, ctx.spec, self.num_clients, ctx.dp_noise_std, ctx.block_len,
                             tag=ctx.tag, round=ctx.round)
        for r, bids in ctx.requests.items():
            bids = np.asarray(bids)
            if not 0 <= int(r) < self.num_clients or (bids.size and (bids.min() < 0 or bids.max() >= ctx.num_blocks)):
                raise ShapeError(f"recipient {r} requests blocks outside [0, {ctx.num_blocks})",
                                 tag=ctx.tag, round=ctx.round, client=r)
        self._validate(ctx, plan)                          # clients: nothing encrypted before this passes
        self._ensure_keys(ctx.round)
        K, n, level, fp = self.num_clients, self.params.n, plan.level, self._fingerprint
        where = lambda k: dict(tag=ctx.tag, round=ctx.round, client=k)  # noqa: E731
        spans = [(a, min(ctx.block_len, a + plan.capacity)) for a in range(0, ctx.block_len, plan.capacity)]
        pieces = len(spans)
        ct_shape = (2, level, n)
        up_s: dict[int, float] = {}
        down_s: dict[int, float] = {k: 0.0 for k in range(K)}
        server_s = 0.0

        # 4. upload: clients encrypt; the server checks every upload, then adds per block
        uploads: dict[int, tuple[np.ndarray, Message | None]] = {}
        for k in sorted(ctx.contributions):
            table = ctx.contributions[k]
            ids = np.asarray(table.ids, dtype=np.int64)
            if ctx.layout == "sparse":
                meta = self._deliver(Message(ctx.round, ctx.tag, client_party(k), SERVER, "metadata", (ids.size,),
                                             4 * ids.size, self.mode, fp, {"block_ids": ids.astype(np.int32)},
                                             note="block ids of the sparse layout"), "block_ids")
                if meta is None:
                    raise DropoutError("the client's block ids are missing; nothing was aggregated", **where(k))
                ids = np.asarray((meta.payload or {}).get("block_ids", []), dtype=np.int64)
            t = time.perf_counter()
            values = np.asarray(table.values, dtype=np.float64)
            if ctx.spec.grid_bits is not None:                 # the client puts a grid exchange on its grid
                values = to_grid(values, ctx.spec.grid_bits)
            data = self._clients[k].encrypt_blocks(plan, values)
            up_s[k] = time.perf_counter() - t
            msg = self._deliver(Message(ctx.round, ctx.tag, client_party(k), SERVER, "ciphertext",
                                        (int(ids.size), ctx.block_len), len(data), self.mode, fp, data,
                                        note=f"{ids.size * pieces} ciphertexts, {plan.describe()}"), "upload")
            uploads[k] = (ids, msg)
        t = time.perf_counter()
        parsed = {}
        for k, (ids, msg) in uploads.items():
            if msg is None:
                raise DropoutError("the client's upload is missing; nothing was aggregated (n-out-of-n)", **where(k))
            self._check_envelope(msg, ctx, k)
            if ids.size and (ids.min() < 0 or ids.max() >= ctx.num_blocks or (np.diff(ids) <= 0).any()):
                raise ShapeError(f"block ids must be increasing in [0, {ctx.num_blocks})", **where(k))
            try:
                parsed[k] = encryption.from_bytes(self.ring, msg.payload, (ids.size, pieces) + ct_shape)
            except ValueError as exc:
                raise IntegrityError(f"upload rejected: {exc}", **where(k)) from exc
        needed = sorted({int(b) for bids in ctx.requests.values() for b in np.asarray(bids).ravel()})
        index = {b: i for i, b in enumerate(needed)}
        agg = np.zeros((len(needed), pieces) + ct_shape, dtype=np.int64)
        counts = np.zeros(len(needed), dtype=np.int64)
        for k, cts in parsed.items():
            ids = uploads[k][0]
            rows = [(index[int(b)], i) for i, b in enumerate(ids) if int(b) in index]
            if rows:
                dst, src = (np.array(x) for x in zip(*rows))
                agg[dst] = self.ring.add(agg[dst], cts[src])
                counts[dst] += 1
        for i in np.nonzero(counts < K)[0]:                # pad missing clients' public offsets
            if plan.offset:
                for j, (a, b) in enumerate(spans):
                    pad = self.ring.ntt(encoding.offset_plaintext(self.ring, plan, b - a, int(K - counts[i])))
                    agg[i, j, 0] = self.ring.add(agg[i, j, 0], pad)
        server_s += time.perf_counter() - t

        # 5. public-key switching: c1 down to every client, shares up, sums down.  When every
        # client receives the same blocks (a broadcast: weighted means, model averages) the
        # blocks are switched once, to the clients' common broadcast key; otherwise once per
        # recipient, to its own key (scoped return).
        c1 = agg[:, :, 1]                                   # [blocks, pieces, L, N]
        c1_bytes = encryption.to_bytes(c1)
        c1_of = {k: self._download(Message(ctx.round, ctx.tag, SERVER, client_party(k), "ciphertext",
                                           (len(needed), pieces), len(c1_bytes), self.mode, fp, c1_bytes,
                                           note="c1 of the aggregate blocks to key-switch"), "keyswitch").payload
                 for k in range(K)}
        smudge = smudging_bits(self.params, K)
        rows_of = {int(r): [index[int(b)] for b in np.asarray(bids).ravel()] for r, bids in ctx.requests.items()}
        if not rows_of:
            raise ShapeError("the exchange has no recipients", tag=ctx.tag, round=ctx.round)
        first = next(iter(rows_of.values()))
        if set(rows_of) == set(range(K)) and all(rows == first for rows in rows_of.values()):
            groups = [("the broadcast key", self._broadcast_pk, first, sorted(rows_of), True)]
        else:
            groups = [(f"recipient {r}'s key", self._recipient_pks[r], rows, [r], False) for r, rows in rows_of.items()]
        share_msgs: list[dict[int, Message | None]] = [{} for _ in groups]
        for k in range(K):
            c1_k = encryption.from_bytes(self.ring, c1_of[k], c1.shape)
            for g, (label, pk, rows, _, _) in enumerate(groups):
                t = time.perf_counter()
                data = self._clients[k].pcks_shares(plan, c1_k[rows].reshape(-1, level, n), pk, smudge) \
                    if rows else b""
                down_s[k] += time.perf_counter() - t
                share_msgs[g][k] = self._deliver(Message(ctx.round, ctx.tag, client_party(k), SERVER, "share",
                                                         (len(rows), pieces), len(data), self.mode, fp, data,
                                                         note=f"PCKS shares to {label}"), "keyswitch", g)
        t = time.perf_counter()
        switched = []
        for g, (label, _, rows, _, _) in enumerate(groups):   # every share of every group checked first
            shares = []
            for k in range(K):
                msg = share_msgs[g][k]
                if msg is None:
                    raise DropoutError(f"the client's key-switching share to {label} is missing: n-out-of-n "
                                       "decryption needs every client; nothing was delivered", **where(k))
                self._check_envelope(msg, ctx, k)
                try:
                    shares.append(encryption.from_bytes(self.ring, msg.payload, (len(rows) * pieces,) + ct_shape))
                except ValueError as exc:
                    raise IntegrityError(f"key-switching share to {label} rejected: {exc}", **where(k)) from exc
            switched.append(combine_shares(self.ring, agg[rows].reshape((-1,) + ct_shape)[:, 0], shares)
                            if rows else np.zeros((0,) + ct_shape, dtype=np.int64))
        server_s += time.perf_counter() - t

        # 6. each recipient receives only its blocks and decrypts them with its own (or the broadcast) secret
        received: dict[int, dict[int, np.ndarray]] = {}
        lengths = [b - a for a, b in spans]
        for (label, _, rows, members, broadcast), out in zip(groups, switched):
            out_bytes = encryption.to_bytes(out)
            delivered = [self._download(Message(ctx.round, ctx.tag, SERVER, client_party(r), "ciphertext",
                                                (len(rows), pieces), len(out_bytes), self.mode, fp, out_bytes,
                                                note=f"aggregate blocks key-switched to {label}")).payload
                         for r in members]
            # members of a broadcast group decrypt the same (verified) bytes: decoded once, the time charged to each
            t = time.perf_counter()
            cts = encryption.from_bytes(self.ring, delivered[0], out.shape)
            decoded = self._clients[members[0]].decrypt_delivery(plan, cts, lengths * len(rows), broadcast)
            blocks = {}
            for i, b in enumerate(np.asarray(ctx.requests[members[0]]).ravel()):
                parts = []
                for j in range(pieces):
                    fields, residual, in_range = decoded[i * pieces + j]
                    if residual > plan.noise_bound or not in_range:
                        why = (f"noise 2^{math.log2(residual):.1f} above the worst-case bound "
                               f"2^{math.log2(plan.noise_bound):.1f}" if residual > plan.noise_bound
                               else "a packed field out of range")
                        raise IntegrityError(f"block {int(b)} switched to {label} decrypts with {why}: a "
                                             "key-switching share or ciphertext was corrupted; nothing was delivered",
                                             tag=ctx.tag, round=ctx.round)
                    parts.append(encoding.dequantize(fields, plan))
                blocks[int(b)] = np.concatenate(parts)
            if ctx.spec.grid_bits is not None:                 # ... and reads the exact sum back off it
                blocks = grid_sums(blocks, ctx.spec.grid_bits, dict(tag=ctx.tag, round=ctx.round))
            elapsed = time.perf_counter() - t
            for r in members:
                received[r] = {b: v.copy() for b, v in blocks.items()}
                down_s[r] += elapsed
        self.last_stats = {"tag": ctx.tag, "params": plan.describe(), "client_upload_s": up_s,
                           "client_download_s": down_s, "server_s": server_s, "level": level,
                           "smudging_bits": smudge, "error_bound": plan.error_bound}
        return received
