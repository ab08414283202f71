"""The CKKS backend: clients encrypt, the server only adds, recipients decrypt.

One exchange (:meth:`CKKSServer.run` driving one :class:`CKKSClient` per client over a
:class:`~protocols.link.ClientLink`, only bytes crossing), in order:

1. **Plan** (public): from the exchange's :class:`~protocols.base.ValueSpec`, K and the DP
   noise std, :mod:`protocols.ckks.params` picks a one-data-prime chain, the scale and
   float, packed integer or (``fixed_point_bits``) packed fixed-point encoding
   (:mod:`protocols.ckks.fixed_point`), and checks the error bound (BoundError otherwise).
   The plan travels to every party in the exchange's ``plan`` message; a client re-checks
   the chain's security before using it.
2. **Client-side validation, before anything is encrypted**: shapes, finiteness, every
   value inside the public range of the encoding (BoundError / PackingOverflowError
   naming the client), and — integer exchanges only — a simulation-side audit that the
   K-way sum respects the public sum bound (no party could check this in a deployment;
   there the bound must be enforced where the data is made, e.g. by a degree cap).
3. **Keys** (stage ``key_setup``): on first use of a chain the server asks client 0, which
   makes the key pair, sends the public context to the server and the (padded) secret
   context to every other client over the relayed encrypted channel
   (:mod:`protocols.ckks.keys`); each client deserializes its own copy.
4. **Upload, streamed in chunks of blocks** (stage ``upload``, one link call per chunk,
   ``part`` = chunk number): each client encrypts its blocks (packed fixed point: first
   quantised with its own rounding generator, ``rounding_rng(seed, tag, round, client)``,
   drawn in block order across chunks; one
   ciphertext per block piece; rows stay aligned to ciphertexts because the base lays
   rows out in blocks of :meth:`block_capacity` values) and sends framed bytes
   (:mod:`protocols.ckks.wire`).  For each chunk the server checks the envelope
   (context fingerprint of this exchange's chain, round, tag), the shape and every
   ciphertext's bytes, scale and level of ALL clients before it adds any of them.
   Chunks bound memory to ``chunk_bytes`` of ciphertexts, so a 1e6-node FedGCN never
   holds the full N x d ciphertext array.  An exchange that fits one chunk (the default
   budget is 16 MiB) is validated completely before anything is summed.  In a larger
   one a bad ciphertext in a later chunk aborts the exchange after earlier chunks were
   summed; those partial sums are discarded — nothing is returned and no download is
   recorded (a real server would spool; this simulation just drops them).
5. **Server adds** per block id the ciphertexts of the clients that uploaded it (no
   plaintext multiply, no rotation: no Galois or relinearisation keys) and sends each
   recipient only the blocks it requested (FedGCN scoped return).
6. **Recipients decrypt** (stage ``download``, one call per chunk) and decode (round +
   unpack for integers), each its own blocks with its own copy of the key.

Transcript: per client per exchange one upload Message (kind ``ciphertext``; payload =
the list of framed serialized ciphertexts, kept only when <= ``keep_payload_bytes``
and the exchange was one chunk — larger payloads are stripped before recording and the
note says so; ``nbytes`` is always the real byte count).  In the sparse layout each
client also sends its block ids as a ``metadata`` message (the documented sparse-layout
leak).  Each recipient gets one download Message (kind ``ciphertext``).  The test hook
``self.intercept`` sees every client->server message before the server reads it (in a
streamed exchange: each chunk's part of a client's upload) and every download.  Every ciphertext has a fixed padded size per chain, so every message size is
a function of public shapes only.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import time
from dataclasses import replace

import numpy as np
import tenseal as ts

from ..base import ExchangeContext, ValueSpec
from ..errors import (
    BoundError,
    ConfigurationError,
    DropoutError,
    IntegrityError,
    MalformedMessageError,
    PackingOverflowError,
    ProtocolError,
    ShapeError,
)
from ..fixed_point import FixedPoint, rounding_rng
from ..halves import HalvesProtocol
from ..party import ClientHalf, ServerHalf, envelope_of
from ..transcript import SERVER, Message, client_party
from ..validate import check_block_table, find_violation, first_out_of_range
from . import wire
from .fixed_point import DEFAULT_FIELD_BITS, FixedPointLayout, client_codec, plan_fixed_point, server_load
from .keys import ClientKey, ClientKeyRing, ServerContext
from .packing import PackingLayout
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

KEYS_TAG = "ckks/keys"
#: sparse row_sum: a smaller ring is preferred when its bytes per value are at most this much
#: above the cheapest plan's (packed counts: N=4096 costs 0.15 % more per value than N=8192)
SPARSE_RING_TOLERANCE = 0.01
_LEN = struct.Struct(">I")


# ====================================================================== the public plan on the wire
def plan_to_payload(plan: EncodingPlan) -> dict:
    """An :class:`EncodingPlan` as a message body (all public)."""
    return {
        "chain": {
            "name": plan.chain.name,
            "n": plan.chain.poly_modulus_degree,
            "bits": np.asarray(plan.chain.coeff_mod_bit_sizes, np.int64),
        },
        "scale_bits": plan.scale_bits,
        "encoding": plan.encoding,
        "error_bound": float(plan.error_bound),
        "exact": bool(plan.exact),
        "sum_bound": float(plan.sum_bound),
        "layout": None if plan.layout is None else dataclasses.asdict(plan.layout),
    }


def _layout_from_payload(p: dict) -> PackingLayout | FixedPointLayout:
    """A packed layout: integer fields (:class:`PackingLayout`) or packed fixed point (``codec``)."""
    if "codec" not in p:
        return PackingLayout(**{k: int(v) for k, v in p.items()})
    c = p["codec"]
    codec = FixedPoint(
        float(c["entry_bound"]),
        float(c["sum_bound"]),
        int(c["num_clients"]),
        int(c["width"]),
        int(c["fields"]),
        bool(c["integer"]),
        int(c["grid_bits"]),
    )
    return FixedPointLayout(codec, int(p["slots"]), str(p["encryption"]), int(p["offset"]))


def plan_from_payload(p) -> EncodingPlan:
    """Strict inverse of :func:`plan_to_payload`; the chain must be 128-bit secure."""
    try:
        c = p["chain"]
        chain = ChainParams(str(c["name"]), int(c["n"]), tuple(int(b) for b in np.asarray(c["bits"]).ravel()))
        layout = None if p["layout"] is None else _layout_from_payload(p["layout"])
        plan = EncodingPlan(
            chain,
            int(p["scale_bits"]),
            str(p["encoding"]),
            float(p["error_bound"]),
            bool(p["exact"]),
            layout,
            float(p["sum_bound"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise MalformedMessageError(f"malformed CKKS encoding plan ({e})") from None
    check_security(chain)
    return plan


def _pieces(plan: EncodingPlan, block_len: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Value ranges of a block's ciphertexts and their slot counts."""
    per_ct = plan.values_per_ciphertext
    n_pieces = math.ceil(block_len / per_ct)
    bounds = [(j * per_ct, min(block_len, (j + 1) * per_ct)) for j in range(n_pieces)]
    return bounds, [(plan.layout.slots_for(b - a) if plan.layout is not None else b - a) for a, b in bounds]


