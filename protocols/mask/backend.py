"""Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017) as a protocol backend.

One call of :meth:`MaskProtocol._aggregate` is one aggregation instance of the
protocol of Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and
Seth, "Practical Secure Aggregation for Privacy-Preserving Machine Learning"
(CCS 2017, §4, Fig. 4), in its honest-but-curious form, over the ring ``Z_{2^b}``:

0. *Local encoding* — every contributor quantises its blocks (:mod:`.quantize`; by
   default the smallest ring that carries the sum within the ValueSpec) and checks
   them against the public bound **before** anything is sent.
1. *Metadata* (sparse layout only) — each client tells the server which block ids it
   touches (the documented leak of this layout); the server returns to each client,
   per peer, the ids they have in common, so that masks of block ``b`` involve only
   the contributors of ``b``.
2. *AdvertiseKeys* — a fresh X25519 mask key pair per client per exchange; public
   keys go to the server, which broadcasts them (:mod:`.keys`).
3. *ShareKeys* — each client draws a fresh self-mask seed ``b_k`` (os.urandom) and
   Shamir-shares it, and (when dropout recovery is on) the secret key of its mask key pair,
   with the other participants, threshold ``t`` (:mod:`.shamir`).  Shares travel over the
   encrypted client-to-client channel relayed by the server (:mod:`protocols.channel`;
   recorded as ``ciphertext`` messages with ``relay='server'``): the server cannot read them.
4. *MaskedInputCollection* — client ``k`` uploads, per block it contributes (Bonawitz
   double masking, plus an output mask),

       y_k = q(x_k) + sum_{j>k} PRG(s_kj) - sum_{j<k} PRG(s_kj) + PRG(b_k) + R_k     (mod 2^b)

   with ``j`` ranging over the other contributors of that block, ``b_k`` the self mask and
   ``R_k`` the output mask (default; absent with ``reveal_to_server=True``), see below.
5. *Unmasking* — the server sums the uploads mod ``2^b``.  Pairwise masks cancel
   between survivors.  The server asks each responding client, per other client, for its
   share of ``b_u`` (survivors ``u``) **or** of the mask secret key (clients ``d`` that dropped
   after step 3) — never both; an honest client refuses a request naming one client in both
   lists (:class:`~protocols.errors.UnmaskingRefusedError`).  The server rebuilds each
   ``b_u`` and removes ``PRG(b_u)``; it rebuilds each dropped key (verified against the
   advertised public key), recomputes the dangling masks and removes them — the sum then
   covers the survivors only and recipients are told who was included.  Too few responders
   (``< t``), recovery disabled, or DP noise placed 'distributed' (a survivors' sum would be
   short of noise): DropoutError.  Never a wrong sum.
6. *Delivery* — each recipient gets exactly the blocks it asked for, removes the
   output mask and decodes.

Every client->server and client->client message is signed (Ed25519) in the envelope of
:mod:`protocols.message`, with stages ``advertise_keys``, ``share_keys``, ``masked_upload``,
``unmask`` (and ``block_ids`` in the sparse layout); the server and each recipient verify it
before use (:mod:`protocols.auth`).

**Individual inputs are protected by ``b_k``** (Bonawitz et al. §4): if a "dropped" client's
upload arrives late after the server rebuilt its mask key, the server (and any coalition of
fewer than ``t`` clients) still faces ``PRG(b_k)``, whose shares it never asked for.

**Output privacy (default).**  In Bonawitz et al. the server learns the sum.  Here the
recipients of every exchange are clients, so the server need not: every client holds
a 32-byte *group seed* ``G`` (drawn by client 0 and sent to every client over the relayed
encrypted channel at the first exchange), and contributor ``k`` adds
``R_k = PRG(HKDF(G; exchange, k))`` to each of its blocks.  The server's sum is
``sum q(x_k) + sum_k R_k``: uniformly random to it.  A recipient subtracts ``R_k`` for every
included contributor of each block it receives (dropout-robust, because the server tells it
who was included).  ``R_k`` hides only the aggregate: every client knows ``G``.  With
``reveal_to_server=True`` there is no output mask and downloads are recorded as ``plain``
(the server can read the aggregate it sends).

**What still leaks.**  The server learns which clients took part and, in the sparse
layout, which block ids each client touches; a block with a single contributor is
that client's value in ``reveal_to_server`` mode.  Each client learns, per peer, the
block ids they share (needed to mask pairwise), and each recipient learns, per block
it receives, which clients contributed (needed to remove the output masks).  Clients
legitimately learn the aggregates they receive (DESIGN.md, threat model).

**Collusion.**  Every client holds ``G``, so the server plus any one client sees the
aggregate (as in standard Bonawitz).  An individual input stays hidden from the server
plus ``c < t`` colluding clients (too few shares to rebuild the victim's ``b_k`` or mask key)
as long as at least one other honest client contributes the same block
(:mod:`attacks.coalition` measures it).  Honest-but-curious server: no SecAgg+ consistency
round, so a server that lies about who dropped is outside the model.

**Dropout simulation.**  :meth:`MaskProtocol.drop_clients` makes clients leave the
*next* exchange at a given stage: ``'keys'`` (before advertising keys: simply not a
participant), ``'upload'`` (after sharing keys, before uploading: needs recovery),
``'unmask'`` (after uploading, does not answer the recovery round), ``'late'`` (like
``'upload'``, but its masked upload arrives after recovery: recorded, never aggregated).  A dropped client
still receives its download (it reconnects for the result), so callers get every
recipient's result; :attr:`MaskProtocol.last_included` names the clients whose
contributions the result covers.

Simulation shortcuts (results are identical, only the compute is shared): the output
mask a recipient removes is computed once per exchange for all recipients, and the
server's "broadcast" of public keys is one message per participant.
"""
from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..base import ExchangeContext, Protocol
from ..errors import ConfigurationError, DropoutError, IntegrityError, ShapeError, UnmaskingRefusedError
from ..transcript import SERVER, Message, client_party
from .keys import PUBLIC_KEY_BYTES, ExchangeBinding, MaskKeyPair, new_secret_seed, output_mask_key
from .prg import ring_mask, stream_id
from .quantize import FixedPoint, choose_encoding
from .shamir import SHARE_BYTES, Share, combine, split

