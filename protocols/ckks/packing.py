"""Packing codec: several bounded non-negative integer fields in one CKKS slot.

FedGCN's neighbour-feature sums of binary features are small counts (at most the degree
cap + 1).  A CKKS slot with one 60-bit data prime holds ``59 - log2(scale)`` exact bits
(docs/ckks.md gives the exact bits per scale), so it can carry several counts at
once, in base ``2^w``:

    ``P = sum_j (x_j + o) * 2^(w*j)``,   ``j = 0 .. F-1``

Adding K ciphertexts adds the P's slot-wise, i.e. adds every field independently **as
long as no field exceeds 2^w - 1**, which is what the field width guarantees:

* ``w = ceil(log2(R + 1))`` where ``R`` is the PUBLIC bound on a field after the K-way
  sum (``sum_max``, e.g. degree cap + 1).  The width is never taken from the data: a
  data-dependent width would leak the maximum, and a too-narrow one silently corrupts
  the neighbouring field.
* With DP the clients' values carry integer noise and may be negative.  Each client
  adds a PUBLIC offset ``o ~ 7 sigma`` before packing, so every field stays
  non-negative; the width then covers ``R = sum_max + 2 K o``; after decoding the
  recipients subtract ``K o`` from every field (the server pads a block that fewer than
  K clients uploaded with the missing offsets, so the total is always ``K o``).
* ``F = floor(C / w)`` fields per slot, where ``C`` is the slot capacity in exact bits
  (:func:`protocols.ckks.params.slot_capacity_bits`).

Field layout of one ciphertext carrying ``n <= F * S`` values with ``S' = ceil(n / F)``
used slots ("planar": field j holds a contiguous run of values, so packing is one
reshape and F shifts):

=========  ===========================  ===========================  =====  ==============================
slot       field 0 (bits 0..w-1)        field 1 (bits w..2w-1)       ...    field F-1 (bits (F-1)w..Fw-1)
=========  ===========================  ===========================  =====  ==============================
0          x[0] + o                     x[S'] + o                    ...    x[(F-1) S'] + o
1          x[1] + o                     x[S' + 1] + o                ...    x[(F-1) S' + 1] + o
...        ...                          ...                          ...    ...
S' - 1     x[S' - 1] + o                x[2 S' - 1] + o              ...    x[F S' - 1] + o (or pad o)
=========  ===========================  ===========================  =====  ==============================

Bits ``F w .. C-1`` of every slot stay zero (carry room is inside each field, not
here).  Example (Cora, K = 10, degree cap 168, no DP): R = 169, w = 8, scale 2^18,
C = 41, F = 5: 20,480 counts per ciphertext.

Packed integers stay below 2^53, so the float64 hand-off to CKKS is exact; decoding
rounds to the nearest integer (the noise bound is <= 1/8) and unpacks with int64 shifts.
All bound checks happen on the clients BEFORE anything is encrypted
(:func:`protocols.validate.find_violation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def field_width(sum_range: int) -> int:
    """Bits needed to hold every integer in ``[0, sum_range]``."""
    if sum_range < 0:
        raise ValueError("sum_range must be non-negative")
    return max(1, int(sum_range).bit_length())


@dataclass(frozen=True)
class PackingLayout:
    """Public description of one packed exchange (all parties derive the same one)."""

    width: int  # bits per field
    fields: int  # fields per slot
    slots: int  # slots per ciphertext (N / 2)
    offset: int = 0  # public per-client DP offset o
    num_clients: int = 1  # K: the recipients subtract K * o

    def __post_init__(self) -> None:
        if self.width * self.fields > 52:
            raise ValueError("packed slots must stay below 2^52 to pass through float64 exactly")

    @property
    def capacity(self) -> int:
        """Values per ciphertext."""
        return self.fields * self.slots

    @property
    def mask(self) -> int:
        """Bit mask of one field, ``2**width - 1``."""
        return (1 << self.width) - 1

    def slots_for(self, n: int) -> int:
        """Slots used by a ciphertext carrying ``n`` values."""
        if n > self.capacity:
            raise ValueError(f"{n} values exceed the {self.capacity} a ciphertext carries")
        return max(1, math.ceil(n / self.fields))

    def _shifts(self) -> np.ndarray:
        return (np.arange(self.fields, dtype=np.int64) * self.width)[:, None]

    def pack(self, values: np.ndarray) -> np.ndarray:
        """Integer-valued ``values`` (length n) -> float64 slot values (length ``slots_for(n)``).

        The caller has validated ``-offset <= v`` and the field range (:func:`protocols.validate.find_violation`).
        """
        v = np.asarray(values)
        n = v.size
        s = self.slots_for(n)
        grid = np.zeros(self.fields * s, dtype=np.int64)
        grid[:n] = np.rint(v).astype(np.int64)
        grid += self.offset
        packed = np.left_shift(grid.reshape(self.fields, s), self._shifts()).sum(axis=0)
        carriers: np.ndarray = packed.astype(np.float64)
        return carriers

    def offset_constant(self, missing: int) -> float:
        """One slot value adding ``missing * o`` to every field (server-side padding)."""
        per_field = int(missing) * self.offset
        return float(sum(per_field << (self.width * j) for j in range(self.fields)))

    def unpack(self, decoded: np.ndarray, n: int) -> tuple[np.ndarray, float, bool]:
        """Decoded slot values -> the n summed integers (offsets removed).

        Returns ``(values float64, max rounding residual, in_range)``; the caller refuses
        the result when the residual exceeds the noise bound or a slot is out of range.
        """
        d = np.asarray(decoded, dtype=np.float64)
        s = self.slots_for(n)
        if d.size != s:
            raise ValueError(f"expected {s} slots, got {d.size}")
        r = np.rint(d)
        residual = float(np.abs(d - r).max()) if d.size else 0.0
        p = r.astype(np.int64)
        in_range = bool(((p >= 0) & (p < (1 << (self.width * self.fields)))).all())
        fields = np.right_shift(p[None, :], self._shifts()) & self.mask
        out = fields.reshape(-1)[:n] - self.num_clients * self.offset
        return out.astype(np.float64), residual, in_range
