"""Rounding under DP cannot push a clipped vector past its bound.

Kairouz, Liu, Steinke, ICML 2021, sec. 4. A block clipped to ``C`` by :func:`protocols.dp.clip_l2`, then quantised
by the packed codec's DP path (:meth:`protocols.ckks.fixed_point.FixedPointLayout.quantize` with ``dp=True``:
conditional randomized rounding), has ``||Delta q||_2`` within Kairouz et al.'s bound for ``C``; integer exchanges,
rounded before their discrete noise, stay inside the ball itself (truncation toward zero).
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.dp import clip_l2
from protocols.fixed_point import CRR_BETA, FixedPoint, rounding_rng


def kairouz_bound(c: float, quantum: float, d: int) -> float:
    """Kairouz et al.'s bound on the conditionally rounded norm of a vector of norm <= c."""
    return min(
        c + quantum * math.sqrt(d),
        math.sqrt(
            c * c
            + quantum * quantum * d / 4.0
            + math.sqrt(2.0 * math.log(1.0 / CRR_BETA)) * quantum * (c + quantum * math.sqrt(d) / 2.0)
        ),
    )


@settings(max_examples=25, deadline=None)
@given(
    d=st.integers(1, 300),
    clip=st.floats(0.05, 4.0),
    scale=st.floats(0.1, 100.0),
    width=st.integers(10, 16),
    seed=st.integers(0, 2**16),
)
def test_a_clipped_block_stays_within_its_bound_after_the_codecs_dp_rounding(d, clip, scale, width, seed):
    from protocols.ckks.fixed_point import FixedPointLayout

    codec = FixedPoint.plan(4.0, 10, width, 52 // width)  # coarse quanta make the slack visible
    layout = FixedPointLayout(codec, slots=2048)
    x = np.random.default_rng(seed).normal(size=(2, d)) * scale
    blocks = np.stack([clip_l2(row, clip) for row in x])
    q = layout.quantize(blocks, rounding_rng(seed, "t", 0, 0), dp=True)
    limit = kairouz_bound(clip, codec.quantum, d)
    assert (np.linalg.norm(q * codec.quantum, axis=1) <= limit * (1 + 1e-12)).all()
    assert (np.linalg.norm(codec.dequantize(q), axis=1) - clip <= codec.quantum * math.sqrt(d) + 1e-12).all()


@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 200), clip=st.floats(0.5, 30.0), seed=st.integers(0, 2**16))
def test_integer_contributions_rounded_before_their_noise_stay_inside_the_ball(d, clip, seed):
    x = np.random.default_rng(seed).integers(-20, 21, size=d).astype(np.float64)
    y = clip_l2(x, clip, integer=True)
    assert np.array_equal(y, np.rint(y)) and np.linalg.norm(y) <= clip
