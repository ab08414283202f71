"""The data prime of a packed dense exchange sized to its fields (``protocols/ckks/data_prime.py``).

The fitted plan never undershoots: on SEAL's actual prime, every coefficient of the decrypted K-way sum stays below
``q_0 / 2`` (the fields at their public extremes plus the noise bound, the complex slot's ``sqrt(2)`` included), the
noise bound still rounds exactly, and one bit less would not hold the fields.  Through the whole protocol, sums at
the extremes of the public bound decrypt exactly on the fitted prime with K at the plan's maximum, and the
bytes shrink with the prime's width.  A server that plans a prime one bit too narrow for the fields is refused
by the clients before they encrypt.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocols import BoundError, PackingOverflowError, ValueSpec, make_protocol
from protocols.ckks import CKKSProtocol
from protocols.ckks import params as P
from protocols.ckks.data_prime import fit_data_prime, fitted_chain
from protocols.ckks.fixed_point import FixedPointLayout, plan_fixed_point
from protocols.ckks.plan_message import plan_from_payload
from protocols.ckks.seeded import upload_bytes
from protocols.ckks.server import CKKSServer
from protocols.fixed_point import to_grid

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _coefficient_headroom_holds(plan: P.EncodingPlan, k: int) -> bool:
    """``c (2^(F b [- 1]) - [1 -] + bound) 2^s < q_0 / 2`` in exact integer arithmetic on the plan's actual prime.

    Signed fields in both slot halves: the largest slot has ``|z| <= sqrt(2) (2^(F b - 1) + bound)``; unsigned
    fields in the real half: ``|z| <= 2^(F b) - 1 + bound``.  A coefficient is at most ``max |z|`` in scaled units.
    """
    layout = plan.layout
    assert layout is not None
    q, s, bits = plan.chain.data_modulus(), plan.scale_bits, layout.fields * layout.width
    eighths = math.ceil(8 * P.noise_bound(plan.chain, s, k, "symmetric"))  # the noise bound in eighths, rounded up
    if isinstance(layout, FixedPointLayout):
        top = (1 << (bits + 2)) + eighths  # 8 (2^(F b - 1) + bound)
        return 2 * (top << s) ** 2 < (4 * q) ** 2
    top = 8 * ((1 << bits) - 1) + eighths
    return (top << s) < 4 * q


def _grid_spec(bound_bits: int, grid_bits: int) -> ValueSpec:
    return ValueSpec(max_abs=2.0**bound_bits, tolerance=2.0 ** -(grid_bits + 2), grid_bits=grid_bits)


@PROPERTY
@given(
    k=st.integers(1, 1000),
    bound_bits=st.integers(-8, 10),
    grid_bits=st.integers(0, 36),
    n=st.sampled_from([8192, 4096]),
)
def test_fitted_grid_plan_never_undershoots(k, bound_bits, grid_bits, n):
    """Signed grid fields of every width a K-way sum needs: the fitted prime holds them, and no narrower one does."""
    chain = P.N8192 if n == 8192 else P.N4096
    spec = _grid_spec(bound_bits, grid_bits)
    try:
        plan = plan_fixed_point(chain, spec, k, 0.0, "symmetric", 20)
    except PackingOverflowError:
        assume(False)
    codec = plan.layout.codec
    assert k * spec.max_abs * 2.0**grid_bits <= (1 << (codec.width - 1)) - 1  # the field holds the K-way sum
    fitted = fit_data_prime(plan)
    assert fitted.layout == plan.layout and fitted.scale_bits == plan.scale_bits
    assert fitted.chain.poly_modulus_degree == n
    assert fitted.chain.coeff_mod_bit_sizes[1:] == chain.coeff_mod_bit_sizes[1:]  # the special prime
    assert fitted.chain.coeff_mod_bit_sizes[0] <= chain.coeff_mod_bit_sizes[0]
    P.check_security(fitted.chain)
    assert P.noise_bound(fitted.chain, fitted.scale_bits, k, "symmetric") <= P.ROUNDING_TARGET
    assert _coefficient_headroom_holds(fitted, k)
    narrower = fitted.chain.coeff_mod_bit_sizes[0] - 1
    if narrower > codec.fields * codec.width + plan.scale_bits:
        assert not _coefficient_headroom_holds(
            P.EncodingPlan(fitted_chain(chain, narrower), plan.scale_bits, "fixed", 0.0, True, plan.layout), k
        ), "a narrower prime would still hold the fields: the fit is not the narrowest"


@PROPERTY
@given(k=st.integers(1, 1000), sum_max=st.integers(1, 2**30), dp_std=st.sampled_from([0.0, 0.5, 3.0]))
def test_fitted_packed_counts_never_undershoot(k, sum_max, dp_std):
    """Unsigned packed counts (with DP offsets): the fitted prime holds the fields at their public extremes."""
    spec = ValueSpec(integer=True, max_abs=float(sum_max), sum_max=sum_max, owner_checked_sum=True)
    try:
        plan = P.plan_packed(P.N8192, spec, k, dp_std, "symmetric")
    except PackingOverflowError:
        assume(False)
    fitted = fit_data_prime(plan)
    assert fitted.layout == plan.layout and fitted.scale_bits == plan.scale_bits
    assert fitted.chain.coeff_mod_bit_sizes[0] <= 60
    assert _coefficient_headroom_holds(fitted, k)


def test_float_plans_and_named_chains_keep_their_prime():
    """Float plans take their scale from the prime's headroom: not narrowed; nor is a chain the caller named."""
    float_plan = P.plan_float(P.N8192, ValueSpec(max_abs=1.0, tolerance=1e-6), 10, 0.0, "symmetric")
    assert fit_data_prime(float_plan) is float_plan
    vals = {c: np.full(100, 0.5) for c in range(3)}
    named = make_protocol("ckks", 3, params="n8192")
    named.weighted_sum("t", 0, vals, spec=_grid_spec(0, 20))
    assert named.last_stats["chain"] == "n8192"


