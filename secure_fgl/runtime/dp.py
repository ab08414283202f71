"""Differential privacy on the client runtimes: clipping and noise where the data is, one accountant with the strategy.

The mechanism is :mod:`protocols.dp`'s, split between the parties:

* **client** (its :class:`~.client.ClientRuntime`): clips its contribution when it computes it
  (``contribute``), then, on ``privatize``, adds its share of the Gaussian (or, for integer
  exchanges, discrete Gaussian) noise to the contribution it keeps for its protocol half --
  drawn from its **own** :class:`protocols.csprng.SecureRandom` (an OS-keyed keystream made in
  the runtime, never the run seed, never leaving it) -- before anything is encoded;
* **strategy** (the driver): the run's one :class:`protocols.dp.DPEngine` calibrates each tag,
  composes every release in the accountant and writes the DP ledger
  (:meth:`~protocols.dp.DPEngine.vector_release`,
  :meth:`~protocols.dp.DPEngine.row_release`), then tells each contributor the std of its
  share: ``sigma`` (``local`` placement) or ``sigma / sqrt(max(1, n - d - c))``
  (``distributed``, n the contributors of the sum -- per row for row sums -- d = ``--dp-dropouts``,
  c = ``--dp-colluders``).

The release is counted before the noise call (conservative: a release counts even if the
exchange then fails).  A contributor lost *after* its share was sized and before its noisy
upload is a dropout of that release: with ``distributed`` placement the others' shares were
sized for it, so the exchange stops with :class:`protocols.DropoutError` naming it (nothing was
uploaded; ``--resume`` repeats the round); dropouts *inside* the exchange keep the backend's
``--dp-dropouts`` semantics (mask refuses more than d).  With ``local`` placement every share is
the full sigma and the survivors go on.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from protocols import DPRequest, DropoutError, PrivacyBudgetError, Protocol
from protocols.csprng import SecureRandom
from protocols.dp import gaussian_noise, grid_bits_of, noise_rows, noise_vector

from .messages import MessageError, PrivatizeIns


def request_fields(req: DPRequest, spec) -> dict:
    """What a client needs of a release's :class:`DPRequest` to clip and noise.

    The :class:`~.messages.PrivatizeIns` fields, with the grid a continuous release is rounded to
    (:func:`protocols.dp.grid_bits_of`).
    """
    return {
        "clip": float(req.clip),
        "per_row": bool(req.per_row),
        "integer": bool(req.integer),
        "grid_bits": grid_bits_of(spec, req),
    }


def request_of(req: PrivatizeIns) -> DPRequest:
    """The :class:`~protocols.dp.DPRequest` of a request's DP fields."""
    return DPRequest(clip=float(req.clip), per_row=bool(req.per_row), integer=bool(req.integer))


