"""The plain data of one exchange.

Shared by every module of the package (it imports nothing of it but :mod:`.errors`): the public bounds of its values
(:class:`ValueSpec`), how it is privatised (:class:`DPRequest`), one client's blocks (:class:`BlockTable`) and the
exchange as a backend sees it (:class:`ExchangeContext`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigurationError, ShapeError

ArrayLike = Any  # numpy array or torch tensor


@dataclass(frozen=True)
class ValueSpec:
    """Public bounds of one exchange's values — they fix the encoding, never the data.

    max_abs:   bound on ``|entry|`` of any single client's contribution (after weighting).
    integer:   entries are non-negative integers (enables exact packed encodings).
    sum_max:   for integer exchanges, a public bound on every entry of the K-way sum
               (e.g. a degree cap + 1 for neighbour-feature counts).
    tolerance: largest absolute error acceptable in a float sum; backends whose
               computed error bound exceeds it refuse the exchange.
    owner_checked_sum: ``sum_max`` holds whenever every client passes its own check (e.g.
               FedGCN: row v's total counts deg(v) + 1 terms and v's owner refuses a degree
               above the cap).  Encodings then size packed fields from ``sum_max``; without
               it from ``K * max_abs``, the only sum bound K client-checked entries guarantee
               (:func:`protocols.precision.kway_sum_bound`).  For a float exchange it says
               that ``max_abs`` bounds the K-way sum too (packed fixed point,
               :mod:`protocols.ckks.fixed_point`, sizes its fields from it).
    float64_wire: the plain protocol carries these values as float64 instead of float32: set
               by plans whose target error is below float32 resolution
               (:meth:`protocols.precision.MeanPrecision.spec`), so plain computes what the
               secure codecs compute.  The float32 byte baseline is unchanged.
    grid_bits: every contribution is rounded to the public grid ``2^-grid_bits`` on its client
               before it is encoded, and every decoded sum back to it, so every mode returns
               the same sum bit for bit (:meth:`protocols.precision.MeanPrecision.grid_spec`
               plans it; :func:`protocols.fixed_point.to_grid` rounds).  ``None``: no grid.
    """

    max_abs: float = 1e4
    integer: bool = False
    sum_max: int | None = None
    tolerance: float = 1e-4
    owner_checked_sum: bool = False
    float64_wire: bool = False
    grid_bits: int | None = None

    def sum_bound(self, num_clients: int) -> float:
        """Bound on |sum| over ``num_clients`` contributions: the owner-checked ``sum_max``, else max_abs * n."""
        if self.integer and self.sum_max is not None and self.owner_checked_sum:
            return float(self.sum_max)
        return float(self.max_abs) * num_clients


@dataclass
class BlockTable:
    """A client's contribution as blocks of equal length.

    ``ids[i]`` is the global block id of row ``i`` of ``values`` (``[n_blocks, block_len]``).
    """

    ids: np.ndarray
    values: np.ndarray

    @property
    def block_len(self) -> int:
        """Values per block."""
        return int(self.values.shape[1])


@dataclass
class ExchangeContext:
    """Everything a backend needs to run one aggregation."""

    tag: str
    round: int
    spec: ValueSpec
    contributions: dict[int, BlockTable]
    requests: dict[int, np.ndarray]  # client -> sorted block ids it receives
    num_blocks: int
    block_len: int
    layout: str = "dense"  # 'dense' | 'sparse'
    dp_noise_std: float = 0.0  # std of the DP noise already in the values (for bounds)
    float32_bytes: tuple[int, int] = (0, 0)  # (up, down) of the plain protocol (protocols.baseline)
    keep: dict[int, Any] | None = None  # recipient -> the rows of its blocks it keeps (RowSelection)

    def check_requests(self, num_clients: int) -> None:
        """Every recipient is a client and asks only for blocks of this exchange (else ShapeError)."""
        for r, bids in self.requests.items():
            bids = np.asarray(bids)
            if not 0 <= int(r) < num_clients or (bids.size and (bids.min() < 0 or bids.max() >= self.num_blocks)):
                raise ShapeError(
                    f"recipient {r} requests blocks outside [0, {self.num_blocks})",
                    tag=self.tag,
                    round=self.round,
                    client=r,
                )


@dataclass(frozen=True)
class DPRequest:
    """How one exchange is privatised when the run has DP on (see :mod:`protocols.dp`).

    clip:         L2 clip bound applied by the client before noise (``math.inf``: the caller
                  bounded its contributions itself and must give ``sensitivity``);
    per_row:      clip each row (first-axis slice / contributed row) separately instead of
                  the whole contribution;
    sensitivity:  L2 sensitivity of the released *sum*.  Default: ``clip`` for a whole
                  contribution (add/remove one client; ``clip*sqrt(rows)`` per row); a DP
                  weighted mean with weights uses ``sqrt(2)*clip`` (the weight is noised too);
                  :meth:`Protocol.row_sum` with ``per_row`` needs it stated (e.g.
                  ``protocols.dp.edge_level_sensitivity(C)``);
    releases:     how many times this tag is released in the run (for calibration);
    integer:      integer noise (discrete Gaussian) so exact integer encodings stay exact;
                  set automatically when the exchange's ``ValueSpec.integer`` is true;
    weight_bound: public bound W on the weights of a DP weighted mean (weights are clipped
                  to W); needed when any weight exceeds 1.
    """

    clip: float
    per_row: bool = False
    sensitivity: float | None = None
    releases: int = 1
    integer: bool = False
    weight_bound: float | None = None

    def __post_init__(self) -> None:
        for name in ("clip", "sensitivity", "releases", "weight_bound"):
            value = getattr(self, name)
            optional = value is None and name in ("sensitivity", "weight_bound")
            if not optional and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))):
                raise ConfigurationError(f"DPRequest.{name} must be a number, got {type(value).__name__}")
        if not self.clip > 0:
            raise ConfigurationError(f"DPRequest.clip must be > 0 (math.inf: no clipping), got {self.clip!r}")
        if self.sensitivity is not None and not (np.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise ConfigurationError(f"DPRequest.sensitivity must be finite and > 0, got {self.sensitivity!r}")
        if int(self.releases) != self.releases or self.releases < 1:
            raise ConfigurationError(f"DPRequest.releases must be an integer >= 1, got {self.releases!r}")
        if self.weight_bound is not None and not (np.isfinite(self.weight_bound) and self.weight_bound > 0):
            raise ConfigurationError(f"DPRequest.weight_bound must be finite and > 0, got {self.weight_bound!r}")
