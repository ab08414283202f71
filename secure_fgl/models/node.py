"""Node-classification GNNs built from torch_geometric layers.

Every model maps ``(x, edge_index)`` to class logits and exposes ``embed`` (the
hidden representation before the last layer), which FedOMD and the attacks use.

* :class:`GCN` — Kipf & Welling, ICLR 2017, eq. 2: ``H' = sigma(D^-1/2 (A+I) D^-1/2 H W)``.
  Defaults (2 layers, hidden 16, dropout 0.5) are Kipf's Cora/CiteSeer settings,
  also used by FedGCN (Yao et al. 2023, sec. 6).
* :class:`SAGE` — Hamilton et al. 2017, mean aggregator.
* :class:`GAT` — Velickovic et al. 2018 (8 heads in hidden layers).
* :class:`SGC` — Wu et al. 2019: ``softmax(S^K X W)``, one linear layer on K-hop propagated features.
* :class:`MLP` — features only (the structure-blind baseline, e.g. FedProx-MLP in FedOMD Table 4).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import GATConv, GCNConv, SAGEConv, SGConv

from ..engine import rng

#: :func:`dropout` computes its mask only at the non-zero entries below this density
SPARSE_DROPOUT_DENSITY = 0.25


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout with randomness that does not depend on the values.

    ``F.dropout(x, p, training)`` in distribution, with randomness that does not depend on the
    values: one key per call (:func:`~secure_fgl.engine.rng.draw_key`) and entry ``(i, j)`` kept
    when ``uniform_at(key, i * cols + j) >= p``, so the mask is a function of the key and the
    position only.  When ``x`` is mostly zero (a dropped zero is still zero) the mask is computed
    only at the non-zeros: bag-of-words inputs and their neighbour sums (Cora 1.3 %, CiteSeer
    0.9 % non-zero) cost in proportion to their non-zeros, as in Kipf & Welling's sparse dropout.
    """
    if not training or p == 0.0 or x.dim() != 2:
        return F.dropout(x, p, training)
    if p >= 1.0:
        return torch.zeros_like(x)
    key = rng.draw_key()
    if int(torch.count_nonzero(x)) > SPARSE_DROPOUT_DENSITY * x.numel():
        keep = rng.uniform_at(key, torch.arange(x.numel(), dtype=torch.int32, device=x.device).view_as(x)) >= p
        return x * keep / (1.0 - p)
    rows, cols = x.nonzero(as_tuple=True)
    keep = rng.uniform_at(key, rows * x.shape[1] + cols) >= p
    rows, cols = rows[keep], cols[keep]
    out = torch.zeros_like(x)
    out[rows, cols] = x[rows, cols] / (1.0 - p)
    return out


class _Stack(nn.Module):
    """Layers applied in sequence with ReLU + dropout between them."""

    def __init__(self, layers: list[nn.Module], dropout: float, uses_graph: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.dropout = dropout
        self.uses_graph = uses_graph

    def _layer(self, layer: nn.Module, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return layer(x, edge_index) if self.uses_graph else layer(x)

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Hidden representation entering the last layer."""
        for layer in self.layers[:-1]:
            x = dropout(x, self.dropout, self.training)
            x = F.relu(self._layer(layer, x, edge_index))
        return x

    def embed_and_logits(self, x: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embed(x), forward(x))`` from one pass (FGSSL contrasts the first, distils the second)."""
        h = self.embed(x, edge_index)
        return h, self._layer(self.layers[-1], dropout(h, self.dropout, self.training), edge_index)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.embed_and_logits(x, edge_index)[1]


def _dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[tuple[int, int]]:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    sizes = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
    return list(zip(sizes[:-1], sizes[1:]))


class GCN(_Stack):
    """GCN (Kipf & Welling, ICLR 2017): H' = sigma(D^-1/2 (A+I) D^-1/2 H W)."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5, normalize: bool = True
    ):
        super().__init__(
            [GCNConv(a, b, normalize=normalize, cached=False) for a, b in _dims(in_dim, hidden, out_dim, num_layers)],
            dropout,
        )


class NarrowingSAGEConv(SAGEConv):
    """Mean-aggregator ``SAGEConv`` that projects before aggregating when the layer narrows.

    Mean-aggregator ``SAGEConv`` (``W_l mean_{j in N(i)} x_j + b + W_r x_i``) that, when the
    layer narrows (in > out channels), computes ``W_l mean_j x_j`` as ``mean_j (W_l x_j)``: the
    same value (a mean commutes with a linear map; a node without neighbours gets ``b`` either
    way), with the neighbour aggregation over ``out`` instead of ``in`` channels (PubMed's 500
    features -> 64: ~8x less scatter work).  Same parameters and state dict as ``SAGEConv``.
    """

    def forward(self, x, edge_index, size=None):
        """Project then aggregate when the layer narrows; otherwise ``SAGEConv``'s forward."""
        if not isinstance(x, torch.Tensor) or self.in_channels <= self.out_channels:
            return super().forward(x, edge_index, size)
        h = F.linear(x, self.lin_l.weight)
        out = self.propagate(edge_index, x=(h, h), size=size) + self.lin_l.bias
        return out + self.lin_r(x)


class SAGE(_Stack):
    """GraphSAGE with the mean aggregator (Hamilton et al., NeurIPS 2017)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__([NarrowingSAGEConv(a, b) for a, b in _dims(in_dim, hidden, out_dim, num_layers)], dropout)


class GAT(_Stack):
    """GAT (Velickovic et al., ICLR 2018): ``heads`` concatenated attention heads per hidden layer."""

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.6, heads: int = 8
    ):
        dims = _dims(in_dim, hidden, out_dim, num_layers)
        layers = []
        for i, (a, b) in enumerate(dims):
            last = i == len(dims) - 1
            a_in = a if i == 0 else a * heads
            layers.append(GATConv(a_in, b, heads=1 if last else heads, concat=not last, dropout=dropout))
        super().__init__(layers, dropout)


class SGC(nn.Module):
    """``softmax(S^K X W)`` with ``S`` the GCN-normalised adjacency (K = ``hops``)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.conv = SGConv(in_dim, out_dim, K=num_layers, cached=False)
        self.dropout = dropout
        #: ``(x, x._version, edge_index, edge_index._version)`` whose ``S^K x`` the conv holds
        self._cached_for: tuple | None = None

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """The input itself (SGC has no hidden layer)."""
        return x

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Logits S^K x W; S^K x is computed once and reused while the same inputs come back."""
        if self.training and self.dropout > 0:  # dropout before propagation: nothing to reuse
            self.conv.cached, self.conv._cached_x, self._cached_for = False, None, None
            return self.conv(F.dropout(x, self.dropout, True), edge_index)
        # ``S^K x`` has no parameters: computed once per input and reused while the same,
        # unmodified tensors come back (a client trains on one graph for the whole run)
        c = self._cached_for
        if c is None or c[0] is not x or c[2] is not edge_index or (c[1], c[3]) != (x._version, edge_index._version):
            self.conv._cached_x = None
            self._cached_for = (x, x._version, edge_index, edge_index._version)
        self.conv.cached = True
        return self.conv(x, edge_index)


class MLP(_Stack):
    """Multi-layer perceptron on the features only (no graph)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__(
            [nn.Linear(a, b) for a, b in _dims(in_dim, hidden, out_dim, num_layers)], dropout, uses_graph=False
        )
