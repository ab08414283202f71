"""One privacy accountant per run: composes every DP release of every exchange tag.

Accounting is separate from the mechanism (the Opacus split): :mod:`protocols.dp` adds
the noise, this module says what it cost.  Every release is a Gaussian mechanism with
noise multiplier ``z = sigma / Delta`` (std over L2 sensitivity of the released sum) and
sampling rate ``q`` (1.0: every client takes part, no amplification).  Underneath sits an
Opacus accountant:

* ``"rdp"`` — Rényi DP (Mironov 2017), converted to (eps, delta) by Opacus' bound.
  Conservative: at q = 1 it needs ~6–9 % more noise than the exact Gaussian curve.
  We pass orders up to 1e6 (Opacus stops at 63, which cannot certify eps < ~0.19).
* ``"exact"`` — exact Gaussian composition (q = 1 only): T_t releases of multiplier z_t
  compose into one Gaussian mechanism with ``mu^2 = sum_t T_t / z_t^2`` (mu-GDP, Dong, Roth
  & Su 2022, Cor. 3.3), whose exact (eps, delta) curve is the analytic Gaussian mechanism
  (Balle & Wang, ICML 2018, Thm 8): ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``,
  solved for eps by bisection.  No slack: the tightest accountant for these releases.
  Sub-sampled histories (q < 1) are refused (use "prv").
* ``"prv"`` — privacy random variables (Gopi, Lee, Wutschitz 2021): numerically
  composes the privacy-loss distributions; we return its *upper* bound with
  ``eps_error = max(1e-3, 0.1 % of eps)`` so the figure is a guarantee, within ~0.3–2 %
  of exact.  Above eps = 100 (z << 0.1) Opacus' PRV numerics overflow and stall, so
  there "prv" answers with the RDP bound (still a guarantee).

At q = 1, T releases with multiplier z compose exactly like one release with
``z / sqrt(T)`` (``z_T = sqrt(T) z_1``); PRV reproduces this, RDP up to its slack.

:func:`calibrate_noise_multiplier` wraps Opacus' ``get_noise_multiplier`` (the smallest z,
up to a 0.1 % relative bisection tolerance, whose composed epsilon is <= the target for
the chosen accountant); :func:`epsilon_of` evaluates a history.  Both silence Opacus'
harmless warnings at q = 1 (``log(1 - q)`` in PRV, "Optimal order is the largest alpha"
in RDP).  The report written to ``result.json`` under ``privacy`` is
:meth:`PrivacyAccountant.report`.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .errors import ConfigurationError

MECHANISMS = ("exact", "prv", "rdp")
#: PRV discretisation error; the reported epsilon is estimate + this (an upper bound)
PRV_EPS_ERROR = 1e-3
#: above this epsilon the PRV accountant's numerics overflow / stall (z << 0.1); there the
#: "prv" accountant answers with RDP, which is also a valid (slightly looser) upper bound
PRV_MAX_EPSILON = 100.0

History = list[tuple[float, float, int]]  # (noise_multiplier, sample_rate, steps) — Opacus' format


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence Opacus' known-harmless warnings (see research notes §6, pitfall 3)."""
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        warnings.filterwarnings("ignore", message=r".*divide by zero encountered in log.*")
        warnings.filterwarnings("ignore", message=r".*invalid value encountered.*")
        warnings.filterwarnings("ignore", message=r".*overflow encountered in exp.*")
        warnings.filterwarnings("ignore", message=r".*Optimal order is the (largest|smallest) alpha.*")
        yield


def _check_mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ConfigurationError(f"unknown accountant {mechanism!r}; choose one of {', '.join(MECHANISMS)}")
    return mechanism


