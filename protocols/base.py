"""The protocol interface: every client<->server exchange of every algorithm.

An algorithm never hands a tensor to the server.  It calls one of four exchange
shapes on a :class:`Protocol`; the backend (plain, ckks, mask) encodes each
client's contribution on the client side, records every message in the
:class:`~protocols.transcript.Transcript`, aggregates on the server side using only
what the server may hold, and decodes the result on the recipients' side.

The four shapes (docs/design.md, "Protocol objects"):

1. :meth:`Protocol.weighted_mean` / :meth:`Protocol.weighted_sum` — dense tensors.
   In secure modes the weights are hidden too: a client sends ``[w*v, w]`` and the
   recipients divide after decoding.
2. :meth:`Protocol.row_sum` — row-keyed sums with scoped return (FedGCN).  Rows are
   laid out in fixed blocks of ``rows_per_block`` global row ids; in the ``sparse``
   layout a client uploads only the blocks it touches (the server learns those block
   ids — a documented leak) and each recipient downloads only the blocks holding the
   rows it asks for; in the ``dense`` layout every client uploads every block.
3. :meth:`Protocol.classwise_mean` — class-wise weighted mean with secret weights
   (FedSpray eq. 15): an absent class contributes an encrypted zero row and zero
   weight, indistinguishable from a present one.
4. :meth:`Protocol.central_moments` — two rounds on shape 1 (FedOMD eq. 10): the
   global mean, then the central moments of order 2..J about it.

All shapes reduce to one backend primitive, :meth:`Protocol._aggregate`, a sum of
equal-length blocks with per-recipient block selection.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from . import validate
from .baseline import row_sum_bytes, vector_sum_bytes
from .errors import ConfigurationError, ShapeError
from .exchange import ArrayLike, BlockTable, DPRequest, ExchangeContext, ValueSpec
from .row_blocks import BlockRows, ReadableRows, RowSelection
from .transcript import Transcript

if TYPE_CHECKING:  # the DP settings are injected: dp imports this package's data types
    from .dp import DPConfig, DPEngine

#: tag of the once-per-run registration of the clients' public keys
AUTH_TAG = "auth/keys"


def classwise_vector(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """One client's upload of :meth:`Protocol.classwise_mean`: ``[w * S ([C, d], row-scaled), w ([C])]``."""
    return np.concatenate([(values * weights[:, None]).ravel(), weights])


