"""The public encoding plan of a CKKS exchange as a message body, and the layout both halves derive from it.

The server sends the plan (:class:`~.params.EncodingPlan`: chain, scale, encoding, packed layout)
in the exchange's ``plan`` message; each client parses it strictly and re-checks the chain's
128-bit security (:func:`.params.check_security`) and that the packed fields fit the chain's data prime at
the plan's scale (:func:`.data_prime.check_fits`) before using it.  From the plan and the
public block length both halves cut every block into the same ciphertext pieces
(:func:`pieces`) and the exchange into the same streamed chunks of blocks (:func:`chunks`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ..errors import MalformedMessageError
from ..fixed_point import FixedPoint
from .data_prime import check_fits
from .fixed_point import FixedPointLayout
from .packing import PackingLayout
from .params import ChainParams, EncodingPlan, check_security

#: the tag of the key set-up messages
KEYS_TAG = "ckks/keys"


def plan_to_payload(plan: EncodingPlan) -> dict[str, Any]:
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


def _layout_from_payload(p: dict[str, Any]) -> PackingLayout | FixedPointLayout:
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


def plan_from_payload(p: Any) -> EncodingPlan:
    """Strict inverse of :func:`plan_to_payload`; the chain must be 128-bit secure and hold the packed fields."""
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
            layout,  # type: ignore[arg-type]  # a FixedPointLayout duck-types PackingLayout
            float(p["sum_bound"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise MalformedMessageError(f"malformed CKKS encoding plan ({e})") from None
    check_security(chain)
    check_fits(plan)
    return plan


def pieces(plan: EncodingPlan, block_len: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Value ranges of a block's ciphertexts and their slot counts."""
    per_ct = plan.values_per_ciphertext
    n_pieces = math.ceil(block_len / per_ct)
    bounds = [(j * per_ct, min(block_len, (j + 1) * per_ct)) for j in range(n_pieces)]
    return bounds, [(plan.layout.slots_for(b - a) if plan.layout is not None else b - a) for a, b in bounds]


def chunks(num_blocks: int, per_chunk: int) -> list[tuple[int, int]]:
    """The ``[b0, b1)`` block ranges of the streamed chunks of ``per_chunk`` blocks."""
    return [(b0, min(num_blocks, b0 + per_chunk)) for b0 in range(0, num_blocks, per_chunk)]