def _chunks(num_blocks: int, per_chunk: int) -> list[tuple[int, int]]:
    return [(b0, min(num_blocks, b0 + per_chunk)) for b0 in range(0, num_blocks, per_chunk)]


def _encrypt(context: ts.Context, plan: EncodingPlan, values: np.ndarray, encryption: str) -> bytes:
    """One framed fresh ciphertext (SEAL's seeded form under symmetric encryption: half the bytes)."""
    fixed = isinstance(plan.layout, FixedPointLayout)
    size = plan.chain.upload_ciphertext_bytes(encryption)
    for _ in range(8):  # a fresh encryption's size is independent of the data (wire doc)
        if fixed:
            ct = plan.layout.encrypt(context, plan, values)
        else:
            slots = (plan.layout.pack(values) if plan.layout is not None else np.asarray(values)).tolist()
            ct = client_codec(context, plan.chain, encryption).encrypt(slots, plan.scale)
        if len(ct) <= size:
            return wire.frame(ct, size)
    raise ConfigurationError(
        f"ciphertexts of {plan.chain.describe()} exceed the padded size {size}; "
        "update PADDED_CT_BYTES / PADDED_SEEDED_CT_BYTES for this TenSEAL version"
    )


def _decrypt(
    context: ts.Context,
    plan: EncodingPlan,
    frame: bytes,
    n: int,
    where: dict,
    encryption: str,
    step: float | None = None,
) -> np.ndarray:
    """Decrypt and decode one frame; float sums rounded to the grid ``step`` (:func:`.params.release_step`)."""
    if isinstance(plan.layout, FixedPointLayout):
        vals, residual, in_range = plan.layout.decrypt(context, plan, wire.unframe(frame), n)
    else:
        slots = n if plan.layout is None else plan.layout.slots_for(n)
        dec = client_codec(context, plan.chain, encryption).decrypt(wire.unframe(frame), plan.chain).real[:slots]
        if plan.layout is None:
            return np.rint(dec) if plan.exact else dec if step is None else np.rint(dec / step) * step
        vals, residual, in_range = plan.layout.unpack(dec, n)
    if residual > 0.25 or not in_range:
        raise BoundError(
            f"decoded packed slots are off their integers by {residual:.3g} (bound "
            f"{plan.error_bound:.3g}) or out of range: the CKKS noise model or the public sum "
            "bound was violated; the result was refused",
            **where,
        )
    return vals


