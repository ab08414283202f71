"""The client half of ``mask``: one handler per stage of the link (``stage_<name>``).

Its mask key pair (one per run), its self-mask seeds, the shares it holds for its peers and its
copy of the output-mask group seed never leave it, except as channel ciphertexts and the
unmasking answers; every plan, key broadcast, survivor set and unmasking request is checked
before it is used (the protocol and its stages: :mod:`.backend`).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ..broadcast_view import EMPTY_VIEW
from ..errors import (
    ConsistencyError,
    InconsistentViewError,
    IntegrityError,
    ThresholdRefusedError,
    UnmaskingRefusedError,
)
from ..party import ClientHalf, Provider, envelope_of
from ..plan import ExchangePlan
from ..plan_policy import collusion_bound
from ..release_commitment import block_leaf, verify
from ..transcript import SERVER, Message, client_party, party_client
from .keys import (
    SIGNED_KEY_BYTES,
    ExchangeBinding,
    MaskKeyPair,
    check_signed_mask_key,
    new_secret_seed,
    output_mask_key,
    output_mask_keys,
    signed_mask_key,
)
from .prg import ranked_mask, ring_mask
from .public import (
    COMMITMENT_BYTES,
    SURVIVOR_MAC_BYTES,
    mask_fingerprint,
    positions,
    read_words,
    shamir_threshold,
    share_commitment,
    stream_ids,
)
from .quantize import FixedPoint
from .shamir import SHARE_BYTES, Share, split_secret

#: (contributors, threshold): the key of a contributor set's self-mask seed batches
_BatchKey = tuple[tuple[int, ...], int]


@dataclass
class Participant:
    """Client-side state of one participant for one exchange (its secrets stay here)."""

    ids: np.ndarray  # block ids it contributes (sorted)
    encoded: np.ndarray | None  # [n_blocks, L] ring elements (freed after the upload)
    common: dict[int, np.ndarray] = field(default_factory=dict)  # peer -> shared block ids
    self_seed: bytes | None = None  # b_k of this exchange
    seeds: dict[int, bytes] = field(default_factory=dict)  # peer -> pairwise seed of this exchange
    held: dict[int, Share] = field(default_factory=dict)  # owner -> its b_owner share of this exchange


@dataclass
class _SelfMaskBatch:
    """Self-mask seeds of a run of exchanges of one contributor set.

    Self-mask seeds ``b^(s)`` for exchanges ``first .. first + len - 1`` of one (contributor set,
    threshold): the owner keeps ``seeds``; each holder keeps its ``shares`` of them.
    """

    first: int
    values: list[Any]  # bytes (the owner's seeds) or Share (a holder's shares)

    def at(self, seq: int) -> Any:
        """The entry for exchange ``seq``, or ``None`` outside the batch."""
        return self.values[seq - self.first] if self.first <= seq < self.first + len(self.values) else None


def _parse_batch(raw: bytes, size: int, ctx: ExchangePlan, owner: int) -> list[Share]:
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


#: domain separator of the survivor set every survivor signs in the consistency round
SURVIVORS_DOMAIN = b"secure-fgl/mask-survivors/v1"


def survivor_statement(
    run_id: bytes, session: bytes, seq: int, tag: str, rnd: int, survivors: Sequence[int], view: bytes = EMPTY_VIEW
) -> bytes:
    """The bytes a survivor signs in the consistency round.

    See Bonawitz et al. §4, ConsistencyCheck: the run, session and exchange, the sorted survivor set and the digest of
    the broadcasts the signer trained on (:mod:`protocols.broadcast_view`), length-prefixed.
    """
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


def survivor_mac(key: bytes, sender: int, receiver: int, statement: bytes) -> bytes:
    """Survivor ``sender``'s MAC of ``statement`` for survivor ``receiver``.

    ``HMAC-SHA256(k_{sender,receiver}, sender || receiver || statement)`` with the pair's consistency
    key (:meth:`.keys.MaskKeyPair.consistency_key`): the pairwise-MAC form of a signature of the
    survivor set (Bonawitz et al. §4, ConsistencyCheck).  The direction is bound, so a MAC is never
    accepted back by its own sender, nor by any client but ``receiver``.
    """
    return hmac.digest(key, int(sender).to_bytes(4, "big") + int(receiver).to_bytes(4, "big") + statement, "sha256")


def _unmask_answer(
    st: Participant, want_pairwise: list[int], want_self: list[int], ctx: ExchangePlan, responder: int
) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """An honest client's answer to the server's unmasking request.

    See Bonawitz et al. §4, round Unmasking, with the pairwise seeds of this exchange in place of the dropped clients'
    key shares. Its pairwise seed with each dropped peer OR its share of each survivor's self-mask seed, never both
    for one client — both would let the server unmask that client's input. Shares it does not hold are left out (the
    server needs ``t`` of them).
    """
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


def _masked(
    st: Participant, k: int, L: int, dtype: np.dtype, sid: dict[str, bytes], out_keys: tuple[bytes, ...]
) -> np.ndarray:
    """Client ``k``'s masked upload.

    Client ``k``'s upload: ``q(x_k) + sum_j +-PRG(s_kj) + PRG(b_k) + R_k`` mod ``2^b``, with
    ``R_k = P_k - P_{k+1}`` from ``out_keys`` (empty: no output mask; one key: ``P_{k+1} = 0``).
    """
    y: np.ndarray = cast(np.ndarray, st.encoded).copy()
    for j, seed in st.seeds.items():
        c = st.common[j]
        m = ranked_mask(seed, sid["pairwise"], c.size, L, dtype)
        pos = positions(st.ids, c)
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
    its last one (-1) cost a stream.
    """
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


