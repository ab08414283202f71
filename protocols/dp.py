r"""Differential privacy for protocol exchanges: L2 clipping + Gaussian noise, added client-side.

A run turns DP on with ``make_protocol(mode, K, dp=DPConfig(epsilon=...))``; an exchange opts
in by passing ``dp=DPRequest(clip=..., ...)``.  Each client clips its contribution and adds
noise *before* encoding, so the protocol then encrypts / masks the noisy values; the
:class:`~protocols.accountant.PrivacyAccountant` composes every release of the run.

Mechanism (per release of tag ``t``)
------------------------------------
* **Clipping** (L2): ``per_row=False`` scales a client's whole contribution to norm
  <= ``clip``; ``per_row=True`` scales each row (first-axis slice of a dense array, or each
  contributed row of :meth:`Protocol.row_sum`) to norm <= ``clip``.  ``clip=inf`` means the
  caller bounded its contributions itself (it must then state ``sensitivity``).
* **Noise**: the released *sum* gets Gaussian noise of std ``sigma = z_t * Delta`` per
  entry, ``Delta`` the L2 sensitivity of the sum (``DPRequest.sensitivity``, default below),
  ``z_t`` the noise multiplier of the tag.
* **Calibration** (the whole run at once): at q = 1 Gaussian releases compose exactly like
  one Gaussian mechanism with ``mu^2 = sum_t R_t / z_t^2`` (Dong, Roth & Su 2022).  The run
  first finds the ``mu`` of the single Gaussian that spends exactly ``epsilon`` at ``delta``
  under its accountant (:meth:`DPEngine.total_mu`; ``1 / get_noise_multiplier(eps, delta,
  steps=1)`` for Opacus' RDP/PRV, the analytic Gaussian for "exact"), then gives tag ``t`` the
  share ``s_t`` of ``mu^2``: ``z_t = sqrt(R_t) / (mu sqrt(s_t))``, ``R_t = DPRequest.releases``.
  When every tag makes its planned releases the run spends ``epsilon`` (to the accountant's
  numerics), not less: splitting epsilon itself across tags would leave most of it unspent
  (eps 4 over two tags spent 2.94).  Shares: ``DPConfig.split`` (relative weights), else an
  even split over ``DPConfig.tags`` / :meth:`DPEngine.declare`, else (nothing declared) the
  whole budget goes to the first tag released and any other tag is refused.  The allocation
  is frozen at the first release.  After calibrating a tag we check that the planned releases
  of every tag so far compose to <= ``epsilon`` (if the accountant's numerics ever disagreed,
  that tag's z would be raised until it holds).  A tag's ``epsilon_budget`` in the report is
  what its releases alone would spend.
  The release ``R_t + 1`` of a tag raises :class:`PrivacyBudgetError`.  A release is counted
  when its noise is drawn, even if the exchange then fails (conservative).

Placement
---------
* ``local``: every contributor adds N(0, sigma^2) to what it uploads, so each upload is
  itself (eps, delta)-DP — needed in ``plain`` mode, where the server reads every upload.
  The released sum carries std ``sigma * sqrt(n)`` (n contributors).  Here ``Delta`` must
  bound the change of the *concatenation* of all uploads; for the units below it is the
  same number as for the sum.
* ``distributed``: each of the n contributors adds N(0, sigma^2 / m) with
  ``m = max(1, n - d - c)``, so the *sum* carries at least sigma even after ``d`` contributors
  drop out (``DPConfig.dropouts``) and ``c`` colluding contributors (``DPConfig.colluders``)
  subtract their own shares (over-provisioning; Truex et al. 2019, Kairouz et al. 2021 "the
  distributed discrete Gaussian": each party adds noise for the worst-case number of honest
  survivors).  With d = c = 0 it is ``sigma/sqrt(n)`` per contributor and the full sum
  carries exactly sigma.  Argument: at most ``d`` drop and at most ``c`` are corrupt, so at
  least ``n - d - c`` honest noise shares of variance ``sigma^2/m`` stay in the sum, i.e. at
  least sigma^2; when ``n - d - c < 1`` every contributor adds all of sigma^2 (a row left with
  no honest contributor holds no honest data).  Only sound when nobody but the recipients
  sees anything but the sum, hence only with ``ckks`` / ``mask``; a backend must refuse an
  exchange that lost more than ``d`` contributors after noising (the mask backend does).
  For :meth:`Protocol.row_sum` n is counted per uploaded row (the clients uploading the
  block holding it), so every uploaded row of the sum carries sigma.

Integer exchanges (``ValueSpec.integer`` / ``DPRequest.integer``): discrete Gaussian noise
------------------------------------------------------------------------------------------
Integer encodings (packed BFV/CKKS fields, the mask ring) stay exact only with integer
noise, so integer exchanges get the **discrete Gaussian** N_Z(0, sigma^2) (P[x] ~
exp(-x^2 / 2 sigma^2) on the integers), sampled by Canonne-Kamath-Steinke 2020 Alg. 3
(discrete-Laplace proposal + rejection; vectorised, :meth:`SecureRandom.discrete_gaussian`).  Privacy argument:
the multivariate discrete Gaussian with L2 sensitivity Delta satisfies (Delta/sigma)^2/2-zCDP
(CKS20 Thm 14) — the same Rényi curve alpha/(2 z^2) as the continuous Gaussian, so the
RDP accountant's bound holds verbatim.  In distributed placement the sum of n independent
N_Z(0, sigma_c^2) is within tau = 10 sum_{k<n} exp(-2 pi^2 sigma_c^2 k/(k+1)) of
N_Z(0, n sigma_c^2) (Kairouz-Liu-Steinke 2021, Thm 15: zCDP epsilon^2 grows by tau*d/2);
we floor the per-client std at 2, where tau < 1e-16 n, negligible for any d.  (Rounded
Gaussian noise is *not* used: a sum of rounded Gaussians is not a post-processing of one
Gaussian release.)  Integer contributions are clipped by scaling and truncating toward
zero, which keeps them integers inside the ball.  Caveats: the PRV accountant evaluates
the *continuous* Gaussian's privacy curve, a close approximation for the discrete one
(the formal guarantee is the RDP/zCDP one); noise makes counts negative, so packed
encoders must leave headroom and an offset (``ExchangeContext.dp_noise_std``).

Sensitivities (add/remove-one adjacency; replace-one doubles them)
------------------------------------------------------------------
* **Model updates / dense contributions**, clipped to C per client (add/remove one
  client): Delta = C (:func:`client_level_sensitivity`); with ``per_row`` on r rows, C*sqrt(r).
* **FedGCN neighbour sums S = (A + I) X**, feature rows ``X_v`` clipped to C (the
  algorithm clips X with :func:`clip_rows`, or binary rows with <= s ones have C = sqrt(s)),
  then ``DPRequest(clip=inf or a no-op bound, per_row=True, sensitivity=...)``:
    - edge-level (one undirected edge (u, v) changes rows u and v by x_v and x_u):
      Delta = sqrt(2) * C (:func:`edge_level_sensitivity`);
    - node-feature-level with degree cap D (node v's features appear in its own row and
      those of its <= D neighbours): Delta = C * sqrt(D + 1) (:func:`node_level_sensitivity`);
      the algorithm must enforce the degree cap.
  Clipping S rows as well is harmless (projection onto the ball is 1-Lipschitz).
  ``row_sum`` with ``per_row=True`` refuses to guess the unit: give ``sensitivity``.
* **weighted_mean** (the flat vector is ``[w v, w]``; the weight is secret in secure
  modes and changes with the client's data, so it must be private too):
    - ``weights=None``: the denominator is the number of contributors, public (the
      transcript shows who sent); each client sends only ``clip(v)``: Delta = C.
    - with weights: v is clipped to C *before* weighting, the weight is clipped to a public
      bound W (``DPRequest.weight_bound``; required if any weight exceeds 1) and
      normalised, w~ = min(w, W)/W in [0, 1] (the mean is unchanged by a common scale);
      the client sends ``[w~ clip(v), w~ C]`` — the weight coordinate scaled by C so it
      carries the same sensitivity as the values — and the **weight is noised too**:
      ||[w~ v, w~ C]|| <= sqrt(2) C, so Delta = sqrt(2) C (C sqrt(r+1) per row).  The
      recipients divide the value total by (weight total / C), floored at the std of its
      noise (post-processing, no privacy cost) so noise cannot make it <= 0.
* ``weighted_sum`` clips the *weighted* contribution w v to C: Delta = C.
  ``classwise_mean`` clips the whole ``[w a, w]`` jointly to C: Delta = C (a uniform
  scale keeps each client's class means and only lowers its weight).

The ``prv`` accountant answers with the RDP bound above eps = 100, where Opacus' PRV
numerics overflow (:data:`protocols.accountant.PRV_MAX_EPSILON`).  :meth:`DPEngine.state_dict`
/ :meth:`DPEngine.load_state_dict` carry the budget across checkpoint resumes.

Not covered by DP: participation (who sends is public), and in the ``sparse`` row layout
the set of blocks a client uploads (a documented leak of that layout: use ``dense`` for DP
over the support).  Noise on every uploaded row of a block, including rows the client
does not hold, hides *which* rows inside a block it holds.

Randomness: every noise draw comes from :class:`protocols.csprng.SecureRandom`, an
AES-256-CTR keystream keyed by ``os.urandom(32)`` when the engine is built and never
persisted (not in :meth:`DPEngine.state_dict`, a checkpoint or ``result.json``).  The run's
``--seed`` plays no part: knowing it, nobody can regenerate the noise and subtract it, so
DP runs are not bit-reproducible by design (everything else still follows ``--seed``).
See :mod:`protocols.csprng` for the sampler and the floating-point/timing caveats (Jin et
al., S&P 2022).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from .accountant import MECHANISMS, PrivacyAccountant, calibrate_noise_multiplier, epsilon_of
from .base import DPRequest, ValueSpec
from .csprng import SecureRandom
from .errors import ConfigurationError, PrivacyBudgetError
from .registry import distributed_dp_modes

PLACEMENTS = ("local", "distributed")
#: protocol modes in which only recipients see the sum (distributed placement is sound)
SECURE_MODES = distributed_dp_modes()
#: per-client floor of discrete-Gaussian std in distributed placement (see module docstring)
MIN_CLIENT_DGAUSS_STD = 2.0


# ----------------------------------------------------------------------------- sensitivities
def client_level_sensitivity(clip: float) -> float:
    """Add/remove one client whose contribution is clipped to ``clip``: Delta = C."""
    return float(clip)


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
    tags:        tags the run declares; the budget is split evenly over them.
    split:       optional per-tag relative shares (any positive weights, normalised);
                 overrides ``tags``.  Neither given: the first tag released takes it all.
    scope:       tag prefixes that are privatised (empty: every exchange that asks for DP);
                 e.g. ``('fedgcn/neighbour_sums',)`` noises only FedGCN's one-shot release and
                 leaves the model exchange exact.  Out-of-scope tags get no noise and no budget.
    dropouts:    distributed placement: contributors that may drop out after noising while
                 the sum still carries sigma (more drops: the backend refuses the exchange).
    colluders:   distributed placement: colluding contributors whose noise shares may be
                 subtracted while the sum still carries sigma for the others.
    """

    epsilon: float
    delta: float = 1e-5
    placement: str = "local"
    accountant: str = "rdp"
    tags: Sequence[str] = ()
    split: Mapping[str, float] | None = None
    scope: Sequence[str] = ()
    dropouts: int = 0
    colluders: int = 0

    def in_scope(self, tag: str) -> bool:
        return not self.scope or any(tag == p or tag.startswith(p.rstrip("/") + "/") for p in self.scope)

    def __post_init__(self):
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
        if self.split is not None:
            split = dict(self.split)
            if not split or any(not (math.isfinite(v) and v > 0) for v in split.values()):
                raise ConfigurationError("DPConfig.split must map each tag to a positive share, "
                                         f"got {self.split!r}")
            object.__setattr__(self, "split", split)


