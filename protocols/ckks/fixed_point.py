"""Packed fixed point in CKKS: signed b-bit fields in both halves of every complex slot.

A CKKS slot is a complex number; TenSEAL's vectors use only its real part, so a ciphertext
of N = 8192 carries 4,096 reals.  Through SEAL's own encoder (``tenseal.sealapi``:
``CKKSEncoder.encode(list[complex])`` / ``decode_complex``) the same ciphertext carries
8,192 reals — real and imaginary parts of 4,096 slots — at the same size and noise.  Each
of these *components* is a carrier of :mod:`protocols.fixed_point`: ``F`` signed digits of
``b`` bits, so a ciphertext holds ``2 F N/2`` values.

Plan (:func:`plan_fixed_point`, public): the scale is the smallest ``2^s`` whose noise
bound (:func:`~protocols.ckks.params.noise_bound`, K ciphertexts) is ``<= 1/8``, so every
decoded component rounds to its exact integer; a component then holds signed integers of
``c`` bits, the largest ``c`` with ``sqrt(2) (2^(c-1) + 1/8) 2^s < q_0 / 2`` (:func:`signed_capacity_bits`;
``c = 41`` for a 60-bit prime at 2^18).  ``F = floor(c / b_min)`` fields of ``b = floor(c / F)``
bits each (``b_min``: the protocol's ``fixed_point_bits``).  The entry bound is the
exchange's ``ValueSpec.max_abs`` (plus the DP tail, as for float plans) and the sum bound
``K B`` (or ``B + K tail`` with ``owner_checked_sum``).  N = 8192, K = 10, ``b_min = 20``:
2 fields of 21 bits, 16,384 values per ciphertext, 8.0 B per value (2.0x float32), quantum
``S / (2^20 - 11)``.

Client side: quantise (randomized rounding from the run seed; conditional rounding when the
exchange carries DP noise), pack, encode as complex slots, encrypt (symmetric or
asymmetric, like the float path).  Server side: load every ciphertext under the public
parameters and check size, parameters and scale before adding (SEAL ciphertexts, not
TenSEAL vectors, travel in the same framed wire format).  Recipients: decrypt, round each
component, refuse the result when a component is off its integer by more than 1/4 or out
of range, unpack, multiply by the quantum.
"""

from __future__ import annotations

import atexit
import math
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import tenseal as ts
from tenseal import sealapi

from ..errors import BoundError, PackingOverflowError
from ..fixed_point import FixedPoint
from .params import (
    MIN_SCALE_BITS,
    ROUNDING_TARGET,
    ChainParams,
    EncodingPlan,
    integer_sum_range,
    noise_bound,
    per_client_limits,
)

if TYPE_CHECKING:
    from ..exchange import ValueSpec

#: default smallest field width of packed fixed point (2 fields per component on a 60-bit prime)
DEFAULT_FIELD_BITS = 20


def signed_capacity_bits(chain: ChainParams, scale_bits: int) -> int:
    """Largest ``c`` with ``sqrt(2) (2^(c-1) + 1/8) 2^s < q_0 / 2``: components hold ``|P| < 2^(c-1)``.

    A slot ``z`` with both components below ``2^(c-1) + 1/8`` (the value and the noise bound) has
    ``|z| < sqrt(2) (2^(c-1) + 1/8)``, and every coefficient of the polynomial that encodes the slots
    is at most ``max |z|`` (the inverse canonical embedding averages the slots), so no coefficient
    of the decrypted sum reaches ``q_0 / 2``.
    """
    q = chain.data_modulus()
    # x8, then squared: 2 ((2^(c+2) + 1) 2^s)^2 < (4 q)^2
    fits: Callable[[int], bool] = lambda c: 2 * (((1 << (c + 2)) + 1) << scale_bits) ** 2 < (4 * q) ** 2  # noqa: E731
    c = 1
    while c < 52 and fits(c + 1):
        c += 1
    return c


