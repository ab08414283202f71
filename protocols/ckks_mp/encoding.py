"""Fixed-point packing of a block of values into one plaintext polynomial, and back.

Field layout ("planar", as :mod:`protocols.ckks.packing`): ``n <= F N`` values use
``S = ceil(n / F)`` coefficients; field ``j`` of coefficient ``c`` holds value ``j S + c``:

    ``m_c = Delta * sum_j (x_{j S + c} + o) 2^(w j)``,   ``c < S``;   ``m_c = 0`` for ``c >= S``

(values past ``n`` are 0 + o, so every field of a used coefficient carries exactly one
offset per contributing client).  ``m_c`` has up to ~130 bits; it is built directly in RNS
(``(x mod q_j) (2^(w j + D) mod q_j) mod q_j``, exact in int64) and read back by the
Chinese remainder theorem in numpy: Garner's mixed-radix digits ``x = d_0 + d_1 q_0 + d_2 q_0 q_1 + ...``
(int64), then Horner's rule into 24-bit limbs, so every coefficient is decoded exactly without a Python
integer per coefficient; the fields are cut out with ``numpy.unpackbits``.
"""

from __future__ import annotations

import numpy as np

from .params import Plan
from .ring import RNSRing


def quantize(values: np.ndarray, plan: Plan) -> np.ndarray:
    """Client side: values -> non-negative int64 fields ``round(x 2^f) + o``."""
    v = np.asarray(values, dtype=np.float64)
    if plan.integer:
        return np.rint(v).astype(np.int64) + plan.offset
    return np.rint(np.ldexp(v, plan.frac_bits)).astype(np.int64) + plan.offset


def dequantize(fields: np.ndarray, plan: Plan) -> np.ndarray:
    """Recipient side: summed fields -> sum of values (``K o`` removed)."""
    total = fields - plan.num_clients * plan.offset
    return total.astype(np.float64) if plan.integer else np.ldexp(total.astype(np.float64), -plan.frac_bits)


