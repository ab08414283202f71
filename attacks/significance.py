"""Chance levels and 95 % confidence intervals of attack metrics.

Every attack result states, for its metric on its own sample,

* the **chance level**: what the metric gives when the attack's scores carry no information
  about the labels.  Analytic where it exists (ROC AUC: ``1/2``; accuracy of guesses ``g``
  against labels ``t`` under a random pairing: ``sum_c P(g = c) P(t = c)``); otherwise the mean
  of a **permutation null**: the member/non-member (edge/non-edge) labels are permuted over the
  attack's fixed scores ``B >= 200`` times and the metric recomputed (the attack is not re-run);
  the null's 95th percentile is reported next to it;
* a **95 % confidence interval**: a percentile bootstrap (positives and negatives resampled
  separately, or whole groups -- e.g. the nodes of a feature matrix -- when the entries of a
  group are correlated), or the Wilson score interval for a proportion
  ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``;
* ``samples``: the number of targets/pairs/nodes the metric is computed on;
* ``at_chance``: the interval contains the chance level; ``below_chance``: the interval lies
  entirely on the non-leaky side of it (a value that needs explaining, never a safe result).

Efron & Tibshirani, *An Introduction to the Bootstrap* (1993); Wilson, JASA 1927;
Good, *Permutation Tests* (2005).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: two-sided 95 % standard normal quantile
Z95 = 1.959963984540054
#: bootstrap and permutation draws
DRAWS = 200


@dataclass
class Estimate:
    """A metric's value with its chance level and 95 % interval on ``samples`` items."""

    metric: str
    value: float | None
    chance: float | None
    ci: tuple[float, float] | None
    samples: int
    chance_method: str = "analytic"
    ci_method: str = f"bootstrap({DRAWS})"
    higher_is_leakier: bool = True
    null_q95: float | None = None

    @property
    def at_chance(self) -> bool | None:
        """Whether the chance level lies in the interval (None without both)."""
        if self.ci is None or self.chance is None:
            return None
        return bool(self.ci[0] - 1e-12 <= self.chance <= self.ci[1] + 1e-12)

    @property
    def below_chance(self) -> bool | None:
        """The interval lies wholly on the non-leaky side of chance."""
        if self.ci is None or self.chance is None:
            return None
        return (
            bool(self.ci[1] < self.chance - 1e-12) if self.higher_is_leakier else bool(self.ci[0] > self.chance + 1e-12)
        )

    def to_dict(self) -> dict:
        """JSON-ready value, chance, interval and methods."""
        d = {
            "value": _f(self.value),
            "chance": _f(self.chance),
            "ci": None if self.ci is None else [_f(self.ci[0]), _f(self.ci[1])],
            "samples": int(self.samples),
            "chance_method": self.chance_method,
            "ci_method": self.ci_method,
            "at_chance": self.at_chance,
            "below_chance": self.below_chance,
        }
        if self.null_q95 is not None:
            d["null_q95"] = _f(self.null_q95)
        return d


def _f(v):
    return None if v is None or not np.isfinite(v) else float(v)


