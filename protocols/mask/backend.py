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

    R_k = P_k - P_{k+1}        so that        sum_{k in S} R_k = sum over the maximal runs [a..c] of S of (P_a - P_{c+1})

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
round, else like ``'upload'``), ``'upload'`` (after the set-up, before uploading: needs recovery), ``'unmask'`` (after uploading, does not answer the
recovery round), ``'late'`` (like ``'upload'``, but its masked upload arrives after recovery:
recorded, never aggregated).  A dropped client still receives its download (it reconnects
for the result), so callers get every recipient's result; :attr:`MaskProtocol.last_included`
names the clients whose contributions the result covers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..base import ExchangeContext
from ..broadcast_view import EMPTY_VIEW
from ..errors import (
    ConfigurationError,
    ConsistencyError,
    DropoutError,
    InconsistentViewError,
    IntegrityError,
    ProtocolError,
    ShapeError,
    ShareIntegrityError,
    ThresholdRefusedError,
    UnmaskingRefusedError,
)
from ..link import stream_groups
from ..party import ClientHalf, ServerHalf, envelope_of
from ..plan_policy import collusion_bound
from ..split import SplitProtocol
from ..transcript import SERVER, Message, client_party, party_client
from .keys import (
    SEED_BYTES,
    SIGNED_KEY_BYTES,
    ExchangeBinding,
    MaskKeyPair,
    check_signed_mask_key,
    new_secret_seed,
    output_mask_key,
    output_mask_keys,
    signed_mask_key,
)
from .prg import ranked_mask, ring_mask, stream_id
from .quantize import RING_BITS, FixedPoint, choose_encoding
from .shamir import SHARE_BYTES, Share, combine, split

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
_ID = 4  # bytes of a client or block id on the wire (int32)


@dataclass
class _Participant:
    """Client-side state of one participant for one exchange (its secrets stay here)."""

    ids: np.ndarray  # block ids it contributes (sorted)
    encoded: np.ndarray  # [n_blocks, L] ring elements
    common: dict[int, np.ndarray] = field(default_factory=dict)  # peer -> shared block ids
    self_seed: bytes | None = None  # b_k of this exchange
    seeds: dict[int, bytes] = field(default_factory=dict)  # peer -> pairwise seed of this exchange
    held: dict[int, Share] = field(default_factory=dict)  # owner -> its b_owner share of this exchange


@dataclass
class _SelfMaskBatch:
    """Self-mask seeds ``b^(s)`` for exchanges ``first .. first + len - 1`` of one (contributor set,
    threshold): the owner keeps ``seeds``; each holder keeps its ``shares`` of them."""

    first: int
    values: list  # bytes (the owner's seeds) or Share (a holder's shares)

    def at(self, seq: int):
        """The entry for exchange ``seq``, or ``None`` outside the batch."""
        return self.values[seq - self.first] if self.first <= seq < self.first + len(self.values) else None


def _parse_batch(raw: bytes, size: int, ctx, owner: int) -> list[Share]:
    """A holder's ``size`` Shamir shares of ``owner``'s self-mask seeds from the decrypted channel bytes."""
    n = 4 + SHARE_BYTES
    if size < 1 or len(raw) != size * n:
        raise IntegrityError(
            f"share message of {len(raw)} bytes, expected {size} shares of {n} bytes",
            tag=ctx.tag,
            round=ctx.round,
            client=owner,
        )
    return [Share.from_bytes(raw[i : i + n]) for i in range(0, len(raw), n)]


#: domain separator of a dealer's commitment to one Shamir share
SHARE_COMMITMENT_DOMAIN = b"secure-fgl/mask-share-commitment/v1"
COMMITMENT_BYTES = 32


def share_commitment(run_id: bytes, dealer: int, seq: int, share: Share) -> bytes:
    """``SHA-256(domain, run, dealer, exchange, x, y)``: the dealer's commitment to the share of its
    self-mask seed for exchange ``seq`` held by the client at ``x = holder + 1``.  The dealer sends
    every commitment to the server in a message it signs; the server checks each share revealed
    for unmasking against it, so a corrupted share is refused naming its sender.  A share is a
    uniform element of a 256-bit prime field: its hash reveals nothing about the seed."""
    return hashlib.sha256(
        SHARE_COMMITMENT_DOMAIN
        + bytes(run_id)
        + int(dealer).to_bytes(4, "big")
        + int(seq).to_bytes(8, "big")
        + share.to_bytes()
    ).digest()


#: domain separator of the survivor set every survivor signs in the consistency round
SURVIVORS_DOMAIN = b"secure-fgl/mask-survivors/v1"


def survivor_statement(
    run_id: bytes, session: bytes, seq: int, tag: str, rnd: int, survivors, view: bytes = EMPTY_VIEW
) -> bytes:
    """The bytes a survivor signs in the consistency round (Bonawitz et al. §4, ConsistencyCheck):
    the run, session and exchange, the sorted survivor set and the digest of the broadcasts the
    signer trained on (:mod:`protocols.broadcast_view`), length-prefixed."""
    fields = (
        SURVIVORS_DOMAIN,
        bytes(run_id),
        bytes(session),
        int(seq).to_bytes(8, "big"),
        tag.encode(),
        int(rnd).to_bytes(8, "big", signed=True),
        np.asarray(survivors, dtype=">i4").tobytes(),
        bytes(view),
    )
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def _unmask_answer(
    st: _Participant, want_pairwise: list[int], want_self: list[int], ctx, responder: int
) -> tuple[dict, dict]:
    """An honest client's answer to the server's unmasking request (Bonawitz et al. §4, round
    Unmasking, with the pairwise seeds of this exchange in place of the dropped clients' key
    shares): its pairwise seed with each dropped peer OR its share of each survivor's self-mask
    seed, never both for one client — both would let the server unmask that client's input.
    Shares it does not hold are left out (the server needs ``t`` of them)."""
    both = sorted(set(want_pairwise) & set(want_self))
    if both:
        raise UnmaskingRefusedError(
            f"the server asked for both the self-mask shares and the pairwise seeds of "
            f"client(s) {both}; an honest client refuses (that would reveal their inputs)",
            tag=ctx.tag,
            round=ctx.round,
            client=responder,
        )
    return (
        {d: st.seeds[d] for d in want_pairwise if d in st.seeds},
        {u: st.held[u].to_bytes() for u in want_self if u in st.held},
    )


def _positions(ids: np.ndarray, subset: np.ndarray) -> slice | np.ndarray:
    """Row positions of ``subset`` (sorted, contained) within ``ids`` (sorted)."""
    if subset.size == ids.size:
        return slice(None)
    return np.searchsorted(ids, subset)


