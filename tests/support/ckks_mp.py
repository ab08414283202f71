"""A ckks-mp exchange that needs both key switches, shared by the ckks-mp test files."""

from __future__ import annotations

import numpy as np

from protocols import ValueSpec


def mixed_exchange(p, spec: ValueSpec, clients: int, shared: int, tag: str = "mixed"):
    """A sparse row sum with ``shared`` blocks every client receives and one block per client that only it receives.

    One row in each block; client ``c``'s values are ``(i + c) mod 2`` over the row-major entries ``i``.  The shared
    blocks go to the broadcast key (CKS), block ``shared + c`` to client ``c``'s key (PCKS).
    Returns (the results per recipient, the exact sums per recipient).
    """
    rpb = p.rows_per_block(spec, 2, 10**7)
    rows = np.arange(shared + clients) * rpb
    values = {c: (np.arange(2 * rows.size).reshape(rows.size, 2) + c) % 2 for c in range(clients)}
    requests = {c: np.concatenate([rows[:shared], rows[shared + c : shared + c + 1]]) for c in range(clients)}
    got = p.row_sum(
        tag,
        0,
        {c: (rows, values[c].astype(float)) for c in range(clients)},
        requests,
        (shared + clients) * rpb,
        layout="sparse",
        spec=spec,
    )
    total = sum(values.values())
    index = {int(r): i for i, r in enumerate(rows)}
    return got, {c: total[[index[int(r)] for r in requests[c]]] for c in range(clients)}