#: values per transport block (the layout granularity of the sparse leak)
MASK_BLOCK = 4096
DROP_STAGES = ("keys", "upload", "unmask", "late")
_ID = 4  # bytes of a client or block id on the wire (int32)
_SHARE_WIRE = _ID + SHARE_BYTES


@dataclass
class _Participant:
    """Client-side state of one participant for one exchange (its secrets stay here)."""

    ids: np.ndarray                      # block ids it contributes (sorted)
    encoded: np.ndarray                  # [n_blocks, L] ring elements
    common: dict[int, np.ndarray] = field(default_factory=dict)  # peer -> shared block ids
    keys: MaskKeyPair | None = None
    self_seed: bytes | None = None
    seeds: dict[int, bytes] = field(default_factory=dict)        # peer -> pairwise seed
    held: dict[int, tuple[Share, Share | None]] = field(default_factory=dict)  # owner -> shares


def _parse_held(raw: bytes, with_key: bool, ctx, owner: int) -> tuple[Share | None, Share]:
    """A recipient's (mask-key share, self-mask share) of ``owner`` from the decrypted channel bytes."""
    n = 4 + SHARE_BYTES
    if len(raw) != (2 if with_key else 1) * n:
        raise IntegrityError(f"share message of {len(raw)} bytes", tag=ctx.tag, round=ctx.round, client=owner)
    shares = [Share.from_bytes(raw[i:i + n]) for i in range(0, len(raw), n)]
    return (shares[0], shares[1]) if with_key else (None, shares[0])


def _unmask_answer(held: dict, want_key: list[int], want_self: list[int], ctx, responder: int) -> tuple[dict, dict]:
    """An honest client's answer to the server's unmasking request (Bonawitz et al. §4, round
    Unmasking): mask-key shares of dropped clients OR self-mask shares of survivors, never
    both for one client — both would let the server unmask that client's individual input."""
    both = sorted(set(want_key) & set(want_self))
    if both:
        raise UnmaskingRefusedError(f"the server asked for both the self-mask and the mask-key shares of client(s) "
                                    f"{both}; an honest client refuses (that would reveal their inputs)",
                                    tag=ctx.tag, round=ctx.round, client=responder)
    if any(held[d][0] is None for d in want_key):
        raise DropoutError("mask-key shares were not distributed (dropout_recovery=False)",
                           tag=ctx.tag, round=ctx.round, client=responder)
    return ({d: held[d][0].to_bytes() for d in want_key}, {u: held[u][1].to_bytes() for u in want_self})


