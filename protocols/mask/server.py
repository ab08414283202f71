"""The server half of ``mask``: one method per stage, as in Flower's SecAgg+ workflow.

:meth:`MaskServer.run` drives one exchange through :meth:`~MaskServer.stage_setup` (the plan,
the output-mask group seed once per run, the shared block ids in the sparse layout),
:meth:`~MaskServer.stage_advertise_keys`, :meth:`~MaskServer.stage_share_keys`,
:meth:`~MaskServer.stage_collect_masked_input`, :meth:`~MaskServer.stage_consistency`,
:meth:`~MaskServer.stage_unmask` and :meth:`~MaskServer.stage_download`, each reading and
extending one :class:`MaskExchange` (the protocol and its stages: :mod:`.backend`).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import ArrayLike

from ..errors import DropoutError, IntegrityError, ProtocolError, ShapeError, ShareIntegrityError
from ..link import stream_groups
from ..party import ServerHalf, envelope_of
from ..plan import ExchangePlan
from ..plan_policy import collusion_bound
from ..release_commitment import block_leaf, empty_leaf, prove, root_of, tree
from ..transcript import SERVER, Message, client_party, party_client
from .keys import SEED_BYTES, SIGNED_KEY_BYTES, check_signed_mask_key
from .prg import ranked_mask
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
from .shamir import Share, combine

if TYPE_CHECKING:
    from ..link import ClientLink
    from ..party import PartySetup
    from ..transcript import Transcript

#: (contributors, threshold): the key of a contributor set's self-mask seed batches
_BatchKey = tuple[tuple[int, ...], int]


def _dropout_error(where: dict[str, Any], clients: list[int], why: str) -> DropoutError:
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


@dataclass
class MaskExchange:
    """What the server knows of one exchange, filled in stage by stage (public data only)."""

    plan: ExchangePlan
    enc: FixedPoint  # the public encoding of the exchange
    contributors: list[int]
    t: int  # the Shamir threshold, from the run's setup
    announced: dict[int, np.ndarray] = field(default_factory=dict)  # client -> block ids it contributes
    participants: list[int] = field(default_factory=list)  # contributors with a key and a share batch
    use_self: bool = False  # Bonawitz self masks (two or more participants)
    union: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # every participant's block ids
    total: np.ndarray | None = None  # [union.size, block_len] sum of the uploads mod 2^b
    uploaders: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # participants whose upload is missing
    #: survivor -> its MACs of the survivor set, one per other survivor (receiver -> MAC)
    macs: dict[int, dict[int, bytes]] = field(default_factory=dict)
    server_s: float = 0.0  # server seconds in checks, sums and recovery

    @property
    def batch_key(self) -> _BatchKey:
        """(contributors, threshold): the self-mask seed batches of this contributor set."""
        return tuple(self.contributors), self.t


class MaskServer(ServerHalf):
    """The mask server: sums masked uploads, runs the recovery round, routes the sums.

    It holds
    public keys, masked vectors and, after the unmasking round, only what Bonawitz et al. give it
    (per client, self-mask shares or this exchange's pairwise seeds, never both).  Over a
    sequential link it folds each upload into the total as it arrives and sends each download as it
    is built (:func:`~protocols.link.stream_groups`): it holds the total and one client's blocks.
    """

    mode = "mask"
    relays_between_clients = True
    relay_stages = frozenset({"group_seed", "share_keys"})
    _NOTES = {"group_seed": "output-mask group seed", "share_keys": "Shamir shares of self-mask seeds"}

    def __init__(self, setup: PartySetup, transcript: Transcript | None = None):
        super().__init__(setup, transcript)
        self.fingerprint = mask_fingerprint(setup.num_clients, setup.options)
        self.group_seed_sent = False
        #: the clients' mask public keys (once per run) and which of them each client was sent
        self.mask_public: dict[int, bytes] = {}
        self.keys_sent: dict[int, set[int]] = defaultdict(set)
        #: (contributors, threshold) -> client -> (first exchange, length, holders) of its shared seed batch
        self.batches: dict[_BatchKey, dict[int, tuple[int, int, frozenset[int]]]] = defaultdict(dict)
        #: (contributors, threshold) -> dealer -> (first exchange, holder -> its share commitments)
        self.commitments: dict[_BatchKey, dict[int, tuple[int, dict[int, bytes]]]] = defaultdict(dict)
        #: clients missing in the last exchange -> the stage at which their answer was missing
        self.last_missing: dict[int, str] = {}
        self.last_included: tuple[int, ...] = ()
        self.last_timing: dict[str, float] = {}

    def record(self, msg: Message) -> None:
        """Record a message; a relayed channel ciphertext gets a note naming what it carries."""
        if msg.relay == SERVER and not msg.note:  # what the server knows a relayed ciphertext is
            stage = envelope_of(msg).stage if len(msg.auth) > 64 else ""
            note = self._NOTES.get(stage, "channel message")
            msg = dataclasses.replace(msg, note=note + " (channel-encrypted, relayed by the server)")
        super().record(msg)

    def _msg(self, k: int, kind: str, shape: tuple[int, ...], payload: Any, note: str = "") -> Message:
        return self.message(k, kind, shape, payload, self.fingerprint, note)

    def _covered(self, key: _BatchKey, k: int, seq: int, participants: list[int]) -> bool:
        """``k``'s batch covers exchange ``seq`` and every participant holds a share of it."""
        first, n, holders = self.batches[key].get(k, (0, 0, frozenset()))
        return first <= seq < first + n and holders.issuperset(participants)

    def _take_commitments(
        self, got: dict[int, list[Message]], k: int, batch_key: _BatchKey, contributors: list[int]
    ) -> None:
        """Keep dealer ``k``'s signed commitments to the shares it dealt.

        Dealer ``k``'s signed commitments to the shares it dealt this exchange (one hash per
        holder and seed of its batch), kept until its batch is replaced.
        """
        msg = self.responses(got, k, "share_keys", "control")
        size = int(self.setup.options["self_mask_batch"]) * COMMITMENT_BYTES
        try:
            table = {int(j): bytes(c) for j, c in msg.payload.items()} if msg is not None else None
        except (AttributeError, TypeError, ValueError):
            table = None
        if table is None or sorted(table) != list(contributors) or any(len(c) != size for c in table.values()):
            raise IntegrityError("the share commitments are missing or malformed", **self.where(k))
        self.commitments[batch_key][k] = (cast(ExchangePlan, self.plan).exchange, table)

    def _check_share(self, batch_key: _BatchKey, dealer: int, holder: int, share: Share) -> None:
        """Refuse a revealed share that is not the one ``dealer`` committed to for ``holder``."""
        first, table = self.commitments[batch_key].get(dealer, (None, {}))
        seq = cast(ExchangePlan, self.plan).exchange
        i = None if first is None else seq - first
        expected = table.get(holder, b"")[i * COMMITMENT_BYTES : (i + 1) * COMMITMENT_BYTES] if i is not None else b""
        if share.x != holder + 1 or share_commitment(self.setup.run_id, dealer, seq, share) != expected:
            raise ShareIntegrityError(
                f"client {holder}'s share of client {dealer}'s self-mask seed does not match "
                f"the commitment client {dealer} signed: corrupted by client {holder}; "
                "nothing was aggregated",
                **self.where(holder),
            )

    def _exclude(self, clients: Iterable[int]) -> None:
        """Clients out of this exchange before uploading: what was queued for them is void."""
        for k in clients:
            self._outbox.pop(k, None)

    def run(self, plan: ExchangePlan, link: ClientLink) -> tuple[int, ...]:
        """Run one masked exchange: share keys, collect masked inputs, check consistency, unmask, send the sums.

        Returns the clients whose inputs the sums cover; timing goes to ``last_timing``.
        """
        t_start = time.perf_counter()
        ex = self.stage_setup(plan, link)
        self.stage_advertise_keys(ex, link)
        self.stage_share_keys(ex, link)
        t_setup = time.perf_counter()
        self.stage_collect_masked_input(ex, link)
        if ex.use_self:
            t_unmask = time.perf_counter()
            self.stage_consistency(ex, link)
            self.stage_unmask(ex, link)
            ex.server_s += time.perf_counter() - t_unmask
        self.stage_download(ex, link)
        self.last_included = tuple(ex.uploaders)
        self.last_timing = {"setup_s": t_setup - t_start, "server_s": ex.server_s}
        return self.last_included

    # ------------------------------------------------------------------ stages
    def stage_setup(self, plan: ExchangePlan, link: ClientLink) -> MaskExchange:
        """Setup stage: send the plan and collect the set-up material.

        Send the plan; once per run, client 0 deals the output-mask group seed; in the sparse
        layout, collect each contributor's block ids and queue, per peer, the ids they share.
        """
        contributors = list(plan.contributors)
        t = shamir_threshold(
            len(contributors), self.setup.options["threshold"], collusion_bound(self.setup).max_colluders
        )
        ex = MaskExchange(plan, FixedPoint(**plan.encoding["fixed_point"]), contributors, t)
        self.last_missing = {}
        deal = not self.setup.options["reveal_to_server"] and not self.group_seed_sent
        if deal:  # every client gets G: all register (and get the directory) now
            self.register(link, plan.round, range(self.setup.num_clients))
        self.begin(plan, link, self.fingerprint, extra=(0,) if deal else ())
        if deal:  # client 0 deals the output-mask group seed, once per run
            got = self.call(link, "group_seed", {0: []})
            if 0 not in got or len([m for m in got[0] if m.relay == SERVER]) != self.setup.num_clients - 1:
                raise _dropout_error(self.where(), [0], "client 0 did not deal the output-mask group seed")
            self.group_seed_sent = True
        if plan.layout == "sparse":
            self._collect_block_ids(ex, link)
        else:
            ex.announced = {k: np.arange(plan.num_blocks) for k in contributors}
        return ex

    def _collect_block_ids(self, ex: MaskExchange, link: ClientLink) -> None:
        """Sparse layout: each contributor's sorted block ids, and per peer the ids two share."""
        plan = ex.plan
        got = self.call(link, "block_ids", {k: [] for k in plan.parties})
        for k in ex.contributors:
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
                raise IntegrityError("block-id metadata must be a sorted list of unique ids in range", **self.where(k))
            ex.announced[k] = ids
        common = {}
        listed = sorted(ex.announced)
        for i, a in enumerate(listed):
            for b in listed[i + 1 :]:
                c = np.intersect1d(ex.announced[a], ex.announced[b], assume_unique=True)
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

    def stage_advertise_keys(self, ex: MaskExchange, link: ClientLink) -> None:
        """AdvertiseKeys: relay each contributor's owner-signed mask key.

        AdvertiseKeys: each contributor's owner-signed mask key, once per run (its first
        exchange); every participant is sent the keys it has not been sent yet, verbatim.
        """
        unkeyed = [k for k in ex.contributors if k in ex.announced and k not in self.mask_public]
        if unkeyed:
            got = self.call(link, "advertise_keys", {k: [] for k in unkeyed})
            for k in unkeyed:
                msg = self.responses(got, k, "advertise_keys", "public_key")
                if msg is None:
                    self.last_missing.setdefault(k, "advertise_keys")
                    continue
                self.check_envelope(msg, self.fingerprint, k)
                check_signed_mask_key(self.registry, self.setup.run_id, client_party(k), msg.payload, self.where(k))
                self.mask_public[k] = bytes(msg.payload)  # forwarded verbatim, with its owner's signature
        ex.participants = [k for k in ex.contributors if k in ex.announced and k in self.mask_public]
        if self.last_missing and len(ex.participants) < ex.t:
            raise _dropout_error(
                self.where(),
                sorted(self.last_missing),
                f"only {len(ex.participants)} of {len(ex.contributors)} contributors advertised keys, "
                f"fewer than the threshold t={ex.t}",
            )
        for k in ex.participants:
            new = {j: self.mask_public[j] for j in ex.participants if j not in self.keys_sent[k]}
            if new:
                self.queue(
                    k,
                    self._msg(k, "public_key", (len(new), SIGNED_KEY_BYTES), new, "broadcast of mask keys"),
                    "advertise_keys",
                )
                self.keys_sent[k] |= set(new)

    def stage_share_keys(self, ex: MaskExchange, link: ClientLink) -> None:
        """ShareKeys: relay fresh batches of self-mask seed shares.

        ShareKeys: a batch of self-mask seeds from each participant whose batch for this
        contributor set does not cover this exchange (the shares are relayed to their holders, the
        dealer's commitments kept); the participant list goes out when someone was left out.
        """
        ex.use_self = len(ex.participants) >= 2
        seq = ex.plan.exchange
        if ex.use_self:
            stale = [k for k in ex.participants if not self._covered(ex.batch_key, k, seq, ex.participants)]
            if stale:
                got = self.call(link, "share_keys", {k: [] for k in stale})
                for k in stale:
                    if sorted(cast(int, party_client(m.receiver)) for m in got.get(k, []) if m.relay == SERVER) != [
                        j for j in ex.contributors if j != k
                    ]:
                        self.last_missing.setdefault(k, "share_keys")
                    else:
                        self._take_commitments(got, k, ex.batch_key, ex.contributors)
                ex.participants = [k for k in ex.participants if k not in self.last_missing]
                size = int(self.setup.options["self_mask_batch"])
                for k in stale:  # the holders: the participants, whose next bundle has the shares
                    if k in ex.participants:
                        self.batches[ex.batch_key][k] = (seq, size, frozenset(ex.participants))
        self._exclude(k for k in ex.contributors if k not in ex.participants)
        if ex.participants != ex.contributors:
            for k in ex.participants:
                self.queue(
                    k,
                    self._msg(
                        k,
                        "control",
                        (len(ex.participants),),
                        {"participants": np.asarray(ex.participants, np.int32)},
                        "participants",
                    ),
                    "share_keys",
                )

    def stage_collect_masked_input(self, ex: MaskExchange, link: ClientLink) -> None:
        """MaskedInputCollection: fold each masked upload into the total.

        MaskedInputCollection: each upload is folded into the total as it arrives, client by
        client over a sequential link (the server holds the total and one upload at a time); too
        few uploads, more dropouts than distributed DP provisioned for, or a dropout without
        recovery: DropoutError.
        """
        o, where, n0 = self.setup.options, self.where, len(ex.contributors)
        ex.union = (
            np.unique(np.concatenate([ex.announced[k] for k in ex.participants]))
            if ex.participants
            else np.zeros(0, np.int64)
        )  # a block only a dropped client announced stays 0
        ex.total = np.zeros((ex.union.size, ex.plan.block_len), dtype=ex.enc.dtype)
        refused = None
        got: dict[int, list[Message]] | None
        for group in stream_groups(link, ex.participants):
            try:  # after a refusal the rest still read their bundles (their relayed shares), as in parallel
                got = self.call(link, "masked_upload", {k: [] for k in group})
                if refused is None:
                    ex.server_s += self._fold_uploads(got, group, ex)
            except ProtocolError as e:
                refused = refused or e
            got = None
        if refused is not None:
            raise refused
        ex.uploaders.sort()
        ex.dropped = [k for k in ex.participants if k not in ex.uploaders]
        missing = sorted(self.last_missing)
        if missing and len(ex.uploaders) < ex.t:
            raise _dropout_error(
                where(),
                missing,
                f"only {len(ex.uploaders)} of {n0} contributors uploaded, fewer than the threshold t={ex.t}",
            )
        provisioned = ex.plan.encoding["provisioned_dropouts"]
        if len(missing) > provisioned:
            raise _dropout_error(
                where(),
                missing,
                "with distributed DP every client adds a share of the noise "
                f"variance provisioned for at most {provisioned:g} "
                "dropout(s), so a sum without them would be short of DP noise (--dp-dropouts)",
            )
        if ex.dropped and not (o["dropout_recovery"] and ex.use_self):
            raise _dropout_error(
                where(),
                ex.dropped,
                "they were counted in (the other clients masked "
                "toward them) and dropout recovery is disabled (dropout_recovery=False)",
            )

    def _fold_uploads(self, got: dict[int, list[Message]], group: list[int], ex: MaskExchange) -> float:
        """Verify one group's masked uploads and add them into the total.

        One group's answers: verify each masked upload and add it into the total (mod ``2^b``); a
        client without one is noted as missing.  Returns the seconds it took.
        """
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
            cast(np.ndarray, ex.total)[positions(ex.union, ex.announced[k])] += self._read_upload(
                k, msg, ex.announced[k], ex.enc
            )
            ex.uploaders.append(k)
        return time.perf_counter() - t0

    def stage_consistency(self, ex: MaskExchange, link: ClientLink) -> None:
        """ConsistencyCheck: collect the uploaders' MACs of the survivor set.

        ConsistencyCheck (Bonawitz et al. §4, active variant): every uploader signs the survivor
        set with one MAC per other uploader (under their pairwise key, which the server does not
        hold); keeps the MACs of those that answered (at least ``t``, else DropoutError).
        """
        survivors = np.asarray(ex.uploaders, np.int32)
        got = self.call(
            link,
            "consistency",
            {
                j: [(self._msg(j, "control", (len(ex.uploaders),), {"survivors": survivors}, "survivor set"), 0)]
                for j in ex.uploaders
            },
        )
        for j in ex.uploaders:
            msg = self.responses(got, j, "consistency", "control")
            if msg is None:
                self.last_missing.setdefault(j, "consistency")
                continue
            self.check_envelope(msg, self.fingerprint, j)
            try:
                receivers = [int(k) for k in msg.payload["receivers"]]
                blob = bytes(msg.payload["macs"])
            except (KeyError, TypeError, ValueError, AttributeError):
                receivers, blob = [j], b""
            if (
                len(blob) != SURVIVOR_MAC_BYTES * len(receivers)
                or len(set(receivers)) != len(receivers)
                or not set(receivers) <= set(ex.uploaders) - {j}
            ):
                raise IntegrityError("malformed survivor-set MACs: one per other survivor", **self.where(j))
            n = SURVIVOR_MAC_BYTES
            ex.macs[j] = {k: blob[i * n : (i + 1) * n] for i, k in enumerate(receivers)}
        if len(ex.macs) < ex.t:
            raise _dropout_error(
                self.where(),
                sorted(self.last_missing),
                f"only {len(ex.macs)} clients signed the survivor set, fewer than the threshold t={ex.t}",
            )
        if (
            len(ex.macs) < len(ex.uploaders)
            and self.schedule is not None
            and self.schedule.every_survivor_signs(ex.plan.tag)
        ):
            raise _dropout_error(
                self.where(),
                sorted(self.last_missing),
                "in an exchange the public schedule marks as a broadcast or statistic every survivor signs the "
                "survivor set (each checks the models the others received, protocols/broadcast_view.py)",
            )

    def stage_unmask(self, ex: MaskExchange, link: ClientLink) -> None:
        """Unmasking: remove the self masks and the dropped clients' pairwise masks.

        Unmasking: remove each uploader's self mask (from ``t`` shares of its seed, each checked
        against its dealer's commitment) and the pairwise masks the survivors shared with the
        dropped clients (from the survivors' seeds), in place.  The request goes to the clients
        that signed the survivor set, each with the MACs the others addressed to it.
        """
        plan, where, t, union, announced = cast(ExchangePlan, self.plan), self.where, ex.t, ex.union, ex.announced
        total = cast(np.ndarray, ex.total)
        dropped, uploaders = ex.dropped, ex.uploaders
        L = plan.block_len
        request = {"pairwise": np.asarray(dropped, np.int32), "self_mask": np.asarray(uploaders, np.int32)}
        asked = sorted(ex.macs)
        got = self.call(
            link,
            "unmask",
            {
                j: [
                    (
                        self._msg(
                            j,
                            "control",
                            (len(dropped) + len(uploaders),),
                            {**request, **self._relayed_macs(ex, j)},
                            "unmasking request",
                        ),
                        0,
                    )
                ]
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
                self._check_share(ex.batch_key, u, j, share)
                b_shares[u].append(share)
        if len(responders) < t:
            raise _dropout_error(
                where(),
                sorted(self.last_missing),
                f"only {len(responders)} clients answered the unmasking round, fewer than the threshold t={t}",
            )
        sid = stream_ids(self.setup.run_id, plan.exchange, plan.tag, plan.round)
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
                m = ranked_mask(seeds[(j, d)], sid["pairwise"], c.size, L, ex.enc.dtype)
                pos = positions(union, c)
                if d > j:  # j added +PRG(s_jd)
                    total[pos] -= m
                else:  # j subtracted it
                    total[pos] += m
        for u in uploaders:
            if len(b_shares[u]) < t:
                self.batches[ex.batch_key].pop(u, None)  # too few holders left: a fresh batch next time
                raise _dropout_error(
                    where(),
                    [u],
                    f"only {len(b_shares[u])} shares of its self-mask seed came back, fewer than the threshold t={t}",
                )
            try:
                b_u = combine(b_shares[u], t)
            except ValueError as e:
                raise IntegrityError(f"cannot reconstruct the self-mask seed: {e}", **where(u)) from None
            total[positions(union, announced[u])] -= ranked_mask(b_u, sid["self"], announced[u].size, L, ex.enc.dtype)

    @staticmethod
    def _relayed_macs(ex: MaskExchange, j: int) -> dict[str, Any]:
        """The survivor-set MACs addressed to ``j``, as its unmasking request carries them (senders ascending)."""
        senders = [i for i in sorted(ex.macs) if j in ex.macs[i]]
        return {"mac_senders": np.asarray(senders, np.int32), "macs": b"".join(ex.macs[i][j] for i in senders)}

    def stage_download(self, ex: MaskExchange, link: ClientLink) -> None:
        """Delivery: send each recipient its blocks.

        Delivery: each recipient gets its blocks, who is included and (sparse, with output
        masks) who contributed what; sent as they are built, recipient by recipient over a
        sequential link.  A recipient's refusal does not keep the download from the others.
        """
        plan, L, enc, union = ex.plan, ex.plan.block_len, ex.enc, ex.union
        included = tuple(ex.uploaders)
        reveal = self.setup.options["reveal_to_server"]
        kind = "plain" if reveal else "masked"
        last: tuple[np.ndarray | None, bytes | None] = (None, None)
        refused: ProtocolError | None = None
        release = self._release_tree(ex) if self.schedule is not None and self.schedule.releases(plan.tag) else None
        for group in stream_groups(link, plan.requests):
            downloads = {}
            for r in group:
                bids = plan.requests[r]
                if last[0] is None or not np.array_equal(last[0], bids):  # dense: every recipient asks the same
                    rows = np.zeros((bids.size, L), dtype=enc.dtype)  # a block nobody contributed sums to 0
                    if union.size:
                        at = np.minimum(np.searchsorted(union, bids), union.size - 1)
                        hit = union[at] == bids
                        rows[hit] = cast(np.ndarray, ex.total)[at[hit]]
                    last = (bids, enc.to_wire(rows))
                payload: dict[str, Any] = {
                    "block_ids": bids.astype(np.int32),
                    "data": last[1],
                    "included": np.asarray(included, np.int32),
                }
                if plan.layout == "sparse" and not reveal:
                    bitmap = (
                        np.stack([np.isin(bids, ex.announced[k]) for k in included], axis=1)
                        if included
                        else np.zeros((bids.size, 0), bool)
                    )
                    payload["contributors"] = np.packbits(bitmap, axis=1)
                if release is not None:  # the whole sum's commitment, and this recipient's proof
                    payload["release"] = {"root": root_of(release), "proof": prove(release, bids.tolist())}
                downloads[r] = [(self._msg(r, kind, (bids.size, L), payload), 0)]
            try:
                self.call(link, "download", downloads)
            except ProtocolError as e:
                refused = refused or e
        if refused is not None:
            raise refused

    def _release_tree(self, ex: MaskExchange) -> list[list[bytes]]:
        """The Merkle tree over every block of the released sum (:mod:`protocols.release_commitment`).

        Leaf ``b``: the block's wire bytes and the contributors whose output masks its recipients remove.
        """
        plan, enc, union, included = ex.plan, ex.enc, ex.union, tuple(ex.uploaders)
        requested: list[ArrayLike] = [np.asarray(b, np.int64) for b in plan.requests.values()]
        needed = np.unique(np.concatenate(requested or [[]]))
        sparse = plan.layout == "sparse" and not self.setup.options["reveal_to_server"]
        holds = {k: np.isin(needed, ex.announced[k]) if sparse else np.ones(needed.size, bool) for k in included}
        leaves = [empty_leaf(b) for b in range(plan.num_blocks)]
        for i, b in enumerate(needed.tolist()):
            row = np.zeros(plan.block_len, dtype=enc.dtype)  # a block nobody contributed sums to 0
            at = int(np.searchsorted(union, b)) if union.size else 0
            if union.size and at < union.size and union[at] == b:
                row = cast(np.ndarray, ex.total)[at]
            leaves[b] = block_leaf(b, enc.to_wire(row), [k for k in included if holds[k][i]])
        return tree(leaves)

    # ------------------------------------------------------------------ server-side checks
    def _read_upload(self, k: int, msg: Message, ids: np.ndarray, enc: FixedPoint) -> np.ndarray:
        """Parse one masked upload; refuse anything but the announced blocks as ring elements."""
        where, L = self.where(k), cast(ExchangePlan, self.plan).block_len
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
