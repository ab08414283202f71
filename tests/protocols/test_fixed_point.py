"""Packed fixed point (protocols/fixed_point.py, protocols/ckks/fixed_point.py).

* The codec: round trip within one quantum, randomized rounding seeded and unbiased,
  conditional rounding within Kairouz et al.'s norm bound; K-way sums of packed signed
  digits exact in the integer domain for every input that passes the client check.
* CKKS with ``fixed_point_bits``: the weighted mean within the stated bound of the exact
  mean at <= 3x float32 bytes; an entry above the public bound and a field that cannot
  hold the K-way sum are refused before anything is encrypted; a ciphertext that is not of
  the plan is refused by the server; FedAvg's first round equals plain's within the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cached import cached_protocol, fresh_round

from protocols import BoundError, IntegrityError, PackingOverflowError, ValueSpec, make_protocol
from protocols.fixed_point import FixedPoint, rounding_rng
from protocols.precision import MeanPrecision

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
CKKS_SETTINGS = settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))


def fixed_ckks(k: int):
    """The session's fixed-point ckks protocol for K clients."""
    return cached_protocol("ckks", k, fixed_point_bits=20)


def plans():
    return st.builds(
        lambda b, k, w, f, owner: FixedPoint.plan(b, k, w, f, owner_checked_sum=owner),
        st.floats(1e-3, 1e3),
        st.integers(1, 20),
        st.integers(8, 26),
        st.integers(1, 2),
        st.booleans(),
    )


def _entries(data, plan: FixedPoint, n: int) -> dict[int, np.ndarray]:
    """K contributions that pass the client check.

    |x| <= B. With an owner-checked sum the K-way sum of every entry is within B too. The extremes are drawn often.
    """
    b = plan.entry_bound
    share = b / plan.num_clients if plan.sum_bound < plan.num_clients * b else b
    value = st.one_of(st.sampled_from([share, -share, 0.0]), st.floats(-share, share))
    return {
        k: np.array(data.draw(st.lists(value, min_size=n, max_size=n)), dtype=float) for k in range(plan.num_clients)
    }


@SETTINGS
@given(plan=plans(), data=st.data())
def test_round_trip_within_one_quantum(plan, data):
    x = np.array(data.draw(st.lists(st.floats(-plan.entry_bound, plan.entry_bound), min_size=1, max_size=50)))
    q = plan.quantize(x, rounding_rng(0, "t", 0, 0))
    assert (np.abs(plan.dequantize(q) - x) < plan.quantum).all()
    assert (np.abs(q) <= np.ceil(plan.entry_bound / plan.quantum)).all()


@SETTINGS
@given(plan=plans(), data=st.data())
def test_kway_sums_of_packed_digits_are_exact(plan, data):
    """Kway sums of packed digits are exact.

    Adding the packed carriers (what the CKKS slots add) and unpacking gives exactly the
    sum of every client's digits, within K quanta of the exact real sum.
    """
    n = data.draw(st.integers(1, 30), label="n")
    xs = _entries(data, plan, n)
    qs = {k: plan.quantize(x, rounding_rng(1, "t", 0, k)) for k, x in xs.items()}
    carriers = sum(plan.pack(q) for q in qs.values())
    assert (np.abs(carriers) < 2 ** (plan.width * plan.fields - 1)).all()
    got = plan.unpack(carriers, n)
    assert np.array_equal(got, sum(qs.values()))
    assert (np.abs(plan.dequantize(got) - sum(xs.values())) <= plan.sum_error * (1 + 1e-12)).all()


def test_randomized_rounding_is_seeded_and_unbiased():
    plan = FixedPoint.plan(1.0, 10, 20, 2)
    x = np.full(200_000, 0.3 * plan.quantum)
    a, b = plan.quantize(x, rounding_rng(5, "t", 2, 1)), plan.quantize(x, rounding_rng(5, "t", 2, 1))
    assert np.array_equal(a, b) and not np.array_equal(a, plan.quantize(x, rounding_rng(6, "t", 2, 1)))
    assert abs(a.mean() - 0.3) < 0.01


def test_conditional_rounding_keeps_the_norm_bound():
    plan = FixedPoint.plan(1.0, 10, 12, 1)  # a coarse quantum makes the slack visible
    rng = np.random.default_rng(0)
    x = rng.normal(size=400)
    x *= 0.5 / np.linalg.norm(x)
    g, d, c = plan.quantum, x.size, 0.5
    beta = 2.0**-20
    limit = min(
        c + g * np.sqrt(d),
        np.sqrt(c * c + g * g * d / 4 + np.sqrt(2 * np.log(1 / beta)) * g * (c + g * np.sqrt(d) / 2)),
    )
    for seed in range(5):
        q = plan.conditional_quantize(x, rounding_rng(seed, "t", 0, 0), c)
        assert np.linalg.norm(q * g) <= limit


