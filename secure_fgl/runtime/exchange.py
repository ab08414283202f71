"""Protocol exchanges run by client halves inside the client runtimes.

Backends split into halves, :mod:`protocols.party`.

With a split backend the strategy never holds a contribution: each client runtime builds its
backend's :class:`~protocols.party.ClientHalf` from the run's public setup bytes (its keys are
generated there), keeps its own contribution, and the server half drives the stages over
:class:`RuntimeLink` -- the executor -- so only signed message bundles cross.  Steps of one
exchange:

1. ``contribute`` (split): the client computes its contribution and keeps it, answering only
   public facts (the vector length; for a row sum the block ids it asks for, :func:`request_blocks`);
2. the strategy plans the exchange from public facts (:func:`plan_dense`, :func:`plan_rows`:
   the blocking of :meth:`protocols.base.Protocol._sum_vectors` / :meth:`~protocols.base.Protocol.row_sum`)
   and runs the server half over the link;
3. ``receive``: each recipient reads its half's decoded result (:func:`dense_result`,
   :func:`rows_result`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from protocols import BlockTable, ExchangeContext
from protocols.baseline import row_sum_bytes, vector_sum_bytes
from protocols.link import ClientLink
from protocols.row_blocks import BlockRows, RowSelection

from .dp import privatize_row_sum
from .messages import ContributeIns, ContributeRes, MessageError


class RuntimeLink(ClientLink):
    """The executor as the protocol's transport.

    Stage ``s`` for client ``k`` is the runtime method ``half:s``; a client that did not answer is missing from the
    result (a dropout).
    """

    def __init__(self, executor, on_lost: Callable[[dict, str], None] = lambda lost, method: None):
        self.executor, self.on_lost = executor, on_lost
        self.sequential = executor.sequential

    def call(self, stage: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
        """Run protocol ``stage`` in the client runtimes; report the clients lost."""
        responses, lost = self.executor.call(f"half:{stage}", requests)
        self.on_lost(lost, f"half:{stage}")
        return responses


def split_backend(protocol) -> bool:
    """Whether the protocol's client halves live in the runtimes.

    The protocol's client halves live in the runtimes: a split backend built with
    :class:`RuntimeLink` (:func:`~.build.make_runtime_protocol`).
    """
    return isinstance(getattr(protocol, "link", None), RuntimeLink)


# ---------------------------------------------------------------- client side
def dense_table(plan, vector: np.ndarray) -> BlockTable:
    """The plan's blocks of a flat ``vector``."""
    return plan.dense_table(vector)


