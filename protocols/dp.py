r"""Differential privacy for protocol exchanges: L2 clipping + Gaussian noise, added client-side.

A run turns DP on with ``make_protocol(mode, K, dp=DPConfig(epsilon=...))``; an exchange opts
in by passing ``dp=DPRequest(clip=..., ...)``.  Each client clips its contribution and adds
noise *before* encoding, so the protocol then encrypts / masks the noisy values; the
:class:`~protocols.accountant.PrivacyAccountant` composes every release of the run.  The design,
the sensitivities of each exchange type and what DP does not cover: docs/dp.md.

Mechanism (per release of tag ``t``):

* clipping (L2): the whole contribution (``per_row=False``) or each row (``per_row=True``) to
  norm <= ``clip``; ``clip=inf``: the caller bounded its contributions and states ``sensitivity``;
* noise: the released sum gets std ``sigma = z_t * Delta`` per entry, ``Delta`` the L2 sensitivity
  of the sum (``DPRequest.sensitivity``), ``z_t`` the tag's noise multiplier;
* calibration: at q = 1 Gaussian releases compose like one Gaussian with
  ``mu^2 = sum_t R_t / z_t^2`` (Dong, Roth & Su 2022); :meth:`DPEngine.total_mu` finds the ``mu``
  that spends ``epsilon`` at ``delta`` and tag ``t`` gets the share ``s_t`` of ``mu^2``,
  ``z_t = sqrt(R_t) / (mu sqrt(s_t))`` with ``R_t = DPRequest.releases``.  Release ``R_t + 1`` of a
  tag raises :class:`PrivacyBudgetError`.

Placement: ``local``, every contributor adds N(0, sigma^2) (each upload is itself DP; needed in
``plain``); ``distributed``, each of the n contributors adds N(0, sigma^2 / m) with
``m = max(1, n - d - c)``, d = ``DPConfig.dropouts``, c = ``DPConfig.colluders`` (Truex et al. 2019;
Kairouz, Liu & Steinke, ICML 2021), so the sum keeps at least sigma^2 (``ckks``, ``mask`` only).

Discrete noise (Kairouz, Liu & Steinke, ICML 2021): every exchange release rounds the clipped
contribution at random onto the public grid ``2^-f`` (the integers for integer exchanges) and adds
discrete Gaussian noise N_Z(0, s^2), P[x] ~ exp(-x^2 / 2 s^2) (Canonne, Kamath & Steinke 2020,
Alg. 3; :func:`grid_noise`).  The sum of n such shares with L2 sensitivity Delta (in steps) is
``eps^2/2``-zCDP with ``eps^2 = Delta^2/(n s^2) + tau d/2``,
``tau = 10 sum_{k<n} exp(-2 pi^2 s^2 k/(k+1))`` (KLS21 Thm 1,
:func:`sum_of_discrete_gaussians_epsilon`); rounding adds at most ``n 2^-f sqrt(entries)`` to the
sensitivity (:func:`grid_slack`).

Sensitivities (add/remove-one adjacency): client level Delta = C (the clip);
FedGCN neighbour sums, rows clipped to C: edge level sqrt(2) C (:func:`edge_level_sensitivity`), node
level with degree cap D, sqrt(D + 1) C (:func:`node_level_sensitivity`); ``weighted_mean`` with
weights sends ``[w~ clip(v), w~ C]``, w~ = min(w, W)/W: Delta = sqrt(2) C.

Randomness: every noise draw comes from :class:`protocols.csprng.SecureRandom`, keyed by
``os.urandom(32)`` and never persisted; the run's ``--seed`` plays no part.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .accountant import MECHANISMS, PrivacyAccountant, calibrate_noise_multiplier, epsilon_of
from .csprng import SecureRandom
from .errors import ConfigurationError, PrivacyBudgetError
from .exchange import DPRequest, ValueSpec
from .registry import distributed_dp_modes

PLACEMENTS = ("local", "distributed")
#: protocol modes in which only recipients see the sum (distributed placement is sound)
SECURE_MODES = distributed_dp_modes()
#: per-client floor of discrete-Gaussian std in grid steps (see module docstring: tau is negligible above it)
MIN_CLIENT_DGAUSS_STD = 2.0
#: the public grid ``2^-DP_GRID_BITS`` onto which a continuous contribution is rounded before its
#: discrete noise, unless the exchange has a grid of its own (``ValueSpec.grid_bits``)
DP_GRID_BITS = 24


# ----------------------------------------------------------------------------- sensitivities
def edge_level_sensitivity(clip: float) -> float:
    """FedGCN S = (A+I)X, feature rows clipped to C, one undirected edge: Delta = sqrt(2) C."""
    return math.sqrt(2.0) * float(clip)


def node_level_sensitivity(clip: float, degree_cap: int) -> float:
    """FedGCN S = (A+I)X, one node's features (clipped to C), degree <= D: Delta = C sqrt(D+1)."""
    return float(clip) * math.sqrt(int(degree_cap) + 1)


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DPConfig:
    """DP settings of a run.

    epsilon:     total budget of the run (all tags, all releases), at ``delta``.
    delta:       the run's delta.
    placement:   'local' (every client adds full noise) | 'distributed' (each adds 1/n of
                 the variance; only with protocol modes 'ckks' / 'mask').
    accountant:  'rdp' | 'prv' (Opacus), used for calibration and the report.
    tags:        tags the run declares; each gets an equal share of the budget.
    budget_shares: optional per-tag relative shares of the budget (any positive weights, normalised);
                 overrides ``tags``.  Neither given: the first tag released takes it all.
    scope:       tag prefixes that are privatised (empty: every exchange that asks for DP);
                 e.g. ``('fedgcn/neighbour_sums',)`` noises only FedGCN's one-shot release and
                 leaves the model exchange exact.  Out-of-scope tags get no noise and no budget.
    dropouts:    distributed placement: contributors that may drop out after noising while
                 the sum still carries sigma (more drops: the backend refuses the exchange).
    colluders:   distributed placement: colluding contributors whose noise shares may be
                 subtracted while the sum still carries sigma for the others.
    exchange_releases: the run privatises exchanges (discrete noise, composed in Renyi DP, so
                 the ``exact`` accountant calibrates for that); False for a run whose only
                 releases are DP-SGD steps (continuous Gaussians, exact composition).
    """

    epsilon: float
    delta: float = 1e-5
    placement: str = "local"
    accountant: str = "rdp"
    tags: Sequence[str] = ()
    budget_shares: Mapping[str, float] | None = None
    scope: Sequence[str] = ()
    dropouts: int = 0
    colluders: int = 0
    exchange_releases: bool = True

    def engine(self, num_clients: int, protocol_mode: str) -> DPEngine:
        """The run's :class:`DPEngine` for a protocol of ``num_clients`` clients in ``protocol_mode``."""
        return DPEngine(self, num_clients=num_clients, protocol_mode=protocol_mode)

    def in_scope(self, tag: str) -> bool:
        """Whether DP applies to ``tag``: every tag when no scope is set, else tags at or under a scope prefix."""
        return not self.scope or any(tag == p or tag.startswith(p.rstrip("/") + "/") for p in self.scope)

    def allowed_missing(self, tag: str) -> int | None:
        """The contributors a sum of ``tag`` may miss for its distributed noise to hold (``dropouts``).

        ``None`` where no distributed noise covers ``tag`` (local placement, or ``tag`` out of scope).
        """
        return int(self.dropouts) if self.placement == "distributed" and self.in_scope(tag) else None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", tuple(self.scope))
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigurationError(f"DPConfig.epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            raise ConfigurationError(f"DPConfig.delta must lie in (0, 1), got {self.delta!r} (1e-5 is usual)")
        if self.placement not in PLACEMENTS:
            raise ConfigurationError(f"DPConfig.placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.accountant not in MECHANISMS:
            raise ConfigurationError(f"DPConfig.accountant must be one of {MECHANISMS}, got {self.accountant!r}")
        for name in ("dropouts", "colluders"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 0):
                raise ConfigurationError(f"DPConfig.{name} must be an integer >= 0, got {v!r}")
        object.__setattr__(self, "tags", tuple(self.tags))
        if len(set(self.tags)) != len(self.tags):
            raise ConfigurationError(f"DPConfig.tags holds duplicates: {self.tags}")
        if self.budget_shares is not None:
            shares = dict(self.budget_shares)
            if not shares or any(not (math.isfinite(v) and v > 0) for v in shares.values()):
                raise ConfigurationError(
                    f"DPConfig.budget_shares must map each tag to a positive share, got {self.budget_shares!r}"
                )
            object.__setattr__(self, "budget_shares", shares)


# ----------------------------------------------------------------------------- mechanism
def clip_l2(x: np.ndarray, bound: float, *, integer: bool = False) -> np.ndarray:
    """``x`` scaled to L2 norm <= ``bound`` (unchanged if already inside).

    Integer inputs
    are scaled then truncated toward zero: still integers, still inside the ball.
    """
    x = np.asarray(x, dtype=np.float64)
    if not math.isfinite(bound):
        return cast(np.ndarray, x.copy())
    norm = float(np.linalg.norm(x))
    if norm <= bound:
        return cast(np.ndarray, x.copy())
    out = x * (bound / norm * (1.0 - 1e-12))
    return np.trunc(out) if integer else out


def clip_rows(x: np.ndarray, bound: float, *, integer: bool = False) -> np.ndarray:
    """Each row (first-axis slice) of ``x`` scaled to L2 norm <= ``bound`` (see :func:`clip_l2`)."""
    x = np.asarray(x, dtype=np.float64)
    if not math.isfinite(bound) or x.size == 0:
        return cast(np.ndarray, x.copy())
    flat = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
    norms = np.linalg.norm(flat, axis=1)
    scale = np.where(norms > bound, bound / np.maximum(norms, 1e-300) * (1.0 - 1e-12), 1.0)
    out = flat * scale[:, None]
    if integer:
        out = np.where((scale < 1.0)[:, None], np.trunc(out), out)
    return out.reshape(x.shape)


def grid_bits_of(spec: ValueSpec | None, req: DPRequest) -> int | None:
    """The grid ``2^-f`` a continuous release is rounded to.

    The exchange's own grid, else :data:`DP_GRID_BITS`. ``None`` for an integer release (its grid is the integers).
    """
    if req.integer:
        return None
    return int(spec.grid_bits) if spec is not None and spec.grid_bits is not None else DP_GRID_BITS


def release_spec(spec: ValueSpec, req: DPRequest, placement: str) -> ValueSpec:
    """The spec a DP sum is encoded with.

    In distributed placement a continuous release is carried on its grid (``grid_bits``, codec tolerance a quarter
    step), so the codecs add the clients' grid values exactly and the released sum is ``2^-f`` times an integer sum
    (module docstring).
    """
    bits = grid_bits_of(spec, req)
    if placement != "distributed" or bits is None or spec.grid_bits is not None:
        return spec
    return dataclasses.replace(spec, grid_bits=bits, tolerance=min(spec.tolerance, 2.0 ** -(bits + 2)))


def grid_slack(bits: int, contributors: int, entries: int) -> float:
    """What randomised rounding onto ``2^-bits`` can add to a sum's L2 sensitivity.

    What randomised rounding onto ``2^-bits`` can add to the L2 sensitivity of a sum of
    ``contributors`` contributions of ``entries`` entries: ``n 2^-bits sqrt(entries)``.

    With the rounding's uniform ``U`` fixed, ``R_U(a) = 2^-f floor(2^f a + U)`` moves two inputs
    apart by less than one step per entry (``|R_U(a) - R_U(b) - (a - b)| < 2^-f``), and only the
    contributions that change move; the mechanism is a mixture over ``U`` with the same weights on
    both datasets, so the Gaussian bound at the inflated sensitivity holds for the mixture.
    """
    return float(contributors) * 2.0 ** -int(bits) * math.sqrt(int(entries))


def grid_noise(rng: SecureRandom, x: np.ndarray, std: float | np.ndarray, bits: int) -> np.ndarray:
    """Round ``x`` at random onto the grid ``2^-bits`` and add discrete Gaussian noise.

    ``x`` rounded at random onto the grid ``2^-bits`` (up with probability its fractional part),
    plus discrete Gaussian noise of ``std`` (in grid steps ``std 2^bits``, per entry or broadcast),
    returned as the grid's floats ``k 2^-bits`` (exact in float64 below 2^53 steps).
    """
    x = np.asarray(x, dtype=np.float64)
    steps = np.floor(np.ldexp(x, int(bits)) + rng.uniform(x.shape))
    steps += rng.discrete_gaussian(np.ldexp(np.asarray(std, dtype=np.float64), int(bits)), x.shape)
    return cast(np.ndarray, np.ldexp(steps, -int(bits)))


def sum_of_discrete_gaussians_tau(client_std: float, honest: int) -> float:
    """The bound ``tau`` on the distance of a sum of discrete Gaussians from one.

    Kairouz, Liu & Steinke 2021 (Thm 1): ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k/(k+1))`` for the
    sum of ``n`` i.i.d. N_Z(0, s^2) (``s`` in grid steps).
    """
    k = np.arange(1, max(int(honest), 1), dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * float(client_std) ** 2 * k / (k + 1))))


