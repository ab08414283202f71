"""The client half of ``ckks-mp``.

One client's key shares, encryption, partial decryptions and decryption of its own result, behind
:meth:`~protocols.party.ClientHalf.handle` (bytes only).

Built from the run's public setup bytes (:class:`~protocols.party.PartySetup`: the ring
parameters, which it checks itself, :func:`.params.check_security`).  Its secrets -- the
collective-key share ``s_i``, its recipient key ``s_R`` and the clients' broadcast key ``s_B`` --
are sampled from the OS CSPRNG here (:class:`.party.MPClient`) and never serialized (``s_B``
travels once, from client 0 to each other client, over the encrypted client-to-client channel).
The CRS seed is a hash of the run id (:func:`.sampling.crs_seed`).  Stages (server request ->
this client's answer):

``key_setup`` part 0   -> ``p_R = -a s_R + e_R`` signed by this client's identity key; client 0
                       also ``p_B`` (signed) and, for every other client, ``s_B`` sealed on the
                       channel (the server relays it and cannot open it)
``key_setup`` part 1   ``p_B`` with client 0's signature -> nothing; a client j > 0 checks the
                       signature, opens ``s_B`` and checks that ``p_B + a s_B`` is a small error
(every stage)          the plan's key switch per block and moduli, checked against the public facts before
                       anything of the exchange is sent (:meth:`CKKSMPClient._plan`, ModulusPlanError;
                       a block switched to the broadcast key that this client does not receive, or any
                       for a client with no request outside a public broadcast: DowngradeError)
``block_ids``          (sparse layout) -> the ids of the blocks it uploads (the documented leak)
``upload``             -> its blocks, checked against the public plan (ShapeError / BoundError
                       naming it; nothing encrypted), encrypted under its own share ``s_i`` with
                       the public ``c1 = a_{x,b,j}`` of exchange ``x`` (only ``c0`` is sent); once per
                       exchange number (RepeatedUploadError: a second one would reuse ``c1``)
``keyswitch``          the groups of aggregate blocks and the recipient each goes to -> its share
                       per group on the ``c1`` it recomputes itself, masked and smudged: PCKS to a
                       recipient's key (Mouchet et al. 2021, Protocol 5), CKS (one polynomial) to
                       the broadcast key (:mod:`.keyswitch`).  Refused
                       (:class:`~protocols.errors.KeySwitchRefusedError`) unless: every recipient
                       key is its owner's signed ``p_R`` (KeySubstitutionError otherwise), each
                       block's switch is the plan's (a recipient key for a block the plan switches to
                       the broadcast key: RecipientKeyError; the broadcast key for any other set of
                       blocks than the plan's: DowngradeError), one planned switch per exchange (t-out-of-n:
                       re-plans below) and one group per recipient (RepeatedKeySwitchError); in the server's
                       batches, at increasing parts: the first names the planned switch, checked whole, and each
                       batch holds only planned (key, block) pairs not switched before (UnplannedKeySwitchError,
                       RepeatedKeySwitchError; n-out-of-n, a download before the whole plan: IntegrityError), within the
                       run's smudging budget (SmudgingBudgetError), after this client's own upload; a request carrying
                       anything else (a ``c1``) is refused
``download``           its blocks: ``c0'`` only for the plan's blocks switched to ``s_B`` (``c1`` is
                       public), ``(c0', c1')`` switched to its own key for the others -> nothing; it decrypts,
                       checks the residual against the worst-case noise bound (IntegrityError: a
                       corrupted share or ciphertext) and decodes.  A release or a statistic (the public
                       schedule's ``release`` role: rows per recipient; ``statistic``: the round's sample,
                       FedOMD's pooled moments) -> the keyed digest of each decoded
                       block, ``HMAC-SHA256(k_B, exchange || b || values)`` with ``k_B`` derived from
                       ``s_B`` (every client's, the server's never), delivered only after
``release``            the root of the server's commitment to every recipient's digests and this
                       client's proof (:mod:`protocols.release_commitment`) -> nothing; it checks
                       its digests against the root (InconsistentViewError, nothing delivered) and
                       chains the root into the digest it binds into every later contribution
                       (:mod:`protocols.broadcast_view`); every client, recipient or not, chains it

t-out-of-n (the public setup's ``threshold`` t < n, with ``2t > n + c``; :mod:`.threshold`, Mouchet,
Bertrand, Hubaux, J. Cryptology 2023): at ``key_setup`` part 0 each client also deals Shamir shares
of ``s_i``; at part ``1 + r`` (r = 1..n-1, in order) it sends the one for client ``(me + r) mod n`` on
the channel and opens the ones relayed to it; at part 1 it must hold one from every other client.
``keyswitch`` part 0 is a liveness probe (answered with an empty signed message); the batches follow at
parts 1, 2, ..., each naming the active set ``A``, the first also the planned switch with the uploaders
``U`` and which of them uploaded each planned block; only the ``t`` clients of ``A`` answer, each with
``lambda_me^A sum_{i in U_b} sigma_{i,me}`` as its key and masks over ``A``.  Refused
(:class:`~protocols.errors.ActiveSetError`) unless ``A`` is exactly t distinct clients of the run
including this one, ``U`` lies within the plan's contributors with at most n - t of them missing,
``U`` names this client's own upload exactly, a block's uploaders are the same in every group, and every
batch names the ``A`` of the request that opened the switch; the mask labels hold a digest of ``A`` and
``U``.  A request naming the planned switch again is the server's re-plan after a member of ``A`` was lost
(the batches left, asked of a new ``A``): answered only with the first request's planned switch and
uploaders, a new active set and none of the lost (:meth:`CKKSMPClient._check_replan`,
RepeatedKeySwitchError).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..auth import check_public_key, sign_public_key
from ..broadcast_view import EMPTY_VIEW
from ..ckks.memo import DecryptionMemo
from ..ckks.params import per_client_limits
from ..errors import (
    ActiveSetError,
    BoundError,
    DowngradeError,
    InconsistentViewError,
    IntegrityError,
    KeySubstitutionError,
    KeySwitchRefusedError,
    ModulusPlanError,
    RecipientKeyError,
    RepeatedKeySwitchError,
    RepeatedUploadError,
    SmudgingBudgetError,
    UnplannedKeySwitchError,
)
from ..message import encode_body
from ..party import ClientHalf, PartySetup, Provider, envelope_of
from ..plan import ExchangePlan
from ..release_commitment import DIGEST_BYTES, leaf, verify
from ..schedule import BROADCAST
from ..similarity_exchange import SIMILARITY_SHAPE
from ..transcript import SERVER, Message, client_party, party_client
from ..validate import check_block_table, find_violation
from . import encoding, encryption
from .keys import BROADCAST_KEY, RECIPIENT_KEY, key_fingerprint
from .keyswitch import planned_broadcast_blocks
from .params import TOTAL_DISTANCE_BITS, Plan, params_from_options, plan_exchange, ring_of, smudging_bits
from .party import MPClient
from .sampling import common_polynomial, crs_seed, pairwise_mask, upload_c1
from .threshold import check_finishers

#: a client's reply to one stage: (message, its sealed bytes) each
_Reply = list[tuple[Message, bytes]]
#: this exchange's checked contribution: (block ids, values)
_Table = tuple[np.ndarray, np.ndarray]

KEYS_TAG = "ckks-mp/keys"
#: tag of the relayed Shamir shares of the t-out-of-n key set-up
THRESHOLD_TAG = "ckks-mp/threshold-shares"
#: envelope part of a relayed Shamir share (``s_B`` travels at part 0 of the same stage)
SHARE_PART = 1
#: t-out-of-n set-up: the server's request of part ``ROTATION_PART + r - 1`` asks each client i for its share of
#: client ``(i + r) mod n`` (r = 1..n-1), so each call relays one share per client, never all at once
ROTATION_PART = 2
#: t-out-of-n set-up: the server's request (and the answer) of this part asks a client to deal the broadcast key in
#: place of client 0, which did not answer the key set-up's first step
DEALER_PART = (1 << 32) - 2
#: envelope part of a client's answer to the t-out-of-n liveness probe (shares: :func:`share_part`)
READY_PART = (1 << 32) - 1
#: domain separator of the key of the released blocks' digests (:meth:`CKKSMPClient._release_digest`)
RELEASE_KEY_DOMAIN = b"secure-fgl/ckks-mp/release-key/v1"
#: the fields of a key-switching request (a ``c1`` is never one: clients compute it)
KEYSWITCH_FIELDS = frozenset({"groups", "blocks", "keys"})
#: t-out-of-n: the field of every key-switching request naming the active set
ACTIVE_FIELD = "active"
#: the field of the request that opens an exchange's key switch (its first batch; t-out-of-n: also a re-plan's) and
#: names its planned switch
PLANNED_FIELD = "planned"
#: the fields of a planned switch: its groups and blocks; t-out-of-n adds the uploaders and which of them uploaded
#: each planned block
PLANNED_FIELDS = frozenset({"groups", "blocks"})
THRESHOLD_PLANNED_FIELDS = PLANNED_FIELDS | {"uploaders", "uploaded"}


def share_part(request: int, group: int, clients: int) -> int:
    """The envelope part of a client's key-switching share of ``group`` in the request of part ``request``.

    ``request * (clients + 1) + group``: a request holds at most one group per key (the broadcast key and each
    client), so no two shares of an exchange's key switch, over its batches and re-plans, share a part.
    """
    return request * (clients + 1) + group


@dataclass(frozen=True)
class Replan:
    """A client's t-out-of-n key switches of one exchange (:meth:`CKKSMPClient._check_replan`).

    ``binding``: the digest of what they decrypt to; ``active_sets``: the sets answered, in order; ``lost``: the
    clients an earlier active set held and a later one left out.
    """

    binding: bytes
    active_sets: list[tuple[int, ...]]
    lost: frozenset[int]


@dataclass
class _Switch:
    """A client's key switch of one exchange, answered in the server's batches (:meth:`CKKSMPClient._switch_batch`).

    ``planned``: each key's blocks (-1: the broadcast key; else a recipient), named by the request that opened the
    switch and checked whole; ``done``: the blocks switched since; ``part``: the envelope part of the last request
    answered (the next one's must be larger).  t-out-of-n (a re-plan opens a new switch): ``active``: the active set
    the opening request named, the same for every batch until a re-plan; ``uploaders``: each planned block's
    uploaders; ``context``: the masks' label context; ``replan``: what the exchange's (re-)plans bound and answered.
    """

    exchange: int
    planned: dict[int, frozenset[int]]
    part: int
    done: dict[int, set[int]] = field(default_factory=dict)
    active: tuple[int, ...] | None = None
    uploaders: dict[int, tuple[int, ...]] = field(default_factory=dict)
    context: str = ""
    replan: Replan | None = None

    @property
    def complete(self) -> bool:
        """Every planned block switched to its key (the union of the batches is the planned switch)."""
        return all(self.done.get(to, set()) == set(bids) for to, bids in self.planned.items())


def threshold_of(setup: PartySetup) -> int:
    """The run's key-switching threshold t from its public setup (default n: n-out-of-n).

    t-out-of-n needs ``2t > n + c`` (c: the run's colluders): any two active sets then share more than c clients,
    so an honest one answers both and refuses the second unless it releases the same sum
    (:meth:`CKKSMPClient._check_replan`).  IntegrityError otherwise.
    """
    k = int(setup.num_clients)
    t = int(setup.options.get("threshold") or k)
    c = setup.collusion.max_colluders
    if not 1 <= t <= k or (t < k and 2 * t <= k + c):
        raise IntegrityError(
            f"the public setup names threshold {t} for {k} clients and {c} colluders: t-out-of-n needs "
            "1 <= t <= n and 2t > n + c (two active sets could otherwise hold no common honest client)"
        )
    return t


#: clients in one process decode a broadcast delivery (same bytes, same key s_B) once; each gets a copy
_MEMO = DecryptionMemo()


def common_plan_digest(plan: ExchangePlan) -> str:
    """SHA-256 hex of the part of an exchange plan every client receives alike.

    That is everything but the recipients' requests, of which each client sees only its own. It labels the zero-sum
    key-switching masks, so the masks cancel only in an exchange where all K clients hold one plan: a server that
    tells one honest client it is no contributor (it then key-switches without ``s_i``) while the others count it
    gets a uniform sum, not the others' inputs without it.
    """
    common = {k: v for k, v in plan.to_payload().items() if k != "requests"}
    return hashlib.sha256(encode_body(common)).hexdigest()


class CKKSMPClient(ClientHalf):
    """One client of ``ckks-mp`` (module docstring)."""

    mode = "ckks-mp"

    def __init__(self, client_id: int, setup: bytes, provider: Provider | None = None) -> None:
        super().__init__(client_id, setup, provider)
        self.params = params_from_options(self.setup.options["params"])
        self.ring = ring_of(self.params)
        #: the key shares (made at key set-up from the OS CSPRNG; never serialized)
        self.keys: MPClient | None = None
        self.fingerprint = ""
        self._seed = crs_seed(self.setup.run_id)
        #: recipients' public keys p_R, each checked against its owner's signature (public)
        self.recipient_keys: dict[int, np.ndarray] = {}
        #: seconds of the key set-up, and per stage of the last exchange (benchmarks)
        self.setup_s = 0.0
        self.timing: dict[str, float] = {}
        self._state: tuple[int | None, _Table | None] = (None, None)  # (exchange, checked contribution)
        #: ciphertexts this client key-switched in the run (against MPParams.max_keyswitches)
        self.switched = 0
        #: the exchange of this client's last key switch
        self._last_switch: int | None = None
        #: the key switch of the current exchange over its batches (:meth:`_switch_batch`)
        self._switch: _Switch | None = None
        #: the exchange of this client's last upload (one upload per exchange number: c1 is per exchange)
        self._last_upload: int | None = None
        self._pair_seeds: dict[int, bytes] | None = None
        #: t-out-of-n set-up: the Shamir shares this client has yet to send (recipient -> bytes), the next offset
        #: it deals (:data:`ROTATION_PART`), and the relayed key set-up messages it keeps for the last step
        self._to_deal: dict[int, bytes] = {}
        self._next_offset = 1
        self._setup_relayed: list[Message] = []
        self._dealt_broadcast = False
        #: the clients whose Shamir share this client was told not to send (they left the set-up)
        self._skipped: set[int] = set()
        #: the clients that finished the key set-up (t-out-of-n: at least t, named by the server; the only ones an
        #: active set or an uploader set may hold)
        self.finishers = frozenset(range(self.setup.num_clients))
        #: t of t-out-of-n key switching (n: every client answers every key switch)
        self.threshold = threshold_of(self.setup)
        #: (exchange, decoded blocks) of a release, delivered once its commitment checks (:meth:`_release`)
        self._released: tuple[int, dict[int, np.ndarray]] | None = None
        self._release_key: bytes | None = None

    @property
    def _exchange_plan(self) -> ExchangePlan:
        """The current exchange's plan (:meth:`on_stage` runs an exchange's stages only once one is set)."""
        return cast(ExchangePlan, self.plan)

    @property
    def _key_shares(self) -> MPClient:
        """This client's key shares (made at key set-up, before any step that uses them)."""
        return cast(MPClient, self.keys)

    def on_stage(self, stage: str, inbox: list[Message]) -> _Reply:
        """Multiparty CKKS client steps: key set-up, block ids, upload, key-switch share, decryption of the download.

        Raises:
            IntegrityError: the exchange names a key fingerprint this client did not set up.
        """
        if stage == "key_setup":
            return self._key_setup(inbox)
        if self.plan is None:
            return []
        if self.keys is not None and not self.fingerprint:
            raise IntegrityError(
                "an exchange for a client that did not finish the key set-up: it holds no share of this run's keys "
                "and cannot rejoin (--resume runs the set-up again with every client)",
                **self.where(),
            )
        if self.keys is None or self.plan.encoding.get("fingerprint") != self.fingerprint:
            raise IntegrityError("the exchange names a key this client did not set up", **self.where())
        if self._state[0] != self.plan.exchange:
            self._state, self.timing = (self.plan.exchange, None), {}
        if stage == "block_ids":
            self._plan()  # the switch and moduli are checked before anything is sent
            return self._block_ids()
        if stage == "upload":
            return self._upload()
        if stage == "keyswitch":
            return self._keyswitch(inbox)
        if stage == "download":
            return self._download(inbox)
        if stage == "release":
            return self._release(inbox)
        return []

    def _accept_plan(self, msg: Message) -> ExchangePlan:
        """The base plan checks, then refuse a plan shaped for GCFL's similarity statistics.

        The base checks, then refuse a plan shaped for GCFL's similarity statistics: ``ckks-mp``
        never runs one, and its steps would encrypt this client's contribution under a key that
        one client (the plan's decider) holds alone, so that the server and that client read it.
        """
        plan = super()._accept_plan(msg)
        if plan.encoding.get("shape") == SIMILARITY_SHAPE:
            self.plan = None
            raise DowngradeError(
                "a similarity-statistics plan in ckks-mp: its steps encrypt this client's "
                "contribution under one client's key; nothing was sent",
                tag=msg.tag,
                round=msg.round,
                client=self.id,
            )
        return plan

    def _from_server(
        self, inbox: list[Message], stage: str, where: dict[str, Any], parts: Sequence[int] = (0,)
    ) -> Message:
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError(f"expected one '{stage}' message from the server, got {len(mine)}", **where)
        part = envelope_of(mine[0]).part
        if stage != "key_setup" and part not in parts:
            expected = list(parts) if len(parts) < 8 else f"{parts[0]}..{parts[-1]}"
            raise IntegrityError(f"a '{stage}' message of part {part}, expected one of {expected}", **where)
        return self.check(mine[0], SERVER, stage, part, where)

    def _plan(self) -> Plan:
        """The exchange's switch and moduli, recomputed from the public plan; they must be the server's.

        Checked before this client sends anything of the exchange (ModulusPlanError, or DowngradeError for a block
        switched to the broadcast key that the exchange does not allow: :meth:`_broadcast_blocks`).  The levels are
        sized for CKS's noise when every block goes to the broadcast key, else for PCKS's (the larger).
        """
        p = self._exchange_plan
        broadcast = self._broadcast_blocks(p).size == p.num_blocks
        ep = plan_exchange(
            self.params,
            p.spec,
            self.setup.num_clients,
            p.dp_noise_std,
            p.block_len,
            tag=p.tag,
            round=p.round,
            broadcast=broadcast,
        )
        if ep.describe() != p.encoding.get("plan"):
            raise ModulusPlanError(
                f"the server's plan {p.encoding.get('plan')!r} is not the one this client computes from the "
                f"exchange's public bounds, its {self.setup.num_clients} clients and its switch ({ep.describe()}): "
                "refused, nothing was sent",
                **self.where(),
            )
        return ep

    def _broadcast_blocks(self, p: ExchangePlan) -> np.ndarray:
        """The blocks the plan switches to the broadcast key (CKS), checked; every other block: PCKS.

        Every client holds ``s_B``, so a CKS block is readable by every client.  The plan names the CKS blocks
        (``broadcast_blocks``) and the exchange's recipients (``broadcast_to``, present with them): this client must
        receive each CKS block (DowngradeError naming the blocks it does not receive), the recipients must name it
        exactly when it has a request (ModulusPlanError), and unless every client of the run is a recipient the public
        schedule must make the tag a broadcast every client trains on (DowngradeError).  Both lists are part of the
        plan digest that labels the key-switching masks (:func:`common_plan_digest`), so the masks cancel only if every
        client holds the same lists, and each honest client checked them against its own request: no block reaches the
        broadcast key unless every honest client receives it.
        """
        K, where = self.setup.num_clients, self.where()
        try:
            blocks = planned_broadcast_blocks(p.encoding, p.num_blocks)
            recipients = tuple(int(r) for r in np.asarray(p.encoding.get("broadcast_to", ()), dtype=np.int64).ravel())
        except (TypeError, ValueError) as e:
            raise ModulusPlanError(f"malformed switch to the broadcast key ({e})", **where) from None
        if not blocks.size and not recipients:
            return blocks
        ordered = list(recipients) == sorted(set(recipients))
        if not blocks.size or not recipients or not ordered or recipients[0] < 0 or recipients[-1] >= K:
            raise ModulusPlanError(
                f"broadcast blocks {blocks[:8].tolist()} and recipients {list(recipients)[:8]}: both or neither, the "
                f"recipients distinct sorted clients of 0..{K - 1}",
                **where,
            )
        if (self.id in recipients) != (self.id in p.requests):
            raise ModulusPlanError(
                f"the plan's broadcast recipients {'name' if self.id in recipients else 'omit'} this client, "
                f"which {'has no' if self.id in recipients else 'has a'} request of its own",
                **where,
            )
        own = p.requests.get(self.id)
        unseen = np.setdiff1d(blocks, own) if own is not None else np.zeros(0, dtype=np.int64)
        if unseen.size:
            raise DowngradeError(
                f"block(s) {unseen[:8].tolist()} switched to the broadcast key, which every client holds, but this "
                "client does not receive them: a block goes to the broadcast key only when every recipient receives it",
                **where,
            )
        public = self.schedule is not None and self.schedule.roles.get(p.tag) == BROADCAST
        if recipients != tuple(range(K)) and not public:
            absent = sorted(set(range(K)) - set(recipients))
            raise DowngradeError(
                f"block(s) {blocks[:8].tolist()} switched to the broadcast key, which every client holds, while "
                f"client(s) {absent[:8]} receive nothing: only for a tag the public schedule makes a broadcast "
                f"({p.tag!r} is not one)",
                **where,
            )
        return blocks

    def _pieces(self, ep: Plan) -> list[int]:
        return [
            min(self._exchange_plan.block_len, a + ep.capacity) - a
            for a in range(0, self._exchange_plan.block_len, ep.capacity)
        ]

    def _labels(self, ep: Plan, blocks: Sequence[int]) -> list[tuple[int, int, int]]:
        """(exchange, block, piece) of each ciphertext of ``blocks``, in the order of :meth:`_c1`."""
        pieces = len(self._pieces(ep))
        return [(self._exchange_plan.exchange, int(b), j) for b in blocks for j in range(pieces)]

    def _c1(self, ep: Plan, blocks: Sequence[int]) -> np.ndarray:
        """The public ``c1`` of this exchange's pieces of ``blocks`` (:func:`.sampling.upload_c1`)."""
        return upload_c1(
            self._seed,
            self.setup.session,
            self._exchange_plan.exchange,
            blocks,
            len(self._pieces(ep)),
            self.params.primes[: ep.level],
            self.params.n,
        )

    # ------------------------------------------------------------------ keys
    def _key_setup(self, inbox: list[Message]) -> _Reply:
        where: dict[str, Any] = dict(tag=KEYS_TAG, round=None, client=self.id)
        req = self._from_server(inbox, "key_setup", where)
        where["round"] = req.round
        if not isinstance(req.payload, dict):
            raise IntegrityError("malformed key set-up message", **where)
        t = time.perf_counter()
        part = envelope_of(req).part
        relayed = [m for m in inbox if m.sender != SERVER]
        out: _Reply
        if part == 0:
            if relayed:
                raise IntegrityError("messages relayed from other clients before key set-up began", **where)
            out = self._make_keys(req, where)
        elif part == DEALER_PART:
            out = self._deal_broadcast_key(req, where)
        else:
            if self.keys is None:
                raise IntegrityError("a key set-up step before this client's key shares", **where)
            self._take_threshold_shares([m for m in relayed if m.tag == THRESHOLD_TAG], where)
            self._setup_relayed += [m for m in relayed if m.tag != THRESHOLD_TAG]
            if part >= ROTATION_PART:
                out = self._deal_next(req, part - ROTATION_PART + 1, where)
            else:
                self._take_public_keys(req, where)
                out = []
        self.setup_s += time.perf_counter() - t
        return out

    def _sign(self, kind: str, key: bytes) -> bytes:
        return sign_public_key(self.signing, kind, self.setup.run_id, self.name, key)

    def _make_keys(self, req: Message, where: dict[str, Any]) -> _Reply:
        self.keys = MPClient(
            self.id, self.ring, self.params, common_polynomial(self._seed, self.params.primes, self.params.n)
        )
        p_r = self._key_shares.recipient_public_key
        public = {"recipient": p_r, "recipient_sig": self._sign(RECIPIENT_KEY, p_r)}
        relayed = self._broadcast_key(public, req.round) if self.id == 0 else []  # client 0 deals the broadcast key
        if self.threshold < self.setup.num_clients:  # t-out-of-n: sent one per call (_deal_next)
            self._to_deal = self._key_shares.deal_threshold_shares(self.threshold, self.setup.num_clients)
        msg = Message(
            req.round,
            KEYS_TAG,
            self.name,
            SERVER,
            "public_key",
            (len(public) // 2, self.params.num_primes, self.params.n),
            0,
            self.mode,
            "",
            public,
            note="p_R = -a s_R + e_R" + (" and p_B" if self.id == 0 else "") + ", owner-signed",
        )
        return [self.seal(msg, "key_setup")] + relayed

    def _broadcast_key(self, public: dict[str, Any], rnd: int, part: int = 0) -> _Reply:
        """Deal the broadcast key: ``p_B`` and its signature into ``public``; ``s_B`` sealed for every other client."""
        p_b = self._key_shares.make_broadcast_key()
        public.update(broadcast=p_b, broadcast_sig=self._sign(BROADCAST_KEY, p_b))
        secret = self._key_shares.broadcast_secret()
        return [
            self.seal_relayed(k, "key_setup", secret, "broadcast secret s_B", "", part, KEYS_TAG, rnd)
            for k in range(self.setup.num_clients)
            if k != self.id
        ]

    def _deal_broadcast_key(self, req: Message, where: dict[str, Any]) -> _Reply:
        """T-out-of-n: deal the broadcast key in place of client 0, which left the set-up at its first step.

        Only once, after this client's own keys and before any Shamir share rotation (IntegrityError otherwise).
        Any client may deal it: every client holds ``s_B`` anyway (broadcast blocks go to all of them).
        """
        if self.threshold == self.setup.num_clients or self.keys is None or self._next_offset != 1 or self.id == 0:
            raise IntegrityError(
                "a request to deal the broadcast key outside t-out-of-n set-up's first steps (or to client 0, "
                "which deals it at the first step)",
                **where,
            )
        if self._dealt_broadcast:
            raise IntegrityError("a second request to deal the broadcast key", **where)
        self._dealt_broadcast = True
        public: dict[str, Any] = {}
        relayed = self._broadcast_key(public, req.round, DEALER_PART)
        msg = Message(
            req.round,
            KEYS_TAG,
            self.name,
            SERVER,
            "public_key",
            (1, self.params.num_primes, self.params.n),
            0,
            self.mode,
            "",
            public,
            note="p_B, owner-signed (client 0 left the key set-up)",
        )
        return [self.seal(msg, "key_setup", DEALER_PART)] + relayed

    def _deal_next(self, req: Message, offset: int, where: dict[str, Any]) -> _Reply:
        """Rotation ``offset`` of the t-out-of-n set-up: this client's Shamir share for client ``(me + offset) mod n``.

        The server asks for the offsets 1..n-1 in order, one call each (IntegrityError otherwise), and relays each
        call's n shares before asking for the next: it never holds more than n of them.  ``skip``: the recipient left
        the set-up, so the share is dropped unsent (the finishing set may then not hold it: :meth:`_take_finishers`).
        """
        K = self.setup.num_clients
        to = (self.id + offset) % K
        if self.threshold == K or offset != self._next_offset or offset >= K or req.payload.get("to") != to:
            raise IntegrityError(
                f"a request for the Shamir share of offset {offset} (to {req.payload.get('to')!r}) where this "
                f"client deals offset {self._next_offset} of 1..{K - 1} (t-out-of-n only), in order",
                **where,
            )
        self._next_offset += 1
        sigma = self._to_deal.pop(to)
        if req.payload.get("skip"):  # the recipient left the set-up: its share is never sent
            self._skipped.add(to)
            return []
        note = f"Shamir share of s_{self.id}"
        return [self.seal_relayed(to, "key_setup", sigma, note, "", SHARE_PART, THRESHOLD_TAG, req.round)]

    def _take_public_keys(self, req: Message, where: dict[str, Any]) -> None:
        relayed, self._setup_relayed = self._setup_relayed, []
        try:
            pk_bytes = bytes(req.payload["broadcast"])
            p_b = encryption.from_bytes(self.ring, pk_bytes, (self.params.num_primes, self.params.n))
            signature = bytes(req.payload["broadcast_sig"])
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed public keys ({e})", **where) from None
        K = self.setup.num_clients
        dealer = 0
        if self.threshold < K:
            dealer = self._take_finishers(req.payload, where)
        if self.id != dealer:  # the dealer compares p_B with its own key below
            check_public_key(
                self.registry, BROADCAST_KEY, self.setup.run_id, client_party(dealer), pk_bytes, signature, where
            )
        fp = key_fingerprint(self.params.describe(), self._seed, pk_bytes)
        if req.fingerprint != fp:
            raise IntegrityError("the server's key fingerprint is not that of the seed and broadcast key", **where)
        if self.id == dealer:
            if not np.array_equal(p_b, self._key_shares.broadcast_pk):
                raise KeySubstitutionError("the server changed the broadcast public key this client dealt", **where)
        else:
            if len(relayed) != 1 or relayed[0].sender != client_party(dealer):
                raise IntegrityError(
                    f"expected the broadcast secret from client {dealer} alone, got {len(relayed)} messages from "
                    f"{sorted({m.sender for m in relayed})}",
                    **where,
                )
            env = envelope_of(relayed[0])
            secret = self.open_relayed(relayed[0], "key_setup", env.part, exchange=env.exchange)
            try:
                self._key_shares.adopt_broadcast_key(secret, p_b)
            except ValueError as e:
                raise IntegrityError(f"broadcast key refused: {e}", **where) from None
        self.fingerprint = fp

    def _take_finishers(self, payload: dict[str, Any], where: dict[str, Any]) -> int:
        """T-out-of-n: the clients that finished the set-up and the broadcast key's dealer, as the server names them.

        Checked (:func:`.threshold.check_finishers`): at least t distinct clients of the run, this one among them,
        and this client holds a Shamir share from each other one and sent its own to each of them; the shares of
        dealers outside them are dropped (they never upload under this run's keys).  Returns the dealer.
        """
        try:
            finishers = [int(k) for k in np.asarray(payload["finishers"], dtype=np.int64).ravel()]
            dealer = int(payload["dealer"])
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed finishing set ({e})", **where) from None
        K = self.setup.num_clients
        check_finishers(finishers, self.id, self.threshold, K, where)
        missing = sorted(set(finishers) - self._key_shares.dealers)
        unsent = sorted(self._skipped & set(finishers))
        dealt = self.id == 0 or self._dealt_broadcast  # this client dealt a broadcast key
        if missing or unsent or self._next_offset != K or not 0 <= dealer < K or (dealer == self.id) != dealt:
            raise IntegrityError(
                f"the key set-up ended before this client received a Shamir share from each client that finished it "
                f"(missing: {missing}) and dealt its own to each of them (dealt {self._next_offset - 1} of {K - 1}, "
                f"unsent: {unsent}), or with broadcast key dealer {dealer} (client 0, or the client asked to deal it "
                "in its place)",
                **where,
            )
        self._key_shares.keep_dealers(finishers)
        self.finishers = frozenset(finishers)
        return dealer

    def _take_threshold_shares(self, relayed: list[Message], where: dict[str, Any]) -> None:
        """Open the Shamir shares of ``s_i`` relayed in this call (at most one per other client i, ever)."""
        K = self.setup.num_clients
        for msg in relayed:
            dealer = party_client(msg.sender)
            if self.threshold == K or dealer is None or dealer == self.id or dealer in self._key_shares.dealers:
                raise IntegrityError(
                    f"a Shamir share from {msg.sender} where this client takes one from each other client once "
                    "(t-out-of-n only)",
                    **where,
                )
            env = envelope_of(msg)
            secret = self.open_relayed(msg, "key_setup", SHARE_PART, exchange=env.exchange)
            try:
                sigma = encryption.from_bytes(self.ring, secret, (self.params.num_primes, self.params.n))
            except ValueError as e:
                raise IntegrityError(f"malformed Shamir share from {msg.sender} ({e})", **where) from None
            self._key_shares.adopt_threshold_share(dealer, sigma)

    def _recipient_key(self, to: int, offered: dict[int, Any], where: dict[str, Any]) -> np.ndarray:
        """Recipient ``to``'s public key ``p_R``, checked.

        Recipient ``to``'s ``p_R``: this client's own, one checked before, or one in this request
        signed by ``to``'s identity key (KeySubstitutionError otherwise).
        """
        if to == self.id:
            return self._key_shares._own.p_hat
        if to in self.recipient_keys:
            return self.recipient_keys[to]
        if not 0 <= to < self.setup.num_clients or to not in offered:
            raise RecipientKeyError(
                f"a key switch to recipient {to}, which is no client of this run or whose "
                "owner-signed key was not sent",
                **where,
            )
        try:
            key, signature = bytes(offered[to]["key"]), bytes(offered[to]["sig"])
            p_r = encryption.from_bytes(self.ring, key, (self.params.num_primes, self.params.n))
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed recipient key ({e})", **where) from None
        check_public_key(self.registry, RECIPIENT_KEY, self.setup.run_id, client_party(to), key, signature, where)
        self.recipient_keys[to] = p_r
        return p_r

    def _masks(
        self, ep: Plan, to: int, blocks: Sequence[int], active: list[int] | None = None, context: str = ""
    ) -> np.ndarray:
        """This client's zero-sum masks of the ciphertexts of ``blocks`` switched to ``to``.

        One mask per (block, piece) (:func:`.sampling.pairwise_mask`), labelled by the session, the digest of the
        plan this client holds (:func:`common_plan_digest`), the digest of the broadcasts it trained on
        (:mod:`protocols.broadcast_view`), the exchange, the recipient, the block and the piece: they cancel only if
        every client holds the same plan and was sent the same broadcasts. t-out-of-n: the masks are over the active
        set ``active`` and ``context`` (a digest of the active set and the uploaders) joins the label: they cancel
        only among clients told the same.
        """
        if self._pair_seeds is None:
            self._pair_seeds = {
                k: self.channel.pair_seed(
                    client_party(k), self._peer_channel(client_party(k)), self.setup.run_id, "ckks-mp/keyswitch-mask"
                )
                for k in range(self.setup.num_clients)
                if k != self.id
            }
        view = self.view_digest().hex()  # the broadcasts this client trained on (protocols.broadcast_view)
        plan = f"{common_plan_digest(self._exchange_plan)}{context}"
        prefix = f"{self.setup.session.hex()}/{plan}/{view}/{self._exchange_plan.exchange}/{to}"
        labels = [f"{prefix}/{b}/{j}" for b in blocks for j in range(len(self._pieces(ep)))]
        seeds = self._pair_seeds if active is None else {k: v for k, v in self._pair_seeds.items() if k in active}
        return pairwise_mask(seeds, self.id, labels, self.params.primes[: ep.switch_level], self.params.n)

    # ------------------------------------------------------------------ upload
    def _table(self) -> _Table:
        """This exchange's contribution, checked against the public plan before anything is encrypted."""
        table = self._state[1]
        if table is None:
            p, K = self._exchange_plan, self.setup.num_clients
            ids, vals = check_block_table(p, self.id, self.contribution(), K)
            lo, hi, offset = per_client_limits(p.spec, p.dp_noise_std, K)
            bad = find_violation(vals, lo, hi, p.spec.integer)
            if bad is not None:
                i, v, why = bad
                raise BoundError(
                    f"entry {i % p.block_len} of block {int(ids[i // p.block_len])} is {v:g}, which "
                    f"{why} of this exchange ({self._plan().describe()}; ValueSpec "
                    f"max_abs={p.spec.max_abs:g}, sum_max={p.spec.sum_max}"
                    + (f", DP offset {offset}" if offset else "")
                    + "). Nothing was encrypted. Fix: "
                    "clip the values or declare a larger public bound",
                    **self.where(),
                )
            table = (np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=np.float64))
            self._state = (p.exchange, table)
        return table

    def _block_ids(self) -> _Reply:
        if self.id not in self._exchange_plan.contributors:
            return []
        ids, _ = self._table()
        msg = self.message(
            SERVER,
            "metadata",
            (ids.size,),
            {"block_ids": ids.astype(np.int32)},
            self.fingerprint,
            note="block ids of the sparse layout",
        )
        return [self.seal(msg, "block_ids")]

    def _upload(self) -> _Reply:
        p = self._exchange_plan
        if self.id not in p.contributors:
            return []
        if self._last_upload is not None and self._last_upload >= p.exchange:
            raise RepeatedUploadError(
                f"a second upload request for exchange {p.exchange}: its ciphertexts would "
                "share the first one's c1 and reveal the difference of the inputs",
                **self.where(),
            )
        if self._last_switch is not None and self._last_switch >= p.exchange:
            raise RepeatedUploadError("an upload after this client's key switch of the exchange", **self.where())
        self._last_upload = p.exchange
        ep = self._plan()
        ids, vals = self._table()
        t = time.perf_counter()
        data = self._key_shares.encrypt_blocks(ep, vals, self._c1(ep, ids.tolist()), self._labels(ep, ids.tolist()))
        self.timing["upload_s"] = time.perf_counter() - t
        pieces = len(self._pieces(ep))
        msg = self.message(
            SERVER,
            "ciphertext",
            (ids.size, p.block_len),
            data,
            self.fingerprint,
            note=f"{ids.size * pieces} ciphertexts (c0; c1 public), {ep.describe()}",
        )
        return [self.seal(msg, "upload")]

    # ------------------------------------------------------------------ partial decryption (PCKS shares)
    def _keyswitch(self, inbox: list[Message]) -> _Reply:
        where = self.where()
        K, p = self.setup.num_clients, self._exchange_plan
        t_of_n = self.threshold < K
        switched = self._last_switch is not None and self._last_switch >= p.exchange
        switch = self._switch if self._switch is not None and self._switch.exchange == p.exchange else None
        if switched and switch is None:  # a refused request ends the exchange's key switch: never a second one
            raise RepeatedKeySwitchError("a second key-switching request in this exchange", **where)
        # t-out-of-n: a contributor that missed its upload may still key-switch the others' uploads
        # (the uploaders then exclude it, checked in _active_set)
        if self.id in p.contributors and self._last_upload != p.exchange and not t_of_n:
            raise KeySwitchRefusedError("a key-switching request before this client's upload of the exchange", **where)
        parts = [envelope_of(m).part for m in inbox if m.sender == SERVER]
        if switch is not None and parts and min(parts) <= switch.part:
            raise RepeatedKeySwitchError(
                f"a key-switching request of part {min(parts)} after this client answered part {switch.part} of the "
                "exchange: each request of a key switch comes once, in order",
                **where,
            )
        # parts below DEALER_PART / (n + 1): the shares' parts (:func:`share_part`) stay below the set-up's
        req = self._from_server(inbox, "keyswitch", where, range(DEALER_PART // (K + 1)))
        if t_of_n and envelope_of(req).part == 0:  # the liveness probe (before any request): commit to nothing
            msg = self.message(SERVER, "control", (), {}, self.fingerprint, note="ready to key-switch")
            return [self.seal(msg, "keyswitch", READY_PART)]
        self._last_switch = p.exchange
        try:
            return self._switch_batch(req, switch, where)
        except BaseException:  # a refused batch ends the exchange's key switch for this client
            self._switch = None
            self._key_shares.forget_upload()
            raise

    def _switch_batch(self, req: Message, switch: _Switch | None, where: dict[str, Any]) -> _Reply:
        """Answer one key-switching request (one batch): check it against the exchange's planned switch, compute shares.

        The request that opens the switch (the first batch) names the planned switch (``planned``: every key's blocks;
        t-out-of-n also the uploaders and each block's), checked whole (:meth:`_open_switch`); every batch must hold
        only planned (key, block) pairs not switched before (UnplannedKeySwitchError, RepeatedKeySwitchError), so the
        union of the batches is at most the planned switch, and a batch after it is complete is refused.  t-out-of-n:
        every batch names the active set the opening request named (ActiveSetError otherwise); only a re-plan, which
        names the planned switch again, changes it (:meth:`_check_replan`).
        """
        K, p = self.setup.num_clients, self._exchange_plan
        t_of_n = self.threshold < K
        ep = self._plan()
        fields = KEYSWITCH_FIELDS | ({ACTIVE_FIELD} if t_of_n else set())
        opening = fields | {PLANNED_FIELD}
        allowed = [opening] if switch is None else [fields, opening] if t_of_n else [fields]
        if not isinstance(req.payload, dict) or set(req.payload) not in allowed:
            got = sorted(req.payload) if isinstance(req.payload, dict) else type(req.payload).__name__
            raise KeySwitchRefusedError(
                f"a key-switching request with fields {got}, expected {sorted(allowed[0])}: clients compute every c1 "
                "themselves, and only the first batch of an exchange names its planned switch (t-out-of-n: also the "
                "first of a re-plan)",
                **where,
            )
        groups, blocks = self._groups(req.payload, where)
        try:
            offered = {int(r): v for r, v in dict(req.payload["keys"]).items()}
        except (TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"malformed key-switching request ({e})", **where) from None
        part = int(envelope_of(req).part)
        if PLANNED_FIELD in req.payload:
            switch = self._open_switch(ep, req.payload, switch, offered, part, where)
        else:
            switch = cast(_Switch, switch)  # a request without the planned switch continues one (fields above)
            named = self._named_active(req.payload, where) if t_of_n else None
            if named is not None and tuple(named) != switch.active:
                raise ActiveSetError(
                    f"a batch names active set {named}, but this key switch's (re-)plan named "
                    f"{list(switch.active or ())}: the active set is fixed for a switch's batches (other Lagrange "
                    "weights on the same uploads), and only a re-plan, naming the planned switch again, changes it",
                    **where,
                )
            if switch.complete:
                raise RepeatedKeySwitchError(
                    "a key-switching batch after this client switched every block of the exchange's planned switch",
                    **where,
                )
        pieces = len(self._pieces(ep))
        jobs, start = [], 0
        for to, count in groups.tolist():
            bids = blocks[start : start + count].tolist()
            start += count
            key = "the broadcast key" if to < 0 else f"recipient {to}'s key"
            if len(set(bids)) != len(bids):
                raise RepeatedKeySwitchError(f"a block switched twice to {key} in one batch", **where)
            unplanned = sorted(set(bids) - switch.planned.get(to, frozenset()))
            if unplanned:
                raise UnplannedKeySwitchError(
                    f"a batch switches block(s) {unplanned[:8]} to {key}, which the exchange's planned switch does "
                    "not: a batch may only hold (key, block) pairs of the plan named by the first batch",
                    **where,
                )
            again = sorted(set(bids) & switch.done.get(to, set()))
            if again:
                raise RepeatedKeySwitchError(
                    f"block(s) {again[:8]} switched to {key} again in a later batch of this exchange", **where
                )
            pk = self._key_shares.broadcast_pk if to < 0 else self._recipient_key(to, offered, where)
            jobs.append((to, bids, pk))
        smudge = smudging_bits(self.params, K)
        active = list(switch.active) if switch.active is not None else None
        designated = self.id == (min(active) if active is not None else 0)  # subtracts s_B c1 (CKS)
        mine = set(self._table()[0].tolist()) if self.id in p.contributors else set()
        t = time.perf_counter()
        out = []
        for g, (to, bids, pk) in enumerate(jobs):
            c1, labels = self._c1(ep, bids), self._labels(ep, bids)
            if active is None:  # s_i c1 only for the blocks this client uploaded
                keyed = np.repeat([b in mine for b in bids], pieces)
                threshold = None
            else:  # each ciphertext's key: the Lagrange-weighted shares of its block's uploaders
                keyed = np.ones(len(bids) * pieces, dtype=bool)
                threshold = ([switch.uploaders[b] for b in bids for _ in range(pieces)], active)
            masks = self._masks(ep, to, bids, active, switch.context)
            if to < 0:
                data = self._key_shares.cks_shares(
                    c1, labels, keyed, masks, smudge, ep.switch_level, designated, threshold
                )
                note = "CKS shares to the broadcast key"
            else:
                data = self._key_shares.pcks_shares(c1, labels, keyed, masks, pk, smudge, ep.switch_level, threshold)
                note = f"PCKS shares to recipient {to}'s key"
            msg = self.message(SERVER, "share", (len(bids) * pieces,), data, self.fingerprint, note=note)
            out.append(self.seal(msg, "keyswitch", share_part(part, g, K)))
            switch.done.setdefault(to, set()).update(bids)
        self.switched += int(groups[:, 1].sum()) * pieces
        switch.part = part
        self._switch = switch
        if t_of_n or switch.complete:  # the products kept from the upload go with the exchange's key switch
            self._key_shares.forget_upload()
        self.timing["keyswitch_s"] = self.timing.get("keyswitch_s", 0.0) + time.perf_counter() - t
        return out

    def _open_switch(
        self,
        ep: Plan,
        payload: dict[str, Any],
        previous: _Switch | None,
        offered: dict[int, Any],
        part: int,
        where: dict[str, Any],
    ) -> _Switch:
        """The key switch a request naming the planned switch opens, checked whole before any share is computed.

        The planned switch (:meth:`_check_planned`) within the run's smudging budget (SmudgingBudgetError);
        t-out-of-n also the active set and the uploaders (:meth:`_active_set`) and the re-plan rules against the
        exchange's earlier (re-)plans (:meth:`_check_replan`).
        """
        K, p = self.setup.num_clients, self._exchange_plan
        t_of_n = self.threshold < K
        planned = payload[PLANNED_FIELD]
        fields = THRESHOLD_PLANNED_FIELDS if t_of_n else PLANNED_FIELDS
        if not isinstance(planned, dict) or set(planned) != fields:
            got = sorted(planned) if isinstance(planned, dict) else type(planned).__name__
            raise KeySwitchRefusedError(f"a planned switch with fields {got}, expected {sorted(fields)}", **where)
        groups, blocks = self._groups(planned, where)
        switch = _Switch(p.exchange, self._check_planned(ep, groups, blocks, offered, where), part)
        if t_of_n:
            mine = set(self._table()[0].tolist()) if self.id in p.contributors else set()
            active, uploaders, uploaded = self._active_set(payload, blocks, mine, where)
            self.check_noise_allowance(uploaders)  # distributed DP: at most --dp-dropouts missing
            self.released_over(p, uploaders)  # a related-input group: one set per round
            binding = hashlib.sha256(
                b"/".join(np.asarray(x).astype("<i8").tobytes() for x in (groups, blocks, uploaders, uploaded))
            ).digest()
            switch.replan = self._check_replan(previous.replan if previous else None, binding, active, where)
            switch.active = tuple(active)
            switch.uploaders = {b: tuple(np.nonzero(row)[0].tolist()) for b, row in zip(blocks.tolist(), uploaded)}
            digest = hashlib.sha256(
                np.asarray(active, dtype="<i8").tobytes()
                + b"/"
                + np.asarray(uploaders, dtype="<i8").tobytes()
                + b"/"
                + uploaded.tobytes()
            ).hexdigest()
            switch.context = f"/active:{digest}"
        total = sum(len(bids) for bids in switch.planned.values()) * len(self._pieces(ep))
        if self.switched + total > self.params.max_keyswitches:
            raise SmudgingBudgetError(
                f"{total} more key-switched ciphertexts would exceed this run's budget of "
                f"{self.params.max_keyswitches} ({self.switched} done), past which the "
                f"smudging's total distance exceeds 2^-{TOTAL_DISTANCE_BITS}. Fix: raise "
                "MPParams.max_keyswitches (a larger smudging noise)",
                **where,
            )
        return switch

    def _groups(self, table: Any, where: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """A request's groups ``[(key, count)]`` and the blocks they partition, checked.

        Keys: -1 (the broadcast key) or a client, at most one group each; blocks of this exchange (IntegrityError,
        RecipientKeyError, RepeatedKeySwitchError).
        """
        try:
            groups = np.asarray(table["groups"], dtype=np.int64).reshape(-1, 2)
            blocks = np.asarray(table["blocks"], dtype=np.int64).ravel()
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"malformed key-switching request ({e})", **where) from None
        if (
            groups[:, 1].min(initial=0) < 0
            or groups[:, 1].sum() != blocks.size
            or blocks.size
            and (blocks.min() < 0 or blocks.max() >= self._exchange_plan.num_blocks)
        ):
            raise IntegrityError("key-switching groups do not partition blocks of this exchange", **where)
        recipients = groups[:, 0].tolist()
        if len(set(recipients)) != len(recipients):
            raise RepeatedKeySwitchError(
                f"key-switching groups {recipients}: one per recipient and at most one to the broadcast key", **where
            )
        strangers = [to for to in recipients if not -1 <= to < self.setup.num_clients]
        if strangers:
            raise RecipientKeyError(
                f"a key switch to recipient {strangers[0]}: the broadcast key is -1, clients are "
                f"0..{self.setup.num_clients - 1}",
                **where,
            )
        return groups, blocks

    def _check_planned(
        self, ep: Plan, groups: np.ndarray, blocks: np.ndarray, offered: dict[int, Any], where: dict[str, Any]
    ) -> dict[int, frozenset[int]]:
        """The exchange's planned switch (key -> blocks), checked against the plan's switch per block.

        Every recipient's key is its owner's signed ``p_R`` (:meth:`_recipient_key`, from ``offered`` or checked
        before); the broadcast key's group must hold exactly the plan's broadcast blocks (DowngradeError) and no
        recipient's group one of them (RecipientKeyError); no block twice in a group (RepeatedKeySwitchError).
        """
        shared = self._broadcast_blocks(self._exchange_plan).tolist()  # checked by _plan
        planned: dict[int, frozenset[int]] = {}
        start = 0
        for to, count in groups.tolist():
            bids = blocks[start : start + count].tolist()
            start += count
            if len(set(bids)) != len(bids):
                raise RepeatedKeySwitchError(f"a block switched twice to one key in group {to}", **where)
            if to < 0 and bids != shared:
                scoped = sorted(set(bids) - set(shared))
                raise DowngradeError(
                    f"blocks {bids[:8]} to the broadcast key, but the plan switches exactly {shared[:8]} "
                    f"({len(shared)} blocks) to it"
                    + (f": block(s) {scoped[:8]} are scoped and may not go to every client" if scoped else ""),
                    **where,
                )
            if to >= 0:
                self._recipient_key(to, offered, where)
            twice = sorted(set(bids) & set(shared)) if to >= 0 else []
            if twice:
                raise RecipientKeyError(
                    f"a key switch of block(s) {twice[:8]} to recipient {to} where the plan switches them to the "
                    "broadcast key" + (" (its levels are sized for that switch's noise)" if ep.broadcast else ""),
                    **where,
                )
            planned[to] = frozenset(bids)
        return planned

    def _check_replan(
        self, answered: Replan | None, binding: bytes, active: list[int], where: dict[str, Any]
    ) -> Replan:
        """T-out-of-n: refuse a key switch that could release anything but the exchange's one result.

        The request that opens the exchange's key switch fixes its ``binding`` (the planned switch's groups, blocks,
        uploaders ``U`` and per-block rows: everything that decides what the shares decrypt to).  A later opening --
        the server re-planning the batches left after a member of the active set was lost -- is answered only with
        the same binding, an active set not answered before, and none of the clients an earlier active set lost
        (RepeatedKeySwitchError otherwise): every answer then releases the same ``s_U c1`` under fresh masks and
        smudging, and each re-plan leaves out at least one more client, so there are at most ``n - t`` of them.
        Returns the updated record.
        """
        if answered is None:
            return Replan(binding, [tuple(active)], frozenset())
        if binding != answered.binding:
            raise RepeatedKeySwitchError(
                "a second key-switching request in this exchange for other blocks, recipients or uploaders: a "
                "re-plan may change only the active set, or the two answers would release two different sums",
                **where,
            )
        back = sorted(answered.lost & set(active))
        if tuple(active) in answered.active_sets or back:
            raise RepeatedKeySwitchError(
                f"a re-plan with active set {active}: answered before, or bringing back client(s) {back} that an "
                "earlier active set lost",
                **where,
            )
        lost = answered.lost.union(*(set(a) - set(active) for a in answered.active_sets))
        return Replan(binding, answered.active_sets + [tuple(active)], frozenset(lost))

    def _named_active(self, payload: dict[str, Any], where: dict[str, Any]) -> list[int]:
        """The active set a t-out-of-n request names (IntegrityError when malformed)."""
        try:
            return [int(k) for k in np.asarray(payload[ACTIVE_FIELD], dtype=np.int64).ravel()]
        except (TypeError, ValueError) as e:
            raise IntegrityError(f"malformed active set ({e})", **where) from None

    def _active_set(
        self, payload: dict[str, Any], blocks: np.ndarray, mine: set[int], where: dict[str, Any]
    ) -> tuple[list[int], list[int], np.ndarray]:
        """The checked active set, uploaders and per-block uploaders of a t-out-of-n request opening a switch.

        The active set ``A`` (the request's) and the uploaders ``U`` and their rows (its planned switch's), checked
        (ActiveSetError): ``A`` exactly t distinct clients of the run, this one among them; ``U`` within the plan's
        contributors, at most n - t of them missing and at least the run's minimum contributors (a server declaring
        honest uploads dropped cannot shrink a sum below it), this client in ``U`` exactly when it uploaded;
        ``uploaded`` (one row per planned block, one column per client) within ``U``, for this client exactly its own
        blocks, and one row per block wherever it appears (two rows would key-switch two sums of one block, to two
        recipients, whose difference is an uploader's input).  Returns (A, U, uploaded).
        """
        K, t = self.setup.num_clients, self.threshold
        active = self._named_active(payload, where)
        try:
            uploaders = [int(k) for k in np.asarray(payload[PLANNED_FIELD]["uploaders"], dtype=np.int64).ravel()]
            uploaded = np.asarray(payload[PLANNED_FIELD]["uploaded"], dtype=np.uint8).reshape(blocks.size, K)
        except (TypeError, ValueError) as e:
            raise IntegrityError(f"malformed uploaders ({e})", **where) from None
        strangers = sorted({k for k in active + uploaders if not 0 <= k < K})
        if strangers:
            raise ActiveSetError(f"the request names client(s) {strangers}, not among this run's 0..{K - 1}", **where)
        unkeyed = sorted(set(active + uploaders) - self.finishers)
        if unkeyed:
            raise ActiveSetError(
                f"the request names client(s) {unkeyed}, which did not finish the key set-up (finishers: "
                f"{sorted(self.finishers)})",
                **where,
            )
        if len(active) != t or len(set(active)) != t or active != sorted(active):
            raise ActiveSetError(
                f"an active set of {len(set(active))} distinct client(s) {active}: t-out-of-n key switching "
                f"needs exactly t = {t}, sorted",
                **where,
            )
        if self.id not in active:
            raise ActiveSetError(f"asked to key-switch by an active set {active} without this client", **where)
        contributors = set(int(k) for k in self._exchange_plan.contributors)
        uploaded_myself = self.id in contributors and self._last_upload == self._exchange_plan.exchange
        missing = contributors - set(uploaders)
        fewest = self.setup.collusion.min_contributors
        if (
            len(set(uploaders)) != len(uploaders)
            or not set(uploaders) <= contributors
            or len(missing) > K - t
            or len(uploaders) < fewest
            or (self.id in uploaders) != uploaded_myself
        ):
            raise ActiveSetError(
                f"uploaders {uploaders}: they must be at least {fewest} (the run's minimum contributors) "
                f"distinct contributors of the plan with at most n - t = {K - t} missing (here "
                f"{sorted(missing)}), and name this client's own upload ({'made' if uploaded_myself else 'none'})",
                **where,
            )
        outside = np.ones(K, dtype=bool)
        outside[uploaders] = False
        own = np.array([b in mine for b in blocks.tolist()], dtype=bool) & uploaded_myself
        if (uploaded > 1).any() or uploaded[:, outside].any() or not np.array_equal(uploaded[:, self.id] == 1, own):
            raise ActiveSetError(
                "the per-block uploaders name a client outside the uploaders, or misreport this client's own blocks",
                **where,
            )
        row_of: dict[int, bytes] = {}
        for b, row in zip(blocks.tolist(), uploaded):
            if row_of.setdefault(b, row.tobytes()) != row.tobytes():
                raise ActiveSetError(
                    f"block {b} named with two different sets of uploaders (in two groups): two sums of one block, "
                    "whose difference is an uploader's input",
                    **where,
                )
        return active, uploaders, uploaded

    # ------------------------------------------------------------------ download
    def _download(self, inbox: list[Message]) -> _Reply:
        p = self._exchange_plan
        if self.id not in p.requests:
            return []
        where = self.where()
        msg = self._from_server(inbox, "download", where)
        unfinished = self._switch is None or self._switch.exchange != p.exchange or not self._switch.complete
        if self.threshold == self.setup.num_clients and unfinished:
            raise IntegrityError(
                "a download before this client switched every block of the exchange's planned switch", **where
            )
        ep = self._plan()
        lengths = self._pieces(ep)
        bids = p.requests[self.id]
        t = time.perf_counter()
        try:
            to = int(msg.payload["to"])
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed download ({e})", **where) from None
        if to != self.id:
            err = DowngradeError if to == -1 else RecipientKeyError
            raise err(
                f"a download addressed to {'the broadcast key' if to == -1 else f'client {to}'}: each recipient's "
                "download carries the plan's broadcast blocks as c0' and its other blocks switched to its own key",
                **where,
            )
        # the plan's broadcast blocks: c0' only (their c1 is public); this client's other blocks: the pair (c0', c1')
        shared = self._broadcast_blocks(p)  # checked by _plan: all of them among this client's blocks
        scoped = bids[~np.isin(bids, shared)]
        pieces = len(lengths)
        try:
            c0 = encryption.from_bytes(
                self.ring, msg.payload["broadcast"], (shared.size * pieces, ep.switch_level, ep.n)
            )
            pairs = encryption.from_bytes(
                self.ring, msg.payload["data"], (scoped.size * pieces, 2, ep.switch_level, ep.n)
            )
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed download ({e})", **where) from None
        values: dict[int, np.ndarray] = {}
        if shared.size:
            decoded = _MEMO.decrypt(
                (self.fingerprint, self.setup.run_id, self.setup.session, p.exchange, shared.tobytes()),
                bytes(msg.payload["broadcast"]),
                lambda: self._decode(ep, c0, shared, lengths, True),
            )
            values.update(zip(shared.tolist(), decoded))
        if scoped.size:
            values.update(zip(scoped.tolist(), self._decode(ep, pairs, scoped, lengths, False)))
        self.timing["download_s"] = time.perf_counter() - t
        blocks = {int(b): values[int(b)] for b in bids.tolist()}
        if self.schedule is not None and self.schedule.commits_decoded(p.tag):  # delivered once the commitment checks
            self._released = (p.exchange, blocks)
            digests = b"".join(self._release_digest(b, v) for b, v in blocks.items())
            msg = self.message(SERVER, "metadata", (len(blocks),), {"digests": digests}, self.fingerprint)
            return [self.seal(msg, "download")]
        self.deliver(blocks)
        return []

    def _release_digest(self, block: int, values: np.ndarray) -> bytes:
        """``HMAC-SHA256(k_B, exchange || block || values)``: what the server commits to for a released block.

        ``k_B = SHA-256(domain || run || s_B)``: the clients' broadcast secret keys it, so the server cannot test
        guesses of a block it does not receive (a colluding client can).
        """
        if self._release_key is None:
            self._release_key = hashlib.sha256(
                RELEASE_KEY_DOMAIN + self.setup.run_id + self._key_shares.broadcast_secret()
            ).digest()
        body = int(self._exchange_plan.exchange).to_bytes(8, "big") + int(block).to_bytes(8, "big")
        return hmac.new(self._release_key, body + np.ascontiguousarray(values, "<f8").tobytes(), "sha256").digest()

    def _release(self, inbox: list[Message]) -> _Reply:
        """Check this client's released blocks against the server's commitment, chain its root, deliver them."""
        p, where = self._exchange_plan, self.where()
        if self.schedule is None or not self.schedule.commits_decoded(p.tag):
            raise IntegrityError(
                "a release commitment for an exchange the schedule neither releases nor gives the statistic role",
                **where,
            )
        msg = self._from_server(inbox, "release", where)
        try:
            root, proof = bytes(msg.payload["root"]), bytes(msg.payload["proof"])
        except (KeyError, TypeError, ValueError):
            root, proof = b"", b""
        pending = self._released[1] if self._released is not None and self._released[0] == p.exchange else {}
        if p.requests.get(self.id) is not None and len(p.requests[self.id]) and not pending:
            raise IntegrityError("a release commitment before this client's download", **where)
        own = {b: leaf(b, self._release_digest(b, v)) for b, v in pending.items()}
        if len(root) != DIGEST_BYTES or (own and not verify(root, p.num_blocks, own, proof)):
            raise InconsistentViewError(
                "the rows of this released sum are not part of the sum the server committed to (or no commitment "
                "came with them): the server may be handing different clients different sums; nothing was delivered",
                **where,
            )
        self.views.release(p.tag, p.round, root)
        self._released = None
        if p.requests.get(self.id) is not None:
            self.deliver(pending)
        return []

    def _decode(self, ep: Plan, cts: np.ndarray, bids: np.ndarray, lengths: list[int], broadcast: bool) -> np.ndarray:
        """Decrypt and decode the delivered blocks.

        Returns ``[len(bids), block_len]``. Raises IntegrityError when a residual exceeds the worst-case noise bound
        or a field is out of range.
        """
        decoded: list[tuple[np.ndarray, int, bool]]
        if not bids.size:
            decoded = []
        elif broadcast:  # c0' only: c1 is the public one this client recomputes
            blocks = bids.tolist()
            decoded = self._key_shares.decrypt_broadcast(
                ep, cts, self._labels(ep, blocks), lambda: self._c1(ep, blocks), lengths * bids.size
            )
        else:
            decoded = self._key_shares.decrypt_delivery(ep, cts, lengths * bids.size)
        out = np.zeros((bids.size, self._exchange_plan.block_len))
        for i, b in enumerate(bids.tolist()):
            parts = []
            for j in range(len(lengths)):
                fields, residual, in_range = decoded[i * len(lengths) + j]
                if residual > ep.noise_bound or not in_range:
                    why = (
                        f"noise 2^{math.log2(residual):.1f} above the worst-case bound "
                        f"2^{math.log2(ep.noise_bound):.1f}"
                        if residual > ep.noise_bound
                        else "a packed field out of range"
                    )
                    bound = self.schedule is not None and self.schedule.binds_views(self._exchange_plan.tag)
                    if bound or self.view_digest() != EMPTY_VIEW:
                        raise InconsistentViewError(
                            f"block {b} of an exchange bound to what the clients received decrypts with {why}: "
                            "the clients' key-switching masks did not cancel, so they hold different plans or were "
                            "sent different broadcasts or released sums to train on (model inconsistency), or a "
                            "share or ciphertext was corrupted; nothing was delivered",
                            **self.where(),
                        )
                    raise IntegrityError(
                        f"block {b} decrypts with {why}: a key-switching share or ciphertext was "
                        "corrupted; nothing was delivered",
                        **self.where(),
                    )
                parts.append(encoding.dequantize(fields, ep))
            out[i] = np.concatenate(parts)
        return out
