"""Fixed-point packing of a block of values into one plaintext polynomial, and back.

Field layout ("planar", as :mod:`protocols.ckks.packing`): ``n <= F N`` values use
``S = ceil(n / F)`` coefficients; field ``j`` of coefficient ``c`` holds value ``j S + c``:

    ``m_c = Delta * sum_j (x_{j S + c} + o) 2^(w j)``,   ``c < S``;   ``m_c = 0`` for ``c >= S``

(values past ``n`` are 0 + o, so every field of a used coefficient carries exactly one
offset per contributing client).  ``m_c`` has up to ~130 bits; it is built directly in RNS
(``(x mod q_j) (2^(w j + D) mod q_j) mod q_j``, exact in int64) and read back by the
Chinese remainder theorem on Python integers, then split into fields with
``numpy.unpackbits`` (no per-field Python loop).
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
    """Non-negative int64 fields (``n <= capacity``) -> plaintext ``Delta m`` in RNS ``[L, N]``."""
    n = fields.size
    s = used_coefficients(plan, n)
    grid = np.full(plan.fields * s, plan.offset, dtype=np.int64)
    grid[:n] = fields
    grid = grid.reshape(plan.fields, s)
    q = ring.q[: plan.level]
    out = np.zeros((plan.level, ring.n), dtype=np.int64)
    for j in range(plan.fields):
        w = np.array([pow(2, plan.width * j + plan.scale_bits, p) for p in ring.primes[: plan.level]], dtype=np.int64)[
            :, None
        ]
        out[:, :s] = (out[:, :s] + np.mod(grid[j][None, :], q) * w) % q
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


def decode(ring: RNSRing, plan: Plan, residues: np.ndarray, n: int) -> tuple[np.ndarray, int, bool]:
    """Decrypted ``(Delta m + e) / P`` at the switch level in RNS -> ``(summed fields [n], max |e|, fields in range)``.

    Each coefficient is multiplied back by ``P`` (:attr:`.params.Plan.switch_factor`); ``max |e|``
    is then the largest distance of any coefficient from a multiple of ``Delta``, in the uploads'
    units (the caller compares it with the noise bound, which includes ``P E_r``); in-range means
    every packed integer is non-negative, below ``2^(F w)``, and the unused coefficients are 0.
    """
    coeffs = [c * plan.switch_factor for c in crt_centered(ring, residues)]
    shift = plan.scale_bits
    half = 1 << (shift - 1)
    packed = [(c + half) >> shift for c in coeffs]
    residual = max(abs(c - (p << shift)) for c, p in zip(coeffs, packed))
    s = used_coefficients(plan, n)
    nbits = plan.fields * plan.width
    in_range = all(0 <= p < (1 << nbits) for p in packed[:s]) and not any(packed[s:])
    if not in_range:
        return np.zeros(n, dtype=np.int64), residual, False
    nbytes = (nbits + 7) // 8
    raw = np.frombuffer(b"".join(p.to_bytes(nbytes, "little") for p in packed[:s]), dtype=np.uint8)
    bits = np.unpackbits(raw.reshape(s, nbytes), axis=1, bitorder="little")[:, :nbits]
    weights = np.left_shift(np.int64(1), np.arange(plan.width, dtype=np.int64))
    fields = bits.reshape(s, plan.fields, plan.width).astype(np.int64) @ weights  # [S, F]
    return fields.T.reshape(-1)[:n], residual, True