# ----------------------------------------------------------------------------- intervals
def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n``.

    Args:
        successes: Number of successes.
        n: Number of trials.
        z: Standard normal quantile of the interval (95 %: 1.96).

    Returns:
        ``(low, high)``; ``(0, 1)`` when ``n = 0``.
    """
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if successes <= 0 else max(0.0, float(mid - half))
    hi = 1.0 if successes >= n else min(1.0, float(mid + half))
    return lo, hi


def _percentile_ci(values: np.ndarray) -> tuple[float, float] | None:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_ci(
    metric: Callable[[np.ndarray, np.ndarray], float],
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    groups: np.ndarray | None = None,
    draws: int = DRAWS,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``metric(scores, labels)``.

    Args:
        metric: ``(scores, labels) -> float``.
        scores: The attack's score per item.
        labels: The item's true class (bool).
        groups: Optional group id per item: whole groups are resampled (correlated items); otherwise
            positives and negatives are resampled separately (their counts stay fixed).
        draws: Bootstrap draws.
        seed: Seed of the resampling.

    Returns:
        The 2.5 and 97.5 percentiles of the resampled metric, or ``None`` if no draw is finite.
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels).astype(bool)
    out = np.empty(draws)
    if groups is not None:
        ids, inv = np.unique(groups, return_inverse=True)
        members = [np.flatnonzero(inv == g) for g in range(ids.size)]
        for b in range(draws):
            idx = np.concatenate([members[g] for g in rng.integers(0, ids.size, ids.size)])
            out[b] = metric(scores[idx], labels[idx])
    else:
        pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
        for b in range(draws):
            idx = np.concatenate([rng.choice(pos, pos.size), rng.choice(neg, neg.size)])
            out[b] = metric(scores[idx], labels[idx])
    return _percentile_ci(out)


def permutation_null(
    metric: Callable[[np.ndarray, np.ndarray], float],
    scores: np.ndarray,
    labels: np.ndarray,
    *,
    draws: int = DRAWS,
    seed: int = 1,
) -> np.ndarray:
    """``metric`` on ``draws`` random permutations of ``labels`` over the fixed ``scores``.

    Args:
        metric: ``(scores, labels) -> float``.
        scores: The attack's fixed scores (the attack is not re-run).
        labels: The labels to permute.
        draws: Number of permutations.
        seed: Seed of the permutations.

    Returns:
        The metric of each permutation (``draws`` values).
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    return np.array([metric(scores, rng.permutation(labels)) for _ in range(draws)])