def sum_of_discrete_gaussians_epsilon(sensitivity: float, client_std: float, honest: int, dim: int) -> float:
    """The zCDP ``epsilon`` of the sum of ``honest`` i.i.d.

    N_Z(0, s^2) per entry over ``dim`` entries
    with L2 sensitivity ``Delta`` (both in grid steps): Kairouz, Liu & Steinke, ICML 2021, Thm 1, the
    sum is ``eps^2/2``-concentrated with ``eps = sqrt(Delta^2 / (n s^2) + tau d / 2)``; the continuous
    Gaussian of the same total variance has ``eps = Delta / (sqrt(n) s)`` (``tau = 0``).
    """
    n = max(int(honest), 1)
    tau = sum_of_discrete_gaussians_tau(client_std, n)
    return math.sqrt(float(sensitivity) ** 2 / (n * float(client_std) ** 2) + tau * int(dim) / 2.0)


def gaussian_noise(
    rng: SecureRandom, std: float | np.ndarray, size: int | tuple[int, ...], *, integer: bool = False
) -> np.ndarray:
    """Continuous or discrete Gaussian noise from the OS-keyed keystream ``rng``.

    Continuous N(0, std^2) or, for integer exchanges, discrete N_Z(0, std^2) noise
    (integer-valued), from the OS-keyed keystream ``rng``.
    """
    if integer:
        return rng.discrete_gaussian(std, size)
    return rng.standard_normal(size) * np.asarray(std, dtype=np.float64)


