"""The client half of ``ckks``: holds the secret context, encrypts its blocks, decrypts its result.

Behind :meth:`~protocols.party.ClientHalf.handle` (bytes only), built from the run's public
setup bytes.  Stages (server request -> this client's answer):

``key_setup``  (client 0, first use of a chain) the chain -> a fresh key pair
               (:mod:`.keys`): the public context to the server, the padded secret context to
               every other client over the relayed encrypted channel; every other client
               adopts the relayed secret context
``block_ids``  (sparse layout) -> the ids of the blocks it uploads (the documented leak)
``upload``     (one call per streamed chunk) -> its blocks of the chunk, checked against the
               public plan before anything is encrypted (shapes, finiteness, every value in
               the encoding's public range: BoundError / PackingOverflowError naming it),
               quantised with its own rounding generator for packed fixed point, one framed
               ciphertext per block piece (:mod:`.wire`; SEAL's seeded form under symmetric
               encryption)
``download``   (one call per chunk) its requested blocks, summed (dense layout: ``sum c0`` and the
               upload seeds, re-expanded with SEAL, :mod:`.seeded`) -> nothing; it decrypts and
               decodes (round + unpack for integers; float sums on the release grid,
               :func:`.params.release_step`), refusing a residual off the integers
               (BoundError)
"""

from __future__ import annotations

import struct
import time
from typing import Any, cast

import numpy as np
import tenseal as ts

from ..errors import BoundError, ConfigurationError, IntegrityError, PackingOverflowError
from ..exchange import BlockTable
from ..fixed_point import rounding_rng
from ..party import ClientHalf, Provider, envelope_of
from ..plan import ExchangePlan
from ..transcript import SERVER, Message
from ..validate import check_block_table, find_violation
from . import wire
from .fixed_point import FixedPointLayout, client_codec
from .keys import ClientKey, ClientKeyRing
from .memo import DecryptionMemo
from .params import EncodingPlan, per_client_limits, release_step
from .plan_message import KEYS_TAG, chunks, pieces, plan_from_payload
from .seeded import expand_sum, pack_upload, upload_bytes, uses_seeded_download

_LEN = struct.Struct(">I")


def _encrypt(context: ts.Context, plan: EncodingPlan, values: np.ndarray, encryption: str, packed: bool) -> bytes:
    """One framed fresh ciphertext.

    SEAL's seeded form under symmetric encryption (half the bytes); with ``packed`` (the exchanges whose downloads are
    seeded, :func:`.seeded.uses_seeded_download`) as the seed and ``c0`` at the primes' widths
    (:func:`.seeded.pack_upload`), whose size is exact.
    """
    fixed = isinstance(plan.layout, FixedPointLayout)
    size = upload_bytes(plan.chain) if packed else plan.chain.upload_ciphertext_bytes(encryption)
    for _ in range(8):  # a fresh encryption's size is independent of the data (wire doc)
        if fixed:
            ct = cast(FixedPointLayout, plan.layout).encrypt(context, plan, values)
        else:
            slots = (plan.layout.pack(values) if plan.layout is not None else np.asarray(values)).tolist()
            ct = client_codec(context, plan.chain, encryption).encrypt(slots, plan.scale)
        if packed:
            ct = pack_upload(plan.chain, ct, plan.scale)
        if len(ct) <= size:
            return wire.frame(ct, size)
    raise ConfigurationError(
        f"ciphertexts of {plan.chain.describe()} exceed the padded size {size}; "
        "update PADDED_CT_BYTES / PADDED_SEEDED_CT_BYTES for this TenSEAL version"
    )


def _ciphertext(
    plan: EncodingPlan, frame: bytes, seeded: bool, max_uploads: int, where: dict[str, Any]
) -> bytes | ts.sealapi.Ciphertext:
    """The summed ciphertext of a download frame: SEAL bytes, or re-expanded from ``sum c0`` and seeds."""
    try:
        body = wire.unframe(frame)
        return expand_sum(plan.chain, body, plan.scale, max_uploads) if seeded else body
    except ValueError as exc:
        raise IntegrityError(f"the summed ciphertext {exc}", **where) from None


def _decrypt(
    context: ts.Context,
    plan: EncodingPlan,
    data: bytes | ts.sealapi.Ciphertext,
    n: int,
    where: dict[str, Any],
    encryption: str,
    step: float | None = None,
) -> np.ndarray:
    """Decrypt and decode one sum (:func:`_ciphertext`); float sums rounded to the grid ``step``.

    The grid ``step``: :func:`.params.release_step`.
    """
    if isinstance(plan.layout, FixedPointLayout):
        vals, residual, in_range = plan.layout.decrypt(context, plan, data, n)
    else:
        slots = n if plan.layout is None else plan.layout.slots_for(n)
        dec = client_codec(context, plan.chain, encryption).decrypt(data, plan.chain).real[:slots]
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


#: one per process (a Ray actor hosting several clients shares it between them)
_MEMO = DecryptionMemo()