def classwise_result(total: np.ndarray, C: int, d: int, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """``(mean [C, d], present [C])`` from the summed :func:`classwise_vector`.

    A class is present when its weight total stands above ``threshold``: the encoding error (the
    backend guarantees ``|error| <= spec.tolerance``; CKKS never decodes an exact 0) and, with DP,
    3 noise stds above zero (post-processing; costs no privacy).  A class whose true total weight
    is below ``spec.tolerance`` is therefore reported absent.
    """
    wsum = total[C * d :]
    present = wsum > threshold
    mean = np.zeros((C, d))
    mean[present] = total[: C * d].reshape(C, d)[present] / wsum[present, None]
    return mean, present


class Protocol(ABC):
    """Base of every backend.  Subclasses implement :meth:`_aggregate`.

    Parameters
    ----------
    num_clients: K, the number of clients of the run (ids ``0..K-1``).
    transcript:  where messages are recorded (a fresh one if ``None``).
    dp:          a :class:`protocols.dp.DPConfig` or ``None`` (no DP).
    seed:        the run's public seed, recorded only: keys, masks and DP noise come from the OS
                 CSPRNG (:mod:`protocols.csprng`), never from it.
    """

    mode: str = "base"
    #: kind of the messages a client uploads ('plain' | 'ciphertext' | 'masked')
    upload_kind: str = "plain"

    def __init__(
        self, num_clients: int, *, transcript: Transcript | None = None, dp: DPConfig | None = None, seed: int = 0
    ):
        self.num_clients = validate.count(num_clients, "num_clients", None, None)
        self.transcript = transcript if transcript is not None else Transcript()
        self.seed = int(seed)
        #: the run's DP engine, built by the injected DP settings (``None``: no DP)
        self.dp: DPEngine | None = None if dp is None else dp.engine(self.num_clients, self.mode)
        #: number of the current exchange in this session (bound into every envelope)
        self.exchange = 0

    # ------------------------------------------------------------------ identity
    @property
    def fingerprint(self) -> str:
        """Public fingerprint of the protocol parameters / public context (hex)."""
        return hashlib.sha256(f"{self.mode}:{self.num_clients}".encode()).hexdigest()[:16]

    def block_capacity(self, spec: ValueSpec) -> int:
        """Values one unit of transport carries (one ciphertext); rows are aligned to it."""
        return 1

    def vector_block_capacity(self, spec: ValueSpec, length: int) -> int:
        """Values per block of a dense vector sum of ``length`` values.

        Default: :meth:`block_capacity`; a backend may pick a smaller transport unit that wastes less.
        """
        return self.block_capacity(spec)

    def row_block_capacity(self, spec: ValueSpec, layout: str = "dense") -> int:
        """Values per block of a :meth:`row_sum` in ``layout`` (default: :meth:`block_capacity`).

        A backend may pick a smaller transport unit for the sparse layout, where a client
        pays for every block it touches (finer blocks -> fewer untouched rows paid for).
        """
        return self.block_capacity(spec)

    def rows_per_block(self, spec: ValueSpec, dim: int, num_rows: int, layout: str = "sparse") -> int:
        """Public rows per block of a :meth:`row_sum` with rows of width ``dim``.

        ``max(1, min(num_rows, capacity // dim))``. A function of public shapes only, so callers can plan a row
        numbering aligned to the blocks (FedGCN's ``row_order``).
        """
        return max(1, min(int(num_rows), self.row_block_capacity(spec, layout) // max(1, int(dim))))

    # ------------------------------------------------------------------ shape 1
    def weighted_sum(
        self,
        tag: str,
        rnd: int,
        values: Mapping[int, ArrayLike],
        weights: Mapping[int, float] | None = None,
        *,
        spec: ValueSpec | None = None,
        recipients: Sequence[int] | None = None,
        dp: DPRequest | None = None,
    ) -> np.ndarray:
        """The weighted sum ``sum_k w_k * v_k`` of the clients' values.

        Args:
            tag: The exchange's tag (for example ``fedavg/model``).
            rnd: The round number.
            values: Client id -> its contribution; every contribution has one shape.
            weights: Client id -> ``w_k`` (default: 1 for every client).
            spec: The public bounds of the values (default: ``ValueSpec()``).
            recipients: The clients that receive the sum (default: the contributors).
            dp: The DP request of this release, or None.

        Returns:
            The sum, in the shape of one contribution.
        """
        arrays = self._dense_inputs(tag, rnd, values)
        shape = next(iter(arrays.values())).shape
        w = validate.weights(weights, arrays, tag, rnd)
        flat = {k: (a.ravel() * (1.0 if w is None else w[k])) for k, a in arrays.items()}
        total = self._sum_vectors(
            tag, rnd, flat, spec or ValueSpec(), recipients, dp, row_len=int(np.prod(shape[1:])) if len(shape) else 1
        )
        return total.reshape(shape)

    def weighted_mean(
        self,
        tag: str,
        rnd: int,
        values: Mapping[int, ArrayLike],
        weights: Mapping[int, float] | None = None,
        *,
        spec: ValueSpec | None = None,
        recipients: Sequence[int] | None = None,
        dp: DPRequest | None = None,
    ) -> np.ndarray:
        """``sum_k w_k v_k / sum_k w_k``.

        Each client sends ``[w_k v_k, w_k]`` in one
        message, so in secure modes the server learns neither values nor weights.

        With DP (``dp`` given and the run has a DP config) the weight is private too:
        unweighted, each client sends ``clip(v_k)`` and the recipients divide by the
        (public) number of contributors; weighted, each sends ``[w~ clip(v_k), w~ C]`` with
        ``w~ = min(w_k, W)/W`` (``W = dp.weight_bound``), noised with sensitivity
        ``sqrt(2) C`` — see :mod:`protocols.dp`.

        Args:
            tag: The exchange's tag (for example ``fedavg/model``).
            rnd: The round number.
            values: Client id -> its contribution; every contribution has one shape.
            weights: Client id -> ``w_k`` (default: 1 for every client).
            spec: The public bounds of the values (default: ``ValueSpec()``).
            recipients: The clients that receive the mean (default: the contributors).
            dp: The DP request of this release, or None.

        Returns:
            The mean, in the shape of one contribution.

        Raises:
            ConfigurationError: The weights sum to zero.
        """
        dp = self._dp_in_scope(tag, dp)
        arrays = self._dense_inputs(tag, rnd, values)
        shape = next(iter(arrays.values())).shape
        w = validate.weights(weights, arrays, tag, rnd) or {k: 1.0 for k in arrays}
        spec = spec or ValueSpec()
        if self.dp is not None and dp is not None:
            flat, dp_sum, spec_sum, wscale = self.dp.mean_contributions(
                tag, rnd, arrays, None if weights is None else w, dp, spec
            )
            total = self._sum_vectors(tag, rnd, flat, spec_sum, recipients, dp_sum)
            if wscale is None:
                return (total / len(arrays)).reshape(shape)
            # post-processing: noise must not make the weight total <= 0 (floor = its noise std)
            denom: float = max(total[-1], self.dp.last_std) / wscale
            return (total[:-1] / denom).reshape(shape)
        flat = {k: np.concatenate([a.ravel() * w[k], [w[k]]]) for k, a in arrays.items()}
        total = self._sum_vectors(tag, rnd, flat, spec, recipients, dp)
        denom = total[-1]
        if not denom > 0:
            raise ConfigurationError(
                "the weights sum to zero; give at least one client a positive weight", tag=tag, round=rnd
            )
        return (total[:-1] / denom).reshape(shape)

    # ------------------------------------------------------------------ shape 2
    def row_sum(
        self,
        tag: str,
        rnd: int,
        contributions: Mapping[int, tuple[ArrayLike, ArrayLike]],
        requests: Mapping[int, ArrayLike],
        num_rows: int,
        *,
        layout: str = "sparse",
        spec: ValueSpec | None = None,
        dp: DPRequest | None = None,
        readable: bool = True,
    ) -> dict[int, np.ndarray]:
        """Row-keyed sum with scoped return.

        A recipient decrypts whole blocks, so it also reads the totals of the other rows of its
        blocks: with ``readable`` :attr:`last_readable` holds, per recipient, ``(row ids, totals)``
        of every row it read (what a curious client can use; the float32 baseline counts only the
        requested rows).  ``readable=False``: each recipient keeps only its requested rows of
        every block as the block is decoded (:class:`~protocols.row_blocks.RowSelection`) and
        :attr:`last_readable` is empty -- the memory of one copy of the requested rows instead of
        whole blocks per recipient; the sums are the same.

        Args:
            tag: The exchange's tag (for example ``fedgcn/neighbour_sums``).
            rnd: The round number.
            contributions: Client -> ``(row ids [m], rows [m, d])``, global row ids.
            requests: Client -> the row ids it receives.
            num_rows: The number of global rows.
            layout: ``sparse`` (a client uploads the blocks it touches) or ``dense`` (every block).
            spec: The public bounds of the values (default: ``ValueSpec()``).
            dp: The DP request of this release, or None.
            readable: Keep what each recipient could read in :attr:`last_readable`.

        Returns:
            Client -> ``[len(request), d]`` totals, in the order of its request.

        Raises:
            ConfigurationError: ``layout`` is neither ``sparse`` nor ``dense``.
            ShapeError: A contribution's row width differs from the others', or its row ids repeat.
        """
        validate.exchange(tag, rnd)
        num_rows = validate.count(num_rows, "num_rows", tag, rnd)
        dp = self._dp_in_scope(tag, dp)
        if layout not in ("sparse", "dense"):
            raise ConfigurationError(f"layout must be 'sparse' or 'dense', got {layout!r}", tag=tag, round=rnd)
        spec = self.release_spec(spec or ValueSpec(), dp)
        self.last_readable: Mapping[int, tuple[np.ndarray, np.ndarray]] | ReadableRows = {}
        ids_np: dict[int, np.ndarray] = {}
        rows_np: dict[int, np.ndarray] = {}
        dim: int | None = None
        for k, item in validate.contributions(contributions, self.num_clients, tag, rnd).items():
            ids, rows = validate.row_contribution(item, num_rows, tag, rnd, k)
            if dim is None:
                dim = rows.shape[1]
            if rows.shape[1] != dim:
                raise ShapeError(
                    f"row width {rows.shape[1]} differs from the other clients' {dim}", tag=tag, round=rnd, client=k
                )
            if np.unique(ids).size != ids.size:
                raise ShapeError("row ids must be unique within a contribution", tag=tag, round=rnd, client=k)
            ids_np[k], rows_np[k] = ids, rows
        assert dim is not None  # validate.contributions refuses an empty mapping
        req_rows = {
            k: validate.row_ids(r, num_rows, tag, rnd, k, "requested row ids")
            for k, r in validate.contributions(requests, self.num_clients, tag, rnd, "requests").items()
        }
        up, down = row_sum_bytes(
            {k: i.size for k, i in ids_np.items()}, {k: r.size for k, r in req_rows.items()}, dim, num_rows, layout
        )
        rpb = self.rows_per_block(spec, dim, num_rows, layout)
        num_blocks = -(-num_rows // rpb)
        block_len = rpb * dim
        if self.dp is not None and dp is not None:
            if spec.integer and not dp.integer:
                dp = replace(dp, integer=True)
            # DP noise goes on every row a client uploads (whole blocks), not only the rows it holds
            ids_np, rows_np = self._expand_to_blocks(ids_np, rows_np, rpb, num_rows, layout)
            rows_np = self.dp.privatize_rows(tag, rnd, ids_np, rows_np, num_rows, dp, layout, spec=spec)
        tables = {}
        for k in ids_np:  # dense blocks built chunk by chunk when a backend reads them
            bids = np.arange(num_blocks) if layout == "dense" else np.unique(ids_np[k] // rpb)
            tables[k] = BlockTable(bids, BlockRows(bids, ids_np[k], rows_np[k], rpb))  # type: ignore[arg-type]  # duck-types ndarray
        req_blocks = {
            k: (np.arange(num_blocks) if layout == "dense" else np.unique(r // rpb)) for k, r in req_rows.items()
        }
        selections = {k: RowSelection(r, rpb, dim) for k, r in req_rows.items()}
        ctx = ExchangeContext(
            tag,
            rnd,
            spec,
            tables,
            req_blocks,
            num_blocks,
            block_len,
            layout,
            dp_noise_std=self.dp.last_std if (self.dp is not None and dp is not None) else 0.0,
            float32_bytes=(sum(up.values()), sum(down.values())),
            keep=None if readable else selections,
        )
        received = self._run(ctx)  # recipient -> {block id -> decoded block, or its kept rows}
        out = {k: sel.assemble(received[k]) for k, sel in selections.items()}
        if readable:
            self.last_readable = ReadableRows(received, dict(req_blocks), rpb, dim, num_rows)
        return out

    # ------------------------------------------------------------------ shape 3
    def classwise_mean(
        self,
        tag: str,
        rnd: int,
        values: Mapping[int, ArrayLike],
        weights: Mapping[int, ArrayLike],
        *,
        spec: ValueSpec | None = None,
        recipients: Sequence[int] | None = None,
        dp: DPRequest | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Class-wise weighted mean with secret weights (FedSpray eq. 15).

        values:  client -> ``[C, d]`` (rows of absent classes are ignored: sent as zeros);
        weights: client -> ``[C]`` non-negative class weights (e.g. class counts).
        Returns ``(mean [C, d], present [C] bool)``; a class no client holds gets a zero
        row and ``present=False``.  Only the recipients learn the totals.
        """
        dp = self._dp_in_scope(tag, dp)
        arrays = self._dense_inputs(tag, rnd, values)
        class_weights = validate.per_client(weights, arrays, "class weights", tag, rnd)
        flat = {}
        for k, a in arrays.items():
            if a.ndim != 2:
                raise ShapeError(f"class values must be [C, d], got {a.shape}", tag=tag, round=rnd, client=k)
            w = validate.real_array(class_weights[k], tag, rnd, k, "class weights").ravel()
            if w.shape != (a.shape[0],):
                raise ShapeError(f"class weights must be [{a.shape[0]}], got {w.shape}", tag=tag, round=rnd, client=k)
            if (w < 0).any():
                raise ShapeError("class weights must be non-negative", tag=tag, round=rnd, client=k)
            flat[k] = classwise_vector(a, w)
        C, d = next(iter(arrays.values())).shape
        total = self._sum_vectors(tag, rnd, flat, spec or ValueSpec(), recipients, dp)
        noise_std = self.dp.last_std if (self.dp is not None and dp is not None) else 0.0
        return classwise_result(total, C, d, max((spec or ValueSpec()).tolerance, 3.0 * noise_std))

    # ------------------------------------------------------------------ shape 4
    def central_moments(
        self,
        tag: str,
        rnd: int,
        samples: Mapping[int, ArrayLike],
        orders: Sequence[int] = (2, 3, 4, 5),
        *,
        spec: ValueSpec | None = None,
        dp: DPRequest | None = None,
    ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Two-round pooled statistics (FedOMD eq. 10).

        Round 1 (tag ``<tag>/mean``): each client sends ``[sum_i x_i, n_k]`` via
        :meth:`weighted_mean` of its local means weighted by ``n_k``; recipients get
        the global mean ``mu``.  Round 2 (tag ``<tag>/moments``): each client sends
        ``[n_k * m_j^(k), n_k]`` with ``m_j^(k) = mean_i (x_i - mu)^j`` for every
        order ``j``; recipients get the pooled central moments ``E[(x - mu)^j]``.
        Returns ``(mu [d], {j: [d]})``.
        """
        validate.exchange(tag, rnd)
        orders = validate.moment_orders(orders, tag, rnd)
        arrays = {}
        for k, a in validate.contributions(samples, self.num_clients, tag, rnd, "samples").items():
            a = validate.real_array(a, tag, rnd, k, "samples", allow_empty=True)
            if a.ndim != 2 or a.shape[1] == 0:
                raise ShapeError(f"samples must be [n_k, d >= 1], got {a.shape}", tag=tag, round=rnd, client=k)
            arrays[k] = a
        counts = {k: float(a.shape[0]) for k, a in arrays.items()}
        means = {k: a.mean(axis=0) if a.shape[0] else np.zeros(a.shape[1]) for k, a in arrays.items()}
        mu = self.weighted_mean(f"{tag}/mean", rnd, means, counts, spec=spec, dp=dp)
        stacked = {
            k: np.stack([((a - mu) ** j).mean(axis=0) if a.shape[0] else np.zeros(a.shape[1]) for j in orders])
            for k, a in arrays.items()
        }
        mom = self.weighted_mean(f"{tag}/moments", rnd, stacked, counts, spec=spec, dp=dp)
        return mu, {j: mom[i] for i, j in enumerate(orders)}

    # ------------------------------------------------------------------ internals
    def _dense_inputs(self, tag: str, rnd: int, values: Mapping[int, ArrayLike]) -> dict[int, np.ndarray]:
        """Validated float64 copies of the equal-shaped contributions of known clients.

        Validated float64 copies of equal-shaped contributions of known clients (and a valid
        tag and round: every dense exchange starts here).
        """
        validate.exchange(tag, rnd)
        arrays, shape = {}, None
        for k, v in validate.contributions(values, self.num_clients, tag, rnd).items():
            a = validate.real_array(v, tag, rnd, k)
            if shape is None:
                shape = a.shape
            elif a.shape != shape:
                raise ShapeError(
                    f"shape {a.shape} differs from the other clients' {shape}", tag=tag, round=rnd, client=k
                )
            arrays[k] = a
        return arrays

    @staticmethod
    def _expand_to_blocks(
        ids: dict[int, np.ndarray], rows: dict[int, np.ndarray], rpb: int, num_rows: int, layout: str
    ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Each client's rows padded with zero rows to the whole blocks it uploads.

        In the dense layout that is every block. Ids are sorted; rows >= num_rows are left out.
        """
        out_ids, out_rows = {}, {}
        for k in ids:
            if layout == "dense":
                full = np.arange(num_rows, dtype=np.int64)
            else:
                bids = np.unique(ids[k] // rpb)
                full = (bids[:, None] * rpb + np.arange(rpb)[None, :]).ravel()
                full = full[full < num_rows]
            vals = np.zeros((full.size, rows[k].shape[1]))
            vals[np.searchsorted(full, ids[k])] = rows[k]
            out_ids[k], out_rows[k] = full, vals
        return out_ids, out_rows

    def _sum_vectors(
        self,
        tag: str,
        rnd: int,
        flat: dict[int, np.ndarray],
        spec: ValueSpec,
        recipients: Sequence[int] | None,
        dp: DPRequest | None,
        *,
        row_len: int | None = None,
    ) -> np.ndarray:
        """Sum 1-D vectors of one length, split into transport blocks; the common result.

        With DP each client clips and noises its vector first (``row_len``: the row
        structure for ``per_row`` clipping).
        """
        dp = self._dp_in_scope(tag, dp)
        spec = self.release_spec(spec, dp)
        if self.dp is not None and dp is not None:
            if spec.integer and not dp.integer:
                dp = replace(dp, integer=True)
            flat = self.dp.privatize_vectors(tag, rnd, flat, dp, row_len=row_len, spec=spec)
        length = next(iter(flat.values())).size
        cap = max(1, self.vector_block_capacity(spec, length))
        num_blocks = max(1, -(-length // cap))
        block_len = min(cap, length) if num_blocks == 1 else cap
        tables = {}
        for k, v in flat.items():
            padded = np.zeros(num_blocks * block_len)
            padded[:length] = v
            tables[k] = BlockTable(np.arange(num_blocks), padded.reshape(num_blocks, block_len))
        recips = list(flat) if recipients is None else validate.recipients(recipients, self.num_clients, tag, rnd)
        ctx = ExchangeContext(
            tag,
            rnd,
            spec,
            tables,
            {r: np.arange(num_blocks) for r in recips},
            num_blocks,
            block_len,
            "dense",
            dp_noise_std=self.dp.last_std if (self.dp is not None and dp is not None) else 0.0,
            float32_bytes=vector_sum_bytes(len(flat), length, len(recips)),
        )
        received = self._run(ctx)
        first = received[recips[0]]
        return np.concatenate([first[b] for b in range(num_blocks)])[:length]

    @staticmethod
    def _check_exchange_id(tag: Any, rnd: Any) -> None:
        """The envelope carries the tag as UTF-8 and the round as a signed 64-bit integer."""
        if not isinstance(rnd, (int, np.integer)) or isinstance(rnd, bool) or not 0 <= int(rnd) < 1 << 63:
            raise ConfigurationError(f"round must be an integer in [0, 2^63), got {rnd!r}")
        if not isinstance(tag, str) or not 0 < len(tag) <= 1024:
            raise ConfigurationError(f"tag must be a non-empty string of at most 1024 characters, got {tag!r:.80}")
        try:
            tag.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(f"tag {tag!r:.80} is not valid UTF-8") from None

    def release_spec(self, spec: ValueSpec, dp: DPRequest | None) -> ValueSpec:
        """The spec a sum is encoded with.

        With distributed DP noise a continuous sum is carried on its public grid, so the released sum is the grid's
        exact integer sum (:func:`protocols.dp.release_spec`).
        """
        if self.dp is None or dp is None:
            return spec
        return self.dp.release_spec(spec, dp)

    def provisioned_dropouts(self, ctx: ExchangeContext) -> float:
        """How many contributors may drop out of ``ctx``'s sum after adding their noise share.

        With distributed DP noise each of the n contributors adds ``sigma / sqrt(max(1, n - d - c))``
        (:mod:`protocols.dp`), sized for ``d = --dp-dropouts``: a sum missing more than d shares would be short of
        noise. Without distributed noise nothing limits it (``inf``).
        """
        config = getattr(self.dp, "config", None)
        if ctx.dp_noise_std > 0 and getattr(config, "placement", "local") == "distributed":
            return float(config.dropouts)  # type: ignore[union-attr]
        return math.inf

    def _dp_in_scope(self, tag: str, dp: DPRequest | None) -> DPRequest | None:
        """The DP request if the run has DP and ``tag`` is in its scope, else ``None``."""
        if dp is None or self.dp is None or not self.dp.config.in_scope(tag):
            return None
        return dp

    def _run(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        """Run the backend and account the exchange's float32 baseline.

        The baseline (:mod:`protocols.baseline`) is the same in every mode, so every mode reports its expansion
        factor against it.
        """
        self._begin_exchange(ctx.tag, ctx.round)
        received = self._aggregate(ctx)
        self.transcript.account_plaintext(ctx.tag, *ctx.float32_bytes)
        return received

    def _begin_exchange(self, tag: str, rnd: int) -> None:
        """Start a new exchange and number it.

        A new exchange: its number is bound into every envelope, so a message of an earlier
        exchange with the same tag and round is a replay.  Every exchange shape calls it once.
        """
        self._check_exchange_id(tag, rnd)
        self.exchange += 1

    @abstractmethod
    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        """Encode, upload, aggregate server-side, download and decode.

        Returns recipient -> {block id -> decoded summed block}.  Must record every
        message in ``self.transcript`` and raise a :class:`ProtocolError` (nothing
        aggregated) on any invalid input.
        """

    # ------------------------------------------------------------------ reporting
    def privacy_report(self) -> dict[str, Any] | None:
        """Epsilon spent per tag and in total (``None`` without DP)."""
        return None if self.dp is None else self.dp.report()