class DecryptionMemo:
    """Clients in one process decrypt each distinct summed ciphertext once.

    A simulation shortcut (the in-process default plays K clients on one core): identical
    ciphertext bytes under the same key decrypt to the same values, so a client that presents
    a frame some co-located client already decrypted in this exchange gets a copy of those
    values.  It learns nothing it could not compute itself (it holds the frame and the key);
    no array is shared (every hit is a copy).  Entries of the current scope only (the caller's:
    one streamed chunk of one exchange, so memory holds one chunk of decrypted blocks).
    """

    def __init__(self):
        self._scope: tuple | None = None
        self._values: dict[bytes, np.ndarray] = {}

    def decrypt(self, scope: tuple, frame: bytes, compute) -> np.ndarray:
        if scope != self._scope:
            self._scope, self._values = scope, {}
        hit = self._values.get(frame)
        if hit is None:
            hit = self._values[frame] = compute()
        return hit.copy()


#: one per process (a Ray actor hosting several clients shares it between them)
_MEMO = DecryptionMemo()


# ====================================================================== client half
class CKKSClient(ClientHalf):
    """One client of the CKKS backend: holds the secret context of every chain (made by client 0,
    or received from it over the encrypted channel), encrypts its blocks, decrypts its result."""

    mode = "ckks"

    def __init__(self, client_id: int, setup: bytes, provider=None):
        super().__init__(client_id, setup, provider)
        self.keys = ClientKeyRing(self.setup.options["encryption"])
        self.timing: dict[str, float] = {}
        self._state_exchange = None

    def on_stage(self, stage, inbox):
        rest = []
        for m in inbox:  # the secret context of a chain, relayed from client 0
            if m.sender != SERVER and envelope_of(m).stage == "key_setup":
                self._take_secret(m)
            else:
                rest.append(m)
        if stage == "key_setup":
            return self._make_key(rest)
        if self.plan is None:
            return []
        self._exchange_state()
        if stage == "block_ids":
            return self._block_ids()
        if stage == "upload":
            return self._upload()
        if stage == "download":
            return self._download(rest)
        return []

    def _exchange_state(self) -> None:
        """Per-exchange state: the chunk counters of the streamed stages, the checked table."""
        p = self.plan
        if self._state_exchange != p.exchange:
            self._state_exchange, self._up_part, self._down_part = p.exchange, 0, 0
            self._received, self._table, self.timing = {}, None, {}
            self._rounding = None

    def _own_table(self, ep: EncodingPlan):
        if self._table is None:
            t0 = time.perf_counter()
            self._table = self._checked_table(ep)
            self.timing["encode_s"] = time.perf_counter() - t0
        return self._table

    def _block_ids(self):
        """Sparse layout: the ids of the blocks this client uploads (the documented leak)."""
        p = self.plan
        if self.id not in p.contributors:
            return []
        ids = np.asarray(self._own_table(plan_from_payload(p.encoding["plan"])).ids, dtype=np.int64)
        msg = self.message(
            SERVER,
            "metadata",
            (ids.size,),
            {"block_ids": ids.astype(np.int32)},
            p.encoding["fingerprint"],
            note="block ids of the sparse layout",
        )
        return [self.seal(msg, "block_ids")]

    # ------------------------------------------------------------------ keys
    def _make_key(self, inbox):
        """Client 0: a fresh key pair for the chain the server names; public context to the
        server, padded secret context to every other client."""
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError("expected one key set-up request", client=self.id)
        req = mine[0]
        env = envelope_of(req)
        where = dict(tag=KEYS_TAG, round=req.round, client=self.id)
        self.check(req, SERVER, "key_setup", env.part, where)
        chain = (
            plan_from_payload(
                {
                    **req.payload,
                    "scale_bits": 0,
                    "encoding": "float",
                    "error_bound": 0.0,
                    "exact": False,
                    "sum_bound": 0.0,
                    "layout": None,
                }
            ).chain
            if isinstance(req.payload, dict)
            else None
        )
        if chain is None:
            raise IntegrityError("malformed key set-up request", **where)
        key = self.keys.get(chain) if chain in self.keys else self.keys.create(chain)
        note = f"CKKS {chain.describe()}, {self.keys.encryption} encryption"
        secret = key.context.serialize(
            save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
        )
        secret = _LEN.pack(len(secret)) + secret
        secret += bytes(max(0, key.secret_nbytes + _LEN.size - len(secret)))  # padded: sizes are public
        out = []
        for k in range(1, self.setup.num_clients):
            out.append(
                self.seal_relayed(
                    k,
                    "key_setup",
                    secret,
                    f"secret context ({note})",
                    key.fingerprint,
                    part=env.part,
                    tag=KEYS_TAG,
                    round=req.round,
                )
            )
        pub = Message(
            req.round,
            KEYS_TAG,
            self.name,
            SERVER,
            "public_key",
            (),
            0,
            self.mode,
            key.fingerprint,
            key.public_bytes,
            note=f"public context without secret/Galois/relin keys ({note})",
        )
        return [self.seal(pub, "key_setup", env.part)] + out

    def coalition_secrets(self) -> dict[str, bytes]:
        """Each chain's secret context (TenSEAL serialization), keyed by its public fingerprint."""
        return {
            k.fingerprint: k.context.serialize(
                save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
            )
            for k in self.keys._keys.values()
        }

    def _take_secret(self, m: Message) -> None:
        env = envelope_of(m)
        raw = self.open_relayed(m, "key_setup", env.part, exchange=env.exchange)
        where = dict(tag=KEYS_TAG, round=m.round, client=self.id)
        try:
            (n,) = _LEN.unpack_from(raw, 0)
            context = ts.context_from(raw[_LEN.size : _LEN.size + n], n_threads=1)
        except Exception as exc:  # noqa: BLE001 - TenSEAL raises several types
            raise IntegrityError(f"the relayed secret context does not deserialize: {exc}", **where) from None
        self.keys.adopt(context, m.fingerprint, len(raw) - _LEN.size)

    def _key(self) -> ClientKey:
        fp = self.plan.encoding["fingerprint"]
        key = self.keys.by_fingerprint(fp)
        if key is None:
            raise IntegrityError(f"no key for the exchange's context fingerprint {fp[:16]}", **self.where())
        return key

    # ------------------------------------------------------------------ upload / download
    def _upload(self):
        p = self.plan
        if self.id not in p.contributors:
            return []
        ep = plan_from_payload(p.encoding["plan"])
        table = self._own_table(ep)
        part = self._up_part
        self._up_part += 1
        chunks = _chunks(p.num_blocks, int(p.encoding["blocks_per_chunk"]))
        if part == len(chunks) - 1:
            self._table = None  # the last chunk: the contribution is not needed again
        b0, b1 = chunks[part]
        bounds, _ = _pieces(ep, p.block_len)
        i0, i1 = np.searchsorted(table.ids, [b0, b1])
        t0 = time.perf_counter()
        context = self._key().context
        rows = table.values[i0:i1]
        if isinstance(ep.layout, FixedPointLayout):  # packed fixed point: quantise this chunk
            if self._rounding is None:  # one generator per client and exchange, drawn in block order
                self._rounding = rounding_rng(int(self.setup.options["rounding_seed"]), p.tag, p.round, self.id)
            rows = ep.layout.quantize(rows, self._rounding, p.dp_noise_std > 0)
        encryption = self.keys.encryption
        frames = [_encrypt(context, ep, row[a:b], encryption) for row in rows for a, b in bounds]
        self.timing["upload_s"] = self.timing.get("upload_s", 0.0) + time.perf_counter() - t0
        msg = self.message(
            SERVER, "ciphertext", (int(i1 - i0), p.block_len), frames, p.encoding["fingerprint"], note=ep.describe()
        )
        return [self.seal(msg, "upload", part)]

    def _checked_table(self, ep: EncodingPlan):
        """The contribution, checked against the public plan before anything is encrypted."""
        p = self.plan
        table = self.contribution(dense=False)  # lazy rows stay lazy: _upload reads them chunk by chunk
        ids, vals = check_block_table(p, self.id, table, self.setup.num_clients)
        lo, hi, offset = per_client_limits(p.spec, p.dp_noise_std, self.setup.num_clients)
        bad = find_violation(vals, lo, hi, p.spec.integer)
        if bad is not None:
            i, v, why = bad
            err = PackingOverflowError if (ep.layout is not None and "range" in why) else BoundError
            raise err(
                f"entry {i % p.block_len} of block {int(ids[i // p.block_len])} is {v:g}, which "
                f"{why} of this exchange's {ep.describe()} encoding (ValueSpec max_abs={p.spec.max_abs:g}, "
                f"sum_max={p.spec.sum_max}, integer={p.spec.integer}"
                + (f", DP offset {offset}" if offset else "")
                + "). Nothing was encrypted. Fix: clip the "
                "values or declare a larger public bound",
                **self.where(),
            )
        return table

    def _download(self, inbox):
        p = self.plan
        if self.id not in p.requests:
            return []
        part = self._down_part
        self._down_part += 1
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError(f"expected one download, got {len(mine)}", **self.where())
        msg = self.check(mine[0], SERVER, "download", part, self.where())
        ep = plan_from_payload(p.encoding["plan"])
        chunks = _chunks(p.num_blocks, int(p.encoding["blocks_per_chunk"]))
        b0, b1 = chunks[part]
        wanted = [int(b) for b in p.requests[self.id] if b0 <= int(b) < b1]
        bounds, _ = _pieces(ep, p.block_len)
        n = len(bounds)
        if not isinstance(msg.payload, list) or len(msg.payload) != len(wanted) * n:
            raise IntegrityError(
                f"download of {len(msg.payload) if isinstance(msg.payload, list) else None} "
                f"ciphertexts, expected {len(wanted) * n}",
                **self.where(),
            )
        t0 = time.perf_counter()
        key = self._key()
        step = release_step(ep, p.spec)
        scope = (key.fingerprint, self.setup.run_id, self.setup.session, p.exchange, part)  # one chunk at a time
        zero = np.zeros(p.block_len)
        for i, bid in enumerate(wanted):
            frames = msg.payload[i * n : (i + 1) * n]
            if any(f == wire.EMPTY for f in frames):  # no client uploaded this block
                self._received[bid] = self.keep(bid, zero)
                continue
            self._received[bid] = self.keep(
                bid,
                np.concatenate(
                    [  # the rows this client keeps, at once
                        _MEMO.decrypt(
                            scope,
                            f,
                            lambda f=f, a=a, b=b: _decrypt(
                                key.context, ep, f, b - a, self.where(), self.keys.encryption, step
                            ),
                        )
                        for f, (a, b) in zip(frames, bounds)
                    ]
                ),
            )
        self.timing["download_s"] = self.timing.get("download_s", 0.0) + time.perf_counter() - t0
        if part == len(chunks) - 1:
            received, self._received = self._received, {}
            self.deliver({int(b): received.get(int(b), zero) for b in p.requests[self.id]})
        return []