def shamir_threshold(n: int, threshold: int | None, max_colluders: int) -> int:
    """The Shamir threshold ``t`` of an exchange with ``n`` contributors, from the run's public
    setup only (never from a plan): the run's ``threshold`` capped at ``n``, by default the smallest
    ``t`` with ``2t > n + c`` (``c``: the run's max colluders), ``floor((n + c) / 2) + 1`` -- so the
    server cannot gather ``t`` answers from two disjoint sets of honest clients (the active-adversary
    condition of Bonawitz et al., CCS 2017, docs/security.md); with ``c = 0`` an honest majority."""
    t = (int(n) + int(max_colluders)) // 2 + 1 if threshold is None else int(threshold)
    return max(1, min(t, int(n)))


def mask_fingerprint(num_clients: int, options: dict) -> str:
    """Public fingerprint of the run's mask parameters (every party computes it from the setup)."""
    o = options
    params = (
        f"mask:{num_clients}:ring{o['ring_bits']}:frac{o['frac_bits']}:reveal{int(o['reveal_to_server'])}:"
        f"recovery{int(o['dropout_recovery'])}:t{o['threshold']}:block{o['block_size']}:"
        f"batch{o['self_mask_batch']}"
    )
    return hashlib.sha256(params.encode()).hexdigest()[:16]


def _streams(run_id: bytes, seq: int, tag: str, rnd: int) -> dict[str, bytes]:
    return {p: stream_id(p, run_id, seq, tag, rnd) for p in ("pairwise", "self", "output")}


def _masked(st: _Participant, k: int, L: int, dtype, sid: dict, out_keys: tuple[bytes, ...]) -> np.ndarray:
    """Client ``k``'s upload: ``q(x_k) + sum_j +-PRG(s_kj) + PRG(b_k) + R_k`` mod ``2^b``, with
    ``R_k = P_k - P_{k+1}`` from ``out_keys`` (empty: no output mask; one key: ``P_{k+1} = 0``)."""
    y = st.encoded.copy()
    for j, seed in st.seeds.items():
        c = st.common[j]
        m = ranked_mask(seed, sid["pairwise"], c.size, L, dtype)
        pos = _positions(st.ids, c)
        if j > k:
            y[pos] += m
        else:
            y[pos] -= m
    if st.self_seed is not None:
        y += ranked_mask(st.self_seed, sid["self"], st.ids.size, L, dtype)
    for sign, key in zip((1, -1), out_keys):
        m = ring_mask(key, sid["output"], st.ids, L, dtype)
        if sign > 0:
            y += m
        else:
            y -= m
    return y


def remove_output_masks(
    rows: np.ndarray,
    members: np.ndarray,
    group_seed: bytes,
    num_clients: int,
    binding: ExchangeBinding,
    sid: bytes,
    block_ids: np.ndarray,
    L: int,
) -> None:
    """Subtract, in place, ``sum_{k in S_b} R_k`` from each summed block ``b``.

    ``members[b, j]``: client ``j`` is an included contributor of block ``b`` (``[n_blocks, K]``).
    The coefficient of ``P_j`` in ``sum_{k in S_b} (P_k - P_{k+1})`` is ``[j in S_b] - [j-1 in S_b]``
    (``P_K = 0``), so only the first id of every run of consecutive members (+1) and the id after
    its last one (-1) cost a stream."""
    m = members.astype(np.int8)
    coef = m - np.concatenate([np.zeros((m.shape[0], 1), np.int8), m[:, :-1]], axis=1)
    for j in np.flatnonzero(np.any(coef != 0, axis=0)).tolist():
        rows_j = np.flatnonzero(coef[:, j])
        whole = rows_j.size == rows.shape[0]
        mask = ring_mask(
            output_mask_key(group_seed, j, binding), sid, block_ids if whole else block_ids[rows_j], L, rows.dtype
        )
        plus = coef[rows_j, j] > 0
        if plus.all():
            rows[slice(None) if whole else rows_j] -= mask
            continue
        rows[rows_j[plus]] -= mask[plus]
        rows[rows_j[~plus]] += mask[~plus]


def _dropout_error(where: dict, clients: list[int], why: str) -> DropoutError:
    names = ", ".join(str(c) for c in clients)
    err = DropoutError(
        f"client(s) {names} dropped out: {why}; nothing was aggregated. Re-run the exchange "
        "without them, or lower the threshold / enable dropout_recovery",
        tag=where.get("tag"),
        round=where.get("round"),
        client=clients[0] if clients else None,
    )
    err.clients = tuple(clients)
    return err


