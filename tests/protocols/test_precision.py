"""Precision plan (protocols/precision.py) and bounds every client enforces alone.

* Any K contributions that pass their clients' checks sum exactly with the server-side audit
  off (ckks packed and mask): the field / ring is sized from what the clients check.
* A weighted mean with tiny FedAvg-like weights is within the plan's stated bound of the
  exact mean in every mode, and FedAvg's per-round parameters stay within the stated bound of
  plain's for 10 rounds; integer exchanges are bit-identical across modes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cached import cached_protocol

from protocols import BoundError, PackingOverflowError, ValueSpec, make_protocol
from protocols.precision import (
    FLOAT32_MEAN_TOLERANCE,
    MeanPrecision,
    grid_tolerance,
    kway_sum_bound,
    largest_scale_bits,
)

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


def test_shared_scale_rule():
    assert kway_sum_bound(3.0, 10) == 30.0
    for bound, headroom in [(1000.0, 2.0**58), (0.3, 2.0**31), (1e-9, 1.0)]:
        s = largest_scale_bits(bound, headroom)
        assert bound * 2.0**s <= headroom < bound * 2.0 ** (s + 1)


@pytest.mark.parametrize("mode", ["ckks", "mask"])
@SETTINGS
@given(data=st.data())
def test_contributions_that_pass_the_client_check_sum_exactly(mode, data):
    """Contributions that pass the client check sum exactly.

    The sum_max of the spec is NOT owner-checked here, and deliberately too small: the
    encoding must not trust it (the audit that would catch it is off, as on a real server).
    """
    k = data.draw(st.integers(2, 4), label="K")
    cap = data.draw(st.integers(1, 300), label="max_abs")
    n = data.draw(st.integers(1, 40), label="n")
    entries = st.one_of(st.just(cap), st.integers(0, cap))  # the worst case is drawn often
    vals = {c: np.array(data.draw(st.lists(entries, min_size=n, max_size=n)), dtype=float) for c in range(k)}
    spec = ValueSpec(integer=True, max_abs=float(cap), sum_max=cap + 1)
    proto = cached_protocol(mode, k)
    assert not getattr(proto, "audit_sum_bound", False)
    got = proto.weighted_sum("bounds", len(proto.transcript.messages), vals, spec=spec)
    assert np.array_equal(got, sum(vals.values()))
    if mode == "ckks":
        assert proto.last_stats["encoding"] == "packed"
        proto.audit_sum_bound = True  # the test aid (plaintext K-way sums) never fires here
        try:
            assert np.array_equal(proto.weighted_sum("bounds", len(proto.transcript.messages), vals, spec=spec), got)
        finally:
            proto.audit_sum_bound = False


@pytest.mark.parametrize("mode", ["ckks", "mask"])
def test_an_entry_above_the_client_bound_is_refused_before_anything_is_sent(mode):
    proto = make_protocol(mode, 2)
    spec = ValueSpec(integer=True, max_abs=3.0, sum_max=4)
    with pytest.raises((BoundError, PackingOverflowError), match="client 1"):
        proto.weighted_sum("bounds", 0, {0: np.array([3.0]), 1: np.array([4.0])}, spec=spec)
    assert not proto.transcript.select(tag="bounds", receiver="server")  # no client sent anything of it


def test_owner_checked_sum_keeps_narrow_fields():
    """Owner checked sum keeps narrow fields.

    FedGCN's spec (sum_max enforced by the owners' degree check) packs log2(cap+1)-bit fields
    (one more, the sign, in the default signed complex fields); without the owner check the plan
    widens them to cover K * max_abs.
    """
    owner_spec = ValueSpec(integer=True, max_abs=169.0, sum_max=169, owner_checked_sum=True)
    alone_spec = ValueSpec(integer=True, max_abs=169.0, sum_max=169)
    for ck, sign in ((cached_protocol("ckks", 4), 1), (make_protocol("ckks", 4, exact_fields=False), 0)):
        owner, alone = ck.plan(owner_spec), ck.plan(alone_spec)
        assert owner.encoding == alone.encoding == ("fixed" if sign else "packed")
        assert owner.layout.width == 8 + sign and alone.layout.width == (4 * 169).bit_length() + sign


def test_mean_precision_bound_is_sound():
    plan = MeanPrecision(value_bound=100.0, min_weight_total=0.5)
    eps = plan.sum_tolerance
    assert plan.error_bound(eps) <= plan.tolerance * (1 + 1e-12)
    assert plan.spec().max_abs == 100.0 and plan.spec().tolerance == eps
    # worst case: numerator and denominator off by eps in opposite directions, mean at the bound
    num, den = 100.0 * 0.5, 0.5
    assert abs((num + eps) / (den - eps) - num / den) <= plan.error_bound(eps) + 1e-13  # float64 slack


@pytest.mark.parametrize("mode", ["plain", "ckks", "mask"])
def test_weighted_mean_with_tiny_weights_within_the_stated_bound(mode):
    """PubMed-like FedAvg weights: the mean is as precise relative to itself as the plan says."""
    k = 5
    rng = np.random.default_rng(0)
    counts = rng.integers(5, 20, size=k).astype(float)
    w = {c: counts[c] / counts.sum() for c in range(k)}  # n_k / n_train: total 1
    v = {c: rng.normal(0, 1e-3, size=500) for c in range(k)}  # small updates
    plan = MeanPrecision(value_bound=100.0)
    proto = cached_protocol(mode, k)
    got = proto.weighted_mean("model", len(proto.transcript.messages), v, w, spec=plan.spec())
    exact = sum(w[c] * v[c] for c in range(k)) / sum(w.values())
    err = np.abs(got - exact).max()
    if mode == "plain":  # float32 wire: relative float32 rounding only
        assert err <= 2.0**-22 * np.abs(exact).max() + 1e-12
    else:
        assert err <= plan.tolerance
        assert err <= 1e-3 * np.abs(exact).max()  # far below a 0.1 % relative error


def _fedavg(run_small, mode: str, rounds: int = 10):
    from secure_fgl.config import RunConfig

    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=4,
        mode=mode,
        rounds=rounds,
        dropout=0.0,
        optimizer="sgd",
        lr=0.5,
        local_epochs=2,
        seed=3,
    )
    run = run_small(cfg)
    trajectory = []
    for r in range(rounds):
        run.strategy.train_round(r)
        trajectory.append(run.logic(0).global_params.double().clone())
    return trajectory


def test_fedavg_parameters_follow_plain_within_the_stated_bound(run_small):
    """Per round, |secure - plain| <= r * (the plan's bound + plain's float32 wire rounding)."""
    plain = _fedavg(run_small, "plain")
    for mode in ("ckks", "mask"):
        sec = _fedavg(run_small, mode)
        for r, (p, s) in enumerate(zip(plain, sec), start=1):
            f32 = 2.0**-23 * float(p.abs().max())
            assert float((s - p).abs().max()) <= r * (FLOAT32_MEAN_TOLERANCE + f32), (mode, r)


def _fedomd(run_small, mode: str, rounds: int = 4):
    """A small FedOMD run with its per-round parameters and statistics.

    FedOMD (Adam, beta = 10) on a small SBM graph: per-round parameters and, per statistics
    exchange, the pooled statistic client 0 decoded against the exact float64 one of the clients'
    uploads.
    """
    from secure_fgl.config import RunConfig
    from secure_fgl.runtime.exchange import dense_result

    cfg = RunConfig(
        algorithm="fedomd",
        dataset="sbm",
        clients=3,
        mode=mode,
        partition="louvain",
        split="fedomd",
        rounds=rounds,
        hidden=8,
        synthetic={"num_nodes": 240, "num_features": 24},
        seed=1,
    )
    run = run_small(cfg)
    stats_errors, first = [], run.logic(0)
    receive = first.receive

    def recording_receive(req):
        # the batched statistics (protocols.batch): [sum w_k, sum w_k v_k] -> the pooled means
        if "/stats/" in req.tag:
            out = dense_result(first.rt.half.result(), int(req.length))
            exact = sum(run.logic(k).uploaded[req.tag][1] for k in run.runtimes)
            stats_errors.append(float(np.abs(out[1:] / out[0] - exact[1:] / exact[0]).max()))
        return receive(req)

    first.receive = recording_receive
    trajectory = []
    for r in range(rounds):
        run.strategy.train_round(r)
        trajectory.append(first.global_params.double().clone())
    return trajectory, stats_errors, run


def test_fedomd_trains_the_same_model_bit_for_bit_in_every_mode(run_small):
    """Fedomd trains the same model bit for bit in every mode.

    FedOMD's statistics and model mean travel on their plans' public grids
    (``MeanPrecision.grid_spec``): per round, for the first 10 rounds, the global parameters of
    ckks and mask are *identical* to plain's (torch.equal, not close), and every pooled statistic
    is within the grid's stated bound of the exact float64 one (before the grid: within the
    bound but not equal, and Adam + CMD amplified the differences into different runs).
    """
    from secure_fgl.algorithms.fedomd.ops import STATS_MEAN_TOLERANCE, stats_grid_spec, stats_precision

    runs = {mode: _fedomd(run_small, mode, rounds=10) for mode in ("plain", "ckks", "mask")}
    for mode, (params, errors, run) in runs.items():
        k, strategy = run.fed.num_clients, run.strategy
        f = strategy.facts
        node_total = f.num_train if strategy.fopts.stats_nodes == "train" else f.num_owned
        spec = stats_grid_spec(strategy.fopts, strategy.orders, node_total, k, k)
        plan = stats_precision(strategy.fopts, strategy.orders, node_total, 1.0)
        assert spec.grid_bits == plan.grid_bits(k) and spec.float64_wire
        assert len(errors) == 2 * 10 and max(errors) <= plan.grid_error_bound(k) <= STATS_MEAN_TOLERANCE, mode
        assert strategy.grid_model_mean
        for r, (p, s) in enumerate(zip(runs["plain"][0], params), start=1):
            assert torch.equal(p, s), (mode, r)
    assert runs["ckks"][1] == runs["plain"][1] == runs["mask"][1]  # the same statistics errors, bit for bit


@pytest.mark.parametrize(
    "plan, num_clients",
    [
        (MeanPrecision(100.0, 1.0, 1.0, 2.0**-22), 10),
        (MeanPrecision(1.0, 2708.0, 2708.0, 2.0**-34), 5),
        (MeanPrecision(1.0, 1.0, 1.0, 2.0**-20), 3),
    ],
)
def test_grid_mean_is_identical_in_every_mode_within_the_stated_bound(plan, num_clients):
    """Grid mean is identical in every mode within the stated bound.

    A mean on ``grid_spec``'s grid: plain (float32 or float64 wire), mask, ckks (by default integer
    fields of quantum ``2^-f`` where they fit and save bytes), ckks with real slots only, and ckks-mp return the same bits, within ``grid_error_bound`` of the exact mean; a decoded sum off the grid by more than the
    codec's planned quarter step is refused.
    """
    from protocols.errors import IntegrityError

    rng = np.random.default_rng(num_clients)
    scale = plan.value_bound * 1e-3
    values = {k: rng.uniform(-scale, scale, 700) for k in range(num_clients)}
    weights = {k: plan.weight_bound * rng.uniform(0.3, 1.0) / num_clients for k in range(num_clients)}
    weights = {k: w * plan.min_weight_total / sum(weights.values()) for k, w in weights.items()}
    spec = plan.grid_spec(num_clients)
    assert spec.float64_wire == (num_clients * spec.max_abs * 2.0**spec.grid_bits > 2**24)
    protocols = {mode: make_protocol(mode, num_clients, seed=0) for mode in ("plain", "mask", "ckks")}
    protocols["ckks-fixed"] = make_protocol("ckks", num_clients, seed=0, fixed_point_bits=20)  # exact grid fields
    protocols["ckks-real"] = make_protocol("ckks", num_clients, seed=0, exact_fields=False)  # one float per slot
    if num_clients <= 5:  # (CI time)
        protocols["ckks-mp"] = make_protocol("ckks-mp", num_clients, seed=0)
    got = {mode: p.weighted_mean("t", 0, values, weights, spec=spec) for mode, p in protocols.items()}
    assert all(np.array_equal(got["plain"], v) for v in got.values())
    exact = sum(weights[k] * values[k] for k in values) / sum(weights.values())
    assert np.abs(got["plain"] - exact).max() <= plan.grid_error_bound(num_clients) <= plan.tolerance
    proto = make_protocol("plain", num_clients)
    half = proto.clients[0]
    off_grid = half.deliver
    half.deliver = lambda blocks: off_grid({b: v + 2.0 ** -(spec.grid_bits + 1) for b, v in blocks.items()})
    with pytest.raises(IntegrityError, match="off the exchange's grid"):
        proto.weighted_mean("t", 0, values, weights, spec=spec)


def test_plain_carries_float64_only_where_the_plan_asks_and_counts_its_bytes():
    """Plain carries float64 only where the plan asks and counts its bytes.

    A mean planned below float32 resolution travels as float64 in plain (8 bytes a value in
    the transcript); the float32 baseline of the exchange is the same as for a float32 plan.
    """
    from protocols import make_protocol

    values = {k: np.random.default_rng(k).uniform(-4.0, 4.0, 5) for k in range(3)}
    weights = {k: 1.0 + k for k in range(3)}
    exact = sum(weights[k] * values[k] for k in range(3)) / sum(weights.values())
    sent = {}
    for name, delta in (("f32", FLOAT32_MEAN_TOLERANCE), ("f64", 2.0**-40)):
        proto = make_protocol("plain", num_clients=3)
        spec = MeanPrecision(value_bound=4.0, weight_bound=3.0, min_weight_total=1.0, tolerance=delta).spec()
        assert spec.float64_wire == (name == "f64")
        out = proto.weighted_mean("t", 0, values, weights, spec=spec)
        per_tag = proto.transcript.comm()["per_tag"]["t"]
        sent[name] = (float(np.abs(out - exact).max()), per_tag)
    assert sent["f64"][0] <= 2.0**-40 < sent["f32"][0]
    assert sent["f64"][1]["plaintext_bytes_up"] == sent["f32"][1]["plaintext_bytes_up"] == 3 * 6 * 4
    for way in ("up", "down"):  # 4 more bytes a value than float32 (the envelope is the same)
        extra = sent["f64"][1][f"bytes_{way}"] - sent["f32"][1][f"bytes_{way}"]
        assert extra == sent["f32"][1][f"plaintext_bytes_{way}"] == 3 * 6 * 4, way


@pytest.mark.parametrize("num_clients", [10, 16, 50])
def test_ckks_carries_fedomd_grids_for_many_clients(num_clients):
    """Ckks carries fedomd grids for many clients.

    Past ten clients ``grid_tolerance`` coarsens the targets so that CKKS still meets the grid's
    quarter step (before it, FedOMD's grids were refused by the CKKS planner at K > 10).
    """
    from secure_fgl.algorithms.base import model_spec
    from secure_fgl.algorithms.fedomd.ops import FedOMDOptions, stats_grid_spec

    ckks = make_protocol("ckks", num_clients)
    for spec in (
        stats_grid_spec(FedOMDOptions(), (2, 3, 4, 5), 2708, num_clients, num_clients),
        model_spec(num_clients, num_clients, grid=True),
    ):
        assert ckks.plan(spec, 1000).error_bound <= spec.tolerance == 2.0 ** -(spec.grid_bits + 2)


@pytest.mark.parametrize("num_clients", [3, 5, 8, 9, 10, 17, 20])
def test_every_mode_plans_fedomd_statistics_for_every_node_count(num_clients):
    """Every mode plans fedomd statistics for every node count.

    The statistics' grid bits and CKKS's scale both step with N: for N = 248 (K = 9, 10, 17), 3327 (CiteSeer,
    K = 10), 4096 (K = 8) and 19717 (PubMed, K = 10) the CKKS planner refused ``grid_tolerance``'s grid.
    ``stats_grid_spec`` coarsens exactly those grids by the smallest power of two CKKS carries; every grid CKKS
    carried is unchanged (the same spec as before), and ckks, mask and ckks-mp plan the one grid every mode uses.
    """
    from dataclasses import replace

    from protocols.mask.quantize import choose_encoding
    from secure_fgl.algorithms.fedomd.ops import FedOMDOptions, stats_grid_spec, stats_precision

    ckks, mask = make_protocol("ckks", num_clients), make_protocol("mask", num_clients)
    ckks_mp = make_protocol("ckks-mp", num_clients)

    def ckks_plans(spec):
        try:
            return ckks.plan(spec, 1000).error_bound <= spec.tolerance
        except BoundError:
            return False

    opts, orders, refused = FedOMDOptions(), (2, 3, 4, 5), []
    for nodes in (248, 2708, 3327, 4096, 19717):
        plan = stats_precision(opts, orders, nodes, 1.0)
        target = grid_tolerance(plan.tolerance, num_clients)
        old = replace(plan, tolerance=target).grid_spec(num_clients)  # grid_tolerance's grid alone (the rule before)
        spec = stats_grid_spec(opts, orders, nodes, num_clients, num_clients)
        if ckks_plans(old):
            assert spec == old, (nodes, num_clients)
        else:  # coarsened by the smallest power of two that CKKS carries
            refused.append(nodes)
            j = next(
                j for j in range(1, 8) if ckks_plans(replace(plan, tolerance=target * 2.0**j).grid_spec(num_clients))
            )
            assert spec == replace(plan, tolerance=target * 2.0**j).grid_spec(num_clients), (nodes, num_clients)
        assert ckks_plans(spec), (nodes, num_clients)
        ckks_mp.plan(spec, 1000)  # raises BoundError where it cannot
        enc = choose_encoding(
            max_abs=spec.max_abs,
            integer=False,
            tolerance=spec.tolerance,
            num_contributors=num_clients,
            ring_bits=mask.ring_bits,
            frac_bits=mask.frac_bits,
        )
        assert enc.error_bound <= spec.tolerance
    assert bool(refused) == (num_clients in (8, 9, 10, 17)), refused