# ====================================================================== server half
class CKKSServer(ServerHalf):
    """The CKKS server: public contexts only; checks every ciphertext, adds, routes."""

    mode = "ckks"
    relays_between_clients = True
    relay_stages = frozenset({"key_setup"})

    def __init__(self, setup, transcript=None):
        super().__init__(setup, transcript)
        self.contexts: dict[str, ServerContext] = {}
        self.keep_payload_bytes = int(setup.options["keep_payload_bytes"])
        self.last_stats: dict = {}

    def record(self, msg: Message) -> None:
        if msg.relay == SERVER and not msg.note and msg.tag == KEYS_TAG:
            msg = replace(msg, note="secret context (channel-encrypted, relayed by the server)")
            if msg.nbytes > self.keep_payload_bytes:
                msg = msg.without_payload()
        if (
            self._streaming is not None
            and msg.tag == self.plan.tag
            and msg.kind == "ciphertext"
            and msg.relay != SERVER
        ):
            sent = self._streaming.setdefault((msg.sender, msg.receiver), [])
            sent.append(msg)
            if len(sent) > 1 or msg.nbytes > self.keep_payload_bytes:
                # recorded without payloads (_record_streamed): drop the ciphertexts now, not when the
                # exchange ends (a 1e6-node pre-training held ~1 GB of them)
                sent[:] = [m.without_payload() for m in sent]
            return
        super().record(msg)

    _streaming: dict | None = None

    def ensure_keys(self, chain: ChainParams, link, rnd: int) -> ServerContext:
        """The public context of ``chain``: on first use, client 0 makes the key pair."""
        if chain.name in self.contexts:
            return self.contexts[chain.name]
        self.register(link, rnd, range(self.setup.num_clients))
        part = len(self.contexts)
        request = Message(
            rnd,
            KEYS_TAG,
            SERVER,
            client_party(0),
            "control",
            (),
            0,
            self.mode,
            "",
            {
                "chain": {
                    "name": chain.name,
                    "n": chain.poly_modulus_degree,
                    "bits": np.asarray(chain.coeff_mod_bit_sizes, np.int64),
                }
            },
            note="key set-up request",
        )
        got = self.call(link, "key_setup", {0: [(request, part)]}, hook=False)
        where = dict(tag=KEYS_TAG, round=rnd, client=0)
        pub = [m for m in got.get(0, []) if m.receiver == SERVER]
        if len(pub) != 1:
            raise DropoutError("client 0 did not answer the key set-up", **where)
        self.check(pub[0], client_party(0), "key_setup", part, where)
        relayed = [m for m in got[0] if m.relay == SERVER]
        if len(relayed) != self.setup.num_clients - 1:
            raise IntegrityError("client 0 did not send the secret context to every client", **where)
        context = ServerContext(pub[0].payload, chain)  # the server: public bytes only
        if context.fingerprint != pub[0].fingerprint:
            raise IntegrityError("the public context does not match its fingerprint", **where)
        self.contexts[chain.name] = context
        return context

    def run(self, plan, link):
        t_setup = time.perf_counter()
        ep = plan_from_payload(plan.encoding["plan"])
        self.plan, self.exchange = plan, plan.exchange
        server = self.ensure_keys(ep.chain, link, plan.round)
        plan = dataclasses.replace(plan, encoding={**plan.encoding, "fingerprint": server.fingerprint})
        fp = server.fingerprint
        self.begin(plan, link, fp)
        chain = ep.chain
        bounds, vec_lens = _pieces(ep, plan.block_len)
        n_pieces = len(bounds)
        chunks = _chunks(plan.num_blocks, int(plan.encoding["blocks_per_chunk"]))
        contributors = list(plan.contributors)
        K = self.setup.num_clients
        setup_s = time.perf_counter() - t_setup
        server_s = 0.0
        where = self.where

        # sparse layout: block ids travel in the clear (documented leak), checked by the server
        server_ids: dict[int, np.ndarray] = {}
        first_call = {k: [] for k in plan.parties}
        dropped: list[int] = []  # contributors that stopped answering before their first upload
        if plan.layout == "sparse":
            got = self.call(link, "block_ids", first_call)
            first_call = {}
            for k in contributors:
                msg = self.responses(got, k, "block_ids", "metadata")
                if msg is None:
                    dropped.append(k)
                    continue
                self.check_envelope(msg, fp, k)
                ids = np.asarray((msg.payload or {}).get("block_ids", []), dtype=np.int64).ravel()
                if ids.size and (ids.min() < 0 or ids.max() >= plan.num_blocks or (np.diff(ids) <= 0).any()):
                    raise ShapeError(f"block ids must be increasing in [0, {plan.num_blocks})", **where(k))
                server_ids[k] = ids
            contributors = [k for k in contributors if k not in dropped]
        else:
            server_ids = {k: np.arange(plan.num_blocks) for k in contributors}
        needed = np.zeros(plan.num_blocks, dtype=bool)
        for bids in plan.requests.values():
            needed[bids] = True

        self._streaming = {}
        try:
            for part, (b0, b1) in enumerate(chunks):
                got = self.call(link, "upload", {**first_call, **{k: [] for k in contributors}})
                first_call = {}
                t = time.perf_counter()
                loaded = {}
                missing = [k for k in contributors if k not in got]
                if part == 0 and missing:  # not a contributor after all: a survivors' sum
                    dropped += missing
                    contributors = [k for k in contributors if k not in missing]
                    missing = []
                if dropped and (plan.dp_noise_std > 0 or not contributors):
                    raise self._missing(
                        dropped,
                        "upload",
                        "every contributor dropped"
                        if not contributors
                        else "each contributor adds a share of the DP noise",
                    )
                if missing:  # after its first chunk: its blocks are in the sums already
                    raise self._missing(missing, "upload")
                for k in contributors:  # check ALL uploads of the chunk first
                    msg = self.responses(got, k, "upload", "ciphertext", part)
                    if msg is None:
                        raise self._missing([k], "upload")
                    self.check_envelope(msg, fp, k)
                    ids = server_ids[k]
                    sel = ids[(ids >= b0) & (ids < b1)]
                    if (
                        tuple(msg.shape) != (sel.size, plan.block_len)
                        or not isinstance(msg.payload, (list, tuple))
                        or len(msg.payload) != sel.size * n_pieces
                    ):
                        n = len(msg.payload) if isinstance(msg.payload, (list, tuple)) else None
                        raise ShapeError(
                            f"upload of shape {tuple(msg.shape)} with {n} ciphertexts; expected shape "
                            f"{(sel.size, plan.block_len)} in {sel.size * n_pieces} ciphertexts",
                            **where(k),
                        )
                    vecs = [self._load(server, ep, f, k, i) for i, f in enumerate(msg.payload)]
                    loaded[k] = (sel, vecs)
                sums: dict[int, list] = {}
                counts: dict[int, int] = {}
                for k in contributors:  # then add, per block id
                    sel, vecs = loaded[k]
                    for i, bid in enumerate(sel.tolist()):
                        if not needed[bid]:
                            continue
                        pieces = vecs[i * n_pieces : (i + 1) * n_pieces]
                        if bid in sums:
                            for acc, v in zip(sums[bid], pieces):
                                acc.add_(v)
                        else:
                            sums[bid] = pieces
                        counts[bid] = counts.get(bid, 0) + 1
                if ep.layout is not None and ep.layout.offset:
                    for bid, c in counts.items():  # pad missing clients' DP offsets (public)
                        if c < K:
                            const = ep.layout.offset_constant(K - c)
                            for acc, n in zip(sums[bid], vec_lens):
                                acc.add_constant_(const, n)
                size = chain.padded_ciphertext_bytes
                out_frames = {
                    bid: [wire.frame(acc.serialize(), size, allow_larger=True) for acc in accs]
                    for bid, accs in sums.items()
                }
                del loaded, sums
                server_s += time.perf_counter() - t
                downloads = {}
                for r, bids in plan.requests.items():  # signed download of this chunk's blocks
                    mine = [int(b) for b in bids if b0 <= int(b) < b1]
                    frames = [f for b in mine for f in out_frames.get(b, [wire.EMPTY] * n_pieces)]
                    downloads[r] = [
                        (
                            self.message(r, "ciphertext", (len(mine), plan.block_len), frames, fp, note=ep.describe()),
                            part,
                        )
                    ]
                self.call(link, "download", downloads)
        finally:
            streamed, self._streaming = self._streaming, None
            self._record_streamed(streamed)
        self.last_stats = {
            "chunks": len(chunks),
            "ciphertexts_per_block": n_pieces,
            "server_s": server_s,
            "setup_s": setup_s,
            "bytes_up": {k: sum(m.nbytes for m in streamed.get((client_party(k), SERVER), [])) for k in contributors},
            "bytes_down": {
                r: sum(m.nbytes for m in streamed.get((SERVER, client_party(r)), [])) for r in plan.requests
            },
        }
        return tuple(contributors)

    def _missing(
        self,
        clients: list[int],
        stage: str,
        why: str = "a client that stops answering during its upload leaves a partial sum",
    ) -> DropoutError:
        err = DropoutError(
            f"client(s) {', '.join(map(str, clients))} did not answer the '{stage}' stage ({why}); "
            "nothing was aggregated. Re-run it without them",
            **self.where(clients[0]),
        )
        err.clients = tuple(clients)
        return err

    def _load(self, server: ServerContext, plan: EncodingPlan, frame, client: int, index: int):
        where = self.where(client)
        expected = server.chain.upload_ciphertext_bytes(self.setup.options["encryption"]) + wire.HEADER_BYTES
        if not isinstance(frame, (bytes, bytearray)) or len(frame) != expected:
            size = len(frame) if isinstance(frame, (bytes, bytearray)) else type(frame).__name__
            raise IntegrityError(
                f"ciphertext {index} is {size} bytes, expected {expected}: truncated, corrupted "
                f"or not made with this exchange's parameters ({server.chain.describe()})",
                **where,
            )
        try:
            body = wire.unframe(frame)
        except ValueError as exc:
            raise IntegrityError(f"ciphertext {index}: {exc}", **where) from exc
        try:  # every encoding travels as a SEAL ciphertext (seeded uploads under symmetric encryption)
            return server_load(server.chain, body, plan.scale)
        except ValueError as exc:
            raise IntegrityError(f"ciphertext {index} {exc}", **where) from exc

    def _record_streamed(self, streamed: dict) -> None:
        """One upload (download) Message per client per exchange; large or streamed payloads are stripped."""
        for msgs in streamed.values():
            if len(msgs) == 1:
                msg = msgs[0]
                if msg.nbytes > self.keep_payload_bytes:
                    msg = replace(msg, payload=None, note=msg.note + "; payload not kept (size)")
            else:
                last = msgs[-1]
                try:
                    shape = (sum(int(m.shape[0]) for m in msgs), self.plan.block_len)
                except (TypeError, ValueError, IndexError):  # a tampered shape: record it as sent
                    shape = last.shape
                msg = replace(
                    last,
                    shape=shape,
                    nbytes=sum(int(m.nbytes) for m in msgs),
                    payload=None,
                    note=last.note + f"; streamed in {len(msgs)} chunks, payload not kept",
                )
            super().record(msg)