def used_coefficients(plan: Plan, n: int) -> int:
    """Plaintext coefficients that ``n`` values occupy under ``plan`` (``plan.fields`` values per coefficient)."""
    return max(1, -(-n // plan.fields))


def encode(ring: RNSRing, plan: Plan, fields: np.ndarray) -> np.ndarray:
    """Non-negative int64 fields (``n <= capacity``) -> plaintext ``Delta m`` in RNS ``[L, N]``.

    Fields are first joined into chunks of ``floor(62 / w)`` fields (exact int64 integers), so each
    prime reduces ``ceil(F / floor(62 / w))`` chunks instead of ``F`` fields (unsigned reductions: every
    chunk and product is non-negative and below ``2^64``).
    """
    n = fields.size
    s = used_coefficients(plan, n)
    grid: np.ndarray = np.full(plan.fields * s, plan.offset, dtype=np.int64)
    grid[:n] = fields
    grid = grid.reshape(plan.fields, s)
    per_chunk = max(1, 62 // plan.width)
    starts = range(0, plan.fields, per_chunk)
    chunks = np.zeros((len(starts), 1, s), dtype=np.int64)
    for c, j0 in enumerate(starts):
        for j in range(j0, min(j0 + per_chunk, plan.fields)):
            chunks[c, 0] |= grid[j] << (plan.width * (j - j0))
    primes = ring.primes[: plan.level]
    q = ring.q[: plan.level].astype(np.uint64)
    weights = np.array(
        [[pow(2, plan.width * j0 + plan.scale_bits, p) for p in primes] for j0 in starts], dtype=np.uint64
    )[:, :, None]
    out = np.zeros((plan.level, ring.n), dtype=np.int64)
    total = out[:, :s].view(np.uint64)
    for c in range(len(starts)):  # (chunk mod q) (weight mod q) < 2^62
        total += chunks[c].view(np.uint64) % q * weights[c] % q
    total %= q
    return out


def offset_plaintext(ring: RNSRing, plan: Plan, n: int, missing: int) -> np.ndarray:
    """The plaintext of the DP offsets the server pads for missing clients.

    ``Delta m`` adding ``missing * o`` to every field of the coefficients a block of ``n``
    values uses (server padding for clients that did not upload the block, so the total
    offset is always ``K o``).
    """
    full = plan.fields * used_coefficients(plan, n)
    return encode(ring, plan, np.full(full, missing * plan.offset, dtype=np.int64))


def crt_centered(ring: RNSRing, residues: np.ndarray) -> list[int]:
    """Residues ``[L, N]`` -> the N coefficients as centred Python ints in ``(-Q/2, Q/2]``."""
    level = residues.shape[0]
    big_q = ring.modulus(level)
    acc = np.zeros(residues.shape[1], dtype=object)
    for j, q in enumerate(ring.primes[:level]):
        q_hat = big_q // q
        y = residues[j] * pow(q_hat % q, -1, q) % q  # int64, < 2^31 * 2^31
        acc = acc + y.astype(object) * q_hat
    half = big_q // 2
    return [(int(v) % big_q) - big_q if int(v) % big_q > half else int(v) % big_q for v in acc]


LIMB_BITS = 24
_LIMB_MASK = (1 << LIMB_BITS) - 1


def _limbs_of(value: int, count: int) -> np.ndarray:
    """A non-negative Python int as ``count`` 24-bit limbs ``[count, 1]``."""
    return np.array([(value >> (LIMB_BITS * i)) & _LIMB_MASK for i in range(count)], dtype=np.int64)[:, None]


def _carry(x: np.ndarray) -> np.ndarray:
    """Normalise limbs in place: each in ``[0, 2^24)`` but the top one, which keeps the sign."""
    for i in range(x.shape[0] - 1):
        x[i + 1] += x[i] >> LIMB_BITS
        x[i] &= _LIMB_MASK
    return x


def _limb_value(x: np.ndarray, col: int) -> int:
    return sum(int(x[i, col]) << (LIMB_BITS * i) for i in range(x.shape[0]))


def centered_limbs(ring: RNSRing, residues: np.ndarray) -> np.ndarray:
    """Residues ``[L, N]`` -> the centred coefficients in ``(-Q/2, Q/2]`` as limbs ``[count, N]``.

    Garner: ``d_0 = r_0``, ``d_j = (...((r_j - d_0) q_0^{-1} - d_1) q_1^{-1} ...) mod q_j``; then
    ``x = d_{L-1}``, ``x <- x q_j + d_j`` for ``j = L-2 .. 0`` on 24-bit limbs; ``x - Q`` where ``x > Q/2``.
    """
    level = residues.shape[0]
    primes = ring.primes[:level]
    big_q = ring.modulus(level)
    count = (big_q.bit_length() + 2) // LIMB_BITS + 2
    digits = [residues[0].astype(np.int64)]
    for j in range(1, level):
        t = residues[j].astype(np.int64)
        for i in range(j):
            t = (t - digits[i]) % primes[j] * pow(primes[i], -1, primes[j]) % primes[j]
        digits.append(t)
    x = np.zeros((count, residues.shape[1]), dtype=np.int64)
    x[0] = digits[-1]
    for j in range(level - 2, -1, -1):
        x *= primes[j]
        x[0] += digits[j]
        _carry(x)
    above = _carry(x - _limbs_of(big_q // 2 + 1, count))[-1] >= 0  # x > Q/2
    return _carry(x - _limbs_of(big_q, count) * above)


def decode(ring: RNSRing, plan: Plan, residues: np.ndarray, n: int) -> tuple[np.ndarray, int, bool]:
    """Decrypted ``(Delta m + e) / P`` at the switch level in RNS -> ``(summed fields [n], max |e|, fields in range)``.

    Each coefficient is multiplied back by ``P`` (:attr:`.params.Plan.switch_factor`); ``max |e|``
    is then the largest distance of any coefficient from a multiple of ``Delta``, in the uploads'
    units (the caller compares it with the noise bound, which includes ``P E_r``); in-range means
    every packed integer is non-negative, below ``2^(F w)``, and the unused coefficients are 0.
    All in 24-bit limbs (:func:`centered_limbs`), exact.
    """
    c = centered_limbs(ring, residues)
    factor = plan.switch_factor
    if factor > 1:
        f_limbs = _limbs_of(factor, -(-factor.bit_length() // LIMB_BITS))[:, 0].tolist()
        v = np.zeros((c.shape[0] + len(f_limbs), c.shape[1]), dtype=np.int64)
        for k, f in enumerate(f_limbs):
            v[k : k + c.shape[0]] += c * f
        _carry(v)
    else:
        v = c
    shift = plan.scale_bits
    v[(shift - 1) // LIMB_BITS] += 1 << ((shift - 1) % LIMB_BITS)  # round to the nearest multiple of Delta
    _carry(v)
    whole, bits = divmod(shift, LIMB_BITS)
    low = v[: whole + 1].copy()
    low[whole] &= (1 << bits) - 1  # v mod Delta = e + Delta / 2
    low[(shift - 1) // LIMB_BITS] -= 1 << ((shift - 1) % LIMB_BITS)
    _carry(low)  # e, signed limbs
    approx = np.abs((low * np.ldexp(1.0, LIMB_BITS * np.arange(low.shape[0]))[:, None]).sum(axis=0))
    near = np.nonzero(approx >= approx.max() - np.ldexp(1.0, shift - 40))[0]  # the exact max is among these
    residual = max(abs(_limb_value(low, int(i))) for i in near)
    packed = v[whole:] >> bits
    if bits:
        packed[:-1] |= (v[whole + 1 :] & ((1 << bits) - 1)) << (LIMB_BITS - bits)
    s = used_coefficients(plan, n)
    nbits = plan.fields * plan.width
    above = np.arange(packed.shape[0])[:, None] * LIMB_BITS
    high = np.where(above >= nbits, packed, packed >> np.clip(nbits - above, 0, LIMB_BITS))
    in_range = bool(packed[-1].min() >= 0 and not high[:, :s].any() and not packed[:, s:].any())
    if not in_range:
        return np.zeros(n, dtype=np.int64), residual, False
    nlimbs = -(-nbits // LIMB_BITS)
    raw = np.ascontiguousarray(packed[:nlimbs, :s].T).astype("<u4").view(np.uint8).reshape(s, nlimbs, 4)[:, :, :3]
    bits_of = np.unpackbits(raw.reshape(s, 3 * nlimbs), axis=1, bitorder="little")[:, :nbits]
    weights = np.left_shift(np.int64(1), np.arange(plan.width, dtype=np.int64))
    fields = bits_of.reshape(s, plan.fields, plan.width).astype(np.int64) @ weights  # [S, F]
    return fields.T.reshape(-1)[:n], residual, True