# ----------------------------------------------------------------------------- mechanism
def clip_l2(x: np.ndarray, bound: float, *, integer: bool = False) -> np.ndarray:
    """``x`` scaled to L2 norm <= ``bound`` (unchanged if already inside).  Integer inputs
    are scaled then truncated toward zero: still integers, still inside the ball."""
    x = np.asarray(x, dtype=np.float64)
    if not math.isfinite(bound):
        return x.copy()
    norm = float(np.linalg.norm(x))
    if norm <= bound:
        return x.copy()
    out = x * (bound / norm * (1.0 - 1e-12))
    return np.trunc(out) if integer else out


def clip_rows(x: np.ndarray, bound: float, *, integer: bool = False) -> np.ndarray:
    """Each row (first-axis slice) of ``x`` scaled to L2 norm <= ``bound`` (see :func:`clip_l2`)."""
    x = np.asarray(x, dtype=np.float64)
    if not math.isfinite(bound) or x.size == 0:
        return x.copy()
    flat = x.reshape(x.shape[0], -1) if x.ndim else x.reshape(1, 1)
    norms = np.linalg.norm(flat, axis=1)
    scale = np.where(norms > bound, bound / np.maximum(norms, 1e-300) * (1.0 - 1e-12), 1.0)
    out = flat * scale[:, None]
    if integer:
        out = np.where((scale < 1.0)[:, None], np.trunc(out), out)
    return out.reshape(x.shape)