#: RDP orders: Opacus' defaults (1.1 .. 63) plus large orders, which small epsilons need —
#: with orders <= 63 RDP cannot certify eps below ~log(1/delta)/62 (0.19 at delta=1e-5)
#: however much noise is added.  At q = 1 the RDP of order alpha is alpha/(2 z^2): cheap.
_ALPHAS_Q1 = (
    [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + sorted({int(a) for a in np.geomspace(64, 1e6, 400)})
)
_ALPHAS_SUBSAMPLED = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + list(range(64, 1025, 16))


def _prv_eps_error(scale: float) -> float:
    """The PRV accountant's discretisation error for an epsilon of this scale.

    1e-3 absolute, or 0.1 % of the epsilon's scale when larger (an absolute 1e-3 at a large
    epsilon makes the PRV mesh, and its cost, huge).
    """
    return max(PRV_EPS_ERROR, 1e-3 * float(scale))


def _kwargs(mechanism: str, sample_rates: Iterable[float] = (1.0,), scale: float = 0.0) -> dict[str, Any]:
    if mechanism == "prv":
        return {"eps_error": _prv_eps_error(scale)}
    return {"alphas": _ALPHAS_Q1 if all(q == 1.0 for q in sample_rates) else _ALPHAS_SUBSAMPLED}


def opacus_options(history: Iterable[tuple[float, float, int]], delta: float, mechanism: str) -> dict[str, Any]:
    """The Opacus ``get_epsilon`` keyword arguments that reproduce :func:`epsilon_of` for this history.

    The keyword arguments :func:`epsilon_of` passes to Opacus' ``get_epsilon`` for this
    history (RDP: the order grid; PRV: ``eps_error``) — to reproduce a figure with Opacus.
    """
    hist = list(history)
    if mechanism == "prv":
        return {"eps_error": _prv_eps_error(epsilon_of(hist, delta, "rdp"))}
    return _kwargs(mechanism, [q for _, q, _ in hist])


def gaussian_mu(history: Iterable[tuple[float, float, int]]) -> float:
    """The Gaussian mu equivalent to composing ``history`` at q = 1.

    ``mu = sqrt(sum steps / z^2)``.
    """
    hist = list(history)
    if any(float(q) != 1.0 for _, q, _ in hist):
        raise ConfigurationError(
            "the 'exact' accountant composes unsampled Gaussian releases only (q = 1); "
            "use accountant 'prv' for sub-sampled releases"
        )
    return math.sqrt(sum(int(n) / float(z) ** 2 for z, _, n in hist))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of one Gaussian mechanism with sensitivity/std = ``mu`` (Balle & Wang 2018, Thm 8)."""
    from scipy.special import log_ndtr, ndtr

    return float(ndtr(-epsilon / mu + mu / 2) - math.exp(epsilon + log_ndtr(-epsilon / mu - mu / 2)))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest eps with ``gaussian_delta(mu, eps) <= delta`` (bisection to 1e-9 relative)."""
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_delta(mu, hi) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_delta(mu, mid) > delta else (lo, mid)
    return hi


def gaussian_mu_for(epsilon: float, delta: float) -> float:
    """Largest mu whose Gaussian mechanism is (epsilon, delta)-DP (inverse of :func:`gaussian_epsilon`)."""
    lo, hi = 0.0, 1.0
    while gaussian_delta(hi, epsilon) <= delta:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gaussian_delta(mid, epsilon) <= delta else (lo, mid)
    return lo


def epsilon_of(history: Iterable[tuple[float, float, int]], delta: float, mechanism: str = "rdp") -> float:
    """Epsilon at ``delta`` of composing the Gaussian releases in ``history``.

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` triples.
        delta: The target delta.
        mechanism: The accountant: ``rdp``, ``prv`` or ``exact``.

    Returns:
        The spent epsilon: 0.0 for an empty history, ``inf`` if a release has no noise.
    """
    _check_mechanism(mechanism)
    hist = [(float(z), float(q), int(n)) for z, q, n in history if int(n) > 0]
    if not hist:
        return 0.0
    if any(not z > 0 for z, _, _ in hist):
        return math.inf
    if mechanism == "exact":
        return gaussian_epsilon(gaussian_mu(hist), delta)
    from opacus.accountants import PRVAccountant, RDPAccountant  # lazy: opacus imports torch

    if mechanism == "prv" and epsilon_of(hist, delta, "rdp") > PRV_MAX_EPSILON:
        return epsilon_of(hist, delta, "rdp")
    acc = RDPAccountant() if mechanism == "rdp" else PRVAccountant()
    acc.history = hist
    with _quiet():
        return float(acc.get_epsilon(delta=delta, **opacus_options(hist, delta, mechanism)))


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, steps: int, mechanism: str = "rdp", sample_rate: float = 1.0
) -> float:
    """Smallest noise multiplier whose composition stays within ``target_epsilon`` at ``delta``.

    The multiplier is found to 0.1 % relative.

    Args:
        target_epsilon: The budget to spend.
        delta: The target delta.
        steps: The number of releases composed.
        mechanism: The accountant: ``rdp``, ``prv`` or ``exact``.
        sample_rate: The sampling rate of every release.

    Returns:
        The noise multiplier ``z`` (noise std over sensitivity).

    Raises:
        ConfigurationError: The budget is not positive, or it would need a multiplier above 1e6.
    """
    _check_mechanism(mechanism)
    if not target_epsilon > 0:
        raise ConfigurationError(f"target epsilon must be > 0, got {target_epsilon}")
    if mechanism == "exact":
        gaussian_mu([(1.0, sample_rate, 1)])  # refuses q < 1
        return math.sqrt(int(steps)) / gaussian_mu_for(float(target_epsilon), float(delta))
    from opacus.accountants.utils import get_noise_multiplier

    if mechanism == "prv" and target_epsilon > PRV_MAX_EPSILON:
        mechanism = "rdp"  # see PRV_MAX_EPSILON
    with _quiet():
        try:
            return float(
                get_noise_multiplier(
                    target_epsilon=float(target_epsilon),
                    target_delta=float(delta),
                    sample_rate=float(sample_rate),
                    steps=int(steps),
                    accountant=mechanism,
                    epsilon_tolerance=max(1e-3 * target_epsilon, 1e-6),
                    **_kwargs(mechanism, [sample_rate], target_epsilon),
                )
            )
        except ValueError as exc:  # "The privacy budget is too low." (z would exceed 1e6)
            raise ConfigurationError(
                f"epsilon {target_epsilon} over {steps} releases needs a noise multiplier "
                f"above 1e6 ({exc}); give a larger epsilon or declare fewer releases"
            ) from exc