class _KeyView:
    """What one client half holds of the CKKS keys (the attack suite reads a colluding client's)."""

    def __init__(self, half: CKKSClient):
        self._ring = half.keys

    def __contains__(self, chain) -> bool:
        return chain in self._ring

    def get(self, chain) -> ClientKey:
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
        transcript=None,
        dp=None,
        seed: int = 0,
        packing=True,
        params=None,
        encryption: str = "symmetric",
        chunk_bytes: int = 16 << 20,
        keep_payload_bytes: int = 8 << 20,
        audit_sum_bound: bool = False,
        fixed_point_bits: int | None = None,
        exact_fields: bool = True,
        link=None,
        schedule: str = "",
        **collusion,
    ):
        if packing not in (True, False):
            raise ConfigurationError(f"packing must be True or False, got {packing!r} (BFV packing is not implemented)")
        ClientKeyRing(encryption)  # validates the encryption type
        self.packing = bool(packing)
        self.encryption = encryption
        self._candidates, self._fixed_scale = self._resolve_params(params)
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
        self.last_stats: dict | None = None

    def public_options(self) -> dict:
        return {
            "encryption": self.encryption,
            "keep_payload_bytes": self.keep_payload_bytes,
            "rounding_seed": int(self.seed),
        }

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _resolve_params(params) -> tuple[tuple[ChainParams, ...], int | None]:
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

    def _plans(self, spec: ValueSpec, dp_std: float, tag=None, rnd=None) -> dict[str, EncodingPlan]:
        """Feasible plans per candidate chain; the first candidate's error if none is."""
        plans, first_error = {}, None
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
            raise first_error
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
        try:
            return self.plan(spec, dp_std=self._dp_std_hint()).values_per_ciphertext
        except ProtocolError:
            return self._candidates[0].slots  # the exchange raises the error with the exchange named

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
        halve the untouched rows it pays for; the exchange then picks the same chain for
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

    # ------------------------------------------------------------------ keys (facade view)
    @property
    def _keys(self) -> _KeyView:
        """Client 0's key ring (every client holds the same keys; the coalition attack reads it)."""
        return _KeyView(self.clients[0])

    @property
    def fingerprint(self) -> str:
        """sha256 of the public context of the current exchange's chain (keys made on demand)."""
        return self.fingerprint_for(self._active or self._candidates[0])

    def fingerprint_for(self, chain: ChainParams | str) -> str:
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        return self.server.ensure_keys(chain, self.link, 0).fingerprint

    def server_context(self, chain: ChainParams | str | None = None) -> ts.Context:
        """The TenSEAL context the server holds (public; for tests and audits)."""
        chain = chain or self._active or self._candidates[0]
        chain = NAMED_CHAINS[chain] if isinstance(chain, str) else chain
        return self.server.ensure_keys(chain, self.link, 0).context

    # ------------------------------------------------------------------ one exchange
    def plan_encoding(self, ctx: ExchangeContext) -> dict:
        ctx.check_requests(self.num_clients)
        ep = choose_chain(self._plans(ctx.spec, ctx.dp_noise_std, ctx.tag, ctx.round), ctx.block_len)
        n_pieces = math.ceil(ctx.block_len / ep.values_per_ciphertext)
        per_chunk = max(1, self.chunk_bytes // max(1, len(ctx.contributions) * n_pieces * ep.chain.ciphertext_bytes))
        if self.audit_sum_bound:
            self._audit(ctx, ep, _chunks(ctx.num_blocks, per_chunk))
        self._active = ep.chain
        self._last_plan = ep
        return {"plan": plan_to_payload(ep), "blocks_per_chunk": per_chunk}

    def _audit(self, ctx: ExchangeContext, plan: EncodingPlan, chunks: list[tuple[int, int]]) -> None:
        """Test aid: every contribution in range, then the K-way sums in the clear against the
        plan's bound (no party could do this in a deployment)."""
        spec = ctx.spec
        lo, hi, offset = per_client_limits(spec, ctx.dp_noise_std, self.num_clients)
        packed = plan.layout is not None
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
        if packed:
            top = (1 << plan.layout.width) - 1 - self.num_clients * offset
            bottom = -self.num_clients * offset
        else:
            top, bottom = plan.sum_bound, -plan.sum_bound
        for b0, b1 in chunks:  # chunk-wise: memory stays bounded
            total = np.zeros((b1 - b0, ctx.block_len))
            for table in ctx.contributions.values():
                i0, i1 = np.searchsorted(table.ids, [b0, b1])
                total[np.asarray(table.ids[i0:i1]) - b0] += table.values[i0:i1]
            bad = np.nonzero((total > top) | (total < bottom))
            if bad[0].size:
                b, j = int(bad[0][0]), int(bad[1][0])
                b += b0
                err = PackingOverflowError if packed else BoundError
                raise err(
                    f"the {len(ctx.contributions)}-client sum of entry {j} of block {b} is {total[b - b0, j]:g}, "
                    f"outside [{bottom:g}, {top:g}] that the public bound sum_max={spec.sum_max} allows"
                    + (f": its {plan.layout.width}-bit packed field would carry into the next one" if packed else "")
                    + ". Nothing was encrypted. Fix: declare the true bound (e.g. degree cap + 1) "
                    "in ValueSpec.sum_max",
                    tag=ctx.tag,
                    round=ctx.round,
                )

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        out = super()._aggregate(ctx)
        plan, ep, srv = self.server.plan, self._last_plan, self.server.last_stats
        timing = {k: self.clients[k].timing for k in plan.parties}
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