def gaussian_noise(rng: SecureRandom, std, size, *, integer: bool = False) -> np.ndarray:
    """Continuous N(0, std^2) or, for integer exchanges, discrete N_Z(0, std^2) noise
    (integer-valued), from the OS-keyed keystream ``rng``."""
    if integer:
        return rng.discrete_gaussian(std, size)
    return rng.standard_normal(size) * np.asarray(std, dtype=np.float64)


def noise_vector(rng: SecureRandom, v: np.ndarray, req: DPRequest, std: float, *,
                 row_len: int | None = None) -> np.ndarray:
    """Client side of a dense release: ``v`` clipped as ``req`` says (whole, or per slice of
    ``row_len``), plus noise of ``std`` (:meth:`DPEngine.vector_release`) from ``rng``, the
    contributor's own OS-keyed keystream."""
    v = np.asarray(v, dtype=np.float64).ravel()
    v = clip_rows(v.reshape(-1, row_len), req.clip, integer=req.integer).ravel() if req.per_row \
        else clip_l2(v, req.clip, integer=req.integer)
    return v + gaussian_noise(rng, std, v.shape, integer=req.integer)


def clip_mean_value(a: np.ndarray, req: DPRequest, nrows: int = 1) -> np.ndarray:
    """Client side of a DP mean: ``a`` (flat) clipped to ``req.clip``, whole or per row."""
    a = np.asarray(a, dtype=np.float64)
    if req.per_row:
        return clip_rows(a.reshape(nrows, -1), req.clip, integer=req.integer).ravel()
    return clip_l2(a.ravel(), req.clip, integer=req.integer)


