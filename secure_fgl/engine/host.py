"""Device -> host once per exchange: the clients' vectors of one exchange in one pinned buffer.

Training runs on the device (``--device auto``); CKKS and mask encoding are CPU work, so each
exchange needs the clients' updates on the host.  :func:`to_host` copies them into one
page-locked (pinned) ``[K, L]`` buffer with asynchronous copies and one synchronisation, instead
of K pageable copies each waiting for the device; on the CPU it returns views, no copy.
"""

from __future__ import annotations

import numpy as np
import torch


def to_host(vectors: dict[int, torch.Tensor]) -> dict[int, np.ndarray]:
    """``client -> 1-D tensor`` (equal lengths, one device) as ``client -> numpy array`` on the host."""
    if not vectors:
        return {}
    first = next(iter(vectors.values()))
    if first.device.type != "cuda":
        return {k: v.detach().numpy() for k, v in vectors.items()}
    buf = torch.empty((len(vectors), first.numel()), dtype=first.dtype, pin_memory=True)
    for row, v in zip(buf, vectors.values()):
        row.copy_(v.detach().reshape(-1), non_blocking=True)
    torch.cuda.current_stream(first.device).synchronize()
    host = buf.numpy()
    return {k: host[i] for i, k in enumerate(vectors)}
