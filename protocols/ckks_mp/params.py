"""Parameters, worst-case noise bounds and the per-exchange encoding plan of ``ckks-mp``.

Ring: ``N = 8192``, ``Q = q_0 ... q_6``, seven NTT primes just below 2^31 (216.997 bits).
The HE security standard (Albrecht et al. 2018, Table 1, classical 128-bit, ternary
secret) allows ``log2 Q <= 218`` at ``N = 8192``; :func:`check_security` enforces it.
An exchange may use only the first ``L`` primes (a smaller ``Q`` is more secure).

Noise bounds (all worst case: ternary secrets, centered-binomial errors |e| <= eta,
``||a b||_inf <= N ||a||_inf ||b||_inf``; K = number of clients of the run):

* an upload ``c0_i = -a_x s_i + e_i + Delta m_i`` (secret-key encryption under the client's own
  share with the public ``c1 = a_x``, :mod:`.encryption`); the sum over the K contributors
  decrypts under ``s = sum_i s_i`` to ``Delta sum m_i + sum e_i``: ``B_ct = K eta``;
* public-key switching (PCKS, Mouchet et al. 2021, Protocol 5) to a recipient key
  ``(p_R = -a s_R + e_R, a)``: client i sends ``h0_i = s_i c1 + z_i + p_R u_i + e0_i``
  (``z_i`` zero-sum masks, :mod:`.keyswitch`),
  ``h1_i = a u_i + e1_i`` with smudging noise ``e0_i`` uniform in ``[-2^b, 2^b)``; the
  recipient's decryption ``c0 + sum h0_i + s_R sum h1_i`` carries
  ``B_ks = B_ct + K 2^b + 2 K N eta``.

Smudging (the defence against the Li-Micciancio IND-CPA^D key-recovery attack on
approximate HE, "On the Security of Homomorphic Encryption on Approximate Numbers",
EUROCRYPT 2021): the noise a recipient decrypts must not reveal the upload errors
``e_i``, which with the public ``c0_i`` and ``c1`` would give linear equations in the shares
``s_i``.  ``B_ct`` is the only such term; the uniform smudging noise of
a single honest client hides any shift ``|d| <= B_ct`` per coefficient within statistical
distance ``|d| / 2^(b+1)``, so over the ``N`` coefficients of a ciphertext within
``N B_ct / 2^(b+1) <= 2^-lambda`` when ``b = ceil(lambda + log2(N B_ct))``.  Distances add
over key switches (T ciphertexts -> ``T 2^-lambda``), so ``lambda = max(40, 30 + ceil(log2 T))``
for a public budget of ``T`` ciphertexts per client per run (:attr:`MPParams.keyswitch_lambda`;
a client refuses a key switch past it) keeps the run within ``2^-30``.

Encoding: every value becomes a non-negative integer field (integers as they are, floats
as ``round(x 2^f)``), ``F`` fields of ``w`` bits are packed into one coefficient in base
``2^w``, and the coefficient is scaled by ``Delta = 2^D`` with ``2^D >= 4 B_ks``, so the
recipient rounds ``d / Delta`` to the exact packed integer (``|noise| <= Delta / 4``) and
detects a corrupted share or ciphertext when the residual exceeds ``B_ks``.  A coefficient
carries ``C`` exact bits, the largest ``C`` with ``(2^C - 1) Delta + B_ks < Q_L / 2``;
``F = floor(C / w)``.  Float error: each client's rounding is at most ``2^-(f+1)``, so the
sum is within ``K 2^-(f+1)`` of the exact float sum; ``f`` is the smallest integer meeting
``ValueSpec.tolerance``.  Integers are exact, and so are values on a public grid
(``ValueSpec.grid_bits``: ``f`` is the grid's, every value an integer multiple of ``2^-f``).
The field width comes from PUBLIC bounds only (:func:`protocols.ckks.params.per_client_limits`
/ ``integer_sum_range``, shared with ``ckks``), never from the data.

Switching down (the key-switching shares and the key-switched downloads): what a recipient
decrypts needs only the fields above the noise, not the whole upload modulus ``Q_L``.  Each
share and the summed ``c0`` are divided by the product ``P = q_L' ... q_{L-1}`` of the dropped
primes and rounded before they leave their sender (:meth:`.ring.RNSRing.rescale`, a public
function of the smudged share, so the security argument is unchanged), and travel at the
switch level ``Q_L'``.  The rounding adds, per coefficient of the recipient's decryption,
``E_r = 1 + K + N K`` (``c0`` and the K shares' ``h0`` each below 1; the K ``h1`` errors
multiplied by the ternary recipient key, below ``N`` each), so the recipient multiplies by
``P`` and decodes as above with ``B_ks + P E_r`` in place of ``B_ks`` (``2^D >= 4 (B_ks + P
E_r)``); the fields fit when ``(2^C - 1) Delta + B_ks + P E_r < Q_L / 2``.

The switch is part of the plan.  A **broadcast** exchange (every recipient gets every block,
switched to the broadcast key, CKS) decrypts ``Delta m + e + sum_i e0_i``: no PCKS terms, so
``B_ks = B_ct + K 2^b``, and its rounding is ``E_r = 1 + K + 1`` (``c0``, the K shares, and the
recipient's own ``s_B c1`` switched down after the product); a **scoped** exchange (PCKS) keeps
the bounds above.  The planner picks ``(L, L')`` with the fewest bytes: per ciphertext ``L`` for
the upload ``c0``, and ``2 L'`` (PCKS: a two-polynomial share and download) or ``L'`` (CKS) for
each share and each download.  The smudging ``b`` depends on ``K`` and ``lambda`` only, never on
the levels: switching down divides the smudged share as a whole, a public function of it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..ckks.packing import field_width
from ..ckks.params import MAX_COEFF_BITS_128, integer_sum_range, per_client_limits
from ..errors import BoundError, ConfigurationError
from .ring import RNSRing, ntt_primes

if TYPE_CHECKING:
    from ..exchange import ValueSpec

#: field values are extracted with int64 arithmetic
MAX_FIELD_BITS = 62
#: the HE standard's error width (standard deviation of the RLWE error)
ERROR_STD = 3.19
#: least statistical parameter of the smudging noise, per key-switched ciphertext
MIN_SMUDGING_LAMBDA = 40
#: a run's key switches together stay within statistical distance 2^-TOTAL_DISTANCE_BITS
TOTAL_DISTANCE_BITS = 30


@dataclass(frozen=True)
class MPParams:
    """Ring and noise parameters of a multiparty run (public)."""

    n: int = 8192
    num_primes: int = 7
    eta: int = 21
    smudging_lambda: int = 40
    max_keyswitches: int = 1 << 20

    @property
    def keyswitch_lambda(self) -> int:
        """The statistical parameter each key-switched ciphertext is smudged to.

        ``max(smudging_lambda, 30 + ceil(log2 T))`` for at most ``T = max_keyswitches`` ciphertexts per client per
        run, so the run's total distance is ``<= T 2^-lambda <= 2^-30``.
        """
        return max(self.smudging_lambda, TOTAL_DISTANCE_BITS + (self.max_keyswitches - 1).bit_length())

    @property
    def primes(self) -> tuple[int, ...]:
        """The ``num_primes`` 31-bit NTT-friendly primes q_i = 1 mod 2N of the RNS modulus."""
        return ntt_primes(self.n, self.num_primes)

    def log_q(self, level: int | None = None) -> float:
        """Bits of Q_level = prod q_i over the first ``level`` primes (all of them by default)."""
        return sum(math.log2(q) for q in self.primes[: level or self.num_primes])

    def modulus(self, level: int) -> int:
        """Q_level, the product of the first ``level`` primes."""
        return math.prod(self.primes[:level])

    def describe(self) -> str:
        """Short text form of the ring, modulus, secret distribution and smudging parameters."""
        return (
            f"N={self.n} Q={self.num_primes}x31-bit ({self.log_q():.1f} bits) eta={self.eta} "
            f"smudging 2^-{self.keyswitch_lambda} per ciphertext, <= {self.max_keyswitches} per client"
        )


def params_to_options(params: MPParams) -> dict[str, int]:
    """The public parameters as a message body (every party builds its ring from them)."""
    return {k: int(v) for k, v in asdict(params).items()}


def params_from_options(options: Any) -> MPParams:
    """Strict inverse of :func:`params_to_options`; ConfigurationError on anything else."""
    try:
        params = MPParams(
            **{k: int(options[k]) for k in ("n", "num_primes", "eta", "smudging_lambda", "max_keyswitches")}
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigurationError(f"malformed ckks-mp parameters ({e})") from None
    check_security(params)
    return params


@lru_cache(maxsize=4)
def ring_of(params: MPParams) -> RNSRing:
    """The ring of ``params`` (NTT tables only, public; shared by the parties of one process)."""
    return RNSRing(params.n, params.primes)


def check_security(params: MPParams) -> None:
    """Refuse parameters outside the HE standard's 128-bit security table.

    Refuse parameters outside the HE standard's 128-bit table (ternary secret), an error
    narrower than its width (``eta / 2 < 3.19^2``) or smudging below ``2^-40`` per ciphertext.
    Every client runs it on the run's public setup before it makes a key.
    """
    limit = MAX_COEFF_BITS_128.get(params.n)
    if limit is None or params.log_q() > limit:
        raise ConfigurationError(
            f"{params.describe()} exceeds the HE standard's 128-bit bound (log2 Q <= {limit} at N={params.n}). "
            "Fix: use fewer primes or a larger N"
        )
    if params.eta / 2 < ERROR_STD**2:
        raise ConfigurationError(
            f"eta={params.eta} gives error std {math.sqrt(params.eta / 2):.2f} < {ERROR_STD} "
            "(HE standard). Fix: use eta >= 21"
        )
    if params.smudging_lambda < MIN_SMUDGING_LAMBDA:
        raise ConfigurationError(
            f"smudging_lambda={params.smudging_lambda} is below the floor of "
            f"{MIN_SMUDGING_LAMBDA} (statistical distance 2^-lambda per key-switched ciphertext). "
            f"Fix: use smudging_lambda >= {MIN_SMUDGING_LAMBDA}"
        )
    if not 1 <= params.max_keyswitches <= 1 << 40:
        raise ConfigurationError(f"max_keyswitches={params.max_keyswitches} must lie in [1, 2^40]")


def fresh_sum_bound(params: MPParams, k: int) -> int:
    """``B_ct``: worst-case noise of a sum of K fresh uploads (each ``|e_i| <= eta``)."""
    return k * params.eta


def smudging_bits(params: MPParams, k: int) -> int:
    """``b``: smudging noise uniform in ``[-2^b, 2^b)`` hides ``B_ct`` within ``2^-lambda``."""
    return math.ceil(params.keyswitch_lambda + math.log2(params.n * fresh_sum_bound(params, k)))


def rescale_error(params: MPParams, k: int, broadcast: bool = False) -> int:
    """Worst-case rounding error ``E_r`` per coefficient that switching down adds.

    In the switched units, what switching ``c0`` and the K shares down adds to the recipient's decryption (module
    docstring): PCKS ``1 + K + N K``; to the broadcast key (``broadcast``, CKS) ``1 + K + 1``.
    """
    return k + 2 if broadcast else 1 + k + params.n * k


def keyswitch_bound(params: MPParams, k: int, broadcast: bool = False) -> int:
    """``B_ks``: worst-case noise a recipient decrypts after the key switch.

    PCKS ``B_ct + K 2^b + 2 K N eta``; to the broadcast key (``broadcast``, CKS) ``B_ct + K 2^b``.
    """
    pcks = 0 if broadcast else 2 * k * params.n * params.eta
    return fresh_sum_bound(params, k) + k * (1 << smudging_bits(params, k)) + pcks


@dataclass(frozen=True)
class Plan:
    """How one exchange is encoded (all parties derive the same plan from public data)."""

    level: int  # primes of the uploads, L
    scale_bits: int  # D, Delta = 2^D
    frac_bits: int  # f: floats are round(x 2^f); 0 for integers
    width: int  # w, bits per field
    fields: int  # F, fields per coefficient
    offset: int  # per-client offset making every field non-negative
    num_clients: int  # K: recipients subtract K * offset
    noise_bound: int  # B_ks + P E_r: bound on the decrypted noise, in the uploads' units
    error_bound: float  # bound on |decoded sum - exact sum| (0 for integers)
    n: int
    integer: bool
    switch_level: int  # primes of the key-switching shares and downloads, L' <= L
    switch_factor: int  # P = q_L' ... q_{L-1}, the product of the dropped primes (1: none)
    broadcast: bool = False  # switched to the broadcast key (CKS) rather than to each recipient's key (PCKS)

    @property
    def capacity(self) -> int:
        """Values per ciphertext."""
        return self.fields * self.n

    @property
    def upload_bytes(self) -> int:
        """One upload ``c0`` (residues as uint32)."""
        return self.level * self.n * 4

    def describe(self) -> str:
        """Short text form of the switch, the levels, the scale and the field packing."""
        kind = "integers" if self.integer else f"fixed-point 2^-{self.frac_bits}"
        switch = "CKS" if self.broadcast else "PCKS"
        return (
            f"L={self.level} ({switch} shares, downloads L'={self.switch_level}) Delta=2^{self.scale_bits} "
            f"{self.fields}x{self.width}-bit fields ({kind})"
        )


def capacity_bits(params: MPParams, level: int, scale_bits: int, noise: int) -> int:
    """Largest C with ``(2^C - 1) 2^D + B_ks < Q_L / 2`` (exact integer arithmetic)."""
    half = params.modulus(level) // 2
    room = half - noise
    if room <= 0:
        return 0
    return ((room - 1) // (1 << scale_bits) + 1).bit_length() - 1


@lru_cache(maxsize=256)
def _cheapest_layout(
    params: MPParams, k: int, width: int, block_len: int | None, broadcast: bool = False
) -> tuple[int, int, int, int, int, int] | None:
    """``(L, L', D, F, P, noise)`` of the fewest bytes for ``width``-bit fields (:func:`plan_exchange`), or None.

    Every party plans every exchange, so the search over ``(L, L')`` is done once per distinct input.
    """
    base_noise = keyswitch_bound(params, k, broadcast)
    best, best_cost = None, None
    for level in range(1, params.num_primes + 1):
        for switch in range(1, level + 1):
            factor = params.modulus(level) // params.modulus(switch)
            noise = base_noise + (factor * rescale_error(params, k, broadcast) if switch < level else 0)
            scale_bits = (4 * noise - 1).bit_length()
            fields = capacity_bits(params, level, scale_bits, noise) // width
            if fields < 1 or width > MAX_FIELD_BITS:
                continue
            per_ct = fields * params.n
            units = level + (2 if broadcast else 4) * switch
            cost = (units / per_ct) if block_len is None else math.ceil(block_len / per_ct) * units
            if best_cost is None or cost < best_cost - 1e-12:
                best, best_cost = (level, switch, scale_bits, fields, factor, noise), cost
    return best


def plan_exchange(
    params: MPParams,
    spec: ValueSpec,
    k: int,
    dp_std: float = 0.0,
    block_len: int | None = None,
    *,
    tag: str | None = None,
    round: int | None = None,
    broadcast: bool = False,
) -> Plan:
    """The cheapest plan meeting the exchange's bounds.

    The fewest bytes for blocks of ``block_len`` values (``None``: per value of an unbounded stream), counting per
    ciphertext ``L`` for the upload and, for a share and a download each, ``2 L'`` (PCKS) or ``L'`` (``broadcast``:
    CKS to the broadcast key, with its smaller noise; module docstring); ties to fewer primes.
    """
    base_noise = keyswitch_bound(params, k, broadcast)
    lo, hi, offset = per_client_limits(spec, dp_std, k)
    if spec.integer:
        frac, error = 0, 0.0
        width = field_width(integer_sum_range(spec, k, offset))
    else:
        tol = float(spec.tolerance)
        if not tol > 0:
            raise BoundError(f"ValueSpec.tolerance must be > 0, got {tol}", tag=tag, round=round)
        if spec.grid_bits is not None:  # values on the public grid 2^-f: exact integers of quantum 2^-f
            frac, error = int(spec.grid_bits), 0.0
        else:
            frac = math.ceil(math.log2(k / (2.0 * tol)))
            error = k * 2.0 ** -(frac + 1)
        offset = math.ceil(max(abs(lo), abs(hi)) * 2.0**frac)
        width = field_width(2 * k * offset)
    layout = _cheapest_layout(params, k, width, block_len, broadcast)
    if layout is None:
        top = capacity_bits(params, params.num_primes, (4 * base_noise - 1).bit_length(), base_noise)
        raise BoundError(
            f"a field needs {width} bits (public range of the K={k} sum"
            + ("" if spec.integer else f" at precision 2^-{frac} for tolerance {spec.tolerance:g}")
            + f") but a coefficient of {params.describe()} carries {min(top, MAX_FIELD_BITS)} exact bits above the "
            "smudging noise. Fix: "
            + (
                "lower ValueSpec.sum_max/max_abs"
                if spec.integer
                else "raise ValueSpec.tolerance or lower ValueSpec.max_abs"
            ),
            tag=tag,
            round=round,
        )
    level, switch, scale_bits, fields, factor, noise = layout
    return Plan(
        level,
        scale_bits,
        frac,
        width,
        fields,
        offset,
        k,
        noise,
        error,
        params.n,
        bool(spec.integer),
        switch,
        factor,
        broadcast,
    )