def test_a_field_too_narrow_for_the_kway_sum_is_refused():
    with pytest.raises(PackingOverflowError, match="no room"):
        FixedPoint.plan(1.0, 200, 8, 1)
    with pytest.raises(PackingOverflowError, match="does not fit"):
        make_protocol("ckks", 3, fixed_point_bits=50).weighted_sum(
            "t", 0, {0: [0.5], 1: [0.5], 2: [0.5]}, spec=ValueSpec(max_abs=1.0)
        )


@CKKS_SETTINGS
@given(data=st.data())
def test_ckks_fixed_point_mean_within_the_stated_bound(data):
    k = data.draw(st.integers(2, 4), label="K")
    n = data.draw(st.integers(4000, 9000), label="n")  # sizes where fixed point saves bytes
    plan = MeanPrecision(value_bound=1.0)
    weights = np.array(data.draw(st.lists(st.floats(0.05, 1.0), min_size=k, max_size=k)))
    weights = weights / weights.sum()
    rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
    vals = {c: rng.uniform(-1, 1, n) for c in range(k)}
    proto = fixed_ckks(k)
    before = len(proto.transcript.messages)
    got = proto.weighted_mean("fx/model", fresh_round(), vals, dict(enumerate(weights)), spec=plan.spec())
    exact = sum(w * vals[c] for c, w in enumerate(weights))
    stats = proto.last_stats
    assert stats["encoding"] == "fixed"
    bound = plan.error_bound(stats["error_bound"], weight_total=1.0, mean_abs=float(np.abs(exact).max()))
    assert np.abs(got - exact).max() <= bound
    up = [
        m.nbytes
        for m in proto.transcript.messages[before:]
        if m.tag == "fx/model" and m.kind == "ciphertext" and m.receiver == "server"
    ]
    assert len(up) == k and max(up) <= 4 * 3 * (n + 1) + 66_000  # <= 3x float32 + one ciphertext of padding


def test_small_exchanges_keep_float_precision():
    """Small exchanges keep float precision.

    A few values fit one ciphertext either way: fixed point would save too little to pay
    for its coarser quantum (params.FIXED_POINT_MIN_SAVING).
    """
    proto = fixed_ckks(2)
    got = proto.weighted_mean(
        "fx/small",
        fresh_round(),
        {0: [0.25] * 200, 1: [0.5] * 200},
        {0: 0.5, 1: 0.5},
        spec=MeanPrecision(value_bound=100.0).spec(),
    )
    assert proto.last_stats["encoding"] == "float" and np.abs(got - 0.375).max() < 1e-8


def test_a_full_fixed_point_ciphertext_costs_at_most_3x_float32():
    for k in (2, 10, 50):
        plan = make_protocol("ckks", k, fixed_point_bits=20).plan(MeanPrecision(value_bound=1.0).spec())
        assert plan.chain.ciphertext_bytes / plan.values_per_ciphertext <= 3 * 4, (k, plan.describe())


@CKKS_SETTINGS
@given(data=st.data())
def test_an_entry_above_the_bound_is_refused_before_encryption(data):
    k = 3
    n = data.draw(st.integers(5000, 8000), label="n")
    bad_client = data.draw(st.integers(0, k - 1), label="client")
    vals = {c: np.zeros(n) for c in range(k)}
    vals[bad_client][data.draw(st.integers(0, n - 1), label="entry")] = data.draw(st.floats(1.0001, 1e6), label="v")
    proto = fixed_ckks(k)
    before = len(proto.transcript.messages)
    assert proto.plan(ValueSpec(max_abs=1.0), block_len=n).encoding == "fixed"
    with pytest.raises(BoundError) as err:
        proto.weighted_sum("fx/refuse", fresh_round(), vals, spec=ValueSpec(max_abs=1.0))
    assert err.value.client == bad_client and "Nothing was encrypted" in str(err.value)
    # (the chain's key set-up, tag ckks/keys, may run first: the halves set keys up before uploads)
    assert not [m for m in proto.transcript.messages[before:] if m.tag == "fx/refuse" and m.kind == "ciphertext"]


def test_a_ciphertext_of_another_plan_is_refused_by_the_server():
    import tenseal as ts

    from protocols.ckks import wire

    proto = make_protocol("ckks", 2, fixed_point_bits=20)
    vals = {0: np.full(6000, 0.1), 1: np.full(6000, 0.2)}
    proto.weighted_sum("fx/ok", 0, vals, spec=ValueSpec(max_abs=1.0))  # keys exist
    assert proto.last_stats["encoding"] == "fixed"
    context = proto._keys.get(proto._active).context
    alien = wire.frame(ts.ckks_vector(context, [0.1], 2.0**30).serialize(), proto._active.padded_ciphertext_bytes)

    def swap(msg):
        if msg.kind == "ciphertext" and msg.receiver == "server" and msg.payload:
            from dataclasses import replace

            return replace(msg, payload=[alien] * len(msg.payload))
        return msg

    proto.intercept = swap
    with pytest.raises(IntegrityError):
        proto.weighted_sum("fx/alien", 0, vals, spec=ValueSpec(max_abs=1.0))