class PrivacyAccountant:
    """Composes every DP release of a run; one instance per run.

    >>> acc = PrivacyAccountant("rdp", delta=1e-5)
    >>> for _ in range(100):
    ...     acc.step("fedavg/model", noise_multiplier=40.47)
    >>> round(acc.epsilon(), 2) <= 1.0
    True
    """

    def __init__(self, mechanism: str = "rdp", delta: float = 1e-5):
        self.mechanism = _check_mechanism(mechanism)
        if not 0 < delta < 1:
            raise ConfigurationError(f"delta must lie in (0, 1), got {delta}")
        self.delta = float(delta)
        #: tag -> list of [noise_multiplier, sample_rate, steps] runs, in release order
        self._runs: OrderedDict[str, list[list[Any]]] = OrderedDict()
        self._sensitivity: dict[str, float] = {}
        #: tags with discrete-Gaussian releases: their guarantee is the zCDP (Renyi) one
        self.discrete_tags: set[str] = set()

    def mechanism_for(self, tag: str | None = None) -> str:
        """The accountant that composes ``tag`` (or the whole run).

        The accountant that composes ``tag`` (or the run): ``exact`` Gaussian composition holds for
        continuous Gaussians only; a history with a discrete-Gaussian release (whose proof is
        ``Delta^2/(2 sigma^2)``-zCDP, Canonne, Kamath & Steinke 2020, Thm 14; Kairouz, Liu & Steinke
        2021 for sums) is composed in Renyi DP instead, the same curve ``alpha/(2 z^2)`` per release;
        so is a history with a Poisson-subsampled release (q < 1).
        """
        discrete = self.discrete_tags if tag is None else self.discrete_tags & {tag}
        subsampled = any(q < 1 for _, q, _ in self.history(tag))  # exact composition needs q = 1
        return "rdp" if self.mechanism == "exact" and (discrete or subsampled) else self.mechanism

    def step(
        self,
        tag: str,
        noise_multiplier: float,
        sample_rate: float = 1.0,
        *,
        sensitivity: float | None = None,
        discrete: bool = False,
    ) -> None:
        """Record one release of ``tag``.

        Args:
            tag: The exchange the release belongs to.
            noise_multiplier: The Gaussian noise std over the sensitivity.
            sample_rate: The release's sampling rate (1: every record).
            sensitivity: The release's L2 sensitivity, kept for the report (the largest per tag).
            discrete: A discrete Gaussian (or a sum of them), whose zCDP bound is that of
                multiplier ``noise_multiplier``.

        Raises:
            ConfigurationError: The multiplier is not positive or the sampling rate is outside ``(0, 1]``.
        """
        if not noise_multiplier > 0:
            raise ConfigurationError(f"noise multiplier must be > 0, got {noise_multiplier}", tag=tag)
        if not 0 < sample_rate <= 1:
            raise ConfigurationError(f"sample_rate must lie in (0, 1], got {sample_rate}", tag=tag)
        runs = self._runs.setdefault(tag, [])
        if runs and runs[-1][0] == noise_multiplier and runs[-1][1] == sample_rate:
            runs[-1][2] += 1
        else:
            runs.append([float(noise_multiplier), float(sample_rate), 1])
        if sensitivity is not None:
            self._sensitivity[tag] = max(float(sensitivity), self._sensitivity.get(tag, 0.0))
        if discrete:
            self.discrete_tags.add(tag)

    @property
    def tags(self) -> list[str]:
        """The tags that have released noise, in the order of their first release."""
        return list(self._runs)

    def history(self, tag: str | None = None) -> History:
        """Opacus-format history of one tag, or of the whole run (identical mechanisms merged)."""
        if tag is not None:
            return [tuple(r) for r in self._runs.get(tag, [])]
        merged: OrderedDict[tuple[float, float], int] = OrderedDict()
        for runs in self._runs.values():
            for z, q, n in runs:
                merged[(z, q)] = merged.get((z, q), 0) + n
        return [(z, q, n) for (z, q), n in merged.items()]

    def releases(self, tag: str | None = None) -> int:
        """Number of noisy releases recorded for ``tag``, or for the whole run when ``tag`` is None."""
        return sum(n for _, _, n in self.history(tag))

    def epsilon(self, tag: str | None = None, delta: float | None = None) -> float:
        """Epsilon spent by ``tag`` alone, or by the whole run (``tag=None``), at ``delta``."""
        return epsilon_of(self.history(tag), self.delta if delta is None else delta, self.mechanism_for(tag))

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (for run checkpoints)."""
        return {
            "mechanism": self.mechanism,
            "delta": self.delta,
            "runs": {t: [list(r) for r in runs] for t, runs in self._runs.items()},
            "sensitivity": dict(self._sensitivity),
            "discrete": sorted(self.discrete_tags),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict` (resuming a checkpointed run).

        Raises:
            ConfigurationError: the checkpoint was made with another mechanism or delta.
        """
        if state["mechanism"] != self.mechanism or state["delta"] != self.delta:
            raise ConfigurationError(
                f"checkpoint accountant ({state['mechanism']}, delta={state['delta']}) differs "
                f"from this run's ({self.mechanism}, delta={self.delta}); resume with the "
                "same DP settings"
            )
        self._runs = OrderedDict(
            (t, [[float(z), float(q), int(n)] for z, q, n in runs]) for t, runs in state["runs"].items()
        )
        self._sensitivity = {t: float(v) for t, v in state["sensitivity"].items()}
        self.discrete_tags = set(state.get("discrete", ()))

    def report(self) -> dict[str, Any]:
        """The privacy report that ``result.json`` stores under ``privacy``.

        ``{"delta", "total_epsilon", "per_tag": {tag: {epsilon, releases, noise_multiplier,
        sensitivity}}, "accountant"}`` — goes into ``result.json`` under ``privacy``.
        """
        per_tag = {}
        for tag, runs in self._runs.items():
            zs = sorted({r[0] for r in runs})
            per_tag[tag] = {
                "epsilon": self.epsilon(tag),
                "releases": self.releases(tag),
                "noise_multiplier": zs[0] if len(zs) == 1 else zs,
                "sensitivity": self._sensitivity.get(tag),
            }
            qs = sorted({r[1] for r in runs})
            if qs != [1.0]:  # Poisson-subsampled releases state their rate
                per_tag[tag]["sample_rate"] = qs[0] if len(qs) == 1 else qs
        return {
            "delta": self.delta,
            "total_epsilon": self.epsilon(),
            "per_tag": per_tag,
            "accountant": self.mechanism,
            "composition": self.mechanism_for(),
            "discrete_tags": sorted(self.discrete_tags),
        }