class CKKSClient(ClientHalf):
    """One client of the CKKS backend.

    Holds the secret context of every chain (made by client 0, or received from it over the encrypted channel),
    encrypts its blocks, decrypts its result.
    """

    mode = "ckks"
    # per-exchange state, set by _exchange_state
    _up_part: int
    _down_part: int
    _received: dict[int, np.ndarray]
    _table: BlockTable | None
    _rounding: np.random.Generator | None

    def __init__(self, client_id: int, setup: bytes, provider: Provider | None = None):
        super().__init__(client_id, setup, provider)
        self.keys = ClientKeyRing(self.setup.options["encryption"])
        self.timing: dict[str, float] = {}
        self._state_exchange: int | None = None

    def on_stage(self, stage: str, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """CKKS client steps: make the key (``key_setup``), send block ids, upload ciphertexts, decrypt the download.

        A secret context relayed from client 0 is taken in whatever stage it arrives.
        """
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
        p = cast(ExchangePlan, self.plan)
        if self._state_exchange != p.exchange:
            self._state_exchange, self._up_part, self._down_part = p.exchange, 0, 0
            self._received, self._table, self.timing = {}, None, {}
            self._rounding = None

    def _own_table(self, ep: EncodingPlan) -> BlockTable:
        if self._table is None:
            t0 = time.perf_counter()
            self._table = self._checked_table(ep)
            self.timing["encode_s"] = time.perf_counter() - t0
        return self._table

    def _block_ids(self) -> list[tuple[Message, bytes]]:
        """Sparse layout: the ids of the blocks this client uploads (the documented leak)."""
        p = cast(ExchangePlan, self.plan)
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
    def _make_key(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """Client 0: make a fresh key pair for the chain the server names.

        Client 0: a fresh key pair for the chain the server names; public context to the
        server, padded secret context to every other client.
        """
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError("expected one key set-up request", client=self.id)
        req = mine[0]
        env = envelope_of(req)
        where: dict[str, Any] = dict(tag=KEYS_TAG, round=req.round, client=self.id)
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
        where: dict[str, Any] = dict(tag=KEYS_TAG, round=m.round, client=self.id)
        try:
            (n,) = _LEN.unpack_from(raw, 0)
            context = ts.context_from(raw[_LEN.size : _LEN.size + n], n_threads=1)
        except Exception as exc:  # noqa: BLE001 - TenSEAL raises several types
            raise IntegrityError(f"the relayed secret context does not deserialize: {exc}", **where) from None
        self.keys.adopt(context, m.fingerprint, len(raw) - _LEN.size)

    def _key(self) -> ClientKey:
        fp = cast(ExchangePlan, self.plan).encoding["fingerprint"]
        key = self.keys.by_fingerprint(fp)
        if key is None:
            raise IntegrityError(f"no key for the exchange's context fingerprint {fp[:16]}", **self.where())
        return key

    # ------------------------------------------------------------------ upload / download
    def _upload(self) -> list[tuple[Message, bytes]]:
        p = cast(ExchangePlan, self.plan)
        if self.id not in p.contributors:
            return []
        ep = plan_from_payload(p.encoding["plan"])
        table = self._own_table(ep)
        part = self._up_part
        self._up_part += 1
        spans = chunks(p.num_blocks, int(p.encoding["blocks_per_chunk"]))
        if part == len(spans) - 1:
            self._table = None  # the last chunk: the contribution is not needed again
        b0, b1 = spans[part]
        bounds, _ = pieces(ep, p.block_len)
        i0, i1 = np.searchsorted(table.ids, [b0, b1])
        t0 = time.perf_counter()
        context = self._key().context
        rows = table.values[i0:i1]
        if isinstance(ep.layout, FixedPointLayout):  # packed fixed point: quantise this chunk
            if self._rounding is None:  # one generator per client and exchange, drawn in block order
                self._rounding = rounding_rng(int(self.setup.options["rounding_seed"]), p.tag, p.round, self.id)
            rows = ep.layout.quantize(rows, self._rounding, p.dp_noise_std > 0)
        encryption = self.keys.encryption
        packed = uses_seeded_download(p.layout, encryption)
        frames = [_encrypt(context, ep, row[a:b], encryption, packed) for row in rows for a, b in bounds]
        self.timing["upload_s"] = self.timing.get("upload_s", 0.0) + time.perf_counter() - t0
        msg = self.message(
            SERVER, "ciphertext", (int(i1 - i0), p.block_len), frames, p.encoding["fingerprint"], note=ep.describe()
        )
        return [self.seal(msg, "upload", part)]

    def _checked_table(self, ep: EncodingPlan) -> BlockTable:
        """The contribution, checked against the public plan before anything is encrypted."""
        p = cast(ExchangePlan, self.plan)
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

    def _download(self, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        p = cast(ExchangePlan, self.plan)
        if self.id not in p.requests:
            return []
        part = self._down_part
        self._down_part += 1
        mine = [m for m in inbox if m.sender == SERVER]
        if len(mine) != 1:
            raise IntegrityError(f"expected one download, got {len(mine)}", **self.where())
        msg = self.check(mine[0], SERVER, "download", part, self.where())
        ep = plan_from_payload(p.encoding["plan"])
        spans = chunks(p.num_blocks, int(p.encoding["blocks_per_chunk"]))
        b0, b1 = spans[part]
        wanted = [int(b) for b in p.requests[self.id] if b0 <= int(b) < b1]
        bounds, _ = pieces(ep, p.block_len)
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
        seeded = uses_seeded_download(p.layout, self.keys.encryption)
        where = self.where()
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
                            lambda f=f, a=a, b=b: _decrypt(  # type: ignore[misc]  # mypy: a lambda with default args
                                key.context,
                                ep,
                                _ciphertext(ep, f, seeded, len(p.contributors), where),
                                b - a,
                                where,
                                self.keys.encryption,
                                step,
                            ),
                        )
                        for f, (a, b) in zip(frames, bounds)
                    ]
                ),
            )
        self.timing["download_s"] = self.timing.get("download_s", 0.0) + time.perf_counter() - t0
        if part == len(spans) - 1:
            received, self._received = self._received, {}
            self.deliver({int(b): received.get(int(b), zero) for b in p.requests[self.id]})
        return []