# ====================================================================== client half
class MaskClient(ClientHalf):
    """One client of the mask protocol: its mask key pair (one per run), self-mask seeds, the
    shares it holds for its peers and its copy of the group seed never leave this object (except
    as channel ciphertexts and the unmasking answers of step 5)."""

    mode = "mask"

    def __init__(self, client_id: int, setup: bytes, provider=None):
        super().__init__(client_id, setup, provider)
        self.options = self.setup.options
        self.fingerprint = mask_fingerprint(self.setup.num_clients, self.options)
        self.group_seed: bytes | None = None
        self.mask_keys: MaskKeyPair | None = None  # drawn once per run
        self.peer_keys: dict[int, bytes] = {}  # peers' mask public keys (server broadcast)
        #: (contributors, threshold) -> own self-mask seed batch / owner -> this client's shares of it
        self.own_batches: dict[tuple, _SelfMaskBatch] = {}
        self.held_batches: dict[tuple, dict[int, _SelfMaskBatch]] = {}
        self.state: _Participant | None = None
        self.encoding: FixedPoint | None = None
        self._prepared: int | None = None  # exchange whose contribution is encoded
        self._participants: list[int] | None = None  # the server's list, when it excluded someone
        self._unmasked: int | None = None  # the exchange whose unmasking round it answered
        #: (exchange, survivor set) this client signed in the consistency round
        self._signed: tuple[int, tuple[int, ...]] | None = None
        #: seconds spent by this client in the last exchange, per step
        self.timing: dict[str, float] = {}
        #: attack simulations only: keep the encoded input after the masked upload is built (by
        #: default it is freed then: the client needs only its seeds and shares for the rest)
        self.keep_input = False

    # ------------------------------------------------------------------ plumbing
    def _binding(self) -> ExchangeBinding:
        p = self.plan
        return ExchangeBinding(self.setup.run_id, p.exchange, p.tag, p.round)

    def _batch_key(self) -> tuple:
        return tuple(self.plan.contributors), self._threshold()

    def _threshold(self) -> int:
        """``t`` from the run's setup (:func:`shamir_threshold`); a plan naming another is refused,
        as is a ``t`` that breaks ``2t > n + c`` (which also gives ``t > c``)."""
        p, c = self.plan, collusion_bound(self.setup).max_colluders
        t = shamir_threshold(len(p.contributors), self.options["threshold"], c)
        planned = p.encoding.get("threshold")
        if planned != t:
            raise ThresholdRefusedError(
                f"the plan names Shamir threshold t={planned}, the run's setup gives t={t} "
                f"for {len(p.contributors)} contributors: refused",
                **self.where(),
            )
        n = len(p.contributors)
        if 2 * t <= n + c:
            raise ThresholdRefusedError(
                f"Shamir threshold t={t} with {n} contributors and max colluders c={c} "
                f"breaks 2t > n + c: the server could collect t answers from two disjoint "
                f"sets of clients; use threshold >= {(n + c) // 2 + 1} (the default)",
                **self.where(),
            )
        return t

    def _message(self, kind, shape, payload, note=""):
        return self.message(SERVER, kind, shape, payload, self.fingerprint, note)

    def _take_group_seed(self, inbox: list[Message]) -> list[Message]:
        rest = []
        for m in inbox:
            if m.sender != SERVER and envelope_of(m).stage == "group_seed":
                if self.group_seed is not None:
                    raise IntegrityError(
                        "a second output-mask group seed was sent; the first one stands", **self.where()
                    )
                self.group_seed = self.open_relayed(m, "group_seed", exchange=envelope_of(m).exchange)
            else:
                rest.append(m)
        return rest

    def _from_server(self, inbox: list[Message], stage: str, kind: str) -> Message:
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError(f"expected one '{stage}' message from the server, got {len(mine)}", **self.where())
        msg = self.check(mine[0], SERVER, stage, 0, self.where())
        if msg.kind != kind:
            raise IntegrityError(f"expected a '{kind}' message, got '{msg.kind}'", **self.where())
        return msg

    def _absorb(self, inbox: list[Message]) -> list[Message]:
        """Take the set-up messages of this exchange, whichever stage's bundle carries them: the
        shared block ids (sparse), the key broadcast, the participant list and the peers' share
        batches.  Returns the other messages."""
        rest = []
        for m in inbox:
            stage = envelope_of(m).stage
            if m.sender == SERVER and stage == "block_ids":
                self._take_common(self.check(m, SERVER, stage, 0, self.where()))
            elif m.sender == SERVER and stage == "advertise_keys":
                self._take_keys(self.check(m, SERVER, stage, 0, self.where()))
            elif m.sender == SERVER and stage == "share_keys":
                self._take_participants(self.check(m, SERVER, stage, 0, self.where()))
            elif m.sender != SERVER and stage == "share_keys":
                owner = party_client(m.sender)
                shares = _parse_batch(
                    self.open_relayed(m, "share_keys"), int(self.options["self_mask_batch"]), self.plan, owner
                )
                self.held_batches.setdefault(self._batch_key(), {})[owner] = _SelfMaskBatch(self.plan.exchange, shares)
            else:
                rest.append(m)
        return rest

    def _take_common(self, msg: Message) -> None:
        if msg.kind != "metadata" or self.state is None:
            raise IntegrityError("unexpected shared-block-id message", **self.where())
        try:
            common = {int(j): np.asarray(c, dtype=np.int64).ravel() for j, c in msg.payload.items()}
        except (AttributeError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed shared block ids ({e})", **self.where()) from None
        own = self.state.ids
        for j, c in common.items():  # a subset of this client's own blocks, with another contributor
            if (
                j == self.id
                or j not in self.plan.contributors
                or np.any(np.diff(c) <= 0)
                or not np.isin(c, own, assume_unique=True).all()
            ):
                raise IntegrityError(
                    f"the block ids shared with client {j} are not a sorted subset of this "
                    "client's own blocks shared with another contributor",
                    **self.where(),
                )
        self.state.common = common

    def _take_keys(self, msg: Message) -> None:
        if msg.kind != "public_key" or not isinstance(msg.payload, dict):
            raise IntegrityError("malformed key broadcast", **self.where())
        for j, signed in msg.payload.items():
            j = int(j)
            raw = check_signed_mask_key(
                self.registry, self.setup.run_id, client_party(j), signed, dict(self.where(), client=j)
            )
            if j == self.id:
                if self.mask_keys is None or raw != self.mask_keys.public_bytes:
                    raise IntegrityError("the key broadcast lists another key for this client", **self.where())
            elif self.peer_keys.setdefault(j, raw) != raw:
                raise IntegrityError(
                    f"the key broadcast changes client {j}'s mask key (keys are fixed for the run)", **self.where()
                )

    def _take_participants(self, msg: Message) -> None:
        try:
            got = [int(k) for k in msg.payload["participants"]]
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed participant list ({e})", **self.where()) from None
        if (
            msg.kind != "control"
            or got != sorted(set(got))
            or not set(got) <= set(self.plan.contributors)
            or self.id not in got
        ):
            raise IntegrityError(
                f"the participant list {got} is not a sorted subset of the contributors that includes this client",
                **self.where(),
            )
        self._participants = got

    # ------------------------------------------------------------------ stages
    def on_stage(self, stage, inbox):
        inbox = self._take_group_seed(inbox)
        if stage == "register":
            return []
        step = getattr(self, "stage_" + stage, None)
        if step is None:
            raise IntegrityError(f"unknown stage {stage!r}", **self.where())
        if stage != "group_seed":
            self._prepare()
        return step(inbox)

    def stage_group_seed(self, inbox):
        """Client 0, once per run: ``G`` for every other client over the relayed channel."""
        if self.group_seed is None:
            self.group_seed = new_secret_seed()
        return [
            self.seal_relayed(c, "group_seed", self.group_seed, "output-mask group seed", self.fingerprint)
            for c in range(self.setup.num_clients)
            if c != self.id
        ]

    def _prepare(self) -> None:
        """Local encoding, once per exchange: every bound is checked before any message leaves."""
        if self.plan is None or self._prepared == self.plan.exchange:
            return
        self._prepared, self.state, self.timing, self._participants = self.plan.exchange, None, {}, None
        if self.id not in self.plan.contributors:
            return
        self._threshold()  # the plan's t is the run's, before anything is sent
        enc = self.encoding = FixedPoint(**self.plan.encoding["fixed_point"])
        t0 = time.perf_counter()
        table = self.contribution()
        encoded = enc.encode(table.values, tag=self.plan.tag, round=self.plan.round, client=self.id)
        self.state = _Participant(table.ids, encoded)
        self.timing["encode_s"] = time.perf_counter() - t0

    def stage_block_ids(self, inbox):
        if self.state is None:
            return []
        ids = self.state.ids
        return [
            self.seal(
                self._message("metadata", ids.shape, {"block_ids": ids.astype(np.int32)}, "block ids"), "block_ids"
            )
        ]

    def stage_advertise_keys(self, inbox):
        """The mask public key, drawn once per run (its secret key never leaves this client)."""
        self._absorb(inbox)
        if self.state is None:
            return []
        if self.mask_keys is None:
            self.mask_keys = MaskKeyPair.generate()
        signed = signed_mask_key(self.signing, self.setup.run_id, self.name, self.mask_keys.public_bytes)
        return [
            self.seal(
                self._message(
                    "public_key", (SIGNED_KEY_BYTES,), signed, "X25519 mask key, signed by the owner (once per run)"
                ),
                "advertise_keys",
            )
        ]

    def stage_share_keys(self, inbox):
        """A fresh batch of self-mask seeds for this and the next exchanges of this contributor set,
        Shamir-shared with every other contributor over the relayed channel."""
        self._absorb(inbox)
        if self.state is None:
            return []
        t0 = time.perf_counter()
        contributors, t = self._batch_key()
        xs = [j + 1 for j in contributors]
        seeds = [new_secret_seed() for _ in range(int(self.options["self_mask_batch"]))]
        shares = [split(b, xs, t) for b in seeds]
        self.own_batches[(contributors, t)] = _SelfMaskBatch(self.plan.exchange, seeds)
        held = self.held_batches.setdefault((contributors, t), {})
        out, commitments, first = [], {}, self.plan.exchange
        for j in contributors:
            mine = [sh[j + 1] for sh in shares]
            commitments[j] = b"".join(
                share_commitment(self.setup.run_id, self.id, first + i, s) for i, s in enumerate(mine)
            )
            if j == self.id:
                held[j] = _SelfMaskBatch(first, mine)
                continue
            out.append(
                self.seal_relayed(
                    j,
                    "share_keys",
                    b"".join(s.to_bytes() for s in mine),
                    f"Shamir shares of {len(seeds)} self-mask seeds",
                    self.fingerprint,
                )
            )
        out.append(
            self.seal(
                self._message(
                    "control",
                    (len(commitments), len(seeds), COMMITMENT_BYTES),
                    commitments,
                    "commitments to the dealt shares (SHA-256)",
                ),
                "share_keys",
            )
        )
        self.timing["setup_s"] = time.perf_counter() - t0
        return out

    def stage_masked_upload(self, inbox):
        self._absorb(inbox)
        st = self.state
        if st is None:
            return []
        t0 = time.perf_counter()
        seq, key = self.plan.exchange, self._batch_key()
        participants = self._participants or list(self.plan.contributors)
        if self.plan.layout == "dense":
            st.common = {j: st.ids for j in participants if j != self.id}
        st.common = {j: c for j, c in st.common.items() if j in participants and j != self.id and c.size}
        if len(participants) >= 2:  # Bonawitz self mask b_k (double masking)
            own = self.own_batches.get(key)
            st.self_seed = own.at(seq) if own is not None else None
            if st.self_seed is None:
                raise IntegrityError(
                    "no self-mask seed was shared for this exchange (the server skipped the share round)",
                    **self.where(),
                )
            st.held = {u: share for u, b in self.held_batches.get(key, {}).items() if (share := b.at(seq)) is not None}
        if st.common and self.mask_keys is None:
            raise IntegrityError("this client advertised no mask key", **self.where())
        binding = self._binding()
        for j in st.common:
            if j not in self.peer_keys:
                raise IntegrityError(f"no mask public key of participant {j} was broadcast", **self.where())
            st.seeds[j] = self.mask_keys.pairwise_seed(self.id, j, self.peer_keys[j], binding)
        y = self._upload_words()
        if not self.keep_input:
            st.encoded = None
        payload = {"block_ids": st.ids.astype(np.int32), "data": self.encoding.to_wire(y)}
        self.timing["mask_s"] = time.perf_counter() - t0
        return [self.seal(self._message("masked", y.shape, payload), "masked_upload")]

    def _upload_words(self) -> np.ndarray:
        st, enc, p = self.state, self.encoding, self.plan
        out_keys = (
            ()
            if self.options["reveal_to_server"]
            else output_mask_keys(self._seed(), self.id, self.setup.num_clients, self._binding())
        )
        return _masked(
            st, self.id, p.block_len, enc.dtype, _streams(self.setup.run_id, p.exchange, p.tag, p.round), out_keys
        )

    def _seed(self) -> bytes:
        if self.group_seed is None:
            raise IntegrityError("no output-mask group seed was received", **self.where())
        return self.group_seed

    def _statement(self, survivors) -> bytes:
        p = self.plan
        return survivor_statement(
            self.setup.run_id, self.setup.session, p.exchange, p.tag, p.round, survivors, self.view_digest()
        )

    def stage_consistency(self, inbox):
        """Consistency check (Bonawitz et al. §4, active variant), once per exchange: sign the
        survivor set the server names, if it is a sorted set of at least ``t`` participants that
        includes this client."""
        if self.state is None:
            return []
        if self._signed is not None and self._signed[0] == self.plan.exchange:
            raise ConsistencyError("a second consistency round in one exchange: refused", **self.where())
        msg = self._from_server(inbox, "consistency", "control")
        try:
            survivors = [int(k) for k in msg.payload["survivors"]]
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed survivor set ({e})", **self.where()) from None
        participants, t = self._participants or list(self.plan.contributors), self._threshold()
        if (
            survivors != sorted(set(survivors))
            or not set(survivors) <= set(participants)
            or self.id not in survivors
            or len(survivors) < t
        ):
            raise ConsistencyError(
                f"the survivor set {survivors} is not a sorted set of at least t={t} participants "
                "that includes this client",
                **self.where(),
            )
        self._signed = (self.plan.exchange, tuple(survivors))
        sig = self.signing.sign(self._statement(survivors))
        return [
            self.seal(
                self._message("control", (len(sig),), {"signature": sig}, "signature of the survivor set"),
                "consistency",
            )
        ]

    def _check_request(self, want_pairwise: list[int], want_self: list[int], signatures: dict) -> None:
        """The unmasking request must name the survivor set this client signed (its self-mask shares)
        and exactly the other participants (their pairwise seeds), with the signatures of at least
        ``t`` survivors over that set -- so no two clients can be asked about different sets."""
        where = self.where()
        if self._signed is None or self._signed[0] != self.plan.exchange:
            raise ConsistencyError("an unmasking request before this client signed the survivor set", **where)
        survivors = list(self._signed[1])
        dropped = [k for k in (self._participants or list(self.plan.contributors)) if k not in survivors]
        if want_self != survivors or want_pairwise != dropped:
            raise ConsistencyError(
                f"the unmasking request (survivors {want_self}, dropped {want_pairwise}) is not "
                f"the survivor set {survivors} this client signed",
                **where,
            )
        statement, t = self._statement(survivors), self._threshold()
        bound = self.schedule is not None and self.schedule.binds_views(self.plan.tag)
        if bound and set(signatures) != set(survivors):  # an unsigned survivor's view is unchecked
            raise InconsistentViewError(
                f"survivors {sorted(set(survivors) - set(signatures))} did not sign the survivor set of a "
                "broadcast exchange: each survivor's view of the broadcasts is checked before unmasking",
                **where,
            )
        for k, sig in signatures.items():
            if k not in survivors:
                raise ConsistencyError(f"a survivor-set signature of client {k}, who is not a survivor", **where)
            try:
                self.registry.check_signature(client_party(k), statement, sig, where)
            except IntegrityError:
                raise (InconsistentViewError if bound else ConsistencyError)(
                    f"client {k}'s signature is not over the survivor set {survivors} this client "
                    "signed: the server told clients different survivor sets"
                    + (" or sent them different broadcasts to train on (model inconsistency)" if bound else ""),
                    **where,
                ) from None
        if len(signatures) < t:
            raise ConsistencyError(
                f"only {len(signatures)} survivors signed the survivor set, fewer than t={t}", **where
            )

    def stage_unmask(self, inbox):
        """Step 5, answered once per exchange, after the consistency round: the request names the
        survivors (self-mask shares) and who dropped (pairwise seeds), with the survivors' signatures."""
        if self.state is None:
            return []
        if self._unmasked == self.plan.exchange:
            raise UnmaskingRefusedError("a second unmasking round in one exchange: refused", **self.where())
        self._unmasked = self.plan.exchange
        msg = self._from_server(inbox, "unmask", "control")
        try:
            want_pairwise = [int(d) for d in msg.payload["pairwise"]]
            want_self = [int(u) for u in msg.payload["self_mask"]]
            signatures = {int(k): bytes(v) for k, v in msg.payload["signatures"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"malformed unmasking request ({e})", **self.where()) from None
        self._check_request(want_pairwise, want_self, signatures)
        if want_pairwise and not self.options["dropout_recovery"]:
            raise UnmaskingRefusedError(
                "the server asked for pairwise seeds, but dropout recovery is off", **self.where()
            )
        seeds, b_part = _unmask_answer(self.state, want_pairwise, want_self, self.plan, self.id)
        n = len(seeds) + len(b_part)
        return [
            self.seal(
                self._message(
                    "share",
                    (n,),
                    {"pairwise": seeds, "self_mask": b_part},
                    "unmasking shares (and pairwise seeds with dropped peers)",
                ),
                "unmask",
            )
        ]

    def stage_download(self, inbox):
        msg = self._from_server(inbox, "download", "plain" if self.options["reveal_to_server"] else "masked")
        t0 = time.perf_counter()
        p, L = self.plan, self.plan.block_len
        enc = self.encoding = FixedPoint(**p.encoding["fixed_point"])
        try:
            bids = np.asarray(msg.payload["block_ids"], dtype=np.int64).ravel()
            data = msg.payload["data"]
            included = [int(k) for k in msg.payload["included"]]
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed download ({e})", **self.where()) from None
        if not np.array_equal(bids, p.requests.get(self.id, np.zeros(0, np.int64))):
            raise IntegrityError("the download carries other block ids than this client asked for", **self.where())
        rows = read_words(data, enc, (bids.size, L), "download", self.where())
        if len(set(included)) != len(included) or any(not 0 <= k < self.setup.num_clients for k in included):
            raise IntegrityError(
                f"malformed download: included clients {included} are not distinct client ids", **self.where()
            )
        if not self.options["reveal_to_server"] and bids.size:
            members = np.zeros((bids.size, self.setup.num_clients), dtype=bool)
            if p.layout == "sparse":
                try:
                    bitmap = np.unpackbits(
                        np.asarray(msg.payload["contributors"], dtype=np.uint8), axis=1, count=len(included)
                    ).astype(bool)
                    members[:, included] = bitmap
                except (KeyError, TypeError, ValueError) as e:
                    raise IntegrityError(f"malformed contributor bitmap ({e})", **self.where()) from None
            else:
                members[:, included] = True
            remove_output_masks(
                rows,
                members,
                self._seed(),
                self.setup.num_clients,
                self._binding(),
                _streams(self.setup.run_id, p.exchange, p.tag, p.round)["output"],
                bids,
                L,
            )
        dec = enc.decode(rows)
        self.deliver({int(b): dec[i] for i, b in enumerate(bids)})
        self.timing["decode_s"] = time.perf_counter() - t0
        return []


def read_words(data, enc: FixedPoint, shape: tuple[int, int], what: str, where: dict) -> np.ndarray:
    """Ring elements of an upload or download: raw bytes, exactly ``shape`` values of ``b/8`` bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ShapeError(
            f"{what} must carry raw bytes of {enc.ring_bits}-bit ring elements, got "
            f"{type(data).__name__}{'/' + str(data.dtype) if hasattr(data, 'dtype') else ''}",
            **where,
        )
    want = shape[0] * shape[1] * enc.bytes_per_value
    if len(data) != want:
        raise IntegrityError(
            f"{what} is {len(data)} bytes, expected {want} ({shape[0]} blocks x {shape[1]} values "
            f"x {enc.bytes_per_value} bytes): truncated or corrupted",
            **where,
        )
    return enc.from_wire(data, shape)


# ====================================================================== server half
class MaskServer(ServerHalf):
    """The mask server: sums masked uploads, runs the recovery round, routes the sums.  It holds
    public keys, masked vectors and, after the unmasking round, only what Bonawitz et al. give it
    (per client, self-mask shares or this exchange's pairwise seeds, never both).  Over a
    sequential link it folds each upload into the total as it arrives and sends each download as it
    is built (:func:`~protocols.link.stream_groups`): it holds the total and one client's blocks."""

    mode = "mask"
    relays_between_clients = True
    relay_stages = frozenset({"group_seed", "share_keys"})
    _NOTES = {"group_seed": "output-mask group seed", "share_keys": "Shamir shares of self-mask seeds"}

    def __init__(self, setup, transcript=None):
        super().__init__(setup, transcript)
        self.fingerprint = mask_fingerprint(setup.num_clients, setup.options)
        self.group_seed_sent = False
        #: the clients' mask public keys (once per run) and which of them each client was sent
        self.mask_public: dict[int, bytes] = {}
        self.keys_sent: dict[int, set[int]] = defaultdict(set)
        #: (contributors, threshold) -> client -> (first exchange, length, holders) of its shared seed batch
        self.batches: dict[tuple, dict[int, tuple[int, int, frozenset]]] = defaultdict(dict)
        #: (contributors, threshold) -> dealer -> (first exchange, holder -> its share commitments)
        self.commitments: dict[tuple, dict[int, tuple[int, dict[int, bytes]]]] = defaultdict(dict)
        #: clients missing in the last exchange -> the stage at which their answer was missing
        self.last_missing: dict[int, str] = {}
        self.last_included: tuple[int, ...] = ()
        self.last_timing: dict[str, float] = {}

    def record(self, msg: Message) -> None:
        if msg.relay == SERVER and not msg.note:  # what the server knows a relayed ciphertext is
            stage = envelope_of(msg).stage if len(msg.auth) > 64 else ""
            note = self._NOTES.get(stage, "channel message")
            msg = dataclasses.replace(msg, note=note + " (channel-encrypted, relayed by the server)")
        super().record(msg)

    def _msg(self, k, kind, shape, payload, note=""):
        return self.message(k, kind, shape, payload, self.fingerprint, note)

    def _covered(self, key: tuple, k: int, seq: int, participants: list[int]) -> bool:
        """``k``'s batch covers exchange ``seq`` and every participant holds a share of it."""
        first, n, holders = self.batches[key].get(k, (0, 0, frozenset()))
        return first <= seq < first + n and holders.issuperset(participants)

    def _take_commitments(self, got, k: int, batch_key: tuple, contributors: list[int]) -> None:
        """Dealer ``k``'s signed commitments to the shares it dealt this exchange (one hash per
        holder and seed of its batch), kept until its batch is replaced."""
        msg = self.responses(got, k, "share_keys", "control")
        size = int(self.setup.options["self_mask_batch"]) * COMMITMENT_BYTES
        try:
            table = {int(j): bytes(c) for j, c in msg.payload.items()} if msg is not None else None
        except (AttributeError, TypeError, ValueError):
            table = None
        if table is None or sorted(table) != list(contributors) or any(len(c) != size for c in table.values()):
            raise IntegrityError("the share commitments are missing or malformed", **self.where(k))
        self.commitments[batch_key][k] = (self.plan.exchange, table)

    def _check_share(self, batch_key: tuple, dealer: int, holder: int, share: Share) -> None:
        """Refuse a revealed share that is not the one ``dealer`` committed to for ``holder``."""
        first, table = self.commitments[batch_key].get(dealer, (None, {}))
        seq = self.plan.exchange
        i = None if first is None else seq - first
        expected = table.get(holder, b"")[i * COMMITMENT_BYTES : (i + 1) * COMMITMENT_BYTES] if i is not None else b""
        if share.x != holder + 1 or share_commitment(self.setup.run_id, dealer, seq, share) != expected:
            raise ShareIntegrityError(
                f"client {holder}'s share of client {dealer}'s self-mask seed does not match "
                f"the commitment client {dealer} signed: corrupted by client {holder}; "
                "nothing was aggregated",
                **self.where(holder),
            )

    def _exclude(self, clients) -> None:
        """Clients out of this exchange before uploading: what was queued for them is void."""
        for k in clients:
            self._outbox.pop(k, None)

    def run(self, plan, link):
        o = self.setup.options
        enc = FixedPoint(**plan.encoding["fixed_point"])
        contributors = list(plan.contributors)
        t = shamir_threshold(len(contributors), o["threshold"], collusion_bound(self.setup).max_colluders)
        n0, L, sparse, seq = len(contributors), plan.block_len, plan.layout == "sparse", plan.exchange
        where = self.where
        self.last_missing = {}
        t_start = time.perf_counter()
        deal = not o["reveal_to_server"] and not self.group_seed_sent
        if deal:  # every client gets G: all register (and get the directory) now
            self.register(link, plan.round, range(self.setup.num_clients))
        self.begin(plan, link, self.fingerprint, extra=(0,) if deal else ())
        if deal:  # client 0 deals the output-mask group seed, once per run
            got = self.call(link, "group_seed", {0: []})
            if 0 not in got or len([m for m in got[0] if m.relay == SERVER]) != self.setup.num_clients - 1:
                raise _dropout_error(where(), [0], "client 0 did not deal the output-mask group seed")
            self.group_seed_sent = True

        # -- 1. metadata (sparse)
        announced: dict[int, np.ndarray] = {}
        if sparse:
            got = self.call(link, "block_ids", {k: [] for k in plan.parties})
            for k in contributors:
                msg = self.responses(got, k, "block_ids", "metadata")
                if msg is None:
                    self.last_missing[k] = "block_ids"
                    continue
                self.check_envelope(msg, self.fingerprint, k)
                ids = np.asarray(msg.payload["block_ids"], dtype=np.int64) if isinstance(msg.payload, dict) else None
                if (
                    ids is None
                    or ids.ndim != 1
                    or np.any(np.diff(ids) <= 0)
                    or (ids.size and (ids[0] < 0 or ids[-1] >= plan.num_blocks))
                ):
                    raise IntegrityError("block-id metadata must be a sorted list of unique ids in range", **where(k))
                announced[k] = ids
            common = {}
            listed = sorted(announced)
            for i, a in enumerate(listed):
                for b in listed[i + 1 :]:
                    c = np.intersect1d(announced[a], announced[b], assume_unique=True)
                    if c.size:
                        common[(a, b)] = c
            for k in listed:
                mine = {j: c for (a, b), c in common.items() for j in (a, b) if k in (a, b) and j != k}
                self.queue(
                    k,
                    self._msg(
                        k,
                        "metadata",
                        (len(mine),),
                        {int(j): c.astype(np.int32) for j, c in mine.items()},
                        "block ids shared with each peer",
                    ),
                    "block_ids",
                )
        else:
            announced = {k: np.arange(plan.num_blocks) for k in contributors}

        # -- 2. AdvertiseKeys: once per run per client (its first exchange), then broadcast
        unkeyed = [k for k in contributors if k in announced and k not in self.mask_public]
        if unkeyed:
            got = self.call(link, "advertise_keys", {k: [] for k in unkeyed})
            for k in unkeyed:
                msg = self.responses(got, k, "advertise_keys", "public_key")
                if msg is None:
                    self.last_missing.setdefault(k, "advertise_keys")
                    continue
                self.check_envelope(msg, self.fingerprint, k)
                check_signed_mask_key(self.registry, self.setup.run_id, client_party(k), msg.payload, where(k))
                self.mask_public[k] = bytes(msg.payload)  # forwarded verbatim, with its owner's signature
        participants = [k for k in contributors if k in announced and k in self.mask_public]
        if self.last_missing and len(participants) < t:
            raise _dropout_error(
                where(),
                sorted(self.last_missing),
                f"only {len(participants)} of {n0} contributors advertised keys, fewer than the threshold t={t}",
            )
        for k in participants:
            new = {j: self.mask_public[j] for j in participants if j not in self.keys_sent[k]}
            if new:
                self.queue(
                    k,
                    self._msg(k, "public_key", (len(new), SIGNED_KEY_BYTES), new, "broadcast of mask keys"),
                    "advertise_keys",
                )
                self.keys_sent[k] |= set(new)

        # -- 3. ShareKeys: a batch of self-mask seeds from each participant whose batch for this
        #       contributor set does not cover this exchange (the shares are relayed to their holders)
        use_self = len(participants) >= 2
        batch_key = (tuple(contributors), t)
        if use_self:
            stale = [k for k in participants if not self._covered(batch_key, k, seq, participants)]
            if stale:
                got = self.call(link, "share_keys", {k: [] for k in stale})
                for k in stale:
                    if sorted(party_client(m.receiver) for m in got.get(k, []) if m.relay == SERVER) != [
                        j for j in contributors if j != k
                    ]:
                        self.last_missing.setdefault(k, "share_keys")
                    else:
                        self._take_commitments(got, k, batch_key, contributors)
                participants = [k for k in participants if k not in self.last_missing]
                for k in stale:  # the holders: the participants, whose next bundle has the shares
                    if k in participants:
                        self.batches[batch_key][k] = (seq, int(o["self_mask_batch"]), frozenset(participants))
        self._exclude(k for k in contributors if k not in participants)
        if participants != contributors:
            for k in participants:
                self.queue(
                    k,
                    self._msg(
                        k,
                        "control",
                        (len(participants),),
                        {"participants": np.asarray(participants, np.int32)},
                        "participants",
                    ),
                    "share_keys",
                )
        t_setup = time.perf_counter()

        # -- 4. MaskedInputCollection: each upload is folded into the total as it arrives, client by
        #       client over a sequential link (the server holds the total and one upload at a time)
        union = (
            np.unique(np.concatenate([announced[k] for k in participants])) if participants else np.zeros(0, np.int64)
        )  # a block only a dropped client announced stays 0
        total = np.zeros((union.size, L), dtype=enc.dtype)
        uploaders, server_s, refused = [], 0.0, None
        for group in stream_groups(link, participants):
            try:  # after a refusal the rest still read their bundles (their relayed shares), as in parallel
                got = self.call(link, "masked_upload", {k: [] for k in group})
                if refused is None:
                    server_s += self._fold_uploads(got, group, total, union, announced, enc, uploaders)
            except ProtocolError as e:
                refused = refused or e
            got = None
        if refused is not None:
            raise refused
        uploaders.sort()
        dropped_upload = [k for k in participants if k not in uploaders]
        missing = sorted(self.last_missing)
        if missing and len(uploaders) < t:
            raise _dropout_error(
                where(), missing, f"only {len(uploaders)} of {n0} contributors uploaded, fewer than the threshold t={t}"
            )
        if len(missing) > plan.encoding["provisioned_dropouts"]:
            raise _dropout_error(
                where(),
                missing,
                "with distributed DP every client adds a share of the noise "
                f"variance provisioned for at most {plan.encoding['provisioned_dropouts']:g} "
                "dropout(s), so a sum without them would be short of DP noise (--dp-dropouts)",
            )
        if dropped_upload and not (o["dropout_recovery"] and use_self):
            raise _dropout_error(
                where(),
                dropped_upload,
                "they were counted in (the other clients masked "
                "toward them) and dropout recovery is disabled (dropout_recovery=False)",
            )

        # -- 5. Consistency check, then unmasking
        if use_self:
            t_unmask = time.perf_counter()
            signatures = self._consistency(link, uploaders, t)
            self._unmask(link, total, union, announced, uploaders, dropped_upload, t, enc, batch_key, signatures)
            server_s += time.perf_counter() - t_unmask

        # -- 6. delivery: each recipient gets its blocks, who is included and (sparse) who contributed
        #       what; sent as they are built, recipient by recipient over a sequential link
        included = tuple(uploaders)
        kind = "plain" if o["reveal_to_server"] else "masked"
        last = (None, None)
        for group in stream_groups(link, plan.requests):
            downloads = {}
            for r in group:
                bids = plan.requests[r]
                if last[0] is None or not np.array_equal(last[0], bids):  # dense: every recipient asks the same
                    rows = np.zeros((bids.size, L), dtype=enc.dtype)  # a block nobody contributed sums to 0
                    if union.size:
                        at = np.minimum(np.searchsorted(union, bids), union.size - 1)
                        hit = union[at] == bids
                        rows[hit] = total[at[hit]]
                    last = (bids, enc.to_wire(rows))
                payload = {
                    "block_ids": bids.astype(np.int32),
                    "data": last[1],
                    "included": np.asarray(included, np.int32),
                }
                if sparse and not o["reveal_to_server"]:
                    bitmap = (
                        np.stack([np.isin(bids, announced[k]) for k in included], axis=1)
                        if included
                        else np.zeros((bids.size, 0), bool)
                    )
                    payload["contributors"] = np.packbits(bitmap, axis=1)
                downloads[r] = [(self._msg(r, kind, (bids.size, L), payload), 0)]
            try:  # a recipient's refusal does not keep the download from the others
                self.call(link, "download", downloads)
            except ProtocolError as e:
                refused = refused or e
        if refused is not None:
            raise refused
        self.last_included = included
        self.last_timing = {"setup_s": t_setup - t_start, "server_s": server_s}
        return included

    def _fold_uploads(self, got, group, total, union, announced, enc, uploaders) -> float:
        """Step 4 for one group's answers: verify each masked upload and add it into ``total`` (mod
        ``2^b``); a client without one is noted as missing.  Returns the seconds it took."""
        t0, where = time.perf_counter(), self.where
        for k in group:
            msg = self.responses(got, k, "masked_upload")
            if msg is None:
                self.last_missing.setdefault(k, "masked_upload")
                continue
            self.check_envelope(msg, self.fingerprint, k)
            if msg.kind != "masked":
                raise IntegrityError(
                    f"message rejected: expected a 'masked' message from {client_party(k)} "
                    f"to the server, got '{msg.kind}'",
                    **where(k),
                )
            total[_positions(union, announced[k])] += self._read_upload(k, msg, announced[k], enc)
            uploaders.append(k)
        return time.perf_counter() - t0

    def _consistency(self, link, uploaders: list[int], t: int) -> dict[int, bytes]:
        """Consistency check (Bonawitz et al. §4, active variant): every uploader signs the survivor
        set; returns the signatures of those that answered (at least ``t``, else DropoutError)."""
        survivors = np.asarray(uploaders, np.int32)
        got = self.call(
            link,
            "consistency",
            {
                j: [(self._msg(j, "control", (len(uploaders),), {"survivors": survivors}, "survivor set"), 0)]
                for j in uploaders
            },
        )
        signatures = {}
        for j in uploaders:
            msg = self.responses(got, j, "consistency", "control")
            if msg is None:
                self.last_missing.setdefault(j, "consistency")
                continue
            self.check_envelope(msg, self.fingerprint, j)
            sig = msg.payload.get("signature") if isinstance(msg.payload, dict) else None
            if not isinstance(sig, (bytes, bytearray)) or len(sig) != 64:
                raise IntegrityError("malformed survivor-set signature", **self.where(j))
            signatures[j] = bytes(sig)
        if len(signatures) < t:
            raise _dropout_error(
                self.where(),
                sorted(self.last_missing),
                f"only {len(signatures)} clients signed the survivor set, fewer than the threshold t={t}",
            )
        if len(signatures) < len(uploaders) and self.schedule is not None and self.schedule.binds_views(self.plan.tag):
            raise _dropout_error(
                self.where(),
                sorted(self.last_missing),
                "in an exchange the public schedule marks as a broadcast every survivor signs the survivor "
                "set (each checks the models the others received, protocols/broadcast_view.py)",
            )
        return signatures

    def _unmask(self, link, total, union, announced, uploaders, dropped, t, enc, batch_key, signatures) -> None:
        """Step 5: remove each uploader's self mask (from ``t`` shares of its seed) and the pairwise
        masks the survivors shared with the dropped clients (from the survivors' seeds), in place.
        The request goes to the clients that signed the survivor set, with their signatures."""
        plan, where = self.plan, self.where
        L = plan.block_len
        request = {
            "pairwise": np.asarray(dropped, np.int32),
            "self_mask": np.asarray(uploaders, np.int32),
            "signatures": signatures,
        }
        asked = sorted(signatures)
        got = self.call(
            link,
            "unmask",
            {
                j: [(self._msg(j, "control", (len(dropped) + len(uploaders),), request, "unmasking request"), 0)]
                for j in asked
            },
        )
        seeds, b_shares, responders = {}, defaultdict(list), []
        for j in asked:
            msg = self.responses(got, j, "unmask", "share")
            if msg is None:
                self.last_missing.setdefault(j, "unmask")
                continue
            self.check_envelope(msg, self.fingerprint, j)
            responders.append(j)
            try:
                for d, raw in msg.payload["pairwise"].items():
                    if int(d) not in dropped or len(raw) != SEED_BYTES:
                        raise ValueError(f"an unrequested or malformed pairwise seed (client {d})")
                    seeds[(j, int(d))] = bytes(raw)
                shares = {int(u): Share.from_bytes(raw) for u, raw in msg.payload["self_mask"].items()}
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise IntegrityError(f"malformed unmasking answer ({e})", **where(j)) from None
            for u, share in shares.items():
                self._check_share(batch_key, u, j, share)
                b_shares[u].append(share)
        if len(responders) < t:
            raise _dropout_error(
                where(),
                sorted(self.last_missing),
                f"only {len(responders)} clients answered the unmasking round, fewer than the threshold t={t}",
            )
        sid = _streams(self.setup.run_id, plan.exchange, plan.tag, plan.round)
        for d in dropped:
            for j in uploaders:
                c = np.intersect1d(announced[d], announced[j], assume_unique=True)
                if not c.size:
                    continue
                if (j, d) not in seeds:
                    raise _dropout_error(
                        where(),
                        [d, j] if j in self.last_missing else [d],
                        f"client {j} did not reveal its pairwise seed with dropped client {d}, "
                        "so their pairwise mask cannot be removed",
                    )
                m = ranked_mask(seeds[(j, d)], sid["pairwise"], c.size, L, enc.dtype)
                pos = _positions(union, c)
                if d > j:  # j added +PRG(s_jd)
                    total[pos] -= m
                else:  # j subtracted it
                    total[pos] += m
        for u in uploaders:
            if len(b_shares[u]) < t:
                self.batches[batch_key].pop(u, None)  # too few holders left: a fresh batch next time
                raise _dropout_error(
                    where(),
                    [u],
                    f"only {len(b_shares[u])} shares of its self-mask seed came back, fewer than the threshold t={t}",
                )
            try:
                b_u = combine(b_shares[u], t)
            except ValueError as e:
                raise IntegrityError(f"cannot reconstruct the self-mask seed: {e}", **where(u)) from None
            total[_positions(union, announced[u])] -= ranked_mask(b_u, sid["self"], announced[u].size, L, enc.dtype)

    # ------------------------------------------------------------------ server-side checks
    def _read_upload(self, k: int, msg: Message, ids: np.ndarray, enc: FixedPoint) -> np.ndarray:
        """Parse one masked upload; refuse anything but the announced blocks as ring elements."""
        where, L = self.where(k), self.plan.block_len
        p = msg.payload
        if not isinstance(p, dict) or "data" not in p or "block_ids" not in p:
            raise IntegrityError("masked upload must carry 'block_ids' and 'data'", **where)
        got_ids = np.asarray(p["block_ids"]).ravel()
        if got_ids.shape != ids.shape or not np.array_equal(got_ids.astype(np.int64), ids):
            raise IntegrityError("masked upload covers other block ids than the client announced", **where)
        expected = (ids.size, L)
        if tuple(msg.shape) != expected:
            raise ShapeError(f"masked upload declares shape {tuple(msg.shape)}, expected {expected}", **where)
        return read_words(p["data"], enc, expected, "masked upload", where)


# ====================================================================== the algorithms' facade
class MaskProtocol(SplitProtocol):
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
        self.last_client_state: dict[int, _Participant] = {}
        self.last_binding: ExchangeBinding | None = None

    def public_options(self) -> dict:
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
        return mask_fingerprint(self.num_clients, self.public_options())

    @property
    def _group_seed(self) -> dict[int, bytes]:
        """Each in-process client's copy of the output-mask group seed (what a colluding client holds)."""
        return {k: c.group_seed for k, c in self.clients.items() if c.group_seed is not None}

    def block_capacity(self, spec) -> int:
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
