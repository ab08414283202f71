"""A client's row-sum contribution as blocks, materialised block range by block range.

:meth:`protocols.base.Protocol.row_sum` lays a client's ``m`` rows (global ids, width ``d``)
out in blocks of ``rpb`` consecutive row ids; a block holds ``rpb * d`` values, zeros for the
rows the client does not contribute.  Materialising every block of every client at once
costs ``K * blocks * rpb * d`` floats -- at 1e6 nodes, 16 features and 10 clients touching
nearly every block, 10 dense copies of the graph's rows.  :class:`BlockRows` keeps the
compact rows and builds the dense blocks only for the block range a backend reads
(``values[i0:i1]``: the CKKS backend encrypts chunk by chunk), so memory holds one chunk of
dense blocks at a time.  ``np.asarray(values)`` still gives the whole ``[blocks, rpb * d]``
array for backends that read everything at once.

The way back: a recipient decrypts whole blocks but needs only the rows it asked for.
:class:`RowSelection` locates those rows in its blocks, so a client half keeps each block's
requested rows as the block is decoded (the rest of the block is dropped at once) and the
caller assembles them in request order.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView
from typing import Any

import numpy as np
import numpy.typing as npt


class BlockRows:
    """Lazy ``[len(block_ids), rpb * dim]`` view of sparse rows (module doc).

    block_ids: sorted ids of the blocks (each block covers row ids ``[b rpb, (b + 1) rpb)``);
    row_ids:   global row id of each row of ``rows`` (unique, inside those blocks);
    rows:      ``[m, dim]``, any real dtype (integer counts stay compact; blocks are float64).
    """

    ndim = 2
    dtype = np.dtype(np.float64)

    def __init__(self, block_ids: np.ndarray, row_ids: np.ndarray, rows: np.ndarray, rows_per_block: int):
        self.block_ids = np.asarray(block_ids, dtype=np.int64)
        self.rpb = int(rows_per_block)
        self.dim = int(rows.shape[1])
        row_ids = np.asarray(row_ids, dtype=np.int64)
        index = np.int32 if max(row_ids.size, int(row_ids.max(initial=0)) + 1) < 2**31 else np.int64
        self._order = np.argsort(row_ids, kind="stable").astype(index)  # int32: half the index memory
        self._sorted_ids = row_ids[self._order].astype(index)
        self._rows = rows

    @property
    def shape(self) -> tuple[int, int]:
        """(blocks, rows per block * dim) of the table these rows form."""
        return (int(self.block_ids.size), self.rpb * self.dim)

    def __len__(self) -> int:
        return int(self.block_ids.size)

    def _dense(self, i0: int, i1: int, dtype: npt.DTypeLike = np.float64) -> np.ndarray:
        """Blocks ``i0..i1-1`` as a dense array.

        Blocks ``i0..i1-1`` (positions in ``block_ids``) as ``[i1 - i0, rpb * dim]``, built in
        ``dtype`` (each value rounded once, as a float64 block cast to it would be).
        """
        bids = self.block_ids[i0:i1]
        out = np.zeros((bids.size, self.rpb, self.dim), dtype=dtype)
        if bids.size:
            lo, hi = np.searchsorted(self._sorted_ids, [bids[0] * self.rpb, (bids[-1] + 1) * self.rpb])
            ids = self._sorted_ids[lo:hi]
            pos = np.searchsorted(bids, ids // self.rpb)
            out[pos, ids % self.rpb] = self._rows[self._order[lo:hi]]
        return out.reshape(bids.size, self.rpb * self.dim)

    def __getitem__(self, key: Any) -> np.ndarray:
        n = len(self)
        if isinstance(key, slice):
            i0, i1, step = key.indices(n)
            dense: np.ndarray = self._dense(i0, max(i0, i1)) if step == 1 else np.asarray(self)[key]
            return dense
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if int(key) < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"block {key} out of range for {n} blocks")
            block: np.ndarray = self._dense(i, i + 1)[0]
            return block
        out: np.ndarray = np.asarray(self)[key]
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return self._dense(0, len(self), np.float64 if dtype is None else dtype)

    def astype(self, dtype: npt.DTypeLike) -> np.ndarray:
        """The rows as a dense array of ``dtype``."""
        return np.asarray(self, dtype=dtype)


class ReadableRows:
    """Recipient to ``(row ids, totals)`` of every row of the blocks it decrypted.

    Recipient -> ``(row ids, totals)`` of every row of the blocks it decrypted
    (:attr:`protocols.base.Protocol.last_readable`), built when asked for from the decoded blocks
    the recipients share, instead of one dense copy per recipient held at once.
    """

    def __init__(
        self,
        received: dict[int, dict[int, np.ndarray]],
        requested_blocks: dict[int, np.ndarray],
        rows_per_block: int,
        dim: int,
        num_rows: int,
    ):
        self._received, self._blocks = received, requested_blocks
        self.rpb, self.dim, self.num_rows = int(rows_per_block), int(dim), int(num_rows)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        bids = np.asarray(self._blocks[k])
        rows = (bids[:, None] * self.rpb + np.arange(self.rpb)[None, :]).ravel()
        keep = rows < self.num_rows
        if not bids.size:
            return rows[keep], np.zeros((0, self.dim))
        stacked = np.stack([self._received[k][int(b)] for b in bids]).reshape(bids.size * self.rpb, self.dim)
        return rows[keep], stacked[keep]

    def pop(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The entry of ``k``, then forget it (the caller keeps its own copy)."""
        value = self[k]
        del self._blocks[k]
        return value

    def __contains__(self, k: object) -> bool:
        return k in self._blocks

    def __iter__(self) -> Iterator[int]:
        return iter(self._blocks)

    def __len__(self) -> int:
        return len(self._blocks)

    def keys(self) -> KeysView[int]:
        """The block ids held."""
        return self._blocks.keys()

    def items(self) -> Iterator[tuple[int, tuple[np.ndarray, np.ndarray]]]:
        """(block id, block) pairs, each block read on demand."""
        return ((k, self[k]) for k in self._blocks)