def weighted_mean_value(a: np.ndarray, weight: float, req: DPRequest, nrows: int = 1, *, tag: str = "",
                        rnd: int = 0) -> np.ndarray:
    """Client side of a DP weighted mean: ``[w~ clip(a), w~ C]`` with ``w~ = min(w, W) / W``
    (``W = req.weight_bound``; without one the weights must lie in ``[0, 1]``, ``W = 1``)."""
    W = req.weight_bound
    if W is None:
        if float(weight) > 1.0:
            raise ConfigurationError(
                "a DP weighted mean needs a public bound on the weights (they are secret and noised): pass "
                "DPRequest(weight_bound=W) (weights above W are clipped to W), or weights in [0, 1]",
                tag=tag, round=rnd)
        W = 1.0
    wt = min(float(weight), W) / W
    return np.concatenate([wt * clip_mean_value(a, req, nrows), [wt * float(req.clip)]])


def noise_rows(rng: SecureRandom, rows: np.ndarray, req: DPRequest, std: np.ndarray) -> np.ndarray:
    """Client side of a row-keyed release: each row clipped (``per_row``, else the whole
    contribution) plus noise of its row's ``std`` (:meth:`DPEngine.row_release`) from ``rng``."""
    r = np.asarray(rows, dtype=np.float64)
    r = clip_rows(r, req.clip, integer=req.integer) if req.per_row else clip_l2(r, req.clip, integer=req.integer)
    return r + gaussian_noise(rng, np.asarray(std, dtype=np.float64)[:, None], r.shape, integer=req.integer)


