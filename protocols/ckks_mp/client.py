"""The client half of ``ckks-mp``: one client's key shares, encryption, partial decryptions and
decryption of its own result, behind :meth:`~protocols.party.ClientHalf.handle` (bytes only).

Built from the run's public setup bytes (:class:`~protocols.party.PartySetup`: the ring
parameters).  Its secrets -- the collective-key share ``s_i``, its recipient key ``s_R`` and the
clients' broadcast key ``s_B`` -- are sampled from the OS CSPRNG here (:class:`.party.MPClient`)
and never serialized (``s_B`` travels once, from client 0 to each other client, over the
encrypted client-to-client channel).  Stages (server request -> this client's answer):

``key_setup`` part 0   the public CRS seed -> ``p_i = -a s_i + e_i`` and ``p_R = -a s_R + e_R``;
                       client 0 also ``p_B`` and, for every other client, ``s_B`` sealed on the
                       channel (the server relays it and cannot open it)
``key_setup`` part 1   the collective key ``p = sum_i p_i`` and ``p_B`` -> nothing; the client
                       checks the context's fingerprint, and a client j > 0 opens ``s_B`` and
                       checks that ``p_B + a s_B`` is a small error
``block_ids``          (sparse layout) -> the ids of the blocks it uploads (the documented leak)
``upload``             -> its blocks, checked against the public plan (ShapeError / BoundError
                       naming it; nothing encrypted), encrypted under ``p``
``keyswitch``          ``c1`` of each group of aggregate blocks and the key it goes to -> its PCKS
                       share per group (Mouchet et al. 2021, Protocol 5): its partial decryption,
                       re-encrypted to the recipient's key and smudged
``download``           its blocks, switched to its own key (or to ``s_B``) -> nothing; it
                       decrypts, checks the residual against the worst-case noise bound
                       (IntegrityError: a corrupted share or ciphertext) and decodes
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..ckks.backend import DecryptionMemo
from ..ckks.params import per_client_limits
from ..errors import BoundError, IntegrityError, SmudgingBudgetError
from ..party import ClientHalf, envelope_of
from ..transcript import SERVER, Message
from ..validate import check_block_table, find_violation
from . import encoding, encryption
from .keys import key_fingerprint
from .params import TOTAL_DISTANCE_BITS, Plan, params_from_options, plan_exchange, ring_of, smudging_bits
from .party import MPClient
from .sampling import common_polynomial

KEYS_TAG = "ckks-mp/keys"
#: clients in one process decode a broadcast delivery (same bytes, same key s_B) once; each gets a copy
_MEMO = DecryptionMemo()


class CKKSMPClient(ClientHalf):
    """One client of ``ckks-mp`` (module docstring)."""

    mode = "ckks-mp"

    def __init__(self, client_id: int, setup: bytes, provider=None):
        super().__init__(client_id, setup, provider)
        self.params = params_from_options(self.setup.options["params"])
        self.ring = ring_of(self.params)
        #: the key shares (made at key set-up from the OS CSPRNG; never serialized)
        self.keys: MPClient | None = None
        self.fingerprint = ""
        self._seed = b""
        #: recipients' public keys p_R, as the server sent them (public)
        self.recipient_keys: dict[int, np.ndarray] = {}
        #: seconds of the key set-up, and per stage of the last exchange (benchmarks)
        self.setup_s = 0.0
        self.timing: dict[str, float] = {}
        self._state = (None, None)              # (exchange, checked contribution)
        #: ciphertexts this client key-switched in the run (against MPParams.max_keyswitches)
        self.switched = 0

    def on_stage(self, stage, inbox):
        if stage == "key_setup":
            return self._key_setup(inbox)
        if self.plan is None:
            return []
        if self.keys is None or self.plan.encoding.get("fingerprint") != self.fingerprint:
            raise IntegrityError("the exchange names a key this client did not set up", **self.where())
        if self._state[0] != self.plan.exchange:
            self._state, self.timing = (self.plan.exchange, None), {}
        if stage == "block_ids":
            return self._block_ids()
        if stage == "upload":
            return self._upload()
        if stage == "keyswitch":
            return self._keyswitch(inbox)
        if stage == "download":
            return self._download(inbox)
        return []

    def _from_server(self, inbox, stage: str, where: dict) -> Message:
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError(f"expected one '{stage}' message from the server, got {len(mine)}", **where)
        return self.check(mine[0], SERVER, stage, envelope_of(mine[0]).part if stage == "key_setup" else 0, where)

    def _plan(self) -> Plan:
        """The exchange's encoding, derived from the public plan; it must be the server's."""
        p = self.plan
        ep = plan_exchange(self.params, p.spec, self.setup.num_clients, p.dp_noise_std, p.block_len,
                           tag=p.tag, round=p.round)
        if ep.describe() != p.encoding.get("plan"):
            raise IntegrityError(f"the server's encoding {p.encoding.get('plan')!r} is not the one the public "
                                 f"bounds give ({ep.describe()})", **self.where())
        return ep

    def _pieces(self, ep: Plan) -> list[int]:
        return [min(self.plan.block_len, a + ep.capacity) - a for a in range(0, self.plan.block_len, ep.capacity)]

    # ------------------------------------------------------------------ keys
    def _key_setup(self, inbox):
        where = dict(tag=KEYS_TAG, round=None, client=self.id)
        req = self._from_server(inbox, "key_setup", where)
        where["round"] = req.round
        if not isinstance(req.payload, dict):
            raise IntegrityError("malformed key set-up message", **where)
        t = time.perf_counter()
        if envelope_of(req).part == 0:
            out = self._make_keys(req, where)
        else:
            self._take_public_keys(req, [m for m in inbox if m.sender != SERVER], where)
            out = []
        self.setup_s += time.perf_counter() - t
        return out

    def _make_keys(self, req: Message, where: dict):
        seed = req.payload.get("seed")
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise IntegrityError("the CRS seed must be 32 bytes", **where)
        self._seed = seed
        self.keys = MPClient(self.id, self.ring, self.params, common_polynomial(seed, self.params.primes,
                                                                                self.params.n))
        public = {"share": self.keys.public_share, "recipient": self.keys.recipient_public_key}
        relayed = []
        if self.id == 0:                           # the dealer of the broadcast key
            public["broadcast"] = self.keys.make_broadcast_key()
            secret = self.keys.broadcast_secret()
            relayed = [self.seal_relayed(k, "key_setup", secret, "broadcast secret s_B", "", tag=KEYS_TAG,
                                         round=req.round) for k in range(1, self.setup.num_clients)]
        msg = Message(req.round, KEYS_TAG, self.name, SERVER, "public_key",
                      (len(public), self.params.num_primes, self.params.n), 0, self.mode, "", public,
                      note="p_i = -a s_i + e_i and p_R = -a s_R + e_R" + (", p_B" if self.id == 0 else ""))
        return [self.seal(msg, "key_setup")] + relayed

    def _take_public_keys(self, req: Message, relayed: list[Message], where: dict) -> None:
        if self.keys is None:
            raise IntegrityError("public keys before this client's key shares", **where)
        shape = (self.params.num_primes, self.params.n)
        try:
            pk_bytes = req.payload["collective"]
            collective = encryption.from_bytes(self.ring, pk_bytes, shape)
            p_b = encryption.from_bytes(self.ring, req.payload["broadcast"], shape)
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed public keys ({e})", **where) from None
        fp = key_fingerprint(self.params.describe(), self._seed, pk_bytes)
        if req.fingerprint != fp:
            raise IntegrityError("the server's key fingerprint is not that of the seed and collective key", **where)
        if self.id == 0:
            if not np.array_equal(p_b, self.keys.broadcast_pk):
                raise IntegrityError("the server changed the broadcast public key", **where)
        else:
            if len(relayed) != 1:
                raise IntegrityError(f"expected the broadcast secret from client 0, got {len(relayed)} messages",
                                     **where)
            env = envelope_of(relayed[0])
            secret = self.open_relayed(relayed[0], "key_setup", env.part, exchange=env.exchange)
            try:
                self.keys.adopt_broadcast_key(secret, p_b)
            except ValueError as e:
                raise IntegrityError(f"broadcast key refused: {e}", **where) from None
        self.keys.collective_pk = collective
        self.fingerprint = fp

    # ------------------------------------------------------------------ upload
    def _table(self):
        """This exchange's contribution, checked against the public plan before anything is encrypted."""
        if self._state[1] is None:
            p, K = self.plan, self.setup.num_clients
            ids, vals = check_block_table(p, self.id, self.contribution(), K)
            lo, hi, offset = per_client_limits(p.spec, p.dp_noise_std, K)
            bad = find_violation(vals, lo, hi, p.spec.integer)
            if bad is not None:
                i, v, why = bad
                raise BoundError(f"entry {i % p.block_len} of block {int(ids[i // p.block_len])} is {v:g}, which "
                                 f"{why} of this exchange ({self._plan().describe()}; ValueSpec "
                                 f"max_abs={p.spec.max_abs:g}, sum_max={p.spec.sum_max}"
                                 + (f", DP offset {offset}" if offset else "") + "). Nothing was encrypted. Fix: "
                                 "clip the values or declare a larger public bound", **self.where())
            self._state = (p.exchange, (np.asarray(ids, dtype=np.int64), np.asarray(vals, dtype=np.float64)))
        return self._state[1]

    def _block_ids(self):
        if self.id not in self.plan.contributors:
            return []
        ids, _ = self._table()
        msg = self.message(SERVER, "metadata", (ids.size,), {"block_ids": ids.astype(np.int32)}, self.fingerprint,
                           note="block ids of the sparse layout")
        return [self.seal(msg, "block_ids")]

    def _upload(self):
        p = self.plan
        if self.id not in p.contributors:
            return []
        ep = self._plan()
        ids, vals = self._table()
        t = time.perf_counter()
        data = self.keys.encrypt_blocks(ep, vals)
        self.timing["upload_s"] = time.perf_counter() - t
        pieces = len(self._pieces(ep))
        msg = self.message(SERVER, "ciphertext", (ids.size, p.block_len), data, self.fingerprint,
                           note=f"{ids.size * pieces} ciphertexts, {ep.describe()}")
        return [self.seal(msg, "upload")]

    # ------------------------------------------------------------------ partial decryption (PCKS shares)
    def _keyswitch(self, inbox):
        where = self.where()
        req = self._from_server(inbox, "keyswitch", where)
        ep = self._plan()
        t = time.perf_counter()
        try:
            for r, key in req.payload["keys"].items():
                self.recipient_keys[int(r)] = encryption.from_bytes(self.ring, key,
                                                                    (self.params.num_primes, self.params.n))
            groups = np.asarray(req.payload["groups"], dtype=np.int64).reshape(-1, 2)
            c1 = encryption.from_bytes(self.ring, req.payload["c1"], (int(groups[:, 1].sum()), ep.level, ep.n))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IntegrityError(f"malformed key-switching request ({e})", **where) from None
        smudge = smudging_bits(self.params, self.setup.num_clients)
        total = int(groups[:, 1].sum())
        if self.switched + total > self.params.max_keyswitches:
            raise SmudgingBudgetError(f"{total} more key-switched ciphertexts would exceed this run's budget of "
                                      f"{self.params.max_keyswitches} ({self.switched} done), past which the "
                                      f"smudging's total distance exceeds 2^-{TOTAL_DISTANCE_BITS}. Fix: raise "
                                      "MPParams.max_keyswitches (a larger smudging noise)", **where)
        self.switched += total
        out, start = [], 0
        for g, (to, count) in enumerate(groups.tolist()):
            if to >= 0 and to not in self.recipient_keys:
                raise IntegrityError(f"no public key of recipient {to}", **where)
            pk = self.keys.broadcast_pk if to < 0 else self.recipient_keys[to]
            label = "the broadcast key" if to < 0 else f"recipient {to}'s key"
            share = self.keys.pcks_shares(ep, c1[start:start + count], pk, smudge)
            start += count
            msg = self.message(SERVER, "share", (count,), share, self.fingerprint, note=f"PCKS shares to {label}")
            out.append(self.seal(msg, "keyswitch", g))
        self.timing["keyswitch_s"] = time.perf_counter() - t
        return out

    # ------------------------------------------------------------------ download
    def _download(self, inbox):
        p = self.plan
        if self.id not in p.requests:
            return []
        where = self.where()
        msg = self._from_server(inbox, "download", where)
        ep = self._plan()
        lengths = self._pieces(ep)
        bids = p.requests[self.id]
        t = time.perf_counter()
        try:
            to = int(msg.payload["to"])
            cts = encryption.from_bytes(self.ring, msg.payload["data"], (bids.size * len(lengths), 2, ep.level, ep.n))
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed download ({e})", **where) from None
        if to not in (-1, self.id):
            raise IntegrityError(f"a download switched to client {to}'s key", **where)
        decode = lambda: self._decode(ep, cts, bids, lengths, to < 0)  # noqa: E731
        values = decode() if to >= 0 else _MEMO.decrypt(
            (self.fingerprint, self.setup.run_id, self.setup.session, p.exchange, bids.tobytes()),
            bytes(msg.payload["data"]), decode)
        self.timing["download_s"] = time.perf_counter() - t
        self.deliver({int(b): v for b, v in zip(bids.tolist(), values)})
        return []

    def _decode(self, ep: Plan, cts: np.ndarray, bids: np.ndarray, lengths: list[int], broadcast: bool) -> np.ndarray:
        """Decrypt and decode the delivered blocks ``[len(bids), block_len]``; IntegrityError when a
        residual exceeds the worst-case noise bound or a field is out of range."""
        decoded = self.keys.decrypt_delivery(ep, cts, lengths * bids.size, broadcast) if bids.size else []
        out = np.zeros((bids.size, self.plan.block_len))
        for i, b in enumerate(bids.tolist()):
            parts = []
            for j in range(len(lengths)):
                fields, residual, in_range = decoded[i * len(lengths) + j]
                if residual > ep.noise_bound or not in_range:
                    why = (f"noise 2^{math.log2(residual):.1f} above the worst-case bound "
                           f"2^{math.log2(ep.noise_bound):.1f}" if residual > ep.noise_bound
                           else "a packed field out of range")
                    raise IntegrityError(f"block {b} decrypts with {why}: a key-switching share or ciphertext was "
                                         "corrupted; nothing was delivered", **self.where())
                parts.append(encoding.dequantize(fields, ep))
            out[i] = np.concatenate(parts)
        return out
