"""Chance levels and confidence intervals of attack metrics.

Attacks/significance.py. The chance levels match Monte-Carlo estimates on scores that carry no signal, the intervals
cover, and ``at_chance`` follows the interval.
"""

from __future__ import annotations

import numpy as np

from attacks.base import advantage, roc_auc, tpr_at_fpr
from attacks.significance import (
    auc_estimate,
    cluster_proportion_estimate,
    matching_chance,
    mean_estimate,
    proportion_estimate,
    score_estimate,
    wilson,
)


def _labels(n1=140, n0=140):
    return np.r_[np.ones(n1, bool), np.zeros(n0, bool)]


def test_permutation_chance_of_the_advantage_matches_monte_carlo():
    """Random scores on 140 + 140 candidates: the advantage a no-signal attack gets is ~0.07, not 0."""
    labels = _labels()
    rng = np.random.default_rng(0)
    mc = np.array([advantage(rng.random(labels.size), labels) for _ in range(400)])
    est = score_estimate("advantage", advantage, rng.random(labels.size), labels)
    assert est.chance_method.startswith("permutation") and est.samples == 280
    assert abs(est.chance - mc.mean()) < 0.01, (est.chance, mc.mean())
    assert abs(est.null_q95 - np.percentile(mc, 95)) < 0.02
    assert est.chance > 0.05 and est.at_chance
    mc_tpr = np.array([tpr_at_fpr(rng.random(labels.size), labels, 0.01) for _ in range(400)])
    est_tpr = score_estimate("tpr_at_1fpr", lambda s, y: tpr_at_fpr(s, y, 0.01), rng.random(labels.size), labels)
    assert abs(est_tpr.chance - mc_tpr.mean()) < 0.01


def test_auc_chance_is_one_half_and_its_interval_covers():
    labels = _labels(100, 100)
    rng = np.random.default_rng(1)
    covered = [auc_estimate("auc", rng.random(labels.size), labels, draws=100, seed=i).at_chance for i in range(30)]
    assert np.mean(covered) >= 0.85  # nominal 95 %
    strong = auc_estimate("auc", labels.astype(float) + rng.normal(0, 0.5, labels.size), labels)
    assert strong.value > 0.8 and not strong.at_chance and not strong.below_chance
    flipped = auc_estimate("auc", -labels.astype(float) + rng.normal(0, 0.5, labels.size), labels)
    assert flipped.below_chance and not flipped.at_chance
    assert abs(roc_auc(labels, labels) - 1.0) < 1e-12


def test_group_bootstrap_is_wider_than_entry_bootstrap_on_correlated_entries():
    """Entries of one node share that node's error: resampling nodes, not entries, is honest."""
    rng = np.random.default_rng(2)
    nodes, d = 30, 50
    truth = rng.random((nodes, d)) < 0.2
    scores = truth + rng.normal(0, 1, (nodes, 1)) + rng.normal(0, 0.3, (nodes, d))
    rows = np.repeat(np.arange(nodes), d)
    grouped = auc_estimate("feature_auc", scores.ravel(), truth.ravel(), groups=rows)
    flat = auc_estimate("feature_auc", scores.ravel(), truth.ravel())
    assert grouped.samples == nodes and flat.samples == nodes * d
    assert grouped.ci[1] - grouped.ci[0] > flat.ci[1] - flat.ci[0]


def test_wilson_and_matching_chance():
    lo, hi = wilson(0, 50)
    assert lo == 0.0 and 0.05 < hi < 0.1
    rng = np.random.default_rng(3)
    n, p, hits = 60, 0.3, 0
    for _ in range(300):
        lo, hi = wilson(float(rng.binomial(n, p)), n)
        hits += lo <= p <= hi
    assert hits / 300 > 0.9
    guess, truth = rng.integers(0, 3, 500), rng.integers(0, 3, 500)
    mc = np.mean([(rng.permutation(guess) == truth).mean() for _ in range(300)])
    assert abs(matching_chance(guess, truth) - mc) < 0.01
    exposure = proportion_estimate("exposure_rate", 0.0, 400, 0.0)
    assert exposure.at_chance and exposure.ci[0] == 0.0
    assert not proportion_estimate("exposure_rate", 2.0, 400, 0.0).at_chance


def test_lower_is_leakier_mean_estimate():
    est = mean_estimate("label_tv", [0.01, 0.02, 0.0, 0.015], 0.3, higher_is_leakier=False)
    assert not est.at_chance and not est.below_chance
    worse = mean_estimate("label_tv", [0.5, 0.55, 0.6, 0.52], 0.3, higher_is_leakier=False)
    assert worse.below_chance
    d = est.to_dict()
    assert {"value", "chance", "ci", "samples", "chance_method", "ci_method", "at_chance", "below_chance"} <= set(d)


def test_cluster_bootstrap_covers_where_wilson_is_too_narrow():
    """Cluster bootstrap covers where wilson is too narrow.

    Nodes of one client share its success rate (rate ~ Beta around 0.5 per client): over 200
    simulated runs of 10 clients x 40 nodes the cluster-bootstrap interval covers the true mean
    about as often as it claims, the Wilson interval (nodes treated as independent) far less.
    """
    rng = np.random.default_rng(0)
    cover_cluster = cover_wilson = 0
    runs = 200
    for _ in range(runs):
        rates = rng.beta(2, 2, 10)
        hits = (rng.random((10, 40)) < rates[:, None]).ravel()
        clusters = np.repeat(np.arange(10), 40)
        est = cluster_proportion_estimate("acc", hits, clusters, 0.5)
        assert est.samples == 400 and "10 clusters" in est.ci_method
        cover_cluster += est.ci[0] <= 0.5 <= est.ci[1]
        lo, hi = wilson(hits.sum(), hits.size)
        cover_wilson += lo <= 0.5 <= hi
    assert cover_cluster / runs > 0.85 and cover_wilson / runs < 0.6, (cover_cluster, cover_wilson)
