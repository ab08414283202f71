"""FedGCN's float pre-training sums on their public grid: every mode returns plain's sums bit for bit.

Float neighbour sums (e.g. PubMed's TF-IDF features) travel on the grid ``2^-PRETRAIN_GRID_BITS``
(:func:`secure_fgl.algorithms.fedgcn.ops.exchange_spec`): each client rounds its rows to the grid before
encoding and each recipient rounds the decoded sums back, so plain, mask, ckks and ckks-mp deliver the
same float64 arrays, not merely close ones; ckks-mp encodes grid values as exact integers.
"""

from __future__ import annotations

import numpy as np
import pytest

from protocols import ValueSpec, make_protocol
from protocols.ckks_mp.params import MPParams, plan_exchange
from secure_fgl.algorithms.fedgcn.ops import PRETRAIN_GRID_BITS, exchange_spec
from secure_fgl.algorithms.options import FedGCNOptions

K = 3


def _rows_sums(mode: str, spec: ValueSpec) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(11)
    rows = np.arange(6)
    contrib = {c: (rows, rng.uniform(0, 0.3, (6, 5)) * rng.integers(0, 2, (6, 5))) for c in range(K)}
    requests = {c: rows[2 * c : 2 * c + 2] for c in range(K)}
    return make_protocol(mode, K).row_sum("fedgcn/neighbour_sums", 0, contrib, requests, 6, spec=spec)


def test_float_pretraining_spec_is_on_the_grid_without_dp_only():
    o = FedGCNOptions(feature_bound=1.3, degree_cap=20)
    spec = exchange_spec(o, binary=False)
    assert spec.grid_bits == PRETRAIN_GRID_BITS and spec.tolerance == 2.0 ** -(PRETRAIN_GRID_BITS + 2)
    assert spec.float64_wire == (21 * 1.3 * 2.0**PRETRAIN_GRID_BITS > 2.0**24)
    assert exchange_spec(o, binary=False, dp_clip=1.0).grid_bits is None  # DP sums: their own release grid
    assert exchange_spec(o, binary=True).integer  # binary features: exact integers already
    huge = exchange_spec(FedGCNOptions(feature_bound=1e8, degree_cap=20), binary=False)
    assert huge.grid_bits < PRETRAIN_GRID_BITS and huge.max_abs * 2.0**huge.grid_bits <= 2.0**39  # coarser grid


def test_every_mode_returns_plains_grid_sums_bit_for_bit():
    spec = exchange_spec(FedGCNOptions(feature_bound=1.3, degree_cap=20), binary=False)
    plain = _rows_sums("plain", spec)
    for mode in ("mask", "ckks", "ckks-mp"):
        got = _rows_sums(mode, spec)
        for c in range(K):
            assert np.array_equal(got[c], plain[c]), mode  # equal, not close
    assert all(
        np.array_equal(v, np.ldexp(np.rint(np.ldexp(v, PRETRAIN_GRID_BITS)), -PRETRAIN_GRID_BITS))
        for v in plain.values()
    )


@pytest.mark.parametrize("bits", [10, 20, 26])
def test_ckks_mp_encodes_grid_values_as_exact_integers(bits):
    spec = ValueSpec(max_abs=2.0, tolerance=2.0 ** -(bits + 2), grid_bits=bits)
    plan = plan_exchange(MPParams(), spec, 10, block_len=1000)
    assert plan.frac_bits == bits and plan.error_bound == 0.0