def noise_vector(
    rng: SecureRandom,
    v: np.ndarray,
    req: DPRequest,
    std: float,
    *,
    row_len: int | None = None,
    grid_bits: int | None = DP_GRID_BITS,
) -> np.ndarray:
    """Client side of a dense release: clip ``v`` and add noise.

    Client side of a dense release: ``v`` clipped as ``req`` says (whole, or per slice of
    ``row_len``), plus noise of ``std`` (:meth:`DPEngine.vector_release`) from ``rng``, the
    contributor's own OS-keyed keystream: discrete Gaussian on the integers (integer release) or
    on the grid ``2^-grid_bits`` after randomised rounding (:func:`grid_noise`).
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    v = (
        clip_rows(v.reshape(-1, cast(int, row_len)), req.clip, integer=req.integer).ravel()
        if req.per_row
        else clip_l2(v, req.clip, integer=req.integer)
    )
    if not req.integer:
        return grid_noise(rng, v, std, DP_GRID_BITS if grid_bits is None else grid_bits)
    return cast(np.ndarray, v + gaussian_noise(rng, std, v.shape, integer=True))


def clip_mean_value(a: np.ndarray, req: DPRequest, nrows: int = 1) -> np.ndarray:
    """Client side of a DP mean: ``a`` (flat) clipped to ``req.clip``, whole or per row."""
    a = np.asarray(a, dtype=np.float64)
    if req.per_row:
        return clip_rows(a.reshape(nrows, -1), req.clip, integer=req.integer).ravel()
    return clip_l2(a.ravel(), req.clip, integer=req.integer)


def weighted_mean_value(
    a: np.ndarray, weight: float, req: DPRequest, nrows: int = 1, *, tag: str = "", rnd: int = 0
) -> np.ndarray:
    """Client side of a DP weighted mean: the clipped, weighted value and its weight.

    Client side of a DP weighted mean: ``[w~ clip(a), w~ C]`` with ``w~ = min(w, W) / W``
    (``W = req.weight_bound``; without one the weights must lie in ``[0, 1]``, ``W = 1``).
    """
    W = req.weight_bound
    if W is None:
        if float(weight) > 1.0:
            raise ConfigurationError(
                "a DP weighted mean needs a public bound on the weights (they are secret and noised): pass "
                "DPRequest(weight_bound=W) (weights above W are clipped to W), or weights in [0, 1]",
                tag=tag,
                round=rnd,
            )
        W = 1.0
    wt = min(float(weight), W) / W
    return np.concatenate([wt * clip_mean_value(a, req, nrows), [wt * float(req.clip)]])


def noise_rows(
    rng: SecureRandom, rows: np.ndarray, req: DPRequest, std: np.ndarray, *, grid_bits: int | None = DP_GRID_BITS
) -> np.ndarray:
    """Client side of a row-keyed release: clip each row and add noise.

    Client side of a row-keyed release: each row clipped (``per_row``, else the whole
    contribution) plus noise of its row's ``std`` (:meth:`DPEngine.row_release`) from ``rng``
    (discrete, as in :func:`noise_vector`).
    """
    r = np.asarray(rows, dtype=np.float64)
    r = clip_rows(r, req.clip, integer=req.integer) if req.per_row else clip_l2(r, req.clip, integer=req.integer)
    std = np.asarray(std, dtype=np.float64)[:, None]
    if not req.integer:
        return grid_noise(rng, r, std, DP_GRID_BITS if grid_bits is None else grid_bits)
    return cast(np.ndarray, r + gaussian_noise(rng, std, r.shape, integer=True))


# ----------------------------------------------------------------------------- engine
@dataclass
class _TagState:
    epsilon: float  # this tag's share of the budget
    releases: int  # planned releases (calibration)
    noise_multiplier: float
    used: int = 0
    sensitivity: float = 0.0  # largest Delta used so far
    clip: float | None = None
    integer: bool = False
    sample_rate: float = 1.0  # Poisson sampling rate of each release (1: every record)


class DPEngine:
    """Glues a :class:`DPConfig`, the clipping/noise mechanism and the run's accountant.

    Built by :class:`~protocols.base.Protocol` (one per protocol object, i.e. per run).
    ``last_std`` is the std of the total noise in the sum of the latest release (backends
    read it as ``ExchangeContext.dp_noise_std`` to leave headroom).
    """

    def __init__(self, config: DPConfig, *, num_clients: int, protocol_mode: str):
        if isinstance(config, Mapping):
            config = DPConfig(**config)
        if not isinstance(config, DPConfig):
            raise ConfigurationError(f"dp must be a protocols.dp.DPConfig, got {type(config).__name__}")
        if config.placement == "distributed" and protocol_mode not in SECURE_MODES:
            raise ConfigurationError(
                f"placement='distributed' needs a protocol in which the server sees only the sum "
                f"(mode 'ckks' or 'mask'), but the mode is {protocol_mode!r}: in it every upload is read "
                f"individually and would carry only 1/K of the noise. Use mode 'ckks' or 'mask', or "
                f"DPConfig(placement='local')"
            )
        self.config = config
        self.num_clients = int(num_clients)
        self.protocol_mode = protocol_mode
        self.last_std = 0.0
        self._noise = SecureRandom()  # OS-keyed; never persisted
        self.accountant = PrivacyAccountant(config.accountant, config.delta)
        self._shares: dict[str, float] = (
            dict(config.budget_shares) if config.budget_shares is not None else {t: 1.0 for t in config.tags}
        )
        self._frozen = False
        self._tags: dict[str, _TagState] = {}
        self._mean_clip: dict[str, float] = {}  # clip of DP means (their sum request has clip=inf)
        self._local_step: dict[str, int] = {}  # last step counted per local-release tag
        self._local_shares: dict[str, int] = {}  # clients whose noise shares a local release's sum carries
        #: called with :meth:`state_dict` after every release, before its values leave the client
        self.on_release: Callable[[dict[str, Any]], None] | None = None
        self.replayed_releases = 0  # releases made again after a resume (see load_state_dict)

    # ------------------------------------------------------------------ budget
    def declare(self, *tags: str) -> None:
        """Declare DP tags of the run (equal shares with the others); before the first release only."""
        if self.config.budget_shares is not None:
            raise ConfigurationError(
                f"DPConfig.budget_shares fixes the tags of the run; add these tags to it instead of declaring {tags}"
            )
        if self._frozen:
            raise ConfigurationError(
                f"cannot declare {tags}: the budget was allocated at the first DP release; "
                "declare every tag before any exchange (or list them in DPConfig.tags)"
            )
        for t in tags:
            if self.config.in_scope(str(t)):
                self._shares.setdefault(str(t), 1.0)

    def share(self, tag: str) -> float:
        """The fraction of the run's mu^2 (Gaussian-DP budget) given to ``tag``."""
        shares = self._shares or {tag: 1.0}
        return shares.get(tag, 0.0) / sum(shares.values())

    def calibration_mechanism(self, discrete: bool = False, subsampled: bool = False) -> str:
        """The accountant the budget is calibrated with.

        The run's, except that ``exact`` (Gaussian composition) becomes ``rdp`` for a run with discrete releases,
        whose proof is zCDP, or with Poisson-subsampled ones
        (:meth:`protocols.accountant.PrivacyAccountant.mechanism_for`).
        """
        subsampled = subsampled or any(s.sample_rate < 1 for s in self._tags.values())
        if self.config.accountant == "exact" and (
            discrete or subsampled or self.config.exchange_releases or self.accountant.discrete_tags
        ):
            return "rdp"
        return self.config.accountant

    def total_mu(self, discrete: bool = False, subsampled: bool = False) -> float:
        """The Gaussian mu that spends exactly ``epsilon`` at ``delta``.

        mu of the one Gaussian mechanism that spends exactly ``epsilon`` at ``delta`` under the
        run's accountant (see "Calibration" in the module docstring).
        """
        return 1.0 / calibrate_noise_multiplier(
            self.config.epsilon, self.config.delta, 1, self.calibration_mechanism(discrete, subsampled)
        )

    def noise_multiplier(self, tag: str) -> float | None:
        """Noise multiplier z of ``tag`` (sigma / sensitivity), or None before its first release."""
        st = self._tags.get(tag)
        return None if st is None else st.noise_multiplier

    def _calibrate(self, tag: str, releases: int, discrete: bool = False, sample_rate: float = 1.0) -> _TagState:
        if not self._frozen:
            self._frozen = True
            if not self._shares:  # nothing declared: the first tag takes the whole budget
                self._shares = {tag: 1.0}
        if tag not in self._shares:
            raise PrivacyBudgetError(
                f"no DP budget for this tag: the budget of epsilon={self.config.epsilon} is allocated to "
                f"{sorted(self._shares)}. Declare every DP tag of the run before the first release: "
                f"DPConfig(tags=(...)) or DPConfig(budget_shares={{tag: share}}) or protocol.dp.declare(tag, ...)",
                tag=tag,
            )
        mech, delta, q = self.calibration_mechanism(discrete, sample_rate < 1), self.config.delta, float(sample_rate)
        z = math.sqrt(releases) / (self.total_mu(discrete, q < 1) * math.sqrt(self.share(tag)))
        eps = epsilon_of([(z, 1.0, releases)], delta, mech)
        if q < 1:  # Poisson-subsampled: the multiplier that spends the tag's own epsilon at rate q
            z = calibrate_noise_multiplier(eps, delta, releases, mech, sample_rate=q)
        plan = [(s.noise_multiplier, s.sample_rate, s.releases) for s in self._tags.values()]

        def total(zz: float) -> float:
            return epsilon_of(plan + [(zz, q, releases)], delta, mech)

        if total(z) > self.config.epsilon:  # never expected (see docstring); keep the total in budget
            lo, hi = z, 2 * z
            while total(hi) > self.config.epsilon:
                lo, hi = hi, 2 * hi
                if hi > 1e7:
                    raise PrivacyBudgetError(
                        "the tags calibrated so far leave no budget for this tag; "
                        "give a larger epsilon or declare fewer releases",
                        tag=tag,
                    )
            while hi - lo > 1e-3 * hi:
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if total(mid) > self.config.epsilon else (lo, mid)
            z = hi
        st = _TagState(epsilon=eps, releases=int(releases), noise_multiplier=z, sample_rate=q)
        self._tags[tag] = st
        return st

    def _begin(
        self,
        tag: str,
        rnd: int,
        req: DPRequest,
        default_sensitivity: float | None,
        *,
        slack: float = 0.0,
        discrete: bool = False,
        sample_rate: float = 1.0,
    ) -> tuple[_TagState, float, float]:
        """Check the budget and calibrate; returns (state, Delta, sigma) of this release.

        ``slack``:
        what rounding onto the release's grid adds to Delta (:func:`grid_slack`).
        """
        sens = req.sensitivity if req.sensitivity is not None else default_sensitivity
        if sens is None or not (math.isfinite(sens) and sens > 0):
            raise ConfigurationError(
                "state the L2 sensitivity of the released sum: DPRequest(sensitivity=...) — e.g. "
                "edge_level_sensitivity(C) or node_level_sensitivity(C, degree_cap) for FedGCN rows "
                "(it cannot be derived from clip=inf or per-row clipping here)",
                tag=tag,
                round=rnd,
            )
        sens = float(sens) + float(slack)
        st = self._tags.get(tag)
        if st is None:
            st = self._calibrate(tag, req.releases, discrete, sample_rate)
        if req.releases > st.releases:
            raise PrivacyBudgetError(
                f"this tag's noise was calibrated for {st.releases} releases but the request declares "
                f"{req.releases}; declare the full count (DPRequest(releases=...)) from the first release",
                tag=tag,
                round=rnd,
            )
        if st.used >= st.releases:
            raise PrivacyBudgetError(
                f"release {st.used + 1} exceeds the {st.releases} releases this tag was calibrated for "
                f"(epsilon share {st.epsilon:.4g}); declare more releases (DPRequest(releases=...)) or a larger "
                f"epsilon (DPConfig(epsilon=...))",
                tag=tag,
                round=rnd,
            )
        return st, float(sens), st.noise_multiplier * float(sens)

    def _commit(
        self,
        tag: str,
        st: _TagState,
        sens: float,
        req: DPRequest,
        total_std: float,
        *,
        discrete: tuple[float, int, int] | None = None,
    ) -> None:
        """Count the release and hand the new state to :attr:`on_release`.

        Count the release, and hand the new state to :attr:`on_release` (the run's write-ahead
        ledger) before the noisy values are returned, i.e. before any upload leaves.  ``discrete``:
        ``(smallest client std in steps, most honest shares, entries)`` of a sum of discrete
        Gaussians, counted at its zCDP bound (:func:`sum_of_discrete_gaussians_epsilon`).
        """
        st.used += 1
        st.sensitivity = max(st.sensitivity, sens)
        st.clip = float(req.clip) if math.isfinite(req.clip) else self._mean_clip.get(tag)
        st.integer = st.integer or bool(req.integer)
        z = st.noise_multiplier
        if discrete is not None:
            client_std, honest, entries = discrete
            tau_term = sum_of_discrete_gaussians_tau(client_std, honest) * entries / 2.0
            z = 1.0 / math.sqrt(1.0 / z**2 + tau_term)
        self.accountant.step(tag, z, st.sample_rate, sensitivity=sens, discrete=discrete is not None)
        self.last_std = float(total_std)
        if self.on_release is not None:
            self.on_release(self.state_dict())

    def _client_std(self, sigma: float, n: float | np.ndarray) -> np.ndarray:
        """Per-client noise std given the number of contributors.

        ``n`` is a scalar or per row. The std is sigma (local) or sigma / sqrt(max(1, n - dropouts - colluders))
        (distributed).
        """
        n = np.asarray(n, dtype=np.float64)
        if self.config.placement == "local":
            return cast(np.ndarray, np.broadcast_to(np.float64(sigma), n.shape).copy())
        return cast(np.ndarray, sigma / np.sqrt(np.maximum(n - self.config.dropouts - self.config.colluders, 1.0)))

    # ------------------------------------------------------------------ local releases
    def local_release(
        self, tag: str, step: int, req: DPRequest, *, contributors: int = 1, sample_rate: float = 1.0
    ) -> float:
        """Each client's noise std for a release computed from its own records.

        Each client's noise std for a release it computes from its own records (a DP-SGD step,
        :mod:`secure_fgl.dpsgd`): ``sigma = z_t Delta``, Delta = ``req.sensitivity`` or ``req.clip``.
        Clients hold disjoint records, so step ``step`` of every client is one release (parallel
        composition, McSherry 2009): the first call with a new, larger ``step`` counts it, later
        calls for the same step do not.  ``contributors`` > 1: the step's results leave the clients
        only as one secure sum of that many (a one-step SGD update averaged by the protocol), so in
        distributed placement each adds ``sigma / sqrt(max(1, n - dropouts - colluders))``, as in an
        exchange.  Whoever holds the records draws the noise (:meth:`local_noise` in process; a
        client runtime from its own keystream).  ``sample_rate`` q < 1: every record takes part in a
        step with probability q, independently and secretly (Poisson sampling, DP-SGD's
        amplification); the tag is calibrated and accounted at rate q (Renyi DP of the subsampled
        Gaussian, Mironov, Talwar & Zhang 2019, as Opacus' RDP accountant).
        """
        if step > self._local_step.get(tag, -1):
            st, sens, sigma = self._begin(tag, step, req, req.clip, sample_rate=sample_rate)
            self._local_step[tag] = int(step)
            self._commit(tag, st, sens, req, sigma)
        else:
            sigma = self._tags[tag].noise_multiplier * float(req.sensitivity or req.clip)
        self._local_shares[tag] = int(contributors)
        return float(self._client_std(sigma, contributors)) if contributors > 1 else sigma

    def local_noise(
        self, tag: str, step: int, size: int, req: DPRequest, *, contributors: int = 1, sample_rate: float = 1.0
    ) -> np.ndarray:
        """Noise for release ``step`` of ``tag`` at the :meth:`local_release` std.

        Noise of size ``size`` for release ``step`` of ``tag`` at the std :meth:`local_release`
        gives, from this engine's OS-keyed keystream.
        """
        std = self.local_release(tag, step, req, contributors=contributors, sample_rate=sample_rate)
        return gaussian_noise(self._noise, std, int(size))

    # ------------------------------------------------------------------ exchanges
    def vector_release(
        self,
        tag: str,
        rnd: int,
        n: int,
        length: int,
        req: DPRequest,
        *,
        row_len: int | None = None,
        grid_bits: int | None = DP_GRID_BITS,
    ) -> float:
        """Server side of one dense release by ``n`` contributors.

        Each of the ``n`` contributors holds a ``length``-vector. Checks the budget, calibrates and counts the
        release; returns each contributor's noise std (the contributors add it themselves, :func:`noise_vector`).
        ``per_row`` clips consecutive slices of ``row_len`` entries; default sensitivity is the client-level bound C
        (whole) or C sqrt(rows) (per row). A continuous release is rounded onto ``2^-grid_bits``: its sensitivity
        grows by :func:`grid_slack`.
        """
        if req.per_row:
            if not row_len or length % row_len:
                raise ConfigurationError(
                    "per_row clipping needs a row structure this exchange does not have; use DPRequest(per_row=False)",
                    tag=tag,
                    round=rnd,
                )
            default = req.clip * math.sqrt(length // row_len)
        else:
            default = req.clip
        bits = 0 if req.integer else (DP_GRID_BITS if grid_bits is None else int(grid_bits))
        slack = 0.0 if req.integer else grid_slack(bits, n, length)
        st, sens, sigma = self._begin(tag, rnd, req, default, slack=slack, discrete=True)
        std = max(float(self._client_std(sigma, n)), self._std_floor(bits))
        self._commit(tag, st, sens, req, std * math.sqrt(n), discrete=(std * 2.0**bits, self._honest(n), length))
        return std

    def privatize_vectors(
        self,
        tag: str,
        rnd: int,
        flat: dict[int, np.ndarray],
        req: DPRequest,
        *,
        row_len: int | None = None,
        spec: ValueSpec | None = None,
    ) -> dict[int, np.ndarray]:
        """Clip and noise each client's 1-D contribution to a dense sum.

        :meth:`vector_release`, then every client's :func:`noise_vector`, all in this process.
        """
        if not flat:
            return {}
        bits = grid_bits_of(spec, req)
        std = self.vector_release(
            tag, rnd, len(flat), next(iter(flat.values())).size, req, row_len=row_len, grid_bits=bits
        )
        return {k: noise_vector(self._noise, v, req, std, row_len=row_len, grid_bits=bits) for k, v in flat.items()}

    def row_release(
        self,
        tag: str,
        rnd: int,
        counts: np.ndarray,
        req: DPRequest,
        *,
        row_len: int,
        grid_bits: int | None = DP_GRID_BITS,
    ) -> np.ndarray:
        """Server side of one row-keyed release.

        ``counts[r]`` clients upload row ``r`` (0: nobody) of ``row_len`` entries. Checks the budget, calibrates,
        counts the release; returns each uploader's noise std per row (distributed placement divides the variance by
        the row's uploaders). ``per_row=True`` needs an explicit sensitivity (edge- or node-level, see module
        docstring). A continuous release is rounded onto ``2^-grid_bits`` (:func:`grid_slack` over every client's
        upload of all rows).
        """
        counts = np.asarray(counts, dtype=np.int64)
        bits = 0 if req.integer else (DP_GRID_BITS if grid_bits is None else int(grid_bits))
        entries = counts.size * int(row_len)
        slack = 0.0 if req.integer else grid_slack(bits, self.num_clients, entries)
        st, sens, sigma = self._begin(tag, rnd, req, None if req.per_row else req.clip, slack=slack, discrete=True)
        std = np.maximum(self._client_std(sigma, counts), self._std_floor(bits))
        up = counts > 0
        self._commit(
            tag,
            st,
            sens,
            req,
            float(np.max(std[up] * np.sqrt(counts[up]))) if up.any() else 0.0,
            discrete=(
                float(np.min(std[up])) * 2.0**bits if up.any() else 1.0,
                self._honest(int(counts.max(initial=1))),
                entries,
            ),
        )
        return cast(np.ndarray, std)

    def _std_floor(self, bits: int) -> float:
        """Distributed placement: the smallest std of each noise share.

        Distributed placement: each share's std is at least :data:`MIN_CLIENT_DGAUSS_STD` grid steps,
        where the sum of the shares is within ``tau`` < 1e-16 per share of one discrete Gaussian
        (:func:`sum_of_discrete_gaussians_tau`); a local upload is one discrete Gaussian, no floor.
        """
        return MIN_CLIENT_DGAUSS_STD * 2.0 ** -int(bits) if self.config.placement == "distributed" else 0.0

    def _honest(self, n: int) -> int:
        """The number of noise shares a sum of ``n`` contributions keeps for sure.

        The noise shares a sum of ``n`` contributions keeps for sure (distributed placement:
        ``n - dropouts - colluders``, at least 1; local: every upload is a release on its own, 1).
        """
        if self.config.placement == "local":
            return 1
        return max(1, int(n) - self.config.dropouts - self.config.colluders)

    def privatize_rows(
        self,
        tag: str,
        rnd: int,
        ids: dict[int, np.ndarray],
        rows: dict[int, np.ndarray],
        num_rows: int,
        req: DPRequest,
        layout: str,
        *,
        spec: ValueSpec | None = None,
    ) -> dict[int, np.ndarray]:
        """Clip and noise each client's rows of a row-keyed sum.

        Calls :meth:`row_release`, then every client's :func:`noise_rows`, all in this process. ``ids``/``rows`` are
        what each client uploads (the caller expands them to whole transport blocks, so padding rows get noise too).
        """
        counts = np.zeros(int(num_rows), dtype=np.int64)
        for k in ids:
            counts[np.asarray(ids[k], dtype=np.int64)] += 1
        bits = grid_bits_of(spec, req)
        row_len = int(np.asarray(next(iter(rows.values()))).shape[-1]) if rows else 1
        std = self.row_release(tag, rnd, counts, req, row_len=row_len, grid_bits=bits)
        return {
            k: noise_rows(self._noise, r, req, std[np.asarray(ids[k], dtype=np.int64)], grid_bits=bits)
            for k, r in rows.items()
        }

    def mean_request(
        self, tag: str, rnd: int, req: DPRequest, spec: ValueSpec, *, nrows: int = 1, weighted: bool = False
    ) -> tuple[DPRequest, ValueSpec, float | None]:
        """Server side of a DP weighted mean: the request and spec of the clipped sum.

        Server side of a DP weighted mean (module docstring, "weighted_mean"): the request and
        spec of the sum of the clipped contributions (:func:`clip_mean_value`; the request has
        ``clip=inf`` and the sensitivity set) and ``weight_scale``, ``None`` for an unweighted
        mean (divide by the number of contributors) else the factor C the weight coordinate
        was scaled by.  ``nrows``: rows of a contribution (``per_row`` clipping).
        """
        C = float(req.clip)
        if not math.isfinite(C):
            raise ConfigurationError("a DP mean needs a finite clip bound on each client's values", tag=tag, round=rnd)
        self._mean_clip[tag] = C
        if not weighted:
            sens = C * math.sqrt(nrows) if req.per_row else C
            return (
                dataclasses.replace(req, clip=math.inf, per_row=False, sensitivity=req.sensitivity or sens),
                dataclasses.replace(spec, max_abs=min(spec.max_abs, C)),
                None,
            )
        sens = C * math.sqrt(nrows + 1) if req.per_row else math.sqrt(2.0) * C
        return (
            dataclasses.replace(req, clip=math.inf, per_row=False, sensitivity=req.sensitivity or sens),
            dataclasses.replace(spec, max_abs=C),
            C,
        )

    def mean_contributions(
        self,
        tag: str,
        rnd: int,
        arrays: dict[int, np.ndarray],
        weights: dict[int, float] | None,
        req: DPRequest,
        spec: ValueSpec,
    ) -> tuple[dict[int, np.ndarray], DPRequest, ValueSpec, float | None]:
        """Client-side inputs of a DP weighted mean, every client in this process.

        Returns ``(flat, request for the sum, spec for the sum, weight_scale)`` (:meth:`mean_request`), the flat
        vectors already clipped.
        """
        shape = next(iter(arrays.values())).shape
        nrows = shape[0] if len(shape) else 1
        dp_sum, spec_sum, wscale = self.mean_request(tag, rnd, req, spec, nrows=nrows, weighted=weights is not None)
        if weights is None:
            return {k: clip_mean_value(a, req, nrows) for k, a in arrays.items()}, dp_sum, spec_sum, None
        flat = {k: weighted_mean_value(a, weights[k], req, nrows, tag=tag, rnd=rnd) for k, a in arrays.items()}
        return flat, dp_sum, spec_sum, wscale

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Plain-data state of the engine.

        Plain-data state: allocation, per-tag calibration and release counts, accountant
        (a resumed run continues the same budget; the noise key is not part of it).
        """
        return {
            "config": dataclasses.asdict(self.config),
            "shares": dict(self._shares),
            "frozen": self._frozen,
            "tags": {t: dataclasses.asdict(st) for t, st in self._tags.items()},
            "mean_clip": dict(self._mean_clip),
            "last_std": self.last_std,
            "local_step": dict(self._local_step),
            "replayed_releases": self.replayed_releases,
            "accountant": self.accountant.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], ledger: dict[str, Any] | None = None) -> None:
        """Resume from a checkpoint's ``state``.

        ``ledger`` is the latest :attr:`on_release`
        state: releases it holds beyond the checkpoint left the client before a crash, and their
        rounds run again after the resume, so the accountant keeps them (the run ends with more
        releases than planned, reported as ``replayed_releases``; epsilon counts them all).
        """
        for st in (state, ledger or state):
            saved = {k: st["config"][k] for k in ("epsilon", "delta", "placement", "accountant")}
            mine = {k: getattr(self.config, k) for k in saved}
            if saved != mine:
                raise ConfigurationError(
                    f"checkpoint DP settings {saved} differ from this run's {mine}; resume with the same --dp-* options"
                )

        def releases(st: dict[str, Any]) -> int:
            return sum(int(n) for runs in st["accountant"]["runs"].values() for _, _, n in runs)

        newest = ledger if ledger is not None and releases(ledger) > releases(state) else state
        self.accountant.load_state_dict(newest["accountant"])
        self.replayed_releases = int(newest.get("replayed_releases", 0)) + releases(newest) - releases(state)
        self._shares = dict(state["shares"])
        self._frozen = bool(state["frozen"])
        self._tags = {t: _TagState(**st) for t, st in state["tags"].items()}
        self._mean_clip = dict(state["mean_clip"])
        self._local_step = dict(state.get("local_step", {}))
        self.last_std = float(state["last_std"])

    # ------------------------------------------------------------------ report
    def release_spec(self, spec: ValueSpec, req: DPRequest) -> ValueSpec:
        """The spec this run encodes the DP sum of ``req`` with.

        :func:`release_spec`, integer noise for an integer exchange.
        """
        return release_spec(spec, dataclasses.replace(req, integer=req.integer or spec.integer), self.config.placement)

    def report(self) -> dict[str, Any]:
        """The accountant's report plus the budget, placement and per-tag calibration."""
        rep = self.accountant.report()
        rep["epsilon_budget"] = self.config.epsilon
        rep["placement"] = self.config.placement
        rep["replayed_releases"] = self.replayed_releases
        for tag, st in self._tags.items():
            entry = rep["per_tag"].setdefault(
                tag, {"epsilon": 0.0, "releases": 0, "noise_multiplier": st.noise_multiplier, "sensitivity": None}
            )
            entry.update(
                {"epsilon_budget": st.epsilon, "planned_releases": st.releases, "clip": st.clip, "integer": st.integer}
            )
            if tag in self._local_shares:
                entry["noise_shares"] = self._local_shares[tag]
        return rep
