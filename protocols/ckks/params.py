"""CKKS parameter chains, the 128-bit security check, the error model and the per-exchange encoding plan.

Secure aggregation only adds ciphertexts, so an exchange needs no multiplicative depth: in SEAL's
chain ``[q_0, ..., q_L, p]`` one prime is spent per rescale and ``p`` is the key-switching
("special") prime, so the add-only chains (:data:`ADD_ONLY_CHAINS`) are ``[q_0, p]`` with a 60-,
50- or 40-bit data prime at N = 8192 or 4096; :data:`REFERENCE` is TenSEAL's common
``[60, 40, 40, 60]`` context.  :func:`choose_chain` takes, among the plans whose headroom and error
bound satisfy the exchange, the one with the fewest bytes for its block length (ties: larger N,
then larger prime).  Every ciphertext is padded to a fixed size per chain (:data:`PADDED_CT_BYTES`,
:data:`PADDED_SEEDED_CT_BYTES`), so message sizes depend on public shapes only.

Security: the total coefficient-modulus bits may not exceed ``MAX_COEFF_BITS_128[N]`` (Albrecht et
al., "Homomorphic Encryption Security Standard", 2018, Table 1, classical 128-bit, ternary
secret); :func:`check_security` names the fix where SEAL fails with an opaque error.

Error model: a decoded value is ``m + e / Delta``, ``Delta = 2^scale_bits``, and every bound is

    ``bound(K) = SAFETY * FRESH_NOISE_MODEL[enc] * sqrt(K) / Delta``    (one data prime)

plus ``|m| 2^-45`` with more than one data prime (SEAL's double-precision FFT).  Headroom: a value
is exact only while ``|m| Delta + e < q_0 / 2`` (past it, it wraps silently), so float exchanges
take the largest ``Delta <= 2^50`` with ``B Delta <= q_0 / 4`` for the public sum bound ``B``, and
packed integer exchanges the smallest ``Delta`` whose bound is ``<= ROUNDING_TARGET``.

DP noise: ``ExchangeContext.dp_noise_std`` (the std of the total noise in the sum) is used as a
per-client std; floats widen the per-client bound by ``DP_TAIL_SIGMAS`` sigmas, packed integers
add a public per-client offset of ``ceil(DP_TAIL_SIGMAS sigma)`` (:mod:`protocols.ckks.packing`).
CKKS's approximation noise is never counted as DP noise.

The measured ciphertext sizes and noise behind these constants are in ``docs/ckks.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..errors import BoundError, ConfigurationError, PackingOverflowError
from ..precision import kway_sum_bound, largest_scale_bits
from .packing import PackingLayout, field_width

if TYPE_CHECKING:
    from ..exchange import ValueSpec

#: HE standard, classical 128-bit security, ternary secret: max total coeff-modulus bits per N
MAX_COEFF_BITS_128 = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}

#: max |noise| of one fresh ciphertext over its slots, in scaled units (model; see module doc)
FRESH_NOISE_MODEL = {"symmetric": 2.0**11, "asymmetric": 2.0**14}
#: multiplicative safety margin applied on top of the model
SAFETY = 4.0
#: a packed exchange needs every decoded slot within this distance of its integer
ROUNDING_TARGET = 1.0 / 8.0
#: largest scale used for float encoding (precision beyond this buys nothing)
MAX_FLOAT_SCALE_BITS = 50
#: smallest scale ever used (below it the noise model's margin is not worth the bits)
MIN_SCALE_BITS = 16
#: fixed scale of the reference (multi-prime) parameter set
REFERENCE_SCALE_BITS = 40
#: packed fixed point replaces a feasible float plan only when it saves at least this share of its bytes
FIXED_POINT_MIN_SAVING = 0.25
#: DP noise: a per-client public offset of this many sigmas keeps packed fields non-negative;
#: P(|N(0,1)| > 7) = 2.6e-12 per entry, so a 4e7-entry exchange is refused with prob ~1e-4
DP_TAIL_SIGMAS = 7.0


@dataclass(frozen=True)
class ChainParams:
    """One CKKS coefficient-modulus chain = one key pair (one context fingerprint)."""

    name: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]

    @property
    def slots(self) -> int:
        """Complex slots of one ciphertext, N/2."""
        return self.poly_modulus_degree // 2

    @property
    def total_bits(self) -> int:
        """Bits of the coefficient modulus Q (the sum of the chain's prime sizes)."""
        return int(sum(self.coeff_mod_bit_sizes))

    @property
    def data_primes(self) -> int:
        """Primes a fresh ciphertext lives on (all but SEAL's special prime)."""
        return len(self.coeff_mod_bit_sizes) - 1

    @property
    def padded_ciphertext_bytes(self) -> int:
        """Fixed wire size of one serialized ciphertext of this chain (see :mod:`.wire`).

        SEAL compresses serializations with zstd, so sizes vary by a few bytes (60-bit
        primes) up to a few hundred (40-bit primes) from ciphertext to ciphertext.  The
        variation is independent of the plaintext (a fresh ciphertext is uniformly random),
        but constant-size messages make the transcript a function of public shapes only, so
        every ciphertext is padded to ``PADDED_CT_BYTES`` (measured max + margin), or to the
        uncompressed size for chains not in the table.
        """
        key = (self.poly_modulus_degree, tuple(self.coeff_mod_bit_sizes))
        return PADDED_CT_BYTES.get(key, 2 * self.poly_modulus_degree * 8 * self.data_primes + 1024)

    def upload_ciphertext_bytes(self, encryption: str) -> int:
        """Padded bytes of a client's fresh ciphertext.

        Symmetric encryption uploads SEAL's seeded form (:data:`PADDED_SEEDED_CT_BYTES`, about half), asymmetric the
        whole ciphertext.
        """
        if encryption != "symmetric":
            return self.padded_ciphertext_bytes
        key = (self.poly_modulus_degree, tuple(self.coeff_mod_bit_sizes))
        return PADDED_SEEDED_CT_BYTES.get(key, self.poly_modulus_degree * 8 * self.data_primes + 1024)

    @property
    def ciphertext_bytes(self) -> int:
        """Bytes on the wire per ciphertext (padded ciphertext + frame header)."""
        from .wire import HEADER_BYTES

        return self.padded_ciphertext_bytes + HEADER_BYTES

    def data_modulus(self) -> int:
        """Product of the data primes (exact, from SEAL's prime generator)."""
        return _data_modulus(self.poly_modulus_degree, self.coeff_mod_bit_sizes)

    def describe(self) -> str:
        """Short text form, e.g. ``N=8192 [60, 40, 60]``."""
        return f"N={self.poly_modulus_degree} {list(self.coeff_mod_bit_sizes)}"


@cache
def _data_modulus(n: int, bits: tuple[int, ...]) -> int:
    from tenseal import sealapi  # registers SEAL types

    primes = [m.value() for m in sealapi.CoeffModulus.Create(n, list(bits))]
    out = 1
    for q in primes[:-1]:
        out *= int(q)
    return out


#: padded serialized ciphertext size per (N, chain): the max of ~250 measured serializations
#: (fresh and summed, both encryption types; TenSEAL 0.3.18) plus a margin of 48 B for
#: 60-bit data primes (spread: 1 B) and 2 % of the raw size for zstd-compressible primes
#: (spread: std 30-340 B).  Raw = 16 B per coefficient pair; measured ranges in comments.
PADDED_CT_BYTES = {
    (8192, (60, 60)): 131_264,  # 131,216 - 131,217  (8.0x float32 per slot)
    (4096, (60, 49)): 65_728,  # 65,675 - 65,676
    (8192, (50, 60)): 120_640,  # 117,854 - 117,996  (7.4x)
    (4096, (50, 49)): 60_352,  # 58,943 - 59,031
    (8192, (40, 60)): 97_152,  # 94,248 - 94,517    (5.9x)
    (4096, (40, 49)): 50_688,  # 49,069 - 49,371
    (8192, (60, 40, 40, 60)): 341_056,  # 330,199 - 333,182  (20.8x; the reference)
}

#: padded size of a *seeded* fresh ciphertext (symmetric encryption: SEAL sends the second
#: polynomial as its PRNG seed, :class:`~protocols.ckks.fixed_point.ClientCodec`): max of 120
#: measured serializations (TenSEAL 0.3.18's SEAL) plus the margins above; raw = 8 B per coefficient
PADDED_SEEDED_CT_BYTES = {
    (8192, (60, 60)): 65_788,  # 65,740
    (4096, (60, 49)): 33_020,  # 32,972
    (8192, (50, 60)): 60_416,  # 58,999 - 59,098
    (4096, (50, 49)): 30_304,  # 29,556 - 29,635
    (8192, (40, 60)): 50_768,  # 49,130 - 49,443
    (4096, (40, 49)): 25_456,  # 24,663 - 24,793
    (8192, (60, 40, 40, 60)): 168_896,  # 160,074 - 164,945
}

N8192 = ChainParams("n8192", 8192, (60, 60))
N4096 = ChainParams("n4096", 4096, (60, 49))
N8192_Q50 = ChainParams("n8192-q50", 8192, (50, 60))
N4096_Q50 = ChainParams("n4096-q50", 4096, (50, 49))
N8192_Q40 = ChainParams("n8192-q40", 8192, (40, 60))
N4096_Q40 = ChainParams("n4096-q40", 4096, (40, 49))
REFERENCE = ChainParams("default", 8192, (60, 40, 40, 60))
#: add-only chains the planner chooses from (one data prime each); the first is the most
#: capable and names the fix when nothing fits
ADD_ONLY_CHAINS = (N8192, N4096, N8192_Q50, N4096_Q50, N8192_Q40, N4096_Q40)
NAMED_CHAINS = {c.name: c for c in (*ADD_ONLY_CHAINS, REFERENCE)}


def check_security(chain: ChainParams) -> None:
    """Refuse a chain that is not 128-bit secure by the HE standard's table."""
    n = chain.poly_modulus_degree
    if n not in MAX_COEFF_BITS_128:
        raise ConfigurationError(
            f"poly_modulus_degree {n} is not a supported power of two; use one of {sorted(MAX_COEFF_BITS_128)}"
        )
    limit = MAX_COEFF_BITS_128[n]
    if chain.total_bits > limit:
        bigger = next((m for m in sorted(MAX_COEFF_BITS_128) if MAX_COEFF_BITS_128[m] >= chain.total_bits), None)
        raise ConfigurationError(
            f"CKKS parameters {chain.describe()} total {chain.total_bits} coefficient-modulus bits, above "
            f"the {limit} allowed for 128-bit security at N={n} (HE standard, Table 1). Fix: drop primes "
            f"(add-only exchanges need one data prime, e.g. N=8192 [60,60])"
            + (f" or raise N to {bigger}" if bigger else "")
        )
    if len(chain.coeff_mod_bit_sizes) < 2:
        raise ConfigurationError(
            "TenSEAL needs at least two primes (one data prime + the special prime); use e.g. N=8192 [60,60]"
        )


def noise_bound(
    chain: ChainParams, scale_bits: float, num_terms: int, encryption: str, magnitude: float = 0.0
) -> float:
    """Bound on |decoded - exact| of a sum of ``num_terms`` fresh ciphertexts (module doc)."""
    fresh = FRESH_NOISE_MODEL[encryption] * math.sqrt(max(1, chain.poly_modulus_degree // 8192))
    bound: float = SAFETY * fresh * math.sqrt(max(1, num_terms)) / 2.0**scale_bits
    if chain.data_primes > 1:
        bound += abs(magnitude) * 2.0**-45
    return bound


def max_float_scale_bits(chain: ChainParams, sum_bound: float) -> int:
    """Largest scale (bits) that leaves one bit of headroom for ``sum_bound``.

    Largest scale (bits) with ``sum_bound * 2^s <= q_data / 4`` (one bit of headroom margin;
    the rule of :func:`protocols.precision.largest_scale_bits`).
    """
    return largest_scale_bits(sum_bound, chain.data_modulus() / 4.0)


def slot_capacity_bits(chain: ChainParams, scale_bits: int) -> int:
    """Exact unsigned bits per slot: largest C with ``(2^C - 1 + 1/8) * 2^s < q_0 / 2``.

    For a 60-bit q_0 this is ``59 - s`` as long as ``2^s`` exceeds the
    distance of q_0 from 2^60; computed exactly from SEAL's prime, never assumed.
    """
    if chain.data_primes != 1:
        return 48  # SEAL's double-precision encoder caps exact integers near 2^48
    q = chain.data_modulus()
    c = 0
    # compare 8 * (2^C - 7/8) * 2^s < 4 q   <=>   (2^(C+3) - 7) * 2^s < 4 q
    while ((1 << (c + 4)) - 7) * (1 << scale_bits) < 4 * q:
        c += 1
    return c


@dataclass(frozen=True)
class EncodingPlan:
    """How one exchange is encoded: chain, scale, float or packed, and its error bound."""

    chain: ChainParams
    scale_bits: int
    encoding: str  # 'float' | 'packed' | 'fixed' (protocols.ckks.fixed_point)
    error_bound: float  # bound on |decoded sum - exact sum| per entry, before rounding
    exact: bool  # results are rounded to integers (integer exchanges)
    layout: PackingLayout | None = None
    sum_bound: float = 0.0  # public bound on |sum| the scale was chosen for

    @property
    def values_per_ciphertext(self) -> int:
        """Values one ciphertext carries: the packed layout's capacity, or one real value per slot."""
        return self.layout.capacity if self.layout is not None else self.chain.slots

    @property
    def scale(self) -> float:
        """The CKKS scale Delta = 2**scale_bits."""
        return float(2**self.scale_bits)

    def describe(self) -> str:
        """Short text form of the chain, scale and encoding."""
        enc = f"{self.encoding} {self.layout.fields}x{self.layout.width}b" if self.layout else "float"
        return f"{self.chain.describe()} scale 2^{self.scale_bits} {enc}"


def per_client_limits(spec: ValueSpec, dp_std: float, num_clients: int) -> tuple[float, float, int]:
    """Public per-client value range ``[lo, hi]`` and the DP offset (integers only).

    Integers: values in ``[0, min(max_abs, sum_max)]``; with DP (integer) noise the range
    widens by the public offset ``o = ceil(DP_TAIL_SIGMAS * sigma)`` on both sides.
    Floats: ``|v| <= max_abs (+ DP_TAIL_SIGMAS * sigma)``.
    """
    if spec.integer:
        hi = float(spec.max_abs)
        if spec.sum_max is not None:
            hi = min(hi, float(spec.sum_max))
        hi = math.floor(hi)
        offset = int(math.ceil(DP_TAIL_SIGMAS * dp_std)) if dp_std > 0 else 0
        return float(-offset), float(hi + offset), offset
    tail = DP_TAIL_SIGMAS * dp_std if dp_std > 0 else 0.0
    return -(spec.max_abs + tail), spec.max_abs + tail, 0


def integer_sum_range(spec: ValueSpec, num_clients: int, offset: int) -> int:
    """Largest value a packed field can hold after the K-way sum.

    The range includes the 2 K offset: ``K * hi`` for K contributions that each passed the client check ``<= hi``,
    or ``sum_max`` where a data owner's check enforces it (``ValueSpec.owner_checked_sum``). Either way no sum of
    contributions that pass their clients' checks can carry into the next field.
    """
    _, hi, _ = per_client_limits(spec, 0.0, num_clients)
    if spec.sum_max is not None and getattr(spec, "owner_checked_sum", False):
        base = int(spec.sum_max)
    else:
        base = int(kway_sum_bound(hi, num_clients))
    return base + 2 * num_clients * offset


def plan_packed(
    chain: ChainParams,
    spec: ValueSpec,
    num_clients: int,
    dp_std: float,
    encryption: str,
    *,
    tag: str | None = None,
    round: int | None = None,
) -> EncodingPlan:
    """Packed integer plan: field width from the PUBLIC sum range, smallest safe scale."""
    _, _, offset = per_client_limits(spec, dp_std, num_clients)
    rng = integer_sum_range(spec, num_clients, offset)
    width = field_width(rng)
    scale_bits = MIN_SCALE_BITS
    while noise_bound(chain, scale_bits, num_clients, encryption) > ROUNDING_TARGET:
        scale_bits += 1
    cap = slot_capacity_bits(chain, scale_bits)
    fields = cap // width
    if fields < 1:
        raise PackingOverflowError(
            f"a packed field needs {width} bits for the public sum range {rng} (K*max_abs or owner-checked "
            f"sum_max, + 2*K*DP offset) "
            f"but a slot of {chain.describe()} at scale 2^{scale_bits} holds only {cap} exact bits. Fix: "
            f"lower ValueSpec.sum_max / the DP noise, or use packing=False",
            tag=tag,
            round=round,
        )
    layout = PackingLayout(width=width, fields=fields, slots=chain.slots, offset=offset, num_clients=num_clients)
    return EncodingPlan(
        chain, scale_bits, "packed", noise_bound(chain, scale_bits, num_clients, encryption), True, layout, float(rng)
    )


def plan_float(
    chain: ChainParams,
    spec: ValueSpec,
    num_clients: int,
    dp_std: float,
    encryption: str,
    *,
    fixed_scale_bits: int | None = None,
    tag: str | None = None,
    round: int | None = None,
) -> EncodingPlan:
    """Float plan: scale from the public sum bound; error bound checked against the tolerance.

    Integer exchanges encoded as floats (``packing=False``) are rounded after decoding and
    need a bound <= 1/8 instead of ``spec.tolerance``.
    """
    lo, hi, offset = per_client_limits(spec, dp_std, num_clients)
    if spec.integer:
        bound = float(integer_sum_range(spec, num_clients, offset))
    else:
        bound = kway_sum_bound(max(abs(lo), abs(hi)), num_clients)
    if fixed_scale_bits is not None:
        s = fixed_scale_bits
        limit = chain.data_modulus() / 4.0 / 2.0**s
        if bound > limit:
            raise BoundError(
                f"the public sum bound {bound:.3g} exceeds the headroom {limit:.3g} of "
                f"{chain.describe()} at scale 2^{s}. Fix: clip (lower ValueSpec.max_abs)",
                tag=tag,
                round=round,
            )
    else:
        s = min(MAX_FLOAT_SCALE_BITS, max_float_scale_bits(chain, bound))
    err = noise_bound(chain, s, num_clients, encryption, magnitude=bound)
    need = ROUNDING_TARGET if spec.integer else float(spec.tolerance)
    if s < 1 or err > need:
        best = noise_bound(chain, max(s, 1), num_clients, encryption, magnitude=bound)
        raise BoundError(
            f"no CKKS parameter set carries sums up to {bound:.3g} (K={num_clients}) within "
            f"{'exact rounding' if spec.integer else f'tolerance {spec.tolerance:g}'}: one 60-bit data prime "
            f"leaves scale 2^{s} and an error bound of {best:.3g}. Fix: "
            + (
                "lower ValueSpec.sum_max/max_abs"
                if spec.integer
                else f"raise ValueSpec.tolerance to >= {best:.2g} or clip harder (lower ValueSpec.max_abs)"
            ),
            tag=tag,
            round=round,
        )
    return EncodingPlan(chain, s, "float", err, bool(spec.integer), None, bound)


def carries_float(spec: ValueSpec, num_clients: int, encryption: str = "symmetric") -> bool:
    """Whether :func:`plan_float` carries ``spec`` among ``num_clients`` on one of the default chains.

    The default chains are :data:`ADD_ONLY_CHAINS` (the ``ckks`` mode's ``params="auto"``), without DP noise: a
    pure function of public facts, for callers that choose a public grid every mode can carry.
    """
    for chain in ADD_ONLY_CHAINS:
        try:
            plan_float(chain, spec, num_clients, 0.0, encryption)
        except BoundError:
            continue
        return True
    return False


def release_step(plan: EncodingPlan, spec: ValueSpec) -> float | None:
    """The grid a float exchange's decrypted sums are rounded to before they leave the client.

    The largest power of two ``g`` with ``g / 2 <= tolerance - error_bound``, so the released error stays within the
    tolerance while the CKKS noise below ``g / 2`` is removed from the output (Li and Micciancio, "On the Security
    of Homomorphic Encryption on Approximate Numbers", EUROCRYPT 2021: exact decryptions of approximate HE leak the
    noise, and with it the key). ``None`` for exact (integer or packed) plans, whose outputs are integers already,
    and for exchanges on a public grid (``ValueSpec.grid_bits``), which the client rounds to that grid.
    """
    if plan.exact or plan.layout is not None or spec.grid_bits is not None:
        return None
    room = float(spec.tolerance) - plan.error_bound
    if not room > 0:
        return None
    return 2.0 ** math.floor(math.log2(2.0 * room))


def choose_chain(plans: dict[str, EncodingPlan], block_len: int | None = None) -> EncodingPlan:
    """The feasible plan with the fewest ciphertext bytes for blocks of ``block_len`` values.

    ``block_len=None`` plans per value of an unbounded stream. Ties go to the larger N (fewer ciphertexts, less
    per-ciphertext overhead), then to the larger data prime (cheaper zstd). Packed fixed point
    (:mod:`protocols.ckks.fixed_point`, coarser than the spec's tolerance) is taken only where it saves at least
    :data:`FIXED_POINT_MIN_SAVING` of the best float plan's bytes: a small exchange (a few class proxies) keeps
    float precision.
    """

    def cost(p: EncodingPlan) -> tuple[float, int, int]:
        per_ct = p.values_per_ciphertext
        nbytes = (
            p.chain.ciphertext_bytes / per_ct
            if block_len is None
            else math.ceil(block_len / per_ct) * p.chain.ciphertext_bytes
        )
        return (round(nbytes, 6), -p.chain.poly_modulus_degree, -p.chain.coeff_mod_bit_sizes[0])

    best = min(plans.values(), key=cost)
    floats = [p for p in plans.values() if p.encoding != "fixed"]
    if best.encoding == "fixed" and floats:
        best_float = min(floats, key=cost)
        if cost(best)[0] > (1.0 - FIXED_POINT_MIN_SAVING) * cost(best_float)[0]:
            return best_float
    return best