def _positions(ids: np.ndarray, subset: np.ndarray) -> slice | np.ndarray:
    """Row positions of ``subset`` (sorted, contained) within ``ids`` (sorted)."""
    if subset.size == ids.size:
        return slice(None)
    return np.searchsorted(ids, subset)


class MaskProtocol(Protocol):
    """Pairwise-mask secure aggregation over ``Z_{2^ring_bits}``.

    Parameters (besides those of :class:`~protocols.base.Protocol`)
    ----------
    ring_bits:         b, the ring ``Z_{2^b}``: 8, 16, 32 or 64, or ``'auto'`` (default): per
                       exchange the smallest ring that carries the K-way sum within the
                       ValueSpec (public bounds only), e.g. 8 bits for binary-feature counts,
                       32 for floats at a 1e-4 tolerance and moderate bounds, else 64.
    frac_bits:         fixed-point fractional bits; ``None`` picks the most that the
                       public bounds allow (see :func:`.quantize.choose_encoding`).
    reveal_to_server:  ``False`` (default): output mask, the server learns nothing;
                       ``True``: standard Bonawitz, the server learns the sums.
    dropout_recovery:  share mask keys so that dropouts after key sharing are
                       recovered; ``False`` aborts on any such dropout.
    threshold:         Shamir threshold t (>= 2); default a majority of the
                       exchange's contributors, ``n // 2 + 1``; capped at n.
    block_size:        values per transport block (default 4096).
    """

    mode = "mask"
    upload_kind = "masked"

    def __init__(self, num_clients: int, *, ring_bits: int | str = "auto", frac_bits: int | None = None,
                 reveal_to_server: bool = False, dropout_recovery: bool = True,
                 threshold: int | None = None, block_size: int = MASK_BLOCK, **base_options):
        super().__init__(num_clients, **base_options)
        if ring_bits not in (8, 16, 32, 64, "auto"):
            raise ConfigurationError(f"ring_bits must be 8, 16, 32, 64 or 'auto', got {ring_bits!r}")
        if threshold is not None and int(threshold) < 2:
            raise ConfigurationError("threshold must be >= 2: with t=1 every share is the secret itself, so "
                                     "each client would hold every other client's mask key")
        if int(block_size) < 1:
            raise ConfigurationError(f"block_size must be >= 1, got {block_size}")
        self.ring_bits = ring_bits if ring_bits == "auto" else int(ring_bits)
        self.frac_bits = frac_bits
        self.reveal_to_server = bool(reveal_to_server)
        self.dropout_recovery = bool(dropout_recovery)
        self.threshold = None if threshold is None else int(threshold)
        self.block_size = int(block_size)
        self._seq = 0
        self._group_seed: dict[int, bytes] = {}   # client -> its copy of G (never the server)
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
        self.last_client_state: dict[int, _Participant] = {}
        self.last_binding: ExchangeBinding | None = None

    # ------------------------------------------------------------------ public knobs
    @property
    def fingerprint(self) -> str:
        params = (f"{self.mode}:{self.num_clients}:ring{self.ring_bits}:frac{self.frac_bits}:"
                  f"reveal{int(self.reveal_to_server)}:recovery{int(self.dropout_recovery)}:"
                  f"t{self.threshold}:block{self.block_size}")
        return hashlib.sha256(params.encode()).hexdigest()[:16]

    def block_capacity(self, spec) -> int:
        return self.block_size

    def drop_clients(self, clients: Iterable[int], stage: str = "upload") -> None:
        """Simulate ``clients`` leaving the next exchange at ``stage`` ('keys' | 'upload' | 'unmask')."""
        if stage not in DROP_STAGES:
            raise ConfigurationError(f"stage must be one of {', '.join(DROP_STAGES)}, got {stage!r}")
        for c in clients:
            c = int(c)
            if not 0 <= c < self.num_clients:
                raise ConfigurationError(f"unknown client id {c} (clients are 0..{self.num_clients - 1})")
            self._pending_drops[c] = stage

    def threshold_for(self, n: int) -> int:
        """Shamir threshold for an exchange with ``n`` contributors."""
        t = n // 2 + 1 if self.threshold is None else self.threshold
        return max(1, min(t, n))

    # ------------------------------------------------------------------ messages
    def _msg(self, ctx: ExchangeContext, sender: str, receiver: str, kind: str, shape: tuple, nbytes: int,
             payload=None, note: str = "") -> Message:
        return Message(ctx.round, ctx.tag, sender, receiver, kind, tuple(shape), int(nbytes), self.mode,
                       self.fingerprint, payload, note)

    def _upload(self, ctx, k, kind, shape, nbytes, payload, note="", stage="masked_upload") -> Message:
        """Client ``k`` -> server, signed, through the test hook; the server verifies it."""
        msg = self._deliver(self._msg(ctx, client_party(k), SERVER, kind, shape, nbytes, payload, note), stage)
        self._check_envelope(msg, ctx, k)
        self._check_sender(msg, ctx, k, kind)
        return msg


    @staticmethod
    def _check_sender(msg: Message, ctx: ExchangeContext, k: int, kind: str) -> None:
        if msg.sender != client_party(k) or msg.receiver != SERVER or msg.kind != kind:
            raise IntegrityError(f"message rejected: expected a '{kind}' message from {client_party(k)} to the "
                                 f"server, got '{msg.kind}' from {msg.sender!r} to {msg.receiver!r}",
                                 tag=ctx.tag, round=ctx.round, client=k)

    # ------------------------------------------------------------------ the exchange
    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        tag, rnd, L = ctx.tag, ctx.round, ctx.block_len
        drops, self._pending_drops = self._pending_drops, {}
        contributors = sorted(int(k) for k in ctx.contributions)
        if not contributors:
            raise ShapeError("no contributions", tag=tag, round=rnd)
        stray = sorted(set(drops) - set(contributors))
        if stray:
            raise ConfigurationError(f"drop_clients named {stray}, which do not contribute to this exchange",
                                     tag=tag, round=rnd)
        n0 = len(contributors)
        t = self.threshold_for(n0)
        t_start = time.perf_counter()

        # -- 0. local encoding: every bound is checked before any message exists
        enc = choose_encoding(max_abs=ctx.spec.max_abs, integer=ctx.spec.integer, tolerance=ctx.spec.tolerance,
                              num_contributors=n0, ring_bits=self.ring_bits, dp_noise_std=ctx.dp_noise_std,
                              frac_bits=self.frac_bits, tag=tag, round=rnd)
        participants = [k for k in contributors if drops.get(k) != "keys"]
        state: dict[int, _Participant] = {}
        encode_s: dict[int, float] = {}
        for k in participants:
            table = ctx.contributions[k]
            ids = np.asarray(table.ids, dtype=np.int64).ravel()
            vals = np.asarray(table.values)
            if vals.ndim != 2 or vals.shape != (ids.size, L):
                raise ShapeError(f"contribution blocks must be [{ids.size}, {L}], got {vals.shape}",
                                 tag=tag, round=rnd, client=k)
            if ids.size and (np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= ctx.num_blocks):
                raise ShapeError(f"block ids must be sorted, unique and in [0, {ctx.num_blocks})",
                                 tag=tag, round=rnd, client=k)
            if ctx.layout == "dense" and ids.size != ctx.num_blocks:
                raise ShapeError("the dense layout needs every block from every client", tag=tag, round=rnd, client=k)
            t0 = time.perf_counter()
            state[k] = _Participant(ids, enc.encode(vals, tag=tag, round=rnd, client=k))
            encode_s[k] = time.perf_counter() - t0
        if drops and len(participants) < t:
            raise self._dropout_error(ctx, sorted(drops), f"only {len(participants)} of {n0} contributors "
                                                          f"advertised keys, fewer than the threshold t={t}")
        self.last_encoding = enc
        self._seq += 1
        binding = ExchangeBinding(self.run_id, self._seq, tag, rnd)
        sid_pair = stream_id("pairwise", self.run_id, self._seq, tag, rnd)
        sid_self = stream_id("self", self.run_id, self._seq, tag, rnd)
        sid_out = stream_id("output", self.run_id, self._seq, tag, rnd)
        uploaders = [k for k in participants if drops.get(k) not in ("upload", "late")]
        responders = [k for k in uploaders if drops.get(k) != "unmask"]
        use_self = len(participants) >= 2          # Bonawitz self mask b_k (double masking)
        share_keys = self.dropout_recovery and len(participants) >= 2

        # -- group seed for output masks: client 0 -> every client, once per run
        if not self.reveal_to_server and not self._group_seed:
            g = new_secret_seed()
            self._group_seed = {0: g}
            for c in range(1, self.num_clients):
                self._group_seed[c] = self._relay(rnd, tag, 0, c, "share_keys", g, "output-mask group seed",
                                                    part=1)

        # -- 1. metadata: who touches which block (sparse layout only)
        announced = {k: state[k].ids for k in participants}
        if ctx.layout == "sparse":
            for k in participants:
                ids = state[k].ids
                msg = self._upload(ctx, k, "metadata", ids.shape, _ID * ids.size,
                                   {"block_ids": ids.astype(np.int32)}, note="block ids", stage="block_ids")
                got = np.asarray(msg.payload["block_ids"], dtype=np.int64) if isinstance(msg.payload, dict) else None
                if got is None or got.ndim != 1 or np.any(np.diff(got) <= 0) or \
                        (got.size and (got[0] < 0 or got[-1] >= ctx.num_blocks)):
                    raise IntegrityError("block-id metadata must be a sorted list of unique ids in range",
                                         tag=tag, round=rnd, client=k)
                if not np.array_equal(got, ids):
                    raise IntegrityError("block-id metadata was altered in transit (it differs from the ids the "
                                         "client sent)", tag=tag, round=rnd, client=k)
        common: dict[tuple[int, int], np.ndarray] = {}
        for i, a in enumerate(participants):
            for b in participants[i + 1:]:
                c = announced[a] if ctx.layout == "dense" else np.intersect1d(announced[a], announced[b],
                                                                             assume_unique=True)
                if c.size:
                    common[(a, b)] = c
                    state[a].common[b] = c
                    state[b].common[a] = c
        if ctx.layout == "sparse":
            for k in participants:
                m = sum(2 * _ID + _ID * c.size for c in state[k].common.values())
                msg = self._download(self._msg(ctx, SERVER, client_party(k), "metadata", (len(state[k].common),), m,
                                               {int(j): c.astype(np.int32) for j, c in state[k].common.items()},
                                               "block ids shared with each peer"), "block_ids")
                state[k].common = {int(j): np.asarray(c, dtype=np.int64) for j, c in msg.payload.items()}

        # -- 2. AdvertiseKeys
        public = {}
        for k in participants:
            state[k].keys = MaskKeyPair.generate()
            msg = self._upload(ctx, k, "public_key", (PUBLIC_KEY_BYTES,), PUBLIC_KEY_BYTES,
                               state[k].keys.public_bytes, note="X25519 mask key", stage="advertise_keys")
            if not isinstance(msg.payload, (bytes, bytearray)) or len(msg.payload) != PUBLIC_KEY_BYTES:
                raise IntegrityError(f"a public key is {PUBLIC_KEY_BYTES} bytes", tag=tag, round=rnd, client=k)
            public[k] = bytes(msg.payload)
        for k in participants:
            msg = self._download(self._msg(ctx, SERVER, client_party(k), "public_key", (len(public), PUBLIC_KEY_BYTES),
                                           len(public) * (_ID + PUBLIC_KEY_BYTES), dict(public),
                                           "broadcast of mask keys"), "advertise_keys")
            st = state[k]
            for j in st.common:
                st.seeds[j] = st.keys.pairwise_seed(k, j, msg.payload[j], binding)

        # -- 3. ShareKeys
        if use_self:
            xs = [j + 1 for j in participants]
            for k in participants:
                st = state[k]
                st.self_seed = new_secret_seed()
                sk_sh = split(st.keys.private_bytes(), xs, t) if share_keys else None
                b_sh = split(st.self_seed, xs, t)
                for j in participants:
                    own = (sk_sh[j + 1] if sk_sh else None, b_sh[j + 1])
                    if j == k:
                        state[j].held[k] = own
                        continue
                    raw = b"".join(s.to_bytes() for s in own if s is not None)
                    got = self._relay(rnd, tag, k, j, "share_keys", raw, "Shamir shares of self-mask seed"
                                      + (" and mask key" if share_keys else ""))
                    state[j].held[k] = _parse_held(got, share_keys, ctx, k)
        t_setup = time.perf_counter()

        # -- 4. MaskedInputCollection
        out_keys = {}
        if not self.reveal_to_server:
            out_keys = {k: output_mask_key(self._group_seed[k], k, binding) for k in participants}
        inbox, client_s = {}, {}
        dtype = enc.dtype
        for k in uploaders:
            t0 = time.perf_counter()
            st = state[k]
            y = self._masked(st, k, L, dtype, sid_pair, sid_self, sid_out, out_keys.get(k))
            payload = {"block_ids": st.ids.astype(np.int32), "data": y.tobytes()}
            client_s[k] = time.perf_counter() - t0 + encode_s[k]
            nbytes = y.nbytes + (_ID * st.ids.size if ctx.layout == "sparse" else 0)
            msg = self._msg(ctx, client_party(k), SERVER, "masked", y.shape, nbytes, payload)
            inbox[k] = self._deliver(msg, "masked_upload")
        t_server = time.perf_counter()

        # -- 5. server: envelopes first, then payloads, then dropouts, then sums
        for k, msg in inbox.items():
            self._check_envelope(msg, ctx, k)
        for k, msg in inbox.items():
            self._check_sender(msg, ctx, k, "masked")
        uploads = {k: self._read_upload(ctx, k, msg, announced[k], enc) for k, msg in inbox.items()}
        dropped_upload = [k for k in participants if drops.get(k) in ("upload", "late")]
        missing = sorted(k for k in contributors if k in drops)
        if missing and len(uploaders) < t:
            raise self._dropout_error(ctx, missing, f"only {len(uploaders)} of {n0} contributors uploaded, fewer "
                                                    f"than the threshold t={t}")
        if len(missing) > self._provisioned_dropouts(ctx):
            raise self._dropout_error(ctx, missing, "with distributed DP every client adds a share of the noise "
                                      f"variance provisioned for at most {self._provisioned_dropouts(ctx)} "
                                      "dropout(s), so a sum without them would be short of DP noise "
                                      "(--dp-dropouts)")
        if dropped_upload and not share_keys:
            raise self._dropout_error(ctx, dropped_upload, "they were counted in (the other clients masked "
                                      "toward them) and dropout recovery is disabled (dropout_recovery=False)")
        union = np.unique(np.concatenate([announced[k] for k in uploaders])) if uploaders else np.zeros(0, np.int64)
        total = np.zeros((union.size, L), dtype=dtype)
        for k, y in uploads.items():
            total[_positions(union, announced[k])] += y

        if dropped_upload or use_self:
            if len(responders) < t:
                raise self._dropout_error(ctx, missing, f"only {len(responders)} clients answered the unmasking "
                                                        f"round, fewer than the threshold t={t}")
            sk_shares, b_shares = defaultdict(list), defaultdict(list)
            want_b = uploaders if use_self else []           # the server's request: survivors' b_k ...
            for j in responders:
                sk_part, b_part = _unmask_answer(state[j].held, dropped_upload, want_b, ctx, j)
                msg = self._upload(ctx, j, "share", (len(sk_part) + len(b_part),),
                                   (len(sk_part) + len(b_part)) * (_ID + _SHARE_WIRE),
                                   {"mask_key": sk_part, "self_mask": b_part}, note="unmasking shares",
                                   stage="unmask")
                try:
                    for d, raw in msg.payload["mask_key"].items():
                        sk_shares[int(d)].append(Share.from_bytes(raw))
                    for u, raw in msg.payload["self_mask"].items():
                        b_shares[int(u)].append(Share.from_bytes(raw))
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise IntegrityError(f"malformed unmasking shares ({e})", tag=tag, round=rnd, client=j) from None
            for d in dropped_upload:
                keys = self._reconstruct_key(ctx, d, sk_shares[d], t, public[d])
                for j in uploaders:
                    pair = (min(d, j), max(d, j))
                    if pair not in common:
                        continue
                    c = common[pair]
                    m = ring_mask(keys.pairwise_seed(d, j, public[j], binding), sid_pair, c, L, dtype)
                    pos = _positions(union, c)
                    if d > j:      # j added +PRG(s_jd)
                        total[pos] -= m
                    else:          # j subtracted it
                        total[pos] += m
            for u in (uploaders if use_self else []):
                try:
                    b_u = combine(b_shares[u], t)
                except ValueError as e:
                    raise IntegrityError(f"cannot reconstruct the self-mask seed: {e}", tag=tag, round=rnd,
                                         client=u) from None
                total[_positions(union, announced[u])] -= ring_mask(b_u, sid_self, announced[u], L, dtype)
        t_down = time.perf_counter()

        # a dropped client's upload that arrives after recovery is recorded, never aggregated
        # (the late-upload attack of the tests reads it: b_k still hides it)
        for k in participants:
            if drops.get(k) == "late":
                st = state[k]
                y = self._masked(st, k, L, dtype, sid_pair, sid_self, sid_out, out_keys.get(k))
                self.transcript.record(self._seal(self._msg(
                    ctx, client_party(k), SERVER, "masked", y.shape, 0,
                    {"block_ids": st.ids.astype(np.int32), "data": y.tobytes()}, "late upload, not aggregated"),
                    "masked_upload"))

        # -- 6. delivery: each recipient gets its blocks and who is included
        included = tuple(uploaders)
        kind = "plain" if self.reveal_to_server else "masked"
        sent = {}
        for r, bids in ctx.requests.items():
            bids = np.asarray(bids, dtype=np.int64).ravel()
            if bids.size and (bids.min() < 0 or bids.max() >= ctx.num_blocks):
                raise ShapeError(f"requested block ids must lie in [0, {ctx.num_blocks})", tag=tag, round=rnd,
                                 client=r)
            rows = np.zeros((bids.size, L), dtype=dtype)   # a block nobody contributed sums to 0
            if union.size:
                where = np.minimum(np.searchsorted(union, bids), union.size - 1)
                hit = union[where] == bids
                rows[hit] = total[where[hit]]
            nbytes = rows.nbytes + _ID * len(included)
            if ctx.layout == "sparse":
                nbytes += _ID * bids.size + (bids.size * -(-len(participants) // 8) if out_keys else 0)
            msg = self._download(self._msg(ctx, SERVER, client_party(int(r)), kind, rows.shape, nbytes,
                                           {"block_ids": bids.astype(np.int32), "data": rows, "included": included}))
            sent[r] = (np.asarray(msg.payload["block_ids"], dtype=np.int64), msg.payload["data"])
        t_recv = time.perf_counter()

        # -- recipients remove the output masks of the included contributors and decode
        out_total = None
        if out_keys and sent:
            wanted = np.unique(np.concatenate([b for b, _ in sent.values()]))
            out_total = np.zeros((wanted.size, L), dtype=dtype)
            for k in uploaders:
                ids = np.intersect1d(announced[k], wanted, assume_unique=True)
                if ids.size:
                    out_total[_positions(wanted, ids)] += ring_mask(out_keys[k], sid_out, ids, L, dtype)
        t_decode = time.perf_counter()
        result, recv_s = {}, {}
        for r, (bids, rows) in sent.items():
            t0 = time.perf_counter()
            if out_total is not None and bids.size:
                rows = rows - out_total[_positions(wanted, bids)]
            dec = enc.decode(rows)
            result[int(r)] = {int(b): dec[i] for i, b in enumerate(bids)}
            recv_s[int(r)] = (t_decode - t_recv) + time.perf_counter() - t0

        self.last_included = included
        self.last_binding = binding
        self.last_client_state = dict(state) if self.keep_client_state else {}
        self.last_dropped = {k: drops[k] for k in missing}
        self.last_timing = {
            "encode_s": sum(encode_s.values()),                      # all clients, quantise + bound check
            "setup_s": t_setup - t_start - sum(encode_s.values()),   # metadata, keys, shares (all clients)
            "client_mask_s": float(np.mean(list(client_s.values()))) if client_s else 0.0,  # one client
            "server_s": t_down - t_server,                           # checks, sum, recovery
            "recipient_s": float(np.mean(list(recv_s.values()))) if recv_s else 0.0,        # one recipient
        }
        # the same figures in the shape the CKKS backend reports (secure_fgl.bench reads it)
        self.last_stats = {
            "tag": tag, "round": rnd, "client_upload_s": client_s, "client_download_s": recv_s,
            "server_s": t_down - t_server, "setup_s": self.last_timing["setup_s"],
            "params": {"ring_bits": enc.ring_bits, "frac_bits": enc.frac_bits, "threshold": t,
                       "output_mask": not self.reveal_to_server, "error_bound": enc.error_bound},
        }
        return result

    @staticmethod
    def _masked(st: _Participant, k: int, L: int, dtype, sid_pair, sid_self, sid_out, out_key) -> np.ndarray:
        """Client ``k``'s upload: ``q(x_k) + sum_j +-PRG(s_kj) + PRG(b_k) [+ PRG(R_k)]`` mod ``2^b``."""
        y = st.encoded.copy()
        for j, seed in st.seeds.items():
            c = st.common[j]
            m = ring_mask(seed, sid_pair, c, L, dtype)
            pos = _positions(st.ids, c)
            if j > k:
                y[pos] += m
            else:
                y[pos] -= m
        if st.self_seed is not None:
            y += ring_mask(st.self_seed, sid_self, st.ids, L, dtype)
        if out_key is not None:
            y += ring_mask(out_key, sid_out, st.ids, L, dtype)
        return y

    # ------------------------------------------------------------------ server-side checks
    def _read_upload(self, ctx: ExchangeContext, k: int, msg: Message, ids: np.ndarray,
                     enc: FixedPoint) -> np.ndarray:
        """Parse one masked upload; refuse anything but the announced blocks as ring elements."""
        tag, rnd, L = ctx.tag, ctx.round, ctx.block_len
        p = msg.payload
        if not isinstance(p, dict) or "data" not in p or "block_ids" not in p:
            raise IntegrityError("masked upload must carry 'block_ids' and 'data'", tag=tag, round=rnd, client=k)
        got_ids = np.asarray(p["block_ids"]).ravel()
        if got_ids.shape != ids.shape or not np.array_equal(got_ids.astype(np.int64), ids):
            raise IntegrityError("masked upload covers other block ids than the client announced",
                                 tag=tag, round=rnd, client=k)
        expected = (ids.size, L)
        if tuple(msg.shape) != expected:
            raise ShapeError(f"masked upload declares shape {tuple(msg.shape)}, expected {expected}",
                             tag=tag, round=rnd, client=k)
        data = p["data"]
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ShapeError(f"masked payload must be raw bytes of {enc.ring_bits}-bit ring elements, got "
                             f"{type(data).__name__}{'/' + str(data.dtype) if hasattr(data, 'dtype') else ''}",
                             tag=tag, round=rnd, client=k)
        want = ids.size * L * enc.bytes_per_value
        if len(data) != want:
            raise IntegrityError(f"masked payload is {len(data)} bytes, expected {want} "
                                 f"({ids.size} blocks x {L} values x {enc.bytes_per_value} bytes): truncated or "
                                 "corrupted", tag=tag, round=rnd, client=k)
        return np.frombuffer(bytes(data), dtype=enc.dtype).reshape(expected)

    def _reconstruct_key(self, ctx, d: int, shares: list[Share], t: int, public: bytes) -> MaskKeyPair:
        try:
            keys = MaskKeyPair.from_private_bytes(combine(shares, t))
        except ValueError as e:
            raise IntegrityError(f"cannot reconstruct the mask key of dropped client {d}: {e}",
                                 tag=ctx.tag, round=ctx.round, client=d) from None
        if keys.public_bytes != public:
            raise IntegrityError(f"shares of dropped client {d}'s mask key are inconsistent (the reconstructed "
                                 "key does not match its advertised public key)", tag=ctx.tag, round=ctx.round,
                                 client=d)
        return keys

    def _distributed_noise(self, ctx: ExchangeContext) -> bool:
        """True when the exchange's DP noise is split across the clients (dropouts then break DP)."""
        return (ctx.dp_noise_std > 0 and self.dp is not None
                and getattr(getattr(self.dp, "config", None), "placement", "local") == "distributed")

    def _provisioned_dropouts(self, ctx: ExchangeContext) -> float:
        """Dropouts the exchange's distributed DP noise was over-provisioned for
        (:attr:`protocols.dp.DPConfig.dropouts`); unlimited without distributed noise."""
        return self.dp.config.dropouts if self._distributed_noise(ctx) else math.inf

    @staticmethod
    def _dropout_error(ctx, clients: list[int], why: str) -> DropoutError:
        names = ", ".join(str(c) for c in clients)
        err = DropoutError(f"client(s) {names} dropped out: {why}; nothing was aggregated. Re-run the exchange "
                           "without them, or lower the threshold / enable dropout_recovery",
                           tag=ctx.tag, round=ctx.round, client=clients[0] if clients else None)
        err.clients = tuple(clients)
        return err