@pytest.mark.parametrize(
    ("k", "spec", "n"),
    [
        (10, ValueSpec(max_abs=100.0, tolerance=2.0**-29, grid_bits=27), 23_065),  # the FedGCN model mean's grid
        pytest.param(100, _grid_spec(0, 20), 3_000, marks=pytest.mark.slow),  # ~5-10 s: 100 x 100 seed expansions
    ],
    ids=["fedgcn-model-grid-k10", "k100"],
)
def test_sums_at_the_public_extremes_decrypt_exactly_on_the_fitted_prime(k, spec, n):
    """Every client at +B or -B (the sums at +-K B, the fields' edges) plus grid values: exact, on a narrower prime."""
    rng = np.random.default_rng(k)
    bound = spec.max_abs
    vals = {}
    for c in range(k):
        v = to_grid(rng.uniform(-bound, bound, n), spec.grid_bits)
        v[0::7], v[1::7] = bound, -bound  # every client at both extremes
        vals[c] = v
    ck = make_protocol("ckks", k)
    got = ck.weighted_sum("t", 0, vals, spec=spec)
    exact = np.sum(np.stack(list(vals.values())), axis=0)  # multiples of 2^-f below 2^49 steps: float64-exact
    assert np.array_equal(got, exact)
    assert got[0] == k * bound and got[1] == -k * bound
    stats = ck.last_stats
    assert stats["encoding"] == "fixed"
    widest = ck.plan(spec, n)  # the planner's choice before the fit
    plan = fit_data_prime(widest)
    assert stats["chain"] == plan.chain.name and plan.chain.coeff_mod_bit_sizes[0] < 60  # narrowed
    named = make_protocol("ckks", k, params=widest.chain.name)  # the same exchange on the 60-bit prime
    assert np.array_equal(named.weighted_sum("t", 0, vals, spec=spec), exact)
    saved = math.ceil(n / plan.values_per_ciphertext) * (upload_bytes(widest.chain) - upload_bytes(plan.chain))
    assert saved > 0
    for c, nbytes in stats["bytes_up"].items():  # c0 at the fitted prime's width: the bytes shrink by exactly that
        assert named.last_stats["bytes_up"][c] - nbytes == saved


def _narrower(chain: P.ChainParams) -> P.ChainParams:
    return fitted_chain(chain, chain.coeff_mod_bit_sizes[0] - 1)


class PrimeNarrowingServer(CKKSServer):
    """Plans the data prime one bit narrower than the fields need: keys for that chain, and the plan on it."""

    def ensure_keys(self, chain, link, rnd):
        return super().ensure_keys(_narrower(chain), link, rnd)

    def begin(self, plan, link, fingerprint, extra=()):
        chain = _narrower(plan_from_payload(plan.encoding["plan"]).chain)
        payload = {**plan.encoding["plan"], "chain": {**plan.encoding["plan"]["chain"], "name": chain.name}}
        payload["chain"]["bits"] = np.asarray(chain.coeff_mod_bit_sizes, np.int64)
        encoding = {**plan.encoding, "plan": payload}
        super().begin(dataclasses.replace(plan, encoding=encoding), link, fingerprint, extra)


def test_a_prime_narrower_than_the_fields_is_refused_before_encryption():
    class Proto(CKKSProtocol):
        server_half = PrimeNarrowingServer

    proto, spec = Proto(3), _grid_spec(0, 20)
    vals = {c: np.full(3000, 0.5) for c in range(3)}
    assert proto.plan(spec, 3000).encoding == "fixed"  # packed fields (a few values would travel as floats)
    with pytest.raises(BoundError, match="past the chain's modulus"):
        proto.weighted_sum("t", 0, vals, spec=spec)
    assert not [m for m in proto.transcript.messages if m.tag == "t" and m.kind == "ciphertext"]