@dataclass(frozen=True)
class FixedPointLayout:
    """Public layout of a packed fixed-point exchange: the codec and the slots per ciphertext."""

    codec: FixedPoint
    slots: int  # complex slots per ciphertext (N / 2)
    encryption: str = "symmetric"
    offset: int = 0  # no DP offset: digits are signed

    @property
    def width(self) -> int:
        """Bits of one packed field."""
        return self.codec.width

    @property
    def fields(self) -> int:
        """Fixed-point fields packed into one slot carrier."""
        return self.codec.fields

    @property
    def capacity(self) -> int:
        """Values per ciphertext: F digits in each of 2 components of every slot."""
        return 2 * self.fields * self.slots

    def slots_for(self, n: int) -> int:
        """Complex slots that ``n`` packed values occupy (two real carriers per slot).

        Raises:
            ValueError: ``n`` exceeds the ciphertext's capacity.
        """
        if n > self.capacity:
            raise ValueError(f"{n} values exceed the {self.capacity} a ciphertext carries")
        return max(1, math.ceil(self.codec.carriers_for(n) / 2))

    # ------------------------------------------------------------------ client side
    def quantize(self, values: np.ndarray, rng: np.random.Generator, dp: bool) -> np.ndarray:
        """A client's blocks as int64 digits by randomized rounding.

        A client's blocks ``[n_blocks, block_len]`` as int64 digits: randomized rounding with
        the client's rounding generator (:func:`protocols.fixed_point.rounding_rng`, consumed in
        block order, so chunk-by-chunk quantisation draws what one call would); conditional
        rounding about each block's own norm when the exchange carries DP noise.
        """
        values = np.asarray(values, dtype=np.float64)
        if not dp or self.codec.integer or not len(values):
            return self.codec.quantize(values, rng)
        return np.stack([self.codec.conditional_quantize(row, rng, float(np.linalg.norm(row))) for row in values])

    def slot_values(self, digits: np.ndarray) -> list[complex]:
        """int64 digits -> complex slot values (carriers: real parts first, then imaginary)."""
        carriers = self.codec.pack(digits)
        s = math.ceil(carriers.size / 2)
        both = np.zeros(2 * s, dtype=np.int64)
        both[: carriers.size] = carriers
        return cast(list[complex], (both[:s].astype(np.float64) + 1j * both[s:].astype(np.float64)).tolist())

    def encrypt(self, context: ts.Context, plan: EncodingPlan, digits: np.ndarray) -> bytes:
        """Serialized SEAL ciphertext of one piece of a block (client side)."""
        return client_codec(context, plan.chain, self.encryption).encrypt(self.slot_values(digits), plan.scale)

    def decrypt(
        self, context: ts.Context, plan: EncodingPlan, data: bytes | sealapi.Ciphertext, n: int
    ) -> tuple[np.ndarray, float, bool]:
        """Recipient side: the n summed values of a serialized (or loaded) sum (see :meth:`unpack`)."""
        return self.unpack(client_codec(context, plan.chain, self.encryption).decrypt(data, plan.chain), n)

    def unpack(self, decoded: np.ndarray, n: int) -> tuple[np.ndarray, float, bool]:
        """Decoded complex slots back to the summed values, the largest residual and a range flag.

        Decoded complex slots -> the n summed values (float64), the largest rounding
        residual, and whether every component was in range.
        """
        z = np.asarray(decoded)[: self.slots_for(n)]
        comps = np.concatenate([z.real, z.imag])[: self.codec.carriers_for(n)]
        r = np.rint(comps)
        residual = float(np.abs(comps - r).max()) if comps.size else 0.0
        limit = 1 << (self.width * self.fields - 1)
        in_range = bool((np.abs(r) < limit).all())
        sums = self.codec.unpack(np.clip(r, -limit, limit).astype(np.int64), n)
        return self.codec.dequantize(sums), residual, in_range


def plan_fixed_point(
    chain: ChainParams,
    spec: ValueSpec,
    num_clients: int,
    dp_std: float,
    encryption: str,
    field_bits: int,
    *,
    tag: str | None = None,
    round: int | None = None,
) -> EncodingPlan:
    """The packed fixed-point plan of an exchange.

    Packed fixed-point plan of a float exchange (module doc); integer exchanges, and float
    exchanges on a public grid (``ValueSpec.grid_bits``), get exact signed fields of the width
    their public sum bound needs (no DP offsets: digits are signed).
    """
    if chain.data_primes != 1:
        raise BoundError(
            f"packed fixed point needs one data prime; {chain.describe()} has {chain.data_primes}", tag=tag, round=round
        )
    _, bound, offset = per_client_limits(spec, dp_std, num_clients)
    tail = bound - float(spec.max_abs)
    owner = bool(getattr(spec, "owner_checked_sum", False))
    scale_bits = MIN_SCALE_BITS
    while noise_bound(chain, scale_bits, num_clients, encryption) > ROUNDING_TARGET:
        scale_bits += 1
    cap = signed_capacity_bits(chain, scale_bits)
    if spec.integer or spec.grid_bits is not None:
        # |sum| <= the unsigned range of params.integer_sum_range without its 2 K o of offsets, + K o;
        # values on a public grid (ValueSpec.grid_bits) are integers of quantum 2^-f with |sum| <= K B
        total = integer_sum_range(spec, num_clients, 0) + num_clients * offset if spec.integer else num_clients * bound
        try:
            codec = FixedPoint.integers(bound, total, num_clients, cap, spec.grid_bits or 0)
        except PackingOverflowError as exc:
            raise PackingOverflowError(str(exc), tag=tag, round=round) from None
        return EncodingPlan(
            chain,
            scale_bits,
            "fixed",
            0.0,
            True,
            FixedPointLayout(codec, chain.slots, encryption),  # type: ignore[arg-type]  # duck-types PackingLayout
            float(total),
        )
    fields = cap // int(field_bits)
    if fields < 1:
        raise PackingOverflowError(
            f"a {field_bits}-bit fixed-point field does not fit the {cap} exact bits of a "
            f"{chain.describe()} slot at scale 2^{scale_bits}. Fix: fixed_point_bits <= {cap}",
            tag=tag,
            round=round,
        )
    codec = FixedPoint.plan(
        bound,
        num_clients,
        cap // fields,
        fields,
        sum_bound=(float(spec.max_abs) + num_clients * tail) if owner else None,
    )
    return EncodingPlan(
        chain,
        scale_bits,
        "fixed",
        codec.sum_error,
        False,
        FixedPointLayout(codec, chain.slots, encryption),  # type: ignore[arg-type]  # duck-types PackingLayout
        codec.sum_bound,
    )


