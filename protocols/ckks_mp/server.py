"""The server half of ``ckks-mp``: combine key shares, add ciphertexts, combine partial decryptions.

It holds public material only -- the CRS seed, every ``p_i``, ``p_R``, ``p_B``, the collective key
``p`` and the ciphertexts -- and verifies every message before reading it.  One exchange
(:meth:`CKKSMPServer.run`) over a :class:`~protocols.link.ClientLink`:

1. ``key_setup`` (first exchange of the run, every client): back each client's owner-signed
   ``p_R`` (client 0 also the signed ``p_B`` and ``s_B`` for each other client on the encrypted
   channel, which the server forwards); ``p_B`` with its signature to every client.  The CRS
   seed is a hash of the run id (:func:`.sampling.crs_seed`): the server does not choose it.
2. ``block_ids`` (sparse layout), ``upload``: every upload (``c0`` only: each client encrypts
   under its own share with the public ``c1`` of the exchange, :mod:`.encryption`) checked
   (envelope, shape, every residue reduced) before any is added; blocks fewer than K clients
   uploaded get the missing clients' public offsets.
3. ``keyswitch`` (every client when decryption is n-out-of-n; t-out-of-n below): the groups of
   aggregate blocks -- one for the blocks the plan switches to the broadcast key (``broadcast_blocks``: those
   every client receives), one per recipient for its other blocks -- their block ids, and the owner-signed
   recipient keys a client has not seen yet; back one share per group, computed on the ``c1`` each client recomputes
   itself: a PCKS share ``(h0_i, h1_i)`` per ciphertext to a recipient's key, a CKS share ``h_i``
   (one polynomial) to the broadcast key (:mod:`.keyswitch`).  A client that does not answer:
   DropoutError naming it (n-out-of-n: ``s`` needs every ``s_i``).  The server adds the K shares to
   ``c0``.  In batches of at most ``keyswitch_batch_bytes`` of shares from all clients (t-out-of-n: from
   the active set; :func:`batches_of`), the first naming the whole planned switch; each batch's shares are
   combined and dropped before the next is asked for.
4. ``download``: each recipient gets only its blocks: ``c0'`` of the exchange's blocks switched to the broadcast key
   (its ``c1`` is the public one; the same bytes for every recipient) and ``(c0', c1')`` of its other blocks, switched
   to its own key.
5. ``release`` (a tag the public schedule gives the ``release`` role, different rows per recipient, or the
   ``statistic`` role, the round's sample's pooled statistics):
   each recipient answered its download with a keyed digest of every block it decoded; the server
   commits to them in one Merkle tree (:mod:`protocols.release_commitment`, leaf ``b``: the digest
   of block ``b``; two recipients reporting different digests of one block: IntegrityError) and
   sends every client the root, each recipient with its proof (:meth:`CKKSMPServer.release_messages`).

t-out-of-n (the public setup's ``threshold`` t < n, :mod:`.threshold`): at key set-up the server
also relays every client's n - 1 Shamir shares (channel-encrypted), streamed in n - 1 rotations of n
shares each (:meth:`CKKSMPServer._relay_shares`); at upload up to n - t missing contributors are
left out (more: DropoutError naming them); ``keyswitch`` starts with a liveness probe of every
client, the active set ``A`` is the first t responders among the uploaders and the clients that
contribute nothing, and only ``A`` is asked, every batch naming ``A``, the first with the planned switch's
uploaders ``U`` and a per-block table of who uploaded what; a member of ``A`` that does not answer a batch
is replaced by the next responder in a re-plan, which names the planned switch again and asks the batches
left (fewer than t responders left: DropoutError naming the missing clients).

What a server that deviates can and cannot do is in :mod:`.client` (the refusals) and
``docs/ckks_mp.md``: it never sends a ``c1``, so it cannot have a key share's product with a
value of its choosing switched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import DropoutError, IntegrityError, ShapeError
from ..party import ServerHalf, envelope_of
from ..plan import ExchangePlan
from ..release_commitment import DIGEST_BYTES, empty_leaf, leaf, prove, root_of, tree
from ..transcript import SERVER, Kind, Message, client_party
from . import encoding, encryption
from .client import DEALER_PART, KEYS_TAG, READY_PART, ROTATION_PART, THRESHOLD_TAG, share_part, threshold_of
from .keys import key_fingerprint
from .keyswitch import combine_broadcast, combine_shares, planned_broadcast_blocks
from .params import params_from_options, plan_exchange, ring_of
from .sampling import crs_seed

if TYPE_CHECKING:
    from ..link import ClientLink
    from ..party import PartySetup
    from ..transcript import Transcript

#: client -> [(message, envelope part)]: one stage's requests (:meth:`ServerHalf.call`)
_Requests = dict[int, list[tuple[Message, int]]]
#: default bound on the share bytes of one key-switching batch, all active clients' together
KEYSWITCH_BATCH_BYTES = 256 << 20
#: (recipient, or -1 for the broadcast key; rows of the aggregate): one key-switching group
_Group = tuple[int, list[int]]


class CKKSMPServer(ServerHalf):
    """The ``ckks-mp`` server (module docstring): public keys and ciphertexts only."""

    mode = "ckks-mp"
    relays_between_clients = True
    relay_stages = frozenset({"key_setup"})

    def __init__(self, setup: PartySetup, transcript: Transcript | None = None) -> None:
        super().__init__(setup, transcript)
        self.params = params_from_options(setup.options["params"])
        self.ring = ring_of(self.params)
        self.keep_payload_bytes = int(setup.options["keep_payload_bytes"])
        #: the most share bytes (all active clients') of one key-switching batch (:func:`batches_of`)
        self.batch_bytes = int(setup.options.get("keyswitch_batch_bytes", KEYSWITCH_BATCH_BYTES))
        self.fingerprint: str | None = None
        #: recipient -> (its p_R bytes, its owner's signature), forwarded verbatim
        self.recipient_pks: dict[int, tuple[bytes, bytes]] = {}
        self._keys_sent: set[tuple[int, int]] = set()  # (client, recipient) p_R already sent
        self.setup_s = 0.0
        self.last_stats: dict[str, Any] = {}
        #: t of t-out-of-n key switching (n: every client key-switches)
        self.threshold = threshold_of(setup)
        #: clients whose view of the broadcasts is stale (they missed one): never in an active set
        self.stale: set[int] = set()
        #: bytes of client-to-client messages the server holds for relaying, now and at most (t-out-of-n set-up:
        #: one rotation's n Shamir shares, :meth:`_relay_shares`), and per recipient
        self.relay_held = self.relay_peak = 0
        self._held_for: dict[int, int] = {}
        #: t-out-of-n: the clients that did not finish the key set-up (at most n - t), never addressed again
        self.unfinished: set[int] = set()

    def record(self, msg: Message) -> None:
        """Record a message without the sealed Shamir shares' bytes, and payloads above ``keep_payload_bytes``."""
        if msg.relay == SERVER and msg.tag == THRESHOLD_TAG and msg.payload is not None:
            msg = replace(msg, payload=None, note=msg.note + "; sealed share not kept")
        if msg.payload is not None and msg.nbytes > self.keep_payload_bytes:
            msg = replace(msg, payload=None, note=msg.note + "; payload not kept (size)")
        super().record(msg)

    def _missing(self, clients: Sequence[int], what: str, **where: Any) -> DropoutError:
        K, t = self.setup.num_clients, self.threshold
        need = (
            f"this run's threshold needs {t} of the {K} clients (at most {K - t} missing)"
            if t < K
            else "ckks-mp needs every client (n-out-of-n)"
        )
        err = DropoutError(
            f"client(s) {', '.join(map(str, clients))} did not send {what}; {need}, so nothing was "
            "delivered. Re-run the exchange without them",
            **cast(dict[str, Any], {"client": clients[0], **where}),
        )
        err.clients = tuple(clients)
        return err

    # ------------------------------------------------------------------ keys
    def _key_request(
        self,
        rnd: int,
        k: int,
        payload: dict[str, Any],
        note: str,
        kind: Kind = "control",
        shape: tuple[int, ...] = (),
        fp: str = "",
    ) -> Message:
        return Message(rnd, KEYS_TAG, SERVER, client_party(k), kind, shape, 0, self.mode, fp, payload, note=note)

    def ensure_keys(self, link: ClientLink, rnd: int) -> None:
        """Key set-up, once per run (module docstring, step 1).

        t-out-of-n: a client that misses a step joins :attr:`unfinished` and the set-up goes on with the others
        (:func:`.threshold.check_finishers`); more than n - t missing: DropoutError naming them.
        """
        if self.fingerprint is not None:
            return
        K, n, P = self.setup.num_clients, self.params.n, self.params.num_primes
        self.register(link, rnd, range(K))
        where: dict[str, Any] = dict(tag=KEYS_TAG, round=rnd)
        request = {k: [(self._key_request(rnd, k, {}, "make your keys"), 0)] for k in range(K)}
        got = self.call(link, "key_setup", request, hook=False)
        t = time.perf_counter()
        silent = [k for k in range(K) if not [m for m in got.get(k, []) if m.receiver == SERVER]]
        self._exclude(silent, "its public keys", where)
        broadcast: dict[str, Any] | None = None
        dealer = 0
        for k in (k for k in range(K) if k not in self.unfinished):
            mine = [m for m in got[k] if m.receiver == SERVER]
            if len(mine) != 1:
                raise IntegrityError(f"{len(mine)} key set-up messages where one was expected", client=k, **where)
            msg = self.check(mine[0], client_party(k), "key_setup", 0, dict(client=k, **where))
            if k == 0:
                broadcast = self._broadcast_key(msg, got[0], 0, where)
            try:
                key = bytes(msg.payload["recipient"])
                encryption.from_bytes(self.ring, key, (P, n))
                self.recipient_pks[k] = (key, bytes(msg.payload["recipient_sig"]))
            except (KeyError, TypeError, ValueError) as e:
                raise IntegrityError(f"malformed public key ({e})", client=k, **where) from None
        del got
        while broadcast is None:  # t-out-of-n: the broadcast key's dealer, client 0, is gone; ask the next client
            dealer = min(k for k in range(K) if k not in self.unfinished)
            ask = {dealer: [(self._key_request(rnd, dealer, {}, "deal the broadcast key"), DEALER_PART)]}
            answer = self.call(link, "key_setup", ask, hook=False)
            mine = [m for m in answer.get(dealer, []) if m.receiver == SERVER]
            if len(mine) == 1:
                msg = self.check(mine[0], client_party(dealer), "key_setup", DEALER_PART, dict(client=dealer, **where))
                broadcast = self._broadcast_key(msg, answer[dealer], dealer, where)
            elif mine:
                raise IntegrityError(f"{len(mine)} broadcast keys where one was expected", client=dealer, **where)
            else:
                self._exclude([dealer], "the broadcast key it was asked to deal", where)
        if self.threshold < K:  # n (n - 1) Shamir shares, n per call
            for offset in range(1, K):
                self._relay_shares(link, rnd, offset)
        finishers = [k for k in range(K) if k not in self.unfinished]
        if self.threshold < K:
            broadcast.update(finishers=np.array(finishers, dtype=np.int64))
        fp = key_fingerprint(self.params.describe(), crs_seed(self.setup.run_id), broadcast["broadcast"])
        self.setup_s += time.perf_counter() - t
        note = f"broadcast key p_B, signed by client {dealer}"
        keys = {k: [(self._key_request(rnd, k, broadcast, note, "public_key", (1, P, n), fp), 1)] for k in finishers}
        got = self.call(link, "key_setup", keys, hook=False)
        self._exclude([k for k in finishers if k not in got], "the key set-up's acknowledgement", where)
        self.fingerprint = fp

    def _broadcast_key(self, msg: Message, answer: list[Message], dealer: int, where: dict[str, Any]) -> dict[str, Any]:
        """The broadcast key ``p_B`` and its signature in ``dealer``'s checked ``msg``.

        The rest of its ``answer`` must be ``s_B`` sealed for every other client.
        """
        K, shape = self.setup.num_clients, (self.params.num_primes, self.params.n)
        try:
            broadcast: dict[str, Any] = {
                "broadcast": bytes(msg.payload["broadcast"]),
                "broadcast_sig": bytes(msg.payload["broadcast_sig"]),
            }
            encryption.from_bytes(self.ring, broadcast["broadcast"], shape)
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed public key ({e})", client=dealer, **where) from None
        if len([m for m in answer if m.relay == SERVER and m.tag == KEYS_TAG]) != K - 1:
            raise IntegrityError(
                f"client {dealer} did not send the broadcast secret to every other client", client=dealer, **where
            )
        if self.threshold < K:
            broadcast["dealer"] = dealer
        return broadcast

    def _exclude(self, clients: Sequence[int], what: str, where: dict[str, Any]) -> None:
        """Leave ``clients`` out of the rest of the run (t-out-of-n set-up); past n - t missing, DropoutError."""
        if not clients:
            return
        self.unfinished.update(clients)
        for k in clients:  # what was queued for them is never sent
            self._outbox.pop(k, None)
            self.relay_held -= self._held_for.pop(k, 0)
        if len(self.unfinished) > self.setup.num_clients - self.threshold:
            raise self._missing(sorted(self.unfinished), what, **where)

    def _relay_shares(self, link: ClientLink, rnd: int, offset: int) -> None:
        """Rotation ``offset`` of the t-out-of-n set-up: each client i's Shamir share for client ``(i + offset) mod n``.

        The n shares of the previous rotation travel in the same call's bundles, so the server holds at most one
        rotation's n shares (:attr:`relay_peak`), never the n (n - 1) of the whole set-up.  A client is told to skip
        its share for a client that left the set-up; one relayed to a client that leaves in the same call is dropped
        (only that client could open it).
        """
        K, where = self.setup.num_clients, cast(dict[str, Any], dict(tag=KEYS_TAG, round=rnd))
        ask: _Requests = {}
        expected: dict[int, list[tuple[str, str, str]]] = {}
        for k in (k for k in range(K) if k not in self.unfinished):
            to = (k + offset) % K
            skip = to in self.unfinished
            payload = {"to": to, "skip": True} if skip else {"to": to}
            note = f"skip your Shamir share for client {to} (it left)" if skip else f"send your Shamir share for {to}"
            ask[k] = [(self._key_request(rnd, k, payload, note), ROTATION_PART + offset - 1)]
            expected[k] = [] if skip else [(SERVER, THRESHOLD_TAG, client_party(to))]
        got = self.call(link, "key_setup", ask, hook=False)
        self._exclude([k for k in ask if k not in got], "its Shamir share", where)
        for k in (k for k in ask if k in got):
            if [(m.relay, m.tag, m.receiver) for m in got[k]] != expected[k]:
                raise IntegrityError(
                    f"expected {len(expected[k])} Shamir share(s) for client {(k + offset) % K} and nothing else",
                    client=k,
                    **where,
                )

    def forward(self, client: int, msg: Message) -> None:
        """Relay ``msg`` to ``client``'s next bundle, counting the relayed bytes held (:attr:`relay_peak`).

        Nothing is relayed to a client left out at key set-up (:attr:`unfinished`).
        """
        if client in self.unfinished:
            return
        super().forward(client, msg)
        size = len(self._outbox[client][-1])
        self._held_for[client] = self._held_for.get(client, 0) + size
        self.relay_held += size
        self.relay_peak = max(self.relay_peak, self.relay_held)

    def queue(self, client: int, msg: Message, stage: str, part: int = 0) -> None:
        """Queue ``msg`` for ``client`` (:meth:`ServerHalf.queue`), unless it was left out at key set-up."""
        if client not in self.unfinished:
            super().queue(client, msg, stage, part)

    def call(self, link: ClientLink, stage: str, messages: _Requests, *, hook: bool = True) -> dict[int, list[Message]]:
        """Run one stage (:meth:`ServerHalf.call`); the relayed messages queued for its clients leave with it.

        A client left out at key set-up (:attr:`unfinished`) is never addressed: it holds no keys of the run (at
        ``download``: it got no result, :attr:`last_undelivered`).
        """
        skipped = set(messages) & self.unfinished
        messages = {k: v for k, v in messages.items() if k not in self.unfinished}
        for k in messages:  # their queued relays leave in this call's bundles
            self.relay_held -= self._held_for.pop(k, 0)
        got = super().call(link, stage, messages, hook=hook)
        if stage == "download" and skipped:
            self.last_undelivered = tuple(sorted(set(self.last_undelivered) | skipped))
        return got

    # ------------------------------------------------------------------ one exchange
    def run(self, plan: ExchangePlan, link: ClientLink) -> tuple[int, ...]:
        """Run one multiparty CKKS exchange: add the uploads, gather key-switch shares, send the switched sums.

        Under a threshold t < n, up to n - t silent clients are tolerated; more raise an error naming them.
        """
        self.plan, self.exchange = plan, plan.exchange
        self.ensure_keys(link, plan.round)
        K, fp = self.setup.num_clients, cast(str, self.fingerprint)  # set by ensure_keys
        cks = planned_broadcast_blocks(plan.encoding, plan.num_blocks)  # (:func:`.keyswitch.broadcast_blocks`)
        ep = plan_exchange(
            self.params,
            plan.spec,
            K,
            plan.dp_noise_std,
            plan.block_len,
            tag=plan.tag,
            round=plan.round,
            broadcast=cks.size == plan.num_blocks,
        )
        plan = replace(plan, encoding={**plan.encoding, "fingerprint": fp})
        self.begin(plan, link, fp, extra=tuple(range(K)))  # every client key-switches
        if not plan.requests:
            raise ShapeError("the exchange has no recipients", **self.where())
        spans = [(a, min(plan.block_len, a + ep.capacity)) for a in range(0, plan.block_len, ep.capacity)]
        pieces, ct_shape, c0_shape = len(spans), (2, ep.switch_level, ep.n), (ep.level, ep.n)
        contributors = list(plan.contributors)
        server_s = 0.0

        first: _Requests = {k: [] for k in range(K)}
        ids_of: dict[int, np.ndarray] = {}
        if plan.layout == "sparse":  # block ids travel in the clear (documented leak)
            got = self.call(link, "block_ids", first)
            first = {}
            answers = {k: self.responses(got, k, "block_ids", "metadata") for k in contributors}
            silent = [k for k, msg in answers.items() if msg is None]
            if len(silent) > K - self.threshold:
                raise self._missing(silent, "its block ids", tag=plan.tag, round=plan.round)
            for k, msg in answers.items():
                if msg is None:
                    continue
                self.check_envelope(msg, fp, k)
                ids = np.asarray((msg.payload or {}).get("block_ids", []), dtype=np.int64).ravel()
                if ids.size and (ids.min() < 0 or ids.max() >= plan.num_blocks or (np.diff(ids) <= 0).any()):
                    raise ShapeError(f"block ids must be increasing in [0, {plan.num_blocks})", **self.where(k))
                ids_of[k] = ids
        else:
            ids_of = {k: np.arange(plan.num_blocks) for k in contributors}

        # upload: every ciphertext checked, then added per needed block
        got = self.call(link, "upload", {**first, **{k: [] for k in ids_of}})
        t = time.perf_counter()
        msgs = {k: self.responses(got, k, "upload", "ciphertext") if k in ids_of else None for k in contributors}
        missing = [k for k, msg in msgs.items() if msg is None]
        if len(missing) > K - self.threshold:
            raise self._missing(missing, "its upload", tag=plan.tag, round=plan.round)
        provisioned = plan.encoding.get("provisioned_dropouts", math.inf)  # distributed DP: --dp-dropouts
        if len(missing) > provisioned:
            err = DropoutError(
                f"client(s) {', '.join(map(str, missing))} did not send its upload: with distributed DP every client "
                f"adds a share of the noise variance provisioned for at most {provisioned:g} dropout(s), so a sum "
                "without them would be short of DP noise (--dp-dropouts); nothing was delivered",
                **cast(dict[str, Any], {"client": missing[0], "tag": plan.tag, "round": plan.round}),
            )
            err.clients = tuple(missing)
            raise err
        uploaders = [k for k in contributors if k not in missing]  # t-out-of-n: the rest are dropouts
        uploads: dict[int, np.ndarray] = {}
        for k, msg in ((k, cast(Message, msgs[k])) for k in uploaders):
            self.check_envelope(msg, fp, k)
            ids = ids_of[k]
            if tuple(msg.shape) != (ids.size, plan.block_len):
                raise ShapeError(
                    f"upload of shape {tuple(msg.shape)}, expected {(ids.size, plan.block_len)}", **self.where(k)
                )
            try:
                uploads[k] = encryption.from_bytes(self.ring, msg.payload, (ids.size, pieces) + c0_shape, words=True)
            except ValueError as exc:
                raise IntegrityError(f"upload rejected: {exc}", **self.where(k)) from None
        del msgs, got  # the upload bundles: ``uploads`` views them until added below
        needed = sorted({int(b) for bids in plan.requests.values() for b in bids.tolist()})
        index = {b: i for i, b in enumerate(needed)}
        agg = np.zeros((len(needed), pieces) + c0_shape, dtype=np.int64)  # coefficient form
        counts = np.zeros(len(needed), dtype=np.int64)
        for k, cts in uploads.items():  # residues below 2^31: K < 2^32 of them add up exactly in int64
            placed = [(index[int(b)], i) for i, b in enumerate(ids_of[k].tolist()) if int(b) in index]
            if len(placed) == len(needed) == cts.shape[0] and all(d == i for d, i in placed):  # every block, in order
                agg += cts
                counts += 1
            elif placed:
                dst, src = (np.array(x) for x in zip(*placed))
                agg[dst] += cts[src]
                counts[dst] += 1
        del uploads
        self.ring.reduce(agg)
        if ep.offset:  # pad the missing clients' public offsets
            for i in np.nonzero(counts < K)[0]:
                for j, (a, b) in enumerate(spans):
                    pad = encoding.offset_plaintext(self.ring, ep, b - a, int(K - counts[i]))
                    agg[i, j] = self.ring.add(agg[i, j], pad)

        # keyswitch: one group to the broadcast key for the plan's broadcast blocks, one per recipient for the rest
        shared = set(cks.tolist())
        rows_of = {
            int(r): [index[int(b)] for b in bids.tolist() if int(b) not in shared] for r, bids in plan.requests.items()
        }
        groups: list[_Group] = [(-1, [index[b] for b in cks.tolist()])] if cks.size else []
        groups += [(r, rows) for r, rows in rows_of.items() if rows]
        server_s += time.perf_counter() - t
        active = list(range(K))
        eligible: list[int] = []
        planned: dict[str, np.ndarray] = {"groups": _table(groups), "blocks": _blocks(groups, needed)}
        if self.threshold < K:  # the active set, the uploaders and which of them uploaded each planned block
            eligible = self._eligible(link, contributors, uploaders)
            active = eligible[: self.threshold]
            table_of = np.zeros((planned["blocks"].size, K), dtype=np.uint8)
            for k in uploaders:
                table_of[:, k] = np.isin(planned["blocks"], ids_of[k])
            planned.update(uploaders=np.array(uploaders, dtype=np.int64), uploaded=table_of)
        row_bytes = pieces * ep.switch_level * ep.n * 4 * len(active)  # one CKS row's shares; PCKS: twice that
        batches = batches_of(groups, lambda to: row_bytes * (1 if to < 0 else 2), self.batch_bytes)
        switched: dict[int, list[bytes]] = {}  # each group's sum as wire bytes, its shares released once combined
        lost: list[int] = []
        replan = b = 0
        part = int(self.threshold < K)  # the next request's envelope part (t-out-of-n: part 0 is the probe)
        opening = True  # the next request opens a (re-)plan: it names the planned switch
        while b < len(batches):
            shares, missing = self._keyswitch(
                link, batches[b], needed, active, (b, replan, part), (pieces,) + ct_shape, planned if opening else None
            )
            part += 1
            if missing:  # t-out-of-n: re-plan the batches left without the lost (n-out-of-n: none is left to ask)
                lost += missing
                active = [k for k in eligible if k not in lost][: self.threshold]
                if len(active) < self.threshold:
                    raise self._missing(
                        sorted(lost), "its key-switching (partial decryption) shares", tag=plan.tag, round=plan.round
                    )
                replan, opening = replan + 1, True
                continue
            t = time.perf_counter()
            for g, (to, rows) in enumerate(batches[b]):
                combine = combine_broadcast if to < 0 else combine_shares
                part_sum = combine(self.ring, agg[rows].reshape((-1,) + c0_shape), shares[g])
                switched.setdefault(to, []).append(encryption.to_bytes(part_sum))
                shares[g] = []
            del shares  # the batch's share bundles (the shares view them), before the next batch
            opening, b = False, b + 1
            server_s += time.perf_counter() - t
        del agg  # the aggregate, before the downloads

        shared_data = b"".join(switched.pop(-1, []))
        downloads: _Requests = {}
        for r, rows in rows_of.items():
            data = b"".join(switched.pop(r, []))
            downloads[r] = [
                (
                    self.message(
                        r,
                        "ciphertext",
                        (cks.size + len(rows), pieces),
                        {"to": r, "data": data, "broadcast": shared_data},
                        fp,
                        note=f"aggregate blocks key-switched: {cks.size} to the broadcast key, {len(rows)} to "
                        f"recipient {r}'s key",
                    ),
                    0,
                )
            ]
        got = self.call(link, "download", downloads)
        if self.schedule is not None and self.schedule.commits_decoded(plan.tag):
            self._commit_release(link, got)
        self.last_stats = {
            "server_s": server_s,
            "plan": ep,
            "active": tuple(active),
            "lost": tuple(sorted(lost)),
            "replans": replan,
            "keyswitch_batches": len(batches),
            "keyswitch_requests": part - int(self.threshold < K),
        }
        return tuple(uploaders)

    def _commit_release(self, link: ClientLink, got: dict[int, list[Message]]) -> None:
        """Stage 5 (module docstring): commit to the recipients' digests of the released rows, send root and proofs."""
        plan, fp = cast(ExchangePlan, self.plan), cast(str, self.fingerprint)
        reports: dict[int, dict[int, bytes]] = {}
        for r, bids in plan.requests.items():
            msg = self.responses(got, r, "download", "metadata")
            if msg is None:
                continue  # silent at its download (last_undelivered)
            self.check_envelope(msg, fp, r)
            digests = (msg.payload or {}).get("digests") if isinstance(msg.payload, dict) else None
            if not isinstance(digests, (bytes, bytearray)) or len(digests) != DIGEST_BYTES * bids.size:
                raise IntegrityError("malformed digests of the released rows", **self.where(r))
            cut = [bytes(digests[i : i + DIGEST_BYTES]) for i in range(0, len(digests), DIGEST_BYTES)]
            reports[r] = dict(zip(bids.tolist(), cut))
        messages = self.release_messages(reports)
        self.call(
            link,
            "release",
            {
                k: [(self.message(k, "control", (), payload, fp, note="commitment to the released rows"), 0)]
                for k, payload in messages.items()
            },
        )

    def release_messages(self, reports: dict[int, dict[int, bytes]]) -> dict[int, dict[str, Any]]:
        """Every client's ``release`` payload: the root over the reported digests, a recipient's with its proof.

        Raises:
            IntegrityError: two recipients report different digests of one block (one of them decoded another
                sum: a corrupted share or ciphertext).
        """
        plan = cast(ExchangePlan, self.plan)
        leaves = [empty_leaf(b) for b in range(plan.num_blocks)]
        seen: dict[int, tuple[int, bytes]] = {}
        for r, digests in sorted(reports.items()):
            for b, d in digests.items():
                if b in seen and seen[b][1] != d:
                    raise IntegrityError(
                        f"recipients {seen[b][0]} and {r} decoded different values of block {b}", **self.where(r)
                    )
                seen[b] = (r, d)
                leaves[b] = leaf(b, d)
        levels = tree(leaves)
        root = root_of(levels)
        return {
            k: {"root": root, "proof": prove(levels, sorted(reports.get(k, {})))} for k in range(self.setup.num_clients)
        }

    def _keyswitch(
        self,
        link: ClientLink,
        groups: list[_Group],
        needed: list[int],
        active: list[int],
        attempt: tuple[int, int, int],
        shape: tuple[int, ...],
        planned: dict[str, np.ndarray] | None,
    ) -> tuple[list[list[np.ndarray]], list[int]]:
        """Ask the active set ``active`` for its key-switching shares of one batch of ``groups``.

        ``attempt``: (batch, re-plan, the request's envelope part); the shares come at :func:`.client.share_part`.
        ``planned``: the exchange's planned switch, sent with the first batch of the switch (t-out-of-n: of each
        re-plan), with every planned recipient's key a member has not been sent.  t-out-of-n: every request names
        ``active``.  Returns (the shares per group, the members of ``active`` that did not answer).  ``needed``: the
        block of each aggregate row; ``shape``: (pieces, ``c1``'s shape after switching down).
        """
        K, fp, (pieces, *ct_shape) = self.setup.num_clients, cast(str, self.fingerprint), shape
        batch, replan, part = attempt
        table, blocks = _table(groups), _blocks(groups, needed)
        first = share_part(part, 0, K)
        payload: dict[str, Any] = {"active": np.array(active, dtype=np.int64)} if self.threshold < K else {}
        if planned is not None:
            payload["planned"] = planned
        requests: _Requests = {}
        named = planned["groups"][:, 0].tolist() if planned is not None else [r for r, _ in groups]
        for k in active:  # the first batch: every planned recipient's key
            new = [r for r in named if r >= 0 and r != k and (k, r) not in self._keys_sent]
            self._keys_sent.update((k, r) for r in new)
            keys = {r: {"key": self.recipient_pks[r][0], "sig": self.recipient_pks[r][1]} for r in new}
            requests[k] = [
                (
                    self.message(
                        k,
                        "control",
                        (len(groups), 2),
                        {"groups": table, "blocks": blocks, "keys": keys, **payload},
                        fp,
                        note=f"block ids to key-switch, per recipient key (batch {batch})"
                        + (f" (re-plan {replan}: active set {active})" if replan else ""),
                    ),
                    part,
                )
            ]
        got = self.call(link, "keyswitch", requests)
        shares: list[list[np.ndarray]] = [[] for _ in groups]
        missing: list[int] = []
        for k in active:
            mine = {envelope_of(m).part - first: m for m in got.get(k, []) if m.relay != SERVER}
            if len(mine) < len(groups):
                missing.append(k)
                continue
            if set(mine) != set(range(len(groups))):
                raise IntegrityError(
                    f"key-switching shares for parts {sorted(p + first for p in mine)}, expected one per group "
                    f"{first}..{first + len(groups) - 1}",
                    **self.where(k),
                )
            for g, (to, rows) in enumerate(groups):
                msg = self.check(mine[g], client_party(k), "keyswitch", first + g, self.where(k))
                if msg.kind != "share":
                    raise IntegrityError(f"expected a 'share' message, got '{msg.kind}'", **self.where(k))
                self.check_envelope(msg, fp, k)
                shape = (len(rows) * pieces, *(ct_shape[1:] if to < 0 else ct_shape))  # CKS: one polynomial
                try:
                    shares[g].append(encryption.from_bytes(self.ring, msg.payload, shape, words=True))
                except ValueError as exc:
                    raise IntegrityError(f"key-switching share rejected: {exc}", **self.where(k)) from None
        return shares, missing

    def _eligible(self, link: ClientLink, contributors: list[int], uploaders: list[int]) -> list[int]:
        """T-out-of-n: the clients an active set may hold, in the order they answered the probe.

        t-out-of-n: probe every client; the responders that uploaded or contribute nothing (a contributor that
        missed its upload is not asked) and are not :attr:`stale`, at least t of them.  The active set is the
        first t; a re-plan takes the next.
        """
        K, t, plan = self.setup.num_clients, self.threshold, cast(ExchangePlan, self.plan)
        probe = {
            k: [
                (
                    self.message(
                        k, "control", (), {}, cast(str, self.fingerprint), note="key-switching liveness probe"
                    ),
                    0,
                )
            ]
            for k in range(K)
        }
        got = self.call(link, "keyswitch", probe)
        ready = []
        for k in range(K):
            if self.responses(got, k, "keyswitch", "control", READY_PART) is not None:
                ready.append(k)
        eligible = [k for k in ready if (k in uploaders or k not in contributors) and k not in self.stale]
        if len(eligible) < t:
            absent = [k for k in range(K) if k not in eligible]
            raise self._missing(
                absent, "an answer to the key-switching probe (or its upload)", tag=plan.tag, round=plan.round
            )
        return eligible