# ---------------------------------------------------------------- client side
class ClientNoise:
    """One client's noise source and the step that noises its kept contribution."""

    def __init__(self):
        self._rng: SecureRandom | None = None

    @property
    def rng(self) -> SecureRandom:
        """This client's noise generator, keyed from the OS CSPRNG on first use."""
        if self._rng is None:  # keyed by os.urandom(32) on first use, in this process
            self._rng = SecureRandom()
        return self._rng

    @staticmethod
    def checked_std(std, tag: str, rnd: int) -> np.ndarray:
        """The std the server asked for, refused unless positive and finite (no noise-free release)."""
        std = np.asarray(std, dtype=np.float64)
        if not (np.all(np.isfinite(std)) and np.all(std > 0)):
            raise PrivacyBudgetError(
                "a DP release needs noise of a positive, finite std; this client refuses to upload without it",
                tag=tag,
                round=int(rnd),
            )
        return std

    def gaussian(self, std: float, size: int, tag: str, rnd: int) -> np.ndarray:
        """``size`` draws of N(0, std^2) for a release this client noises alone (a DP-SGD step)."""
        return gaussian_noise(self.rng, float(self.checked_std(std, tag, rnd)), int(size))

    def privatize(self, kept: tuple, req: PrivatizeIns) -> tuple:
        """``kept`` (a dense vector, or row ids and rows) clipped and noised as ``req`` says."""
        dp, std = request_of(req), self.checked_std(req.std, req.tag, req.round)
        if len(kept) == 1:
            return (noise_vector(self.rng, kept[0], dp, float(std), row_len=req.row_len, grid_bits=req.grid_bits),)
        if req.blocks is None or req.rpb is None or req.num_rows is None or req.layout is None:
            raise MessageError(f"the noising of the row sum {req.tag!r} without its blocks, rpb, num_rows, layout")
        ids, rows = kept
        rpb, num_rows = int(req.rpb), int(req.num_rows)
        ids, rows = Protocol._expand_to_blocks({0: np.asarray(ids)}, {0: np.asarray(rows)}, rpb, num_rows, req.layout)
        ids, rows = ids[0], rows[0]  # every row of the blocks it uploads gets noise
        blocks = np.asarray(req.blocks, dtype=np.int64)
        row_std = std[np.searchsorted(blocks, ids // rpb)]
        return ids, noise_rows(self.rng, rows, dp, row_std, grid_bits=req.grid_bits)


# ---------------------------------------------------------------- server side
def _check_lost(strategy, tag: str, rnd: int, asked, answered) -> list[int]:
    gone = sorted(set(asked) - set(answered))
    if gone and strategy.protocol.dp.config.placement == "distributed":
        raise DropoutError(
            f"client(s) {gone} were lost after their share of the distributed DP noise of {tag} was "
            "sized; the other contributors' shares are short of it, so nothing is uploaded. "
            "Run again with --resume",
            tag=tag,
            round=rnd,
        )
    return sorted(answered)


def for_spec(req: DPRequest, spec) -> DPRequest:
    """Integer exchanges get integer (discrete Gaussian) noise (as :meth:`Protocol._sum_vectors`)."""
    return dataclasses.replace(req, integer=True) if spec.integer and not req.integer else req


def privatize_dense(
    strategy, tag: str, rnd: int, contributors, length: int, req: DPRequest, spec, *, row_len: int | None = None
) -> tuple[list[int], float, object]:
    """Count one dense release and have every contributor noise its kept vector.

    Count one dense release in the run's accountant and have every contributor noise its kept
    vector; returns the contributors still there, the std of the noise in the sum and the spec
    the sum is encoded with (:meth:`protocols.base.Protocol.release_spec`).
    """
    dp, req = strategy.protocol.dp, for_spec(req, spec)
    spec = strategy.protocol.release_spec(spec, req)
    std = dp.vector_release(
        tag, rnd, len(contributors), length, req, row_len=row_len, grid_bits=grid_bits_of(spec, req)
    )
    ask = PrivatizeIns(tag, rnd, std, row_len=row_len, **request_fields(req, spec))
    done = strategy.ask("privatize", {k: ask for k in contributors})
    return _check_lost(strategy, tag, rnd, contributors, done), dp.last_std, spec


def privatize_row_sum(
    strategy,
    tag: str,
    rnd: int,
    blocks: dict[int, np.ndarray],
    rpb: int,
    num_rows: int,
    layout: str,
    req: DPRequest,
    spec,
    dim: int,
) -> tuple[list[int], float]:
    """Count one row-sum release and have every contributor noise its rows.

    The same for a row sum of ``dim``-wide rows: ``blocks[k]`` are the blocks client k uploads;
    each of their rows gets noise sized by the number of clients uploading that block (``spec``:
    the release spec the caller sized its blocks with).
    """
    num_blocks = -(-num_rows // rpb)
    per_block = np.zeros(num_blocks, dtype=np.int64)
    for b in blocks.values():
        per_block[np.asarray(b, dtype=np.int64)] += 1
    dp, req = strategy.protocol.dp, for_spec(req, spec)
    row_std = dp.row_release(
        tag, rnd, np.repeat(per_block, rpb)[:num_rows], req, row_len=dim, grid_bits=grid_bits_of(spec, req)
    )
    block_std = row_std[::rpb]
    done = strategy.ask(
        "privatize",
        {
            k: PrivatizeIns(
                tag,
                rnd,
                block_std[np.asarray(b, dtype=np.int64)],
                blocks=np.asarray(b, dtype=np.int64),
                rpb=rpb,
                num_rows=num_rows,
                layout=layout,
                **request_fields(req, spec),
            )
            for k, b in blocks.items()
        },
    )
    return _check_lost(strategy, tag, rnd, blocks, done), dp.last_std