# ----------------------------------------------------------------------------- estimates
def score_estimate(
    name: str,
    metric: Callable[[np.ndarray, np.ndarray], float],
    scores,
    labels,
    *,
    chance: float | None = None,
    groups: np.ndarray | None = None,
    draws: int = DRAWS,
    seed: int = 0,
) -> Estimate:
    """A score-based metric (AUC, advantage, TPR at low FPR) with its interval.

    Args:
        name: The metric's name.
        metric: ``(scores, labels) -> float``.
        scores: The attack's score per item.
        labels: The item's true class (bool).
        chance: The analytic chance level; ``None`` takes the permutation null's mean.
        groups: Optional group id per item for a group bootstrap (``samples`` then counts groups).
        draws: Bootstrap and permutation draws.
        seed: Seed of the resampling.

    Returns:
        The estimate; without both classes among the labels its value and interval are ``None``.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).astype(bool).ravel()
    n = int(labels.size if groups is None else np.unique(groups).size)
    if labels.all() or not labels.any():
        return Estimate(name, None, chance, None, n)
    value = metric(scores, labels)
    ci = bootstrap_ci(metric, scores, labels, groups=groups, draws=draws, seed=seed)
    q95, method = None, "analytic"
    if chance is None:
        null = permutation_null(metric, scores, labels, draws=draws, seed=seed + 1)
        chance, q95, method = float(np.mean(null)), float(np.percentile(null, 95)), f"permutation({draws})"
    ci_method = (
        f"group bootstrap({draws}, {np.unique(groups).size} groups)" if groups is not None else f"bootstrap({draws})"
    )
    return Estimate(name, float(value), float(chance), ci, n, method, ci_method, null_q95=q95)


def auc_estimate(name: str, scores, labels, **kw) -> Estimate:
    """ROC AUC (chance 1/2 analytically)."""
    from .base import roc_auc

    return score_estimate(name, roc_auc, scores, labels, chance=0.5, **kw)


def pair_auc_estimate(name: str, positive_scores, negative_scores, **kw) -> Estimate:
    """ROC AUC of positive against negative pair scores."""
    sp_, sn = np.asarray(positive_scores, float).ravel(), np.asarray(negative_scores, float).ravel()
    return auc_estimate(name, np.concatenate([sp_, sn]), np.r_[np.ones(sp_.size), np.zeros(sn.size)], **kw)


def proportion_estimate(
    name: str,
    successes: float,
    n: int,
    chance: float | None,
    *,
    higher_is_leakier: bool = True,
    chance_method: str = "analytic",
) -> Estimate:
    """A proportion (accuracy, exposure rate) with its Wilson interval.

    Args:
        name: The metric's name.
        successes: Number of successes.
        n: Number of independent trials.
        chance: The chance level.
        higher_is_leakier: Whether a higher value means more leakage.
        chance_method: How the chance level was obtained.

    Returns:
        The estimate.
    """
    value = successes / n if n else None
    return Estimate(
        name, value, chance, wilson(successes, n) if n else None, int(n), chance_method, "wilson", higher_is_leakier
    )


def cluster_proportion_estimate(
    name: str,
    successes,
    clusters,
    chance: float | None,
    *,
    draws: int = DRAWS,
    seed: int = 0,
) -> Estimate:
    """A proportion over units correlated inside clusters, with a cluster bootstrap interval.

    Units are e.g. the nodes of one client; whole clusters are resampled with replacement and the proportion
    ``sum successes / count`` recomputed over the units they hold.

    Args:
        name: The metric's name.
        successes: One 0/1 outcome per unit.
        clusters: The cluster id of each unit.
        chance: The metric's chance level.
        draws: Bootstrap draws.
        seed: Seed of the resampling.

    Returns:
        The estimate; ``samples`` counts the units, ``ci_method`` names the clusters.
    """
    hits = np.asarray(successes, dtype=np.float64).ravel()
    ids, inv = np.unique(np.asarray(clusters).ravel(), return_inverse=True)
    if hits.size == 0:
        return Estimate(name, None, chance, None, 0, "analytic", "cluster bootstrap")
    per_hits = np.bincount(inv, weights=hits, minlength=ids.size)
    per_count = np.bincount(inv, minlength=ids.size).astype(np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, ids.size, (draws, ids.size))
    boots = per_hits[pick].sum(1) / np.maximum(per_count[pick].sum(1), 1.0)
    return Estimate(
        name,
        float(hits.mean()),
        chance,
        _percentile_ci(boots),
        int(hits.size),
        "analytic",
        f"cluster bootstrap({draws}, {ids.size} clusters)",
    )


def matching_chance(guess, truth) -> float:
    """Expected accuracy of ``guess`` against ``truth`` when paired at random.

    ``sum_c P(guess = c) P(truth = c)`` (the permutation null's mean, exactly).
    """
    g, t = np.asarray(guess).ravel(), np.asarray(truth).ravel()
    if g.size == 0:
        return float("nan")
    vals = np.union1d(g, t)
    return float(sum((g == v).mean() * (t == v).mean() for v in vals))


def mean_estimate(
    name: str,
    values,
    chance: float | None,
    *,
    higher_is_leakier: bool = True,
    chance_method: str = "baseline",
    draws: int = DRAWS,
    seed: int = 0,
) -> Estimate:
    """A mean over independent units (e.g. clients) with a bootstrap interval over the units.

    Args:
        name: The metric's name.
        values: One value per unit (``None`` and non-finite values are left out).
        chance: The chance level (or baseline).
        higher_is_leakier: Whether a higher value means more leakage.
        chance_method: How the chance level was obtained.
        draws: Bootstrap draws.
        seed: Seed of the resampling.

    Returns:
        The estimate.
    """
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return Estimate(name, None, chance, None, 0, chance_method, higher_is_leakier=higher_is_leakier)
    rng = np.random.default_rng(seed)
    boots = v[rng.integers(0, v.size, (draws, v.size))].mean(1)
    return Estimate(
        name,
        float(v.mean()),
        chance,
        _percentile_ci(boots),
        int(v.size),
        chance_method,
        f"bootstrap({draws})",
        higher_is_leakier,
    )