class MaskClient(ClientHalf):
    """One client of the mask protocol.

    Its mask key pair (one per run), self-mask seeds, the shares it holds for its peers and its copy of the group
    seed never leave this object (except as channel ciphertexts and the unmasking answers of step 5).
    """

    mode = "mask"

    def __init__(self, client_id: int, setup: bytes, provider: Provider | None = None):
        super().__init__(client_id, setup, provider)
        self.options = self.setup.options
        self.fingerprint = mask_fingerprint(self.setup.num_clients, self.options)
        self.group_seed: bytes | None = None
        self.mask_keys: MaskKeyPair | None = None  # drawn once per run
        self.peer_keys: dict[int, bytes] = {}  # peers' mask public keys (server broadcast)
        #: (contributors, threshold) -> own self-mask seed batch / owner -> this client's shares of it
        self.own_batches: dict[_BatchKey, _SelfMaskBatch] = {}
        self.held_batches: dict[_BatchKey, dict[int, _SelfMaskBatch]] = {}
        self.state: Participant | None = None
        self.encoding: FixedPoint | None = None
        self._prepared: int | None = None  # exchange whose contribution is encoded
        self._participants: list[int] | None = None  # the server's list, when it excluded someone
        self._unmasked: int | None = None  # the exchange whose unmasking round it answered
        #: (exchange, survivor set, statement) this client signed (MACed to every other survivor) in the
        #: consistency round
        self._signed: tuple[int, tuple[int, ...], bytes] | None = None
        #: seconds spent by this client in the last exchange, per step
        self.timing: dict[str, float] = {}
        #: attack simulations only: keep the encoded input after the masked upload is built (by
        #: default it is freed then: the client needs only its seeds and shares for the rest)
        self.keep_input = False

    # ------------------------------------------------------------------ plumbing
    @property
    def _exchange_plan(self) -> ExchangePlan:
        """The plan of the current exchange (set before any of its stages runs)."""
        return cast(ExchangePlan, self.plan)

    def _binding(self) -> ExchangeBinding:
        p = self._exchange_plan
        return ExchangeBinding(self.setup.run_id, p.exchange, p.tag, p.round)

    def _batch_key(self) -> _BatchKey:
        return tuple(self._exchange_plan.contributors), self._threshold()

    def _threshold(self) -> int:
        """The Shamir threshold ``t`` from the run's setup.

        ``t`` from the run's setup (:func:`shamir_threshold`); a plan naming another is refused,
        as is a ``t`` that breaks ``2t > n + c`` (which also gives ``t > c``).
        """
        p, c = self._exchange_plan, collusion_bound(self.setup).max_colluders
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

    def _message(self, kind: str, shape: tuple[int, ...], payload: Any, note: str = "") -> Message:
        return self.message(SERVER, kind, shape, payload, self.fingerprint, note)

    def take_run_material(self, inbox: list[Message]) -> list[Message]:
        """Verify and keep the set-up material of the whole run.

        The material is kept whatever the fate of the plan it travels with: client 0's output-mask group seed ``G``
        (once per run) and the server's broadcasts of the peers' mask keys (each key once per run). A client that
        refuses the plan of the exchange carrying them still holds them for the exchanges to come.

        Keeping them gives a deviating server nothing: ``G`` is signed by client 0's identity key
        (pinned by the run manifest), encrypted under its owner-signed channel key and bound to this
        run, session and client, and a second seed is refused; each mask key is signed by its owner
        and fixed for the run.  The server can neither choose nor change them, and keeping them sends
        nothing: whatever this client contributes is still decided by the plans it accepts.
        """
        rest = []
        for m in inbox:
            stage = envelope_of(m).stage
            if m.sender != SERVER and stage == "group_seed":
                if self.group_seed is not None:
                    raise IntegrityError(
                        "a second output-mask group seed was sent; the first one stands", **self.where()
                    )
                self.group_seed = self.open_relayed(m, "group_seed", exchange=envelope_of(m).exchange)
            elif m.sender == SERVER and stage == "advertise_keys":
                self._take_keys(self.check(m, SERVER, stage, 0, self.where()))
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
        """Take the set-up messages of this exchange.

        Whichever stage's bundle carries them: the shared block ids (sparse), the participant list and the peers'
        share batches (those of the whole run: :meth:`take_run_material`). Returns the other messages.
        """
        rest = []
        for m in inbox:
            stage = envelope_of(m).stage
            if m.sender == SERVER and stage == "block_ids":
                self._take_common(self.check(m, SERVER, stage, 0, self.where()))
            elif m.sender == SERVER and stage == "share_keys":
                self._take_participants(self.check(m, SERVER, stage, 0, self.where()))
            elif m.sender != SERVER and stage == "share_keys":
                owner = cast(int, party_client(m.sender))
                shares = _parse_batch(
                    self.open_relayed(m, "share_keys"), int(self.options["self_mask_batch"]), self._exchange_plan, owner
                )
                self.held_batches.setdefault(self._batch_key(), {})[owner] = _SelfMaskBatch(
                    self._exchange_plan.exchange, shares
                )
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
                or j not in self._exchange_plan.contributors
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
            or not set(got) <= set(self._exchange_plan.contributors)
            or self.id not in got
        ):
            raise IntegrityError(
                f"the participant list {got} is not a sorted subset of the contributors that includes this client",
                **self.where(),
            )
        self._participants = got

    # ------------------------------------------------------------------ stages
    def on_stage(self, stage: str, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Dispatch ``stage`` to the matching ``stage_<name>`` method.

        Raises:
            IntegrityError: the stage is unknown.
        """
        if stage == "register":
            return []
        step: Callable[[list[Message]], list[tuple[Message, bytes]]] | None = getattr(self, "stage_" + stage, None)
        if step is None:
            raise IntegrityError(f"unknown stage {stage!r}", **self.where())
        if stage != "group_seed":
            self._prepare()
        return step(inbox)

    def stage_group_seed(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
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
        self.state = Participant(table.ids, encoded)
        self.timing["encode_s"] = time.perf_counter() - t0

    def stage_block_ids(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Send the ids of the blocks this client contributes to (sparse layout)."""
        if self.state is None:
            return []
        ids = self.state.ids
        return [
            self.seal(
                self._message("metadata", ids.shape, {"block_ids": ids.astype(np.int32)}, "block ids"), "block_ids"
            )
        ]

    def stage_advertise_keys(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
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

    def stage_share_keys(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Deal a fresh batch of self-mask seeds.

        A fresh batch of self-mask seeds for this and the next exchanges of this contributor set,
        Shamir-shared with every other contributor over the relayed channel.
        """
        self._absorb(inbox)
        if self.state is None:
            return []
        t0 = time.perf_counter()
        contributors, t = self._batch_key()
        xs = [j + 1 for j in contributors]
        seeds = [new_secret_seed() for _ in range(int(self.options["self_mask_batch"]))]
        shares = [split_secret(b, xs, t) for b in seeds]
        self.own_batches[(contributors, t)] = _SelfMaskBatch(self._exchange_plan.exchange, seeds)
        held = self.held_batches.setdefault((contributors, t), {})
        out, commitments, first = [], {}, self._exchange_plan.exchange
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

    def stage_masked_upload(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Upload y_k = x_k + PRG(b_k) + sum_j +-PRG(s_kj) mod 2^ring_bits (Bonawitz et al., CCS 2017).

        Pairwise masks are drawn over the blocks shared with each peer; the self mask b_k is used when there are at
        least
        two participants.

        Raises:
            IntegrityError: a self-mask seed or a peer's mask key is missing.
        """
        self._absorb(inbox)
        st = self.state
        if st is None:
            return []
        t0 = time.perf_counter()
        seq, key = self._exchange_plan.exchange, self._batch_key()
        participants = self._participants or list(self._exchange_plan.contributors)
        if self._exchange_plan.layout == "dense":
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
            st.seeds[j] = cast(MaskKeyPair, self.mask_keys).pairwise_seed(self.id, j, self.peer_keys[j], binding)
        y = self._upload_words()
        if not self.keep_input:
            st.encoded = None
        payload = {"block_ids": st.ids.astype(np.int32), "data": cast(FixedPoint, self.encoding).to_wire(y)}
        self.timing["mask_s"] = time.perf_counter() - t0
        return [self.seal(self._message("masked", y.shape, payload), "masked_upload")]

    def _upload_words(self) -> np.ndarray:
        st, enc, p = cast(Participant, self.state), cast(FixedPoint, self.encoding), self._exchange_plan
        out_keys = (
            ()
            if self.options["reveal_to_server"]
            else output_mask_keys(self._seed(), self.id, self.setup.num_clients, self._binding())
        )
        return _masked(
            st, self.id, p.block_len, enc.dtype, stream_ids(self.setup.run_id, p.exchange, p.tag, p.round), out_keys
        )

    def _seed(self) -> bytes:
        if self.group_seed is None:
            raise IntegrityError("no output-mask group seed was received", **self.where())
        return self.group_seed

    def _statement(self, survivors: list[int]) -> bytes:
        p = self._exchange_plan
        return survivor_statement(
            self.setup.run_id, self.setup.session, p.exchange, p.tag, p.round, survivors, self.view_digest()
        )

    def _consistency_key(self, peer: int) -> bytes:
        """The consistency MAC key this client shares with survivor ``peer`` (from their pinned mask keys)."""
        if self.mask_keys is None or peer not in self.peer_keys:
            raise IntegrityError(f"no mask public key of survivor {peer} was broadcast", **self.where())
        return self.mask_keys.consistency_key(self.id, peer, self.peer_keys[peer], self.setup.run_id)

    def stage_consistency(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Consistency check: sign the survivor set the server names, with one MAC per other survivor.

        Consistency check (Bonawitz et al. §4, active variant), once per exchange: if the survivor
        set the server names is a sorted set of at least ``t`` participants that includes this
        client, MAC its statement (:func:`survivor_statement`) for each other survivor ``j`` under
        their pairwise key (:func:`survivor_mac`); the server relays each MAC to its ``j``.
        """
        if self.state is None:
            return []
        if self._signed is not None and self._signed[0] == self._exchange_plan.exchange:
            raise ConsistencyError("a second consistency round in one exchange: refused", **self.where())
        msg = self._from_server(inbox, "consistency", "control")
        try:
            survivors = [int(k) for k in msg.payload["survivors"]]
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed survivor set ({e})", **self.where()) from None
        participants, t = self._participants or list(self._exchange_plan.contributors), self._threshold()
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
        self.released_over(self._exchange_plan, survivors)  # a related-input group: one set per round
        statement = self._statement(survivors)
        others = [j for j in survivors if j != self.id]
        macs = b"".join(survivor_mac(self._consistency_key(j), self.id, j, statement) for j in others)
        self._signed = (self._exchange_plan.exchange, tuple(survivors), statement)
        return [
            self.seal(
                self._message(
                    "control",
                    (len(others), SURVIVOR_MAC_BYTES),
                    {"receivers": np.asarray(others, np.int32), "macs": macs},
                    "MACs of the survivor set, one per other survivor",
                ),
                "consistency",
            )
        ]

    def _check_request(self, want_pairwise: list[int], want_self: list[int], macs: dict[int, bytes]) -> None:
        """Check the unmasking request against what this client signed.

        The unmasking request must name the survivor set this client signed (its self-mask shares)
        and exactly the other participants (their pairwise seeds), and carry, from other survivors,
        MACs to this client over that same set: with this client's own, at least ``t`` (every
        survivor's where the exchange binds the views) -- so no two clients can be asked about
        different sets.
        """
        where = self.where()
        if self._signed is None or self._signed[0] != self._exchange_plan.exchange:
            raise ConsistencyError("an unmasking request before this client signed the survivor set", **where)
        survivors = list(self._signed[1])
        dropped = [k for k in (self._participants or list(self._exchange_plan.contributors)) if k not in survivors]
        if want_self != survivors or want_pairwise != dropped:
            raise ConsistencyError(
                f"the unmasking request (survivors {want_self}, dropped {want_pairwise}) is not "
                f"the survivor set {survivors} this client signed",
                **where,
            )
        statement, t = self._signed[2], self._threshold()
        bound = self._binds_view()
        signed = set(macs) | {self.id}
        if bound and signed != set(survivors):  # an unsigned survivor's view is unchecked
            raise InconsistentViewError(
                f"survivors {sorted(set(survivors) - signed)} did not sign the survivor set of an "
                "exchange bound to the broadcasts, statistics or released sums received: each survivor's view "
                "is checked before unmasking",
                **where,
            )
        for k, mac in macs.items():
            if k not in survivors or k == self.id:
                raise ConsistencyError(f"a survivor-set MAC from client {k}, who is not another survivor", **where)
            if not hmac.compare_digest(mac, survivor_mac(self._consistency_key(k), k, self.id, statement)):
                raise (InconsistentViewError if bound else ConsistencyError)(
                    f"client {k}'s pairwise-MAC signature is not over the survivor set {survivors} this client "
                    "signed: the server told clients different survivor sets"
                    + (" or sent them different broadcasts to train on (model inconsistency)" if bound else ""),
                    **where,
                )
        if len(signed) < t:
            raise ConsistencyError(f"only {len(signed)} survivors signed the survivor set, fewer than t={t}", **where)

    def _binds_view(self) -> bool:
        """Whether every survivor's view must be checked before unmasking (:mod:`protocols.schedule`).

        A broadcast or a statistic; a released sum once this client holds an earlier release's
        commitment (fedgcn-gap's next hop is computed from the last one's rows).
        """
        tag = self._exchange_plan.tag
        if self.schedule is None:
            return False
        return self.schedule.every_survivor_signs(tag) or (
            self.schedule.releases(tag) and self.views.released != EMPTY_VIEW
        )

    def stage_unmask(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Answer the unmasking request.

        Step 5, answered once per exchange, after the consistency round: the request names the
        survivors (self-mask shares) and who dropped (pairwise seeds), with the other survivors' MACs
        to this client over the survivor set.
        """
        if self.state is None:
            return []
        if self._unmasked == self._exchange_plan.exchange:
            raise UnmaskingRefusedError("a second unmasking round in one exchange: refused", **self.where())
        self._unmasked = self._exchange_plan.exchange
        msg = self._from_server(inbox, "unmask", "control")
        try:
            want_pairwise = [int(d) for d in msg.payload["pairwise"]]
            want_self = [int(u) for u in msg.payload["self_mask"]]
            senders = [int(k) for k in msg.payload["mac_senders"]]
            blob = bytes(msg.payload["macs"])
            if len(blob) != SURVIVOR_MAC_BYTES * len(senders) or len(set(senders)) != len(senders):
                raise ValueError(f"{len(blob)} bytes of MACs from {len(senders)} distinct senders")
            macs = {k: blob[i * SURVIVOR_MAC_BYTES : (i + 1) * SURVIVOR_MAC_BYTES] for i, k in enumerate(senders)}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"malformed unmasking request ({e})", **self.where()) from None
        self._check_request(want_pairwise, want_self, macs)
        self.check_noise_allowance(want_self)  # distributed DP: at most --dp-dropouts missing
        if want_pairwise and not self.options["dropout_recovery"]:
            raise UnmaskingRefusedError(
                "the server asked for pairwise seeds, but dropout recovery is off", **self.where()
            )
        seeds, b_part = _unmask_answer(self.state, want_pairwise, want_self, self._exchange_plan, self.id)
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

    def _check_release(
        self, payload: dict[str, Any], bids: np.ndarray, rows: np.ndarray, enc: FixedPoint, included: list[int]
    ) -> None:
        """Verify this client's blocks against the server's commitment to the whole sum; chain its root.

        :mod:`protocols.release_commitment`; InconsistentViewError (nothing delivered) if they are not
        leaves of the committed sum.
        """
        p = self._exchange_plan
        try:
            root, proof = bytes(payload["release"]["root"]), bytes(payload["release"]["proof"])
        except (KeyError, TypeError, ValueError):
            root, proof = b"", b""
        sparse = p.layout == "sparse" and not self.options["reveal_to_server"]
        if sparse:
            try:
                bitmap = np.unpackbits(
                    np.asarray(payload["contributors"], dtype=np.uint8), axis=1, count=len(included)
                ).astype(bool)
            except (KeyError, TypeError, ValueError) as e:
                raise IntegrityError(f"malformed contributor bitmap ({e})", **self.where()) from None
        own = {
            int(b): block_leaf(
                int(b),
                enc.to_wire(rows[i]),
                [k for j, k in enumerate(included) if bitmap[i, j]] if sparse else included,
            )
            for i, b in enumerate(bids.tolist())
        }
        if len(root) != 32 or (own and not verify(root, p.num_blocks, own, proof)):
            raise InconsistentViewError(
                "the rows of this released sum are not part of the sum the server committed to (or no commitment "
                "came with them): the server may be handing different clients different sums; nothing was delivered",
                **self.where(),
            )
        self.views.release(p.tag, p.round, root)

    def stage_download(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Check the download against this client's request, remove its output masks and decode the fixed-point sums.

        Raises:
            IntegrityError: the download is malformed or carries other blocks or clients than planned.
        """
        msg = self._from_server(inbox, "download", "plain" if self.options["reveal_to_server"] else "masked")
        t0 = time.perf_counter()
        p, L = self._exchange_plan, self._exchange_plan.block_len
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
        if self.schedule is not None and self.schedule.releases(p.tag):
            self._check_release(msg.payload, bids, rows, enc, included)
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
                stream_ids(self.setup.run_id, p.exchange, p.tag, p.round)["output"],
                bids,
                L,
            )
        dec = enc.decode(rows)
        self.deliver({int(b): dec[i] for i, b in enumerate(bids)})
        self.timing["decode_s"] = time.perf_counter() - t0
        return []
