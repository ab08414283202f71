"""Input validation of the protocol layer's public entry points.

Every malformed input raises a :class:`~protocols.errors.ProtocolError` subclass naming the
exchange and the fix — never a bare ``ValueError``/``TypeError``/``OverflowError`` from deep
inside numpy or ``cryptography``, and never a silent coercion (a complex array is *not*
truncated to its real part, a float row id is *not* rounded, a string client id is *not*
parsed):

* exchange identity: the tag is a ``str`` that encodes to UTF-8 (no lone surrogates), the
  round an ``int`` in ``[0, 2^63)`` (it is bound into 8-byte fields) —
  :class:`ConfigurationError`;
* client ids: ``int`` (numpy integers too, not ``bool``) in ``[0, K)`` —
  :class:`ConfigurationError`;
* values: real numbers (bool/int/uint/float dtypes) in a regular, non-empty array —
  :class:`ShapeError`; NaN/inf — :class:`NonFiniteError`;
* row ids: integers (integral floats accepted) in ``[0, num_rows)`` — :class:`ShapeError`;
* weights and counts: finite non-negative reals / integers — :class:`ConfigurationError`;
* block tables of the encrypted backends (``ckks``, ``ckks-mp``), on the client before
  encryption: shape, block ids, finiteness, and the first value outside the public range
  (:func:`check_block_table`, :func:`first_out_of_range`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ConfigurationError, NonFiniteError, ShapeError
from .exchange import BlockTable, ExchangeContext

if TYPE_CHECKING:
    from .plan import ExchangePlan

#: rounds are bound into signed 64-bit fields
MAX_ROUND = 2**63
#: longest accepted tag, in UTF-8 bytes
MAX_TAG_BYTES = 1024
_REAL_KINDS = "biuf"


def exchange(tag: Any, rnd: Any) -> None:
    """Check the tag and round of an exchange (see module docstring)."""
    if not isinstance(tag, str):
        raise ConfigurationError(f"an exchange tag must be a str, got {type(tag).__name__} {tag!r:.60}")
    try:
        n = len(tag.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"exchange tag {ascii(tag):.80} is not valid UTF-8 (lone surrogate?); use a plain text tag"
        ) from None
    if not 0 < n <= MAX_TAG_BYTES:
        raise ConfigurationError(f"an exchange tag must have 1..{MAX_TAG_BYTES} UTF-8 bytes, got {n}")
    if not _is_int(rnd) or not 0 <= int(rnd) < MAX_ROUND:
        raise ConfigurationError(f"the round must be an integer in [0, 2^63), got {rnd!r:.60}", tag=tag)


def client_id(k: Any, num_clients: int, tag: str, rnd: int) -> int:
    """``k`` as an int in ``[0, num_clients)``."""
    if not _is_int(k) or not 0 <= int(k) < num_clients:
        raise ConfigurationError(
            f"unknown client id {k!r:.40} (clients are the integers 0..{num_clients - 1})", tag=tag, round=rnd
        )
    return int(k)


def contributions(values: Any, num_clients: int, tag: str, rnd: int, what: str = "contributions") -> dict[int, Any]:
    """A non-empty mapping client id -> item, with validated ids."""
    if not isinstance(values, Mapping):
        raise ConfigurationError(
            f"{what} must be a mapping client id -> value, got {type(values).__name__}", tag=tag, round=rnd
        )
    if not values:
        raise ShapeError(f"no {what}", tag=tag, round=rnd)
    return {client_id(k, num_clients, tag, rnd): v for k, v in values.items()}


def real_array(
    x: Any,
    tag: str,
    rnd: int,
    client: int,
    what: str = "contribution",
    *,
    allow_empty: bool = False,
    copy: bool = True,
    keep_dtype: bool = False,
) -> np.ndarray:
    """A float64 copy of an array of real numbers.

    A float64 copy of a numpy array / torch tensor / nested list of real numbers (``copy=False``:
    the caller's float64 CPU memory itself when it already is one; the caller must not write to it;
    ``keep_dtype``: the caller's memory in its own real dtype, e.g. int16 counts, read as float64 by
    the consumer).
    """
    if hasattr(x, "detach"):  # torch tensor, any device
        if x.is_complex():
            raise ShapeError(f"{what} is complex ({x.dtype}); send real values", tag=tag, round=rnd, client=client)
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged nesting, odd objects
        raise ShapeError(
            f"{what} is not a regular array ({str(exc)[:80]})", tag=tag, round=rnd, client=client
        ) from None
    if a.dtype.kind not in _REAL_KINDS:
        raise ShapeError(
            f"{what} has dtype {a.dtype}; send real numbers (complex, strings and objects are refused, not coerced)",
            tag=tag,
            round=rnd,
            client=client,
        )
    if not keep_dtype:
        a = a.astype(np.float64, copy=copy)
    if a.size == 0 and not allow_empty:
        raise ShapeError(f"{what} is empty (shape {a.shape})", tag=tag, round=rnd, client=client)
    if not np.isfinite(a).all():
        raise NonFiniteError(
            f"{what} holds NaN or inf (or a value beyond float64); check the local training for divergence",
            tag=tag,
            round=rnd,
            client=client,
        )
    return a


def row_ids(x: Any, num_rows: int, tag: str, rnd: int, client: int, what: str = "row ids") -> np.ndarray:
    """A flat int64 array of ids in ``[0, num_rows)`` (integral floats accepted)."""
    a = real_array(x, tag, rnd, client, what, allow_empty=True).ravel()
    if (a != np.floor(a)).any():
        raise ShapeError(f"{what} must be integers", tag=tag, round=rnd, client=client)
    if a.size and (a.min() < 0 or a.max() >= num_rows):
        raise ShapeError(f"{what} must lie in [0, {num_rows})", tag=tag, round=rnd, client=client)
    return a.astype(np.int64)


def weight(w: Any, tag: str, rnd: int, client: int) -> float:
    """A finite non-negative real weight as a float."""
    a = real_array(w, tag, rnd, client, "weight")
    if a.size != 1 or not a.item() >= 0:
        raise ConfigurationError(
            f"a weight must be one finite non-negative number, got {a.ravel()[:3]} (shape {a.shape})",
            tag=tag,
            round=rnd,
            client=client,
        )
    return float(a.item())


def count(n: Any, what: str, tag: str | None, rnd: int | None, *, minimum: int = 1, maximum: int = 2**62) -> int:
    """An integer in ``[minimum, maximum]`` (e.g. ``num_rows``)."""
    if not _is_int(n) or not minimum <= int(n) <= maximum:
        raise ConfigurationError(
            f"{what} must be an integer in [{minimum}, {maximum}], got {n!r:.40}", tag=tag, round=rnd
        )
    return int(n)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def per_client(items: Any, clients: Any, what: str, tag: str, rnd: int) -> dict[int, Any]:
    """``{k: items[k]}`` for every client ``k``; ``items`` must be a mapping holding each of them."""
    if not isinstance(items, Mapping):
        raise ConfigurationError(
            f"{what} must be a mapping client id -> value, got {type(items).__name__}", tag=tag, round=rnd
        )
    missing = [k for k in clients if k not in items]
    if missing:
        raise ConfigurationError(f"{what} lack client(s) {missing[:5]}", tag=tag, round=rnd)
    return {k: items[k] for k in clients}


def recipients(recips: Any, num_clients: int, tag: str, rnd: int) -> list[int]:
    """A non-empty list of valid client ids."""
    out = [client_id(r, num_clients, tag, rnd) for r in sequence(recips, "recipients", tag, rnd)]
    if not out:
        raise ConfigurationError("recipients is empty: name at least one client", tag=tag, round=rnd)
    return out


def row_contribution(item: Any, num_rows: int, tag: str, rnd: int, client: int) -> tuple[np.ndarray, np.ndarray]:
    """One client's row-sum contribution as ``(row ids, rows)``.

    ``(row ids [m] int64, rows [m, d])`` of one client of a row sum; the rows in the caller's own
    real dtype and memory (read only; integer counts stay compact, blocks are built in float64).
    """
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ShapeError("a row-sum contribution is a pair (row_ids, rows)", tag=tag, round=rnd, client=client)
    ids = row_ids(item[0], num_rows, tag, rnd, client)
    rows = real_array(item[1], tag, rnd, client, "rows", allow_empty=True, copy=False, keep_dtype=True)
    if rows.ndim != 2 or rows.shape[0] != ids.size or rows.shape[1] == 0:
        raise ShapeError(
            f"rows must be [len(row_ids), d >= 1], got {rows.shape} for {ids.size} ids",
            tag=tag,
            round=rnd,
            client=client,
        )
    return ids, rows


def sequence(items: Any, what: str, tag: str, rnd: int) -> list[Any]:
    """``items`` as a list; it must be a (non-string) sequence."""
    if isinstance(items, (str, bytes, Mapping)) or not hasattr(items, "__iter__"):
        raise ConfigurationError(f"{what} must be a sequence, got {type(items).__name__}", tag=tag, round=rnd)
    return list(items)


def weights(items: Any, clients: Any, tag: str, rnd: int) -> dict[int, float] | None:
    """Validated float weights of ``clients`` (``None`` stays ``None``)."""
    if items is None:
        return None
    return {k: weight(w, tag, rnd, k) for k, w in per_client(items, clients, "weights", tag, rnd).items()}


def moment_orders(orders: Any, tag: str, rnd: int) -> list[int]:
    """Moment orders: integers in [1, 64]."""
    return [count(j, "a moment order", tag, rnd, maximum=64) for j in sequence(orders, "orders", tag, rnd)]


# ---------------------------------------------------------------- encrypted backends, client side
def _any_fraction(v: np.ndarray, step: int = 1 << 16) -> bool:
    """Whether a flat array holds a non-integer entry, scanned a cache-sized slice at a time."""
    return any(not np.array_equal(np.rint(v[i : i + step]), v[i : i + step]) for i in range(0, v.size, step))


def find_violation(values: np.ndarray, lo: float, hi: float, integer: bool) -> tuple[int, float, str] | None:
    """First entry of ``values`` outside ``[lo, hi]`` (or non-integer): ``(flat index, value, why)``."""
    v = np.asarray(values).reshape(-1)
    if v.size and v.min() >= lo and v.max() <= hi and not (integer and _any_fraction(v)):
        return None  # the common case: two reductions and a cache-sized integrality scan, no index arrays
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


def check_block_table(
    ctx: ExchangeContext | ExchangePlan, client: int, table: BlockTable, num_clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, values)`` of ``table`` after checking it.

    ``(ids, values)`` of ``table`` after checking the client id, the shape, the block ids
    (increasing, in range; every block in the dense layout) and finiteness.  Raises
    :class:`ShapeError` / :class:`NonFiniteError` naming the client; nothing is encrypted.
    """
    where: dict[str, Any] = dict(tag=ctx.tag, round=ctx.round, client=client)
    if not 0 <= int(client) < num_clients:
        raise ShapeError(f"unknown client id {client}", **where)
    ids, vals = np.asarray(table.ids), np.asarray(table.values)
    if ids.ndim != 1 or vals.shape != (ids.size, ctx.block_len):
        raise ShapeError(
            f"contribution of shape {vals.shape} with {ids.size} block ids; expected [{ids.size}, {ctx.block_len}]",
            **where,
        )
    if ids.size and (
        not np.issubdtype(ids.dtype, np.integer)
        or ids.min() < 0
        or ids.max() >= ctx.num_blocks
        or (np.diff(ids) <= 0).any()
    ):
        raise ShapeError(f"block ids must be increasing integers in [0, {ctx.num_blocks})", **where)
    if ctx.layout == "dense" and not np.array_equal(ids, np.arange(ctx.num_blocks)):
        raise ShapeError("the dense layout needs every block from every client", **where)
    if not np.isfinite(vals).all():
        raise NonFiniteError("contribution holds NaN or inf; check the local training for divergence", **where)
    return ids, vals


def first_out_of_range(
    ctx: ExchangeContext, num_clients: int, lo: float, hi: float
) -> tuple[int, int, int, float, str] | None:
    """Check every contribution and return the first value outside the public range.

    Check every contribution (:func:`check_block_table`), then return the first value outside the
    public range ``[lo, hi]`` (or not an integer, for integer exchanges) as ``(client, block id,
    entry, value, why)``; ``None`` if all are inside.  The backend raises its own error for it.
    """
    if not ctx.contributions:
        raise ShapeError("no contributions", tag=ctx.tag, round=ctx.round)
    for k, table in ctx.contributions.items():
        ids, vals = check_block_table(ctx, k, table, num_clients)
        bad = find_violation(vals, lo, hi, ctx.spec.integer)
        if bad is not None:
            i, v, why = bad
            return k, int(ids[i // ctx.block_len]), i % ctx.block_len, v, why
    return None
