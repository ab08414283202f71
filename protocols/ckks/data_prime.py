"""The data prime of a packed exchange sized to what the exchange holds.

An add-only exchange lives on one data prime ``q_0`` (:mod:`.params`).  A packed plan fixes, from
public bounds only, the scale ``2^s`` (the smallest whose noise bound on the K-way sum is
``<= 1/8``) and ``F`` fields of ``b`` bits per carrier, which must hold the K-way sum of every field
(``b`` from the field's public sum bound: ``log2 (K B 2^f)`` grid bits plus the sign for packed fixed
point, :class:`protocols.fixed_point.FixedPoint`; ``log2`` of the sum range for unsigned counts,
:mod:`.packing`).  Decryption stays exact while every coefficient of the decrypted sum stays below
``q_0 / 2``:

    ``sqrt(2) (2^(F b - 1) + 1/8) 2^s < q_0 / 2``      (signed fields in both halves of a slot)
    ``(2^(F b) - 1 + 1/8) 2^s < q_0 / 2``              (unsigned fields in the real half)

(:func:`~.fixed_point.signed_capacity_bits`, :func:`~.params.slot_capacity_bits`), so ``log2 q_0`` must
exceed ``F b + s`` by half a bit (signed) or one bit (unsigned).  The 60-bit prime of
:data:`~.params.N8192` leaves the rest unused: the Cora FedGCN model mean on its grid needs 38-bit
fields at ``2^18``, 57 bits of its 60.

:func:`fit_data_prime` keeps everything of a plan -- ``N``, the special prime, the scale, the layout,
the fields -- and takes the narrowest data prime that still satisfies the inequality above, checked on
SEAL's actual prime (the largest prime of that size with ``q = 1 mod 2N``), never on its nominal size.
It is applied where the bytes follow the prime's width: the packed upload and the seeded download
(:mod:`.seeded`: ``c0`` at the prime's bit width), i.e. symmetric encryption in the dense layout.
Every party re-checks the inequality on the plan it receives (:func:`check_fits`), so a server that plans a
prime too narrow for the fields is refused before anything is encrypted.  A narrower modulus is only more
secure (the 128-bit check, :func:`~.params.check_security`, bounds ``log2 Q`` from above); a fitted chain
is a new parameter set with its own key pair.
"""

from __future__ import annotations

import dataclasses

from ..errors import BoundError
from .fixed_point import FixedPointLayout, signed_capacity_bits
from .params import ChainParams, EncodingPlan, slot_capacity_bits


def fitted_chain(chain: ChainParams, data_bits: int) -> ChainParams:
    """``chain`` with its one data prime replaced by a ``data_bits``-bit prime (same N, same special prime)."""
    n, special = chain.poly_modulus_degree, chain.coeff_mod_bit_sizes[-1]
    name = f"n{n}" if data_bits == 60 else f"n{n}-q{data_bits}"
    return ChainParams(name, n, (int(data_bits), special))


def capacity_bits(plan: EncodingPlan, chain: ChainParams) -> int:
    """Exact bits a carrier of ``plan``'s layout holds on ``chain`` at ``plan``'s scale."""
    capacity = signed_capacity_bits if isinstance(plan.layout, FixedPointLayout) else slot_capacity_bits
    return capacity(chain, plan.scale_bits)


def needed_bits(plan: EncodingPlan) -> int:
    """Exact bits one carrier of a packed plan uses: ``F b``."""
    if plan.layout is None:
        raise ValueError("only packed plans have fields")
    return int(plan.layout.fields) * int(plan.layout.width)


def fit_data_prime(plan: EncodingPlan) -> EncodingPlan:
    """``plan`` on the narrowest data prime whose capacity still holds its ``F b`` bits (module doc).

    Float plans (whose scale is taken from the prime's headroom) and multi-prime chains are returned
    unchanged, and so is a plan whose prime is already the narrowest.
    """
    if plan.layout is None or plan.chain.data_primes != 1:
        return plan
    need, widest = needed_bits(plan), plan.chain.coeff_mod_bit_sizes[0]
    for bits in range(need + plan.scale_bits + 1, widest):  # q_0 > 2^(F b + s) at the least
        chain = fitted_chain(plan.chain, bits)
        if capacity_bits(plan, chain) >= need:
            return dataclasses.replace(plan, chain=chain)
    return plan


def check_fits(plan: EncodingPlan) -> None:
    """Refuse a packed plan whose ``F b`` bits exceed its chain's capacity at its scale (module doc).

    Raises:
        BoundError: the decrypted sums could wrap modulo ``q_0``; nothing is encrypted under such a plan.
    """
    if plan.layout is None or plan.chain.data_primes != 1:
        return
    need, have = needed_bits(plan), capacity_bits(plan, plan.chain)
    if have < need:
        raise BoundError(
            f"the plan's {plan.layout.fields} x {plan.layout.width}-bit fields need {need} exact bits, but "
            f"{plan.chain.describe()} holds {have} at scale 2^{plan.scale_bits}: a plan with a scale or packed "
            "fields past the chain's modulus is refused"
        )