def _fedavg_first_round(run_small, **extra):
    from secure_fgl.config import RunConfig

    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=4,
        rounds=1,
        dropout=0.0,
        optimizer="sgd",
        lr=0.5,
        local_epochs=2,
        seed=3,
        update_bound=4.0,
        **extra,
    )
    run = run_small(cfg)
    start = run.logic(0).global_params.double().clone()
    run.strategy.train_round(0)
    return start, run.logic(0).global_params.double().clone(), run.protocol


def test_fedavg_round_equals_plain_within_the_stated_bound(run_small):
    """Fedavg round equals plain within the stated bound.

    One FedAvg round from the same start: the packed fixed-point mean differs from
    plain's by at most the bound the recipients can state (decoded total, |mean|).
    """
    from protocols.ckks.params import release_step

    start, plain, _ = _fedavg_first_round(run_small, mode="plain")
    _, fixed, proto = _fedavg_first_round(run_small, mode="ckks", fixed_point_bits=20)
    plan = proto._last_plan  # the encoding plan of the run's last exchange: the model mean
    assert plan.encoding == "fixed"
    step = release_step(plan, proto.server.plan.spec)
    mean_abs = float((plain - start).abs().max())
    total_bound = plan.error_bound + (step / 2 if step else 0.0)
    bound = MeanPrecision(value_bound=4.0).error_bound(total_bound, weight_total=1.0, mean_abs=mean_abs)
    f32 = 2.0**-23 * float(plain.abs().max())
    diff = float((fixed - plain).abs().max())
    assert 0 < diff <= bound + f32


def test_real_valued_row_sums_within_the_stated_bound():
    """Real valued row sums within the stated bound.

    FedGCN-shaped real-valued neighbour sums (sparse layout, owner-checked totals): every
    requested row within the plan's K Delta of the exact total, at <= 3x float32 per value.
    """
    k, num_rows, dim = 3, 600, 21
    rng = np.random.default_rng(4)
    spec = ValueSpec(max_abs=30.0, owner_checked_sum=True)  # (cap + 1) x feature bound
    contributions = {}
    for c in range(k):
        ids = np.sort(rng.choice(num_rows, 250, replace=False))
        contributions[c] = (ids, rng.uniform(0, 10.0, (ids.size, dim)))  # 3 x 10 <= 30 per entry
    requests = {c: np.sort(rng.choice(num_rows, 100, replace=False)) for c in range(k)}
    proto = fixed_ckks(k)
    got = proto.row_sum("fx/rows", 0, contributions, requests, num_rows, layout="sparse", spec=spec)
    stats = proto.last_stats
    assert stats["encoding"] == "fixed"
    total = np.zeros((num_rows, dim))
    for ids, rows in contributions.values():
        total[ids] += rows
    for c, r in requests.items():
        assert np.abs(got[c] - total[r]).max() <= stats["error_bound"]
    plan = proto.plan(spec, block_len=proto.row_block_capacity(spec, "sparse"))
    assert plan.chain.ciphertext_bytes / plan.values_per_ciphertext <= 3 * 4


@CKKS_SETTINGS
@given(data=st.data())
def test_integer_exchanges_sum_exactly_in_signed_complex_fields(data):
    """Integer exchanges sum exactly in signed complex fields.

    Integer exchanges (FedGCN's counts) as exact signed fields in both halves of each slot:
    any K contributions that pass the client check sum exactly (no owner-checked bound here:
    fields sized from K * max_abs).
    """
    k = 3
    cap = data.draw(st.integers(100, 300), label="max_abs")  # 9-10 bit unsigned fields: 4 per real
    n = data.draw(st.integers(20000, 24000), label="n")  # slot; signed complex ones fit n in one N=8192
    rng = np.random.default_rng(data.draw(st.integers(0, 99), label="seed"))
    vals = {c: rng.integers(0, cap + 1, n).astype(float) for c in range(k)}
    vals[0][: n // 3] = cap  # the worst case
    proto = fixed_ckks(k)
    got = proto.weighted_sum("fx/int", fresh_round(), vals, spec=ValueSpec(integer=True, max_abs=float(cap)))
    assert proto.last_stats["encoding"] == "fixed" and proto.last_stats["error_bound"] == 0.0
    assert np.array_equal(got, sum(vals.values()))
