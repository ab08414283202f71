"""The coalition attack against t-out-of-n ckks-mp.

T colluding clients rebuild a victim's key share from their Shamir shares and read its upload; t - 1 get a uniform
key (chance).
"""

from __future__ import annotations

import numpy as np

from attacks.base import View
from attacks.coalition import CoalitionAttack, ckks_mp_break, key_collusion_bound
from protocols import ValueSpec, make_protocol

K, T = 4, 3
SPEC = ValueSpec(integer=True, max_abs=200, sum_max=K * 200)


def _exchange(threshold: int):
    p = make_protocol("ckks-mp", K, threshold=threshold)
    rng = np.random.default_rng(11)
    vals = {k: rng.integers(0, 200, 2048).astype(float) for k in range(K)}
    p.weighted_sum("victim", 0, vals, spec=SPEC)
    return p, vals


def test_t_colluders_read_a_t_of_n_upload_and_t_minus_1_stay_at_chance():
    p, vals = _exchange(T)
    victim = K - 1
    assert key_collusion_bound(p) == T - 1
    full = ckks_mp_break(p, "victim", 0, victim, list(range(T)), vals[victim], SPEC)
    assert full["holds_key"] and full["exact"] and full["abs_corr"] > 0.999999
    short = ckks_mp_break(p, "victim", 0, victim, list(range(T - 1)), vals[victim], SPEC)
    assert not short["holds_key"] and not short["exact"]
    assert short["abs_corr"] < 5 * short["chance"]


def test_n_of_n_needs_the_victim_and_shared_key_ckks_needs_one_client():
    p, vals = _exchange(K)
    assert key_collusion_bound(p) == K - 1
    attack = ckks_mp_break(p, "victim", 0, K - 1, list(range(K - 1)), vals[K - 1], SPEC)
    assert not attack["holds_key"] and attack["abs_corr"] < 5 * attack["chance"]
    assert key_collusion_bound(make_protocol("ckks", K)) == 0


def test_the_runners_attack_reports_the_t_coalition_holding_the_key():
    p, _ = _exchange(T)
    by_size = {}
    for size in (T - 1, T):
        observer = "coalition:[server," + ",".join(map(str, range(size))) + "]"
        attack = CoalitionAttack(observer)
        view = View.of(p.transcript, observer, num_clients=K)
        by_size[size] = attack.run(view, {"coalition_keys": {"protocol": p, "clients": list(range(size))}})
    assert by_size[T].metrics["coalition_holds_key"] and by_size[T].metrics["break_probe_exact"]
    assert by_size[T].value > 0.999999
    assert not by_size[T - 1].metrics["coalition_holds_key"] and not by_size[T - 1].metrics["break_probe_exact"]
    assert by_size[T - 1].value < 5 * by_size[T - 1].chance
