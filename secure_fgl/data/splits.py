"""Train/val/test splits of a partitioned graph.

:func:`apply_split` returns *global* boolean masks ``[N]``; dropped nodes (``owner = -1``)
are in none of them.  Per-client splits draw each client's nodes at random (not stratified)
and give client ``k`` ``round(a * n_k)`` training, ``round(b * n_k)`` validation and up to
``round(c * n_k)`` test nodes; with ``a + b + c < 1`` the rest are unlabelled.

==========  =======================  ===============================================
name        train / val / test       source
==========  =======================  ===============================================
public      dataset's own masks      Planetoid public split (Yang et al., 2016); datasets
                                     without one (Amazon, Coauthor) get ``shchur``
shchur      20 / 30 / rest per class  Shchur et al., "Pitfalls of Graph Neural Network
                                     Evaluation" (2018), sec. 4: 20 training and 30
                                     validation nodes per class, the rest test (global,
                                     stratified by class, not per client)
fedspray    40 / 30 / 30 per client  FedSpray (Fu et al., 2024) sec. 5.1.1
fgssl       60 / 20 / 20 per client  FGSSL (Huang et al., 2023), Experiments,
                                     "Implement Details"
fedomd      1 / 20 / 20 per client   FedOMD sec. 5.1, Table 2 ("1 %, 20 % and 20 %");
                                     the 1 % label rate, at least one training node
                                     per client; 59 % unlabelled
random:a/b/c  a / b / c per client   fractions (0.6/0.2/0.2) or percent (60/20/20)
==========  =======================  ===============================================
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from .errors import DataError

__all__ = ["SPLITS", "parse_split", "apply_split"]

#: named per-client splits: (train, val, test, minimum training nodes per client)
SPLITS: dict[str, tuple[float, float, float, int]] = {
    "fedspray": (0.4, 0.3, 0.3, 0),
    "fgssl": (0.6, 0.2, 0.2, 0),
    "fedomd": (0.01, 0.2, 0.2, 1),
}

#: Shchur et al. (2018): training and validation nodes per class
SHCHUR_PER_CLASS = (20, 30)

_HINT = "use 'public', 'shchur', 'fedspray', 'fgssl', 'fedomd' or 'random:a/b/c' (e.g. random:0.6/0.2/0.2)"


def parse_split(split: str) -> tuple[float, float, float, int] | None:
    """``None`` for ``'public'``, else ``(train, val, test, min_train)`` fractions."""
    s = str(split).strip().lower()
    if s in ("public", "shchur"):
        return None
    if s in SPLITS:
        return SPLITS[s]
    if s.startswith("random:"):
        parts = s[len("random:") :].split("/")
        try:
            vals = [float(p) for p in parts]
        except ValueError:
            vals = []
        if len(vals) != 3 or min(vals) < 0:
            raise DataError(
                f"bad split {split!r}: write random:a/b/c with three non-negative numbers, e.g. random:0.6/0.2/0.2"
            )
        if max(vals) > 1:  # percentages
            vals = [v / 100.0 for v in vals]
        if sum(vals) > 1 + 1e-9:
            raise DataError(
                f"bad split {split!r}: the fractions sum to {sum(vals):.3g} > 1; make train + val + test <= 1"
            )
        return vals[0], vals[1], vals[2], 0
    raise DataError(f"unknown split {split!r}: {_HINT}")


def _per_client_masks(
    owner: np.ndarray, fracs: tuple[float, float, float, int], seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised: rank every node inside its client by a random key, then threshold."""
    a, b, c, min_train = fracs
    n = owner.shape[0]
    rng = np.random.default_rng([seed, 21])
    key = rng.random(n)
    kept = np.flatnonzero(owner >= 0)
    order = kept[np.lexsort((key[kept], owner[kept]))]  # by client, then random key
    k = int(owner.max()) + 1 if kept.size else 0
    sizes = np.bincount(owner[kept], minlength=k)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(order.size) - np.repeat(starts, sizes)
    n_tr = np.round(a * sizes).astype(np.int64)
    if min_train:
        n_tr = np.maximum(n_tr, np.minimum(min_train, sizes))
    n_va = np.minimum(np.round(b * sizes).astype(np.int64), sizes - n_tr)
    n_te = np.minimum(np.round(c * sizes).astype(np.int64), sizes - n_tr - n_va)
    o = np.where(owner >= 0, owner, 0)
    valid = owner >= 0
    train = valid & (rank < n_tr[o])
    val = valid & (rank >= n_tr[o]) & (rank < (n_tr + n_va)[o])
    test = valid & (rank >= (n_tr + n_va)[o]) & (rank < (n_tr + n_va + n_te)[o])
    return train, val, test


def _per_class_masks(y: np.ndarray, owner: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shchur et al.'s split.

    Per class, a seeded random ``SHCHUR_PER_CLASS`` training and validation nodes among the kept ones (fewer if the
    class is smaller), the rest test.
    """
    n_train, n_val = SHCHUR_PER_CLASS
    rng = np.random.default_rng([seed, 22])
    train, val = np.zeros(y.shape[0], bool), np.zeros(y.shape[0], bool)
    valid = owner >= 0
    for cls in np.unique(y[valid]):
        members = rng.permutation(np.flatnonzero(valid & (y == cls)))
        train[members[:n_train]] = True
        val[members[n_train : n_train + n_val]] = True
    return train, val, valid & ~train & ~val


def apply_split(
    data: Data, owner: torch.Tensor, split: str = "public", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Global ``(train_mask, val_mask, test_mask)`` for a partitioned graph (see module doc)."""
    own = owner.detach().cpu().numpy().astype(np.int64)
    if own.shape[0] != data.num_nodes:
        raise DataError(
            f"owner has {own.shape[0]} entries for {data.num_nodes} nodes: partition the same graph you split"
        )
    fracs = parse_split(split)
    if fracs is None:
        masks = [getattr(data, m, None) for m in ("train_mask", "val_mask", "test_mask")]
        if str(split).strip().lower() == "shchur" or any(m is None for m in masks):
            tr, va, te = _per_class_masks(data.y.detach().cpu().numpy(), own, seed)
            return torch.from_numpy(tr), torch.from_numpy(va), torch.from_numpy(te)
        valid = torch.from_numpy(own >= 0)
        out = []
        for m in masks:
            m = m.bool()
            if m.dim() != 1 or m.numel() != own.shape[0]:
                raise DataError(
                    f"public mask of shape {tuple(m.shape)} does not match "
                    f"{own.shape[0]} nodes: pick one split column or use a per-client split"
                )
            out.append(m & valid)
        return out[0], out[1], out[2]
    tr, va, te = _per_client_masks(own, fracs, seed)
    return torch.from_numpy(tr), torch.from_numpy(va), torch.from_numpy(te)
