"""Client-side checks of the contributions to a block exchange, shared by the encrypted backends."""
from __future__ import annotations

import numpy as np

from .base import BlockTable, ExchangeContext
from .errors import NonFiniteError, ShapeError


def find_violation(values: np.ndarray, lo: float, hi: float, integer: bool) -> tuple[int, float, str] | None:
    """First entry of ``values`` outside ``[lo, hi]`` (or non-integer): ``(flat index, value, why)``."""
    v = np.asarray(values).reshape(-1)
    if integer:
        bad = np.nonzero(v != np.rint(v))[0]
        if bad.size:
            i = int(bad[0])
            return i, float(v[i]), "is not an integer"
    bad = np.nonzero((v < lo) | (v > hi))[0]
    if bad.size:
        i = int(bad[0])
        return i, float(v[i]), ("is below" if v[i] < lo else "is above") + f" the public range [{lo:g}, {hi:g}]"
    return None


def check_block_table(ctx: ExchangeContext, client: int, table: BlockTable,
                      num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, values)`` of ``table`` after checking the client id, the shape, the block ids
    (increasing, in range; every block in the dense layout) and finiteness.  Raises
    :class:`ShapeError` / :class:`NonFiniteError` naming the client; nothing is encrypted."""
    where = dict(tag=ctx.tag, round=ctx.round, client=client)
    if not 0 <= int(client) < num_clients:
        raise ShapeError(f"unknown client id {client}", **where)
    ids, vals = np.asarray(table.ids), np.asarray(table.values)
    if ids.ndim != 1 or vals.shape != (ids.size, ctx.block_len):
        raise ShapeError(f"contribution of shape {vals.shape} with {ids.size} block ids; expected "
                         f"[{ids.size}, {ctx.block_len}]", **where)
    if ids.size and (not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0
                     or ids.max() >= ctx.num_blocks or (np.diff(ids) <= 0).any()):
        raise ShapeError(f"block ids must be increasing integers in [0, {ctx.num_blocks})", **where)
    if ctx.layout == "dense" and not np.array_equal(ids, np.arange(ctx.num_blocks)):
        raise ShapeError("the dense layout needs every block from every client", **where)
    if not np.isfinite(vals).all():
        raise NonFiniteError("contribution holds NaN or inf; check the local training for divergence", **where)
    return ids, vals


def first_out_of_range(ctx: ExchangeContext, num_clients: int, lo: float,
                       hi: float) -> tuple[int, int, int, float, str] | None:
    """Check every contribution (:func:`check_block_table`), then return the first value outside the
    public range ``[lo, hi]`` (or not an integer, for integer exchanges) as ``(client, block id,
    entry, value, why)``; ``None`` if all are inside.  The backend raises its own error for it."""
    if not ctx.contributions:
        raise ShapeError("no contributions", tag=ctx.tag, round=ctx.round)
    for k, table in ctx.contributions.items():
        ids, vals = check_block_table(ctx, k, table, num_clients)
        bad = find_violation(vals, lo, hi, ctx.spec.integer)
        if bad is not None:
            i, v, why = bad
            return k, int(ids[i // ctx.block_len]), i % ctx.block_len, v, why
    return None