def rows_table(plan, ids: np.ndarray, rows: np.ndarray) -> BlockTable:
    """A row contribution as the plan's blocks.

    Blocks of ``rpb = block_len / width`` rows each, built block range by block range as the half reads them
    (:class:`~protocols.row_blocks.BlockRows`): a client holds its compact rows, not its dense blocks, while the
    exchange streams.
    """
    rpb = plan.block_len // rows.shape[1]
    bids = np.arange(plan.num_blocks) if plan.layout == "dense" else np.unique(ids // rpb)
    return BlockTable(bids, BlockRows(bids, ids, rows, rpb))


def request_blocks(request_rows: np.ndarray, rpb: int, num_blocks: int, layout: str) -> np.ndarray:
    """Blocks a client requests: every block (dense), else those holding its requested rows."""
    return np.arange(num_blocks) if layout == "dense" else np.unique(request_rows // rpb)


def dense_result(blocks: dict[int, np.ndarray], length: int) -> np.ndarray:
    """The first ``length`` values of the decoded blocks, in block order."""
    return np.concatenate([blocks[b] for b in sorted(blocks)])[:length]


def rows_result(half, request_rows: np.ndarray, rpb: int, dim: int) -> np.ndarray:
    """The totals of the requested rows from ``half``'s decoded row sum.

    The totals of the requested rows, in request order, from ``half``'s decoded result of a row
    sum, which the half then forgets: the rows its selection kept (:func:`keep_rows`), or whole blocks.
    """
    blocks, selection = half.take_result(), half.selection
    half.selection = None
    if selection is not None:
        return selection.assemble(blocks)
    bids = np.unique(request_rows // rpb)
    stacked = np.stack([blocks[int(b)] for b in bids]).reshape(bids.size * rpb, dim)
    return stacked[np.searchsorted(bids, request_rows // rpb) * rpb + request_rows % rpb]


def keep_rows(
    logic,
    tag: str,
    ids: np.ndarray,
    rows: np.ndarray,
    request: np.ndarray,
    req: ContributeIns,
    whole_blocks: bool = False,
) -> ContributeRes:
    """Client side of a split row sum: keep the rows for the half.

    Client side of a split row sum: keep ``(ids, rows)`` for the half and answer only public
    facts -- row counts, the blocks it asks for and, under DP, the blocks it uploads (the server
    half learns them in the sparse layout anyway; all of them in the dense layout).  The half keeps
    only the requested rows of each block it decodes (:class:`~protocols.row_blocks.RowSelection`;
    ``whole_blocks``: every row, for a client that reads them all).
    """
    if req.rpb is None or req.num_blocks is None or req.layout is None:
        raise MessageError(f"the row sum {tag!r} asked without its blocking (rpb, num_blocks, layout)")
    logic.keep(tag, ids, rows)
    rpb, num_blocks, layout = int(req.rpb), int(req.num_blocks), req.layout
    logic.rt.half.selection = None if whole_blocks else RowSelection(request, rpb, rows.shape[1])
    return ContributeRes(
        rows_up=int(ids.size),
        rows_down=int(request.size),
        request_blocks=request_blocks(request, rpb, num_blocks, layout),
        upload_blocks=(
            None if req.dp_clip is None else (np.arange(num_blocks) if layout == "dense" else np.unique(ids // rpb))
        ),
    )


# ---------------------------------------------------------------- server side
def plan_dense(
    protocol, tag: str, rnd: int, contributors, recipients, length: int, spec, *, dp_noise_std: float = 0.0
) -> ExchangeContext:
    """The public context of a dense sum of ``length``-vectors.

    Blocking of ``_sum_vectors``. ``dp_noise_std``: the std of the DP noise in the sum (the encodings leave room for
    it).
    """
    cap = max(1, protocol.vector_block_capacity(spec, length))
    num_blocks = max(1, -(-length // cap))
    block_len = min(cap, length) if num_blocks == 1 else cap
    return ExchangeContext(
        tag,
        rnd,
        spec,
        {k: None for k in contributors},
        {r: np.arange(num_blocks) for r in recipients},
        num_blocks,
        block_len,
        "dense",
        dp_noise_std=dp_noise_std,
        float32_bytes=vector_sum_bytes(len(contributors), length, len(recipients)),
    )


def plan_rows(
    tag: str,
    rnd: int,
    rows_up: dict[int, int],
    requests: dict[int, np.ndarray],
    rows_down: dict[int, int],
    num_rows: int,
    dim: int,
    layout: str,
    spec,
    rpb: int,
    *,
    dp_noise_std: float = 0.0,
) -> ExchangeContext:
    """The public context of a row sum in blocks of ``rpb`` rows.

    The blocking of :meth:`protocols.base.Protocol.row_sum`, fixed before any DP noise, as the clients were told.
    """
    num_blocks = -(-num_rows // rpb)
    up, down = row_sum_bytes(rows_up, rows_down, dim, num_rows, layout)
    return ExchangeContext(
        tag,
        rnd,
        spec,
        {k: None for k in rows_up},
        requests,
        num_blocks,
        rpb * dim,
        layout,
        dp_noise_std=dp_noise_std,
        float32_bytes=(sum(up.values()), sum(down.values())),
    )


def run_row_sum(
    strategy,
    tag: str,
    rnd: int,
    sent: dict[int, ContributeRes],
    num_rows: int,
    dim: int,
    layout: str,
    spec,
    rpb: int,
    dp=None,
) -> float:
    """Server side of a split row sum whose contributions the clients kept.

    The clients kept their rows (:func:`keep_rows`) in blocks of ``rpb`` rows (``protocol.rows_per_block``, taken
    before the release): with ``dp`` (a :class:`~protocols.DPRequest`) each uploader first noises its blocks
    (:func:`~.dp.privatize_row_sum`); then the exchange runs. Returns the std of the noise in the totals (0 without
    DP).
    """
    protocol, noise_std = strategy.protocol, 0.0
    if dp is not None:
        privatize_row_sum(
            strategy, tag, rnd, {k: r.upload_blocks for k, r in sent.items()}, rpb, num_rows, layout, dp, spec, dim
        )
        strategy.check_lost(sent, f"the noising of {tag}")
        noise_std = protocol.dp.last_std
    run_split(
        protocol,
        plan_rows(
            tag,
            rnd,
            {k: int(r.rows_up) for k, r in sent.items()},
            {k: r.request_blocks for k, r in sent.items()},
            {k: int(r.rows_down) for k, r in sent.items()},
            num_rows,
            dim,
            layout,
            spec,
            rpb,
            dp_noise_std=noise_std,
        ),
    )
    return noise_std


def run_split(protocol, ctx: ExchangeContext) -> tuple[int, ...]:
    """Run one exchange's server half over the protocol's link.

    Returns the clients whose contributions the result covers (also kept as ``protocol.last_included``).  A client the
    server half left out of the run (t-out-of-n ``ckks-mp``: it did not finish the key set-up) is reported lost to the
    strategy (:meth:`RuntimeLink.on_lost`), so no later step addresses it.
    """
    protocol._begin_exchange(ctx.tag, ctx.round)
    protocol._ensure_registered(ctx.round)
    server = protocol.server
    left = set(getattr(server, "unfinished", ()))
    try:
        included = server.run(protocol.plan_exchange(ctx), protocol.link)
    finally:  # t-out-of-n ckks-mp: clients that did not finish the key set-up are out of the run
        gone = set(getattr(server, "unfinished", ())) - left
        if gone and isinstance(protocol.link, RuntimeLink):
            why = "did not finish the ckks-mp key set-up: holds no share of this run's keys (--resume runs it again)"
            protocol.link.on_lost({k: why for k in sorted(gone)}, "half:key_setup")
    protocol.transcript.account_plaintext(ctx.tag, *ctx.float32_bytes)
    protocol.last_included = tuple(included)
    return included