# ----------------------------------------------------------------------------- engine
@dataclass
class _TagState:
    epsilon: float                 # this tag's share of the budget
    releases: int                  # planned releases (calibration)
    noise_multiplier: float
    used: int = 0
    sensitivity: float = 0.0       # largest Delta used so far
    clip: float | None = None
    integer: bool = False


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
                f"DPConfig(placement='local')")
        self.config = config
        self.num_clients = int(num_clients)
        self.protocol_mode = protocol_mode
        self.last_std = 0.0
        self._noise = SecureRandom()      # OS-keyed; never persisted
        self.accountant = PrivacyAccountant(config.accountant, config.delta)
        self._shares: dict[str, float] = (dict(config.split) if config.split is not None
                                          else {t: 1.0 for t in config.tags})
        self._frozen = False
        self._tags: dict[str, _TagState] = {}
        self._mean_clip: dict[str, float] = {}     # clip of DP means (their sum request has clip=inf)
        self._local_step: dict[str, int] = {}      # last step counted per local-release tag
        self._local_shares: dict[str, int] = {}    # clients whose noise shares a local release's sum carries
        #: called with :meth:`state_dict` after every release, before its values leave the client
        self.on_release: Callable[[dict], None] | None = None
        self.replayed_releases = 0                 # releases made again after a resume (see load_state_dict)

    # ------------------------------------------------------------------ budget
    def declare(self, *tags: str) -> None:
        """Declare DP tags of the run (even split with the others); before the first release only."""
        if self.config.split is not None:
            raise ConfigurationError("DPConfig.split fixes the tags of the run; add these tags to it instead "
                                     f"of declaring {tags}")
        if self._frozen:
            raise ConfigurationError(f"cannot declare {tags}: the budget was allocated at the first DP release; "
                                     "declare every tag before any exchange (or list them in DPConfig.tags)")
        for t in tags:
            if self.config.in_scope(str(t)):
                self._shares.setdefault(str(t), 1.0)

    def share(self, tag: str) -> float:
        """The fraction of the run's mu^2 (Gaussian-DP budget) given to ``tag``."""
        shares = self._shares or {tag: 1.0}
        return shares.get(tag, 0.0) / sum(shares.values())

    def total_mu(self) -> float:
        """mu of the one Gaussian mechanism that spends exactly ``epsilon`` at ``delta`` under the
        run's accountant (see "Calibration" in the module docstring)."""
        return 1.0 / calibrate_noise_multiplier(self.config.epsilon, self.config.delta, 1, self.config.accountant)

    def noise_multiplier(self, tag: str) -> float | None:
        st = self._tags.get(tag)
        return None if st is None else st.noise_multiplier

    def _calibrate(self, tag: str, releases: int) -> _TagState:
        if not self._frozen:
            self._frozen = True
            if not self._shares:              # nothing declared: the first tag takes the whole budget
                self._shares = {tag: 1.0}
        if tag not in self._shares:
            raise PrivacyBudgetError(
                f"no DP budget for this tag: the budget of epsilon={self.config.epsilon} is allocated to "
                f"{sorted(self._shares)}. Declare every DP tag of the run before the first release: "
                f"DPConfig(tags=(...)) or DPConfig(split={{tag: share}}) or protocol.dp.declare(tag, ...)",
                tag=tag)
        mech, delta = self.config.accountant, self.config.delta
        z = math.sqrt(releases) / (self.total_mu() * math.sqrt(self.share(tag)))
        eps = epsilon_of([(z, 1.0, releases)], delta, mech)
        plan = [(s.noise_multiplier, 1.0, s.releases) for s in self._tags.values()]

        def total(zz: float) -> float:
            return epsilon_of(plan + [(zz, 1.0, releases)], delta, mech)

        if total(z) > self.config.epsilon:   # never expected (see docstring); keep the total in budget
            lo, hi = z, 2 * z
            while total(hi) > self.config.epsilon:
                lo, hi = hi, 2 * hi
                if hi > 1e7:
                    raise PrivacyBudgetError("the tags calibrated so far leave no budget for this tag; "
                                             "give a larger epsilon or declare fewer releases", tag=tag)
            while hi - lo > 1e-3 * hi:
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if total(mid) > self.config.epsilon else (lo, mid)
            z = hi
        st = _TagState(epsilon=eps, releases=int(releases), noise_multiplier=z)
        self._tags[tag] = st
        return st

    def _begin(self, tag: str, rnd: int, req: DPRequest, default_sensitivity: float | None) -> tuple[_TagState, float, float]:
        """Check the budget and calibrate; returns (state, Delta, sigma) of this release."""
        sens = req.sensitivity if req.sensitivity is not None else default_sensitivity
        if sens is None or not (math.isfinite(sens) and sens > 0):
            raise ConfigurationError(
                "state the L2 sensitivity of the released sum: DPRequest(sensitivity=...) — e.g. "
                "edge_level_sensitivity(C) or node_level_sensitivity(C, degree_cap) for FedGCN rows "
                "(it cannot be derived from clip=inf or per-row clipping here)", tag=tag, round=rnd)
        st = self._tags.get(tag)
        if st is None:
            st = self._calibrate(tag, req.releases)
        if req.releases > st.releases:
            raise PrivacyBudgetError(
                f"this tag's noise was calibrated for {st.releases} releases but the request declares "
                f"{req.releases}; declare the full count (DPRequest(releases=...)) from the first release",
                tag=tag, round=rnd)
        if st.used >= st.releases:
            raise PrivacyBudgetError(
                f"release {st.used + 1} exceeds the {st.releases} releases this tag was calibrated for "
                f"(epsilon share {st.epsilon:.4g}); declare more releases (DPRequest(releases=...)) or a larger "
                f"epsilon (DPConfig(epsilon=...))", tag=tag, round=rnd)
        return st, float(sens), st.noise_multiplier * float(sens)

    def _commit(self, tag: str, st: _TagState, sens: float, req: DPRequest, total_std: float) -> None:
        """Count the release, and hand the new state to :attr:`on_release` (the run's write-ahead
        ledger) before the noisy values are returned, i.e. before any upload leaves."""
        st.used += 1
        st.sensitivity = max(st.sensitivity, sens)
        st.clip = float(req.clip) if math.isfinite(req.clip) else self._mean_clip.get(tag)
        st.integer = st.integer or bool(req.integer)
        self.accountant.step(tag, st.noise_multiplier, 1.0, sensitivity=sens)
        self.last_std = float(total_std)
        if self.on_release is not None:
            self.on_release(self.state_dict())

    def _client_std(self, sigma, n) -> np.ndarray:
        """Per-client noise std given the number of contributors n (scalar or per row):
        sigma (local), sigma / sqrt(max(1, n - dropouts - colluders)) (distributed)."""
        n = np.asarray(n, dtype=np.float64)
        if self.config.placement == "local":
            return np.broadcast_to(np.float64(sigma), n.shape).copy()
        return sigma / np.sqrt(np.maximum(n - self.config.dropouts - self.config.colluders, 1.0))

    # ------------------------------------------------------------------ local releases
    def local_release(self, tag: str, step: int, req: DPRequest, *, contributors: int = 1) -> float:
        """Each client's noise std for a release it computes from its own records (a DP-SGD step,
        :mod:`secure_fgl.dpsgd`): ``sigma = z_t Delta``, Delta = ``req.sensitivity`` or ``req.clip``.
        Clients hold disjoint records, so step ``step`` of every client is one release (parallel
        composition, McSherry 2009): the first call with a new, larger ``step`` counts it, later
        calls for the same step do not.  ``contributors`` > 1: the step's results leave the clients
        only as one secure sum of that many (a one-step SGD update averaged by the protocol), so in
        distributed placement each adds ``sigma / sqrt(max(1, n - dropouts - colluders))``, as in an
        exchange.  Whoever holds the records draws the noise (:meth:`local_noise` in process; a
        client runtime from its own keystream)."""
        if step > self._local_step.get(tag, -1):
            st, sens, sigma = self._begin(tag, step, req, req.clip)
            self._local_step[tag] = int(step)
            self._commit(tag, st, sens, req, sigma)
        else:
            sigma = self._tags[tag].noise_multiplier * float(req.sensitivity or req.clip)
        self._local_shares[tag] = int(contributors)
        return float(self._client_std(sigma, contributors)) if contributors > 1 else sigma

    def local_noise(self, tag: str, step: int, size: int, req: DPRequest, *, contributors: int = 1) -> np.ndarray:
        """Noise of size ``size`` for release ``step`` of ``tag`` at the std :meth:`local_release`
        gives, from this engine's OS-keyed keystream."""
        return gaussian_noise(self._noise, self.local_release(tag, step, req, contributors=contributors), int(size))

    # ------------------------------------------------------------------ exchanges
    def vector_release(self, tag: str, rnd: int, n: int, length: int, req: DPRequest, *,
                       row_len: int | None = None) -> float:
        """Server side of one dense release by ``n`` contributors of ``length``-vectors: check the
        budget, calibrate, count the release; returns each contributor's noise std (the
        contributors add it themselves, :func:`noise_vector`).  ``per_row`` clips consecutive
        slices of ``row_len`` entries; default sensitivity is the client-level bound C (whole)
        or C sqrt(rows) (per row)."""
        if req.per_row:
            if not row_len or length % row_len:
                raise ConfigurationError("per_row clipping needs a row structure this exchange does not have; "
                                         "use DPRequest(per_row=False)", tag=tag, round=rnd)
            default = req.clip * math.sqrt(length // row_len)
        else:
            default = req.clip
        st, sens, sigma = self._begin(tag, rnd, req, default)
        std = float(self._client_std(sigma, n))
        if req.integer and self.config.placement == "distributed":
            std = max(std, MIN_CLIENT_DGAUSS_STD)
        self._commit(tag, st, sens, req, std * math.sqrt(n))
        return std

    def privatize_vectors(self, tag: str, rnd: int, flat: dict[int, np.ndarray], req: DPRequest, *,
                          row_len: int | None = None) -> dict[int, np.ndarray]:
        """Clip and noise each client's 1-D contribution to a dense sum (:meth:`vector_release`,
        then every client's :func:`noise_vector`, all in this process)."""
        if not flat:
            return {}
        std = self.vector_release(tag, rnd, len(flat), next(iter(flat.values())).size, req, row_len=row_len)
        return {k: noise_vector(self._noise, v, req, std, row_len=row_len) for k, v in flat.items()}

    def row_release(self, tag: str, rnd: int, counts: np.ndarray, req: DPRequest) -> np.ndarray:
        """Server side of one row-keyed release: ``counts[r]`` clients upload row ``r`` (0: nobody).
        Checks the budget, calibrates, counts the release; returns each uploader's noise std per
        row (distributed placement divides the variance by the row's uploaders).  ``per_row=True``
        needs an explicit sensitivity (edge- or node-level, see module docstring)."""
        st, sens, sigma = self._begin(tag, rnd, req, None if req.per_row else req.clip)
        counts = np.asarray(counts, dtype=np.int64)
        std = self._client_std(sigma, counts)
        if req.integer and self.config.placement == "distributed":
            std = np.maximum(std, MIN_CLIENT_DGAUSS_STD)
        up = counts > 0
        self._commit(tag, st, sens, req, float(np.max(std[up] * np.sqrt(counts[up]))) if up.any() else 0.0)
        return std

    def privatize_rows(self, tag: str, rnd: int, ids: dict[int, np.ndarray], rows: dict[int, np.ndarray],
                       num_rows: int, req: DPRequest, layout: str) -> dict[int, np.ndarray]:
        """Clip and noise each client's rows of a row-keyed sum (:meth:`row_release`, then every
        client's :func:`noise_rows`, all in this process).  ``ids``/``rows`` are what each client
        uploads (the caller expands them to whole transport blocks, so padding rows get noise too)."""
        counts = np.zeros(int(num_rows), dtype=np.int64)
        for k in ids:
            counts[np.asarray(ids[k], dtype=np.int64)] += 1
        std = self.row_release(tag, rnd, counts, req)
        return {k: noise_rows(self._noise, r, req, std[np.asarray(ids[k], dtype=np.int64)])
                for k, r in rows.items()}

    def mean_request(self, tag: str, rnd: int, req: DPRequest, spec: ValueSpec, *, nrows: int = 1,
                     weighted: bool = False) -> tuple[DPRequest, ValueSpec, float | None]:
        """Server side of a DP weighted mean (module docstring, "weighted_mean"): the request and
        spec of the sum of the clipped contributions (:func:`clip_mean_value`; the request has
        ``clip=inf`` and the sensitivity set) and ``weight_scale``, ``None`` for an unweighted
        mean (divide by the number of contributors) else the factor C the weight coordinate
        was scaled by.  ``nrows``: rows of a contribution (``per_row`` clipping)."""
        C = float(req.clip)
        if not math.isfinite(C):
            raise ConfigurationError("a DP mean needs a finite clip bound on each client's values",
                                     tag=tag, round=rnd)
        self._mean_clip[tag] = C
        if not weighted:
            sens = C * math.sqrt(nrows) if req.per_row else C
            return (dataclasses.replace(req, clip=math.inf, per_row=False, sensitivity=req.sensitivity or sens),
                    dataclasses.replace(spec, max_abs=min(spec.max_abs, C)), None)
        sens = C * math.sqrt(nrows + 1) if req.per_row else math.sqrt(2.0) * C
        return (dataclasses.replace(req, clip=math.inf, per_row=False, sensitivity=req.sensitivity or sens),
                dataclasses.replace(spec, max_abs=C), C)

    def mean_contributions(self, tag: str, rnd: int, arrays: dict[int, np.ndarray],
                           weights: dict[int, float] | None, req: DPRequest, spec: ValueSpec
                           ) -> tuple[dict[int, np.ndarray], DPRequest, ValueSpec, float | None]:
        """Client-side inputs of a DP weighted mean, every client in this process: returns
        ``(flat, request for the sum, spec for the sum, weight_scale)`` (:meth:`mean_request`),
        the flat vectors already clipped."""
        shape = next(iter(arrays.values())).shape
        nrows = shape[0] if len(shape) else 1
        dp_sum, spec_sum, wscale = self.mean_request(tag, rnd, req, spec, nrows=nrows, weighted=weights is not None)
        if weights is None:
            return {k: clip_mean_value(a, req, nrows) for k, a in arrays.items()}, dp_sum, spec_sum, None
        flat = {k: weighted_mean_value(a, weights[k], req, nrows, tag=tag, rnd=rnd) for k, a in arrays.items()}
        return flat, dp_sum, spec_sum, wscale

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Plain-data state: allocation, per-tag calibration and release counts, accountant
        (a resumed run continues the same budget; the noise key is not part of it)."""
        return {"config": dataclasses.asdict(self.config), "shares": dict(self._shares), "frozen": self._frozen,
                "tags": {t: dataclasses.asdict(st) for t, st in self._tags.items()},
                "mean_clip": dict(self._mean_clip), "last_std": self.last_std, "local_step": dict(self._local_step),
                "replayed_releases": self.replayed_releases, "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict, ledger: dict | None = None) -> None:
        """Resume from a checkpoint's ``state``.  ``ledger`` is the latest :attr:`on_release`
        state: releases it holds beyond the checkpoint left the client before a crash, and their
        rounds run again after the resume, so the accountant keeps them (the run ends with more
        releases than planned, reported as ``replayed_releases``; epsilon counts them all)."""
        for st in (state, ledger or state):
            saved = {k: st["config"][k] for k in ("epsilon", "delta", "placement", "accountant")}
            mine = {k: getattr(self.config, k) for k in saved}
            if saved != mine:
                raise ConfigurationError(f"checkpoint DP settings {saved} differ from this run's {mine}; "
                                         "resume with the same --dp-* options")
        def releases(st: dict) -> int:
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
    def report(self) -> dict:
        """The accountant's report plus the budget, placement and per-tag calibration."""
        rep = self.accountant.report()
        rep["epsilon_budget"] = self.config.epsilon
        rep["placement"] = self.config.placement
        rep["replayed_releases"] = self.replayed_releases
        for tag, st in self._tags.items():
            entry = rep["per_tag"].setdefault(tag, {"epsilon": 0.0, "releases": 0,
                                                    "noise_multiplier": st.noise_multiplier,
                                                    "sensitivity": None})
            entry.update({"epsilon_budget": st.epsilon, "planned_releases": st.releases,
                          "clip": st.clip, "integer": st.integer})
            if tag in self._local_shares:
                entry["noise_shares"] = self._local_shares[tag]
        return rep