class RowSelection:
    """The rows a recipient asked for, located in its blocks of ``rpb`` rows of width ``dim``.

    ``take(b, block)`` keeps the requested rows of decoded block ``b`` (``[rpb * dim]`` values ->
    ``[n_b * dim]``, rows in increasing id order), in the narrowest integer dtype that holds them
    exactly when every value is an integer (:func:`exact_integers`: counts of binary features,
    the FedGCN neighbour sums of Photo, CS, Physics, keep 2 bytes a value instead of 8 while every
    recipient waits for its totals); it is idempotent (a block already taken, or one whose every
    row was requested, passes unchanged).  ``assemble(kept)`` gives the ``[len(rows), dim]``
    float64 totals in request order from the kept blocks.
    """

    def __init__(self, rows: np.ndarray, rows_per_block: int, dim: int):
        self.rows = np.asarray(rows, dtype=np.int64).ravel()
        self.rpb, self.dim = int(rows_per_block), int(dim)
        self._unique = np.unique(self.rows)
        blocks = self._unique // self.rpb
        self.block_ids, starts = np.unique(blocks, return_index=True)
        ends = np.append(starts[1:], self._unique.size)
        self._span = {int(b): (int(s), int(e)) for b, s, e in zip(self.block_ids, starts, ends)}
        self._offsets = self._unique % self.rpb

    def take(self, block_id: int, block: np.ndarray) -> np.ndarray:
        """The requested rows of ``block_id`` from a block that holds either the whole block or just those rows.

        Raises:
            ValueError: the block holds neither.
        """
        s, e = self._span.get(int(block_id), (0, 0))
        block = np.asarray(block)
        if block.size == (e - s) * self.dim:
            return block
        if block.size != self.rpb * self.dim:
            raise ValueError(
                f"block {block_id} holds {block.size} values: neither a whole block "
                f"({self.rpb * self.dim}) nor its {e - s} requested rows"
            )
        return exact_integers(block.reshape(self.rpb, self.dim)[self._offsets[s:e]].ravel())

    def assemble(self, kept: dict[int, np.ndarray]) -> np.ndarray:
        """The requested rows, in request order, from the ``kept`` blocks."""
        if not self.rows.size:
            return np.zeros((0, self.dim))
        unique = np.concatenate([self.take(b, kept[int(b)]) for b in self.block_ids]).reshape(-1, self.dim)
        return unique[np.searchsorted(self._unique, self.rows)].astype(np.float64, copy=False)


def exact_integers(values: np.ndarray) -> np.ndarray:
    """``values`` in the narrowest integer dtype that holds them exactly.

    ``values`` in the narrowest of int8 / int16 / int32 that holds every entry exactly, when
    every entry is an integer (the same numbers in a quarter or less of float64's bytes); else
    ``values`` unchanged.
    """
    if (
        not values.size
        or values.dtype.kind not in "fiu"
        or values.dtype.kind == "f"
        and not np.array_equal(values, np.rint(values))
    ):
        return values
    lo, hi = values.min(), values.max()
    for dtype in (np.int8, np.int16, np.int32):
        info = np.iinfo(dtype)
        if info.min <= lo and hi <= info.max:
            return values.astype(dtype, copy=False)
    return values