# ---------------------------------------------------------------------- SEAL objects
_scratch = threading.local()


class _ScratchDescriptor:
    """The descriptor of a thread's unlinked scratch file, closed when the thread's storage goes or at exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        weakref.finalize(self, os.close, fd)


def _scratch_path() -> str:
    """A per-thread scratch file (sealapi saves and loads through paths only).

    Where the OS
    names open files (``/proc/self/fd``), the file is unlinked at once and reached through its
    descriptor: it vanishes with the process, however that ends, so no serialised key or
    ciphertext outlives a crashed or killed run.  Elsewhere it is removed at exit.
    """
    path = getattr(_scratch, "path", None)
    if path is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="sfgl-ckks-", dir=base)
        if os.path.isdir("/proc/self/fd"):
            os.unlink(path)
            _scratch.file, path = _ScratchDescriptor(fd), f"/proc/self/fd/{fd}"
        else:
            os.close(fd)
            atexit.register(_remove, path)
        _scratch.path = path
    return path


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _to_bytes(obj: Any) -> bytes:
    path = _scratch_path()
    obj.save(path)
    held = getattr(_scratch, "file", None)
    if held is not None:  # the scratch file's own descriptor: no open per call
        fd = held.fd
        return os.pread(fd, os.fstat(fd).st_size, 0)
    with open(path, "rb") as f:
        return f.read()


def _load_into(obj: Any, context: Any, data: bytes) -> Any:
    path = _scratch_path()
    held = getattr(_scratch, "file", None)
    if held is not None:
        fd = held.fd
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    else:
        with open(path, "wb") as f:
            f.write(data)
    obj.load(context, path)
    return obj


@cache
def seal_context(n: int, bits: tuple[int, ...]) -> sealapi.SEALContext:
    """SEAL context of a chain (public parameters only)."""
    parms = sealapi.EncryptionParameters(sealapi.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(n)
    parms.set_coeff_modulus(sealapi.CoeffModulus.Create(n, list(bits)))
    return sealapi.SEALContext(parms, True, sealapi.SEC_LEVEL_TYPE.TC128)


def _chain_context(chain: ChainParams) -> sealapi.SEALContext:
    return seal_context(chain.poly_modulus_degree, tuple(chain.coeff_mod_bit_sizes))


class ClientCodec:
    """SEAL encoder, encryptor and decryptor over the keys of a client's TenSEAL context."""

    def __init__(self, context: ts.Context, chain: ChainParams, encryption: str):
        sc = _chain_context(chain)
        self.encoder = sealapi.CKKSEncoder(sc)
        path = _scratch_path()
        context.secret_key().data.save(path)
        secret = sealapi.SecretKey()
        secret.load(sc, path)
        self.symmetric = encryption == "symmetric"
        if self.symmetric:
            self.encryptor = sealapi.Encryptor(sc, secret)
        else:  # a public key of the secret (the relayed secret contexts carry none)
            public = sealapi.PublicKey()
            sealapi.KeyGenerator(sc, secret).create_public_key(public)
            self.encryptor = sealapi.Encryptor(sc, public)
        self.decryptor = sealapi.Decryptor(sc, secret)

    def encrypt(self, slots: list[complex] | list[float], scale: float) -> bytes:
        """Serialized fresh ciphertext of ``slots``.

        Symmetric encryption sends SEAL's *seeded*
        form: the second polynomial of ``(c0, c1) = (-a s + m + e, a)`` is the uniform ``a``, which
        SEAL replaces by the seed of the PRNG that drew it, so an upload is half a ciphertext; the
        server's load expands the seed (``a`` is public in either form).
        """
        plain = sealapi.Plaintext()
        try:
            self.encoder.encode(slots, scale, plain)
        except ValueError as exc:  # SEAL: the scale or the values exceed the chain's modulus
            raise BoundError(
                f"the exchange plan's values do not fit {scale:.3g} x the slot range of this chain "
                f"(SEAL: {exc}); a plan with a scale or packed fields past the chain's modulus is "
                "refused"
            ) from None
        if self.symmetric:
            return _to_bytes(self.encryptor.encrypt_symmetric(plain))
        ct = sealapi.Ciphertext()
        self.encryptor.encrypt(plain, ct)
        return _to_bytes(ct)

    def decrypt(self, data: bytes | sealapi.Ciphertext, chain: ChainParams) -> np.ndarray:
        """Decrypt a serialised (or an already loaded) ciphertext of ``chain`` and decode its complex slots."""
        ct = data
        if not isinstance(ct, sealapi.Ciphertext):
            ct = _load_into(sealapi.Ciphertext(), _chain_context(chain), data)
        plain = sealapi.Plaintext()
        self.decryptor.decrypt(ct, plain)
        return np.asarray(self.encoder.decode_complex(plain))