def _table(groups: list[_Group]) -> np.ndarray:
    """``[(key, rows)]`` of key-switching groups (key -1: the broadcast key)."""
    return np.array([(to, len(rows)) for to, rows in groups], dtype=np.int64).reshape(-1, 2)


def _blocks(groups: list[_Group], needed: list[int]) -> np.ndarray:
    """The block ids of the groups' aggregate rows, in order."""
    return np.array([needed[i] for _, rows in groups for i in rows], dtype=np.int64)


def batches_of(groups: list[_Group], row_bytes: Callable[[int], int], bound: int) -> list[list[_Group]]:
    """Cut key-switching groups, in order, into batches of at most ``bound`` share bytes each.

    ``row_bytes(key)``: the bytes of one aggregate row's shares (all clients') to that key.  A group larger than the
    room left is split across batches; a row larger than ``bound`` travels alone.  At least one (possibly empty)
    batch.
    """
    out: list[list[_Group]] = []
    batch: list[_Group] = []
    size = 0
    for to, rows in groups:
        per, start = row_bytes(to), 0
        while start < len(rows):
            room = (bound - size) // per
            if room <= 0 and batch:
                out.append(batch)
                batch, size = [], 0
                continue
            chunk = rows[start : start + max(room, 1)]
            batch.append((to, chunk))
            size += len(chunk) * per
            start += len(chunk)
    return out + [batch] if batch or not out else out