#: per client context, its SEAL objects (dropped with the context)
_client_codecs: weakref.WeakKeyDictionary[ts.Context, ClientCodec] = weakref.WeakKeyDictionary()


def client_codec(context: ts.Context, chain: ChainParams, encryption: str) -> ClientCodec:
    """The (cached) SEAL objects of a client's context."""
    codec = _client_codecs.get(context)
    if codec is None:
        codec = _client_codecs[context] = ClientCodec(context, chain, encryption)
    return codec


class SealSum:
    """A loaded (server-side) SEAL ciphertext with the two operations the server uses."""

    def __init__(self, ct: sealapi.Ciphertext, chain: ChainParams):
        self.ct, self.chain = ct, chain
        self.padded_bytes = chain.padded_ciphertext_bytes  # on the wire (:mod:`.wire`)

    def add_(self, other: SealSum) -> SealSum:
        """Add ``other``'s ciphertext into this one in place (homomorphic addition) and return self."""
        _evaluator(self.chain.poly_modulus_degree, tuple(self.chain.coeff_mod_bit_sizes)).add_inplace(self.ct, other.ct)
        return self

    def add_constant_(self, value: float, slots: int) -> SealSum:
        """Add the public ``value`` to the first ``slots`` slots (the DP offsets of missing clients)."""
        n, bits = self.chain.poly_modulus_degree, tuple(self.chain.coeff_mod_bit_sizes)
        plain = sealapi.Plaintext()
        try:
            sealapi.CKKSEncoder(seal_context(n, bits)).encode(
                [float(value)] * slots, self.ct.parms_id(), self.ct.scale, plain
            )
        except ValueError as exc:
            raise BoundError(f"the public offset {value:g} does not fit the ciphertext's scale (SEAL: {exc})") from None
        _evaluator(n, bits).add_plain_inplace(self.ct, plain)
        return self

    def serialize(self) -> bytes:
        """The running sum's ciphertext as SEAL bytes."""
        return _to_bytes(self.ct)


@cache
def _evaluator(n: int, bits: tuple[int, ...]) -> sealapi.Evaluator:
    return sealapi.Evaluator(seal_context(n, bits))


def server_load(chain: ChainParams, data: bytes, scale: float) -> SealSum:
    """Server side: load a ciphertext and check it is fresh, of this chain and at the plan's scale.

    Server side: load a ciphertext under the public parameters and check that it is a fresh
    two-polynomial ciphertext of this chain at the plan's scale; ``ValueError`` otherwise.
    """
    sc = _chain_context(chain)
    try:
        ct = _load_into(sealapi.Ciphertext(sc), sc, data)
    except Exception as exc:  # noqa: BLE001 - SEAL raises ValueError/RuntimeError
        raise ValueError(f"does not deserialize under {chain.describe()}: {exc}") from exc
    if (
        ct.size() != 2
        or list(ct.parms_id()) != list(sc.first_parms_id())
        or not ct.is_ntt_form()
        or not math.isclose(ct.scale, scale, rel_tol=1e-9)
    ):
        raise ValueError(f"was not encrypted with this exchange's parameters ({chain.describe()}, scale {scale:g})")
    return SealSum(ct, chain)
