"""The graph-classification GIN of GCFL.

Xie et al., NeurIPS 2021, sec. 6.1; the authors' ``models.py``. A local input layer, ``num_layers`` GIN layers (Xu
et al., ICLR 2019)

    h_v' = MLP((1 + eps) h_v + sum_{u in N(v)} h_u),   MLP = Linear-ReLU-Linear (hidden -> hidden),

a sum readout, a local ``post`` layer and a local classifier.  Only the GIN layers
(``convs``) are shared in federated training (the reference's ``serverGIN``); the input
layer maps each client's own feature dimension to ``hidden``, so clients holding different
datasets share the same GIN layers.  Dropout is the keyed one of
:func:`secure_fgl.models.node.dropout` (its mask a function of the active generator).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import GINConv, global_add_pool

from .node import dropout as keyed_dropout


class GCFLGIN(nn.Module):
    """GCFL's GIN: local input layer, shared GIN layers, sum readout, local post layer and classifier."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 3, dropout: float = 0.5):
        super().__init__()
        self.pre = nn.Linear(in_dim, hidden)
        self.convs = nn.ModuleList(
            GINConv(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)))
            for _ in range(num_layers)
        )
        self.post = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.readout = nn.Linear(hidden, out_dim)
        self.dropout = dropout

    def shared_parameters(self) -> list[nn.Parameter]:
        """The parameters federated training aggregates: the GIN layers only."""
        return list(self.convs.parameters())

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """Class logits of each graph of ``batch``."""
        x = self.pre(x)
        for conv in self.convs:
            x = keyed_dropout(F.relu(conv(x, edge_index)), self.dropout, self.training)
        x = keyed_dropout(self.post(global_add_pool(x, batch)), self.dropout, self.training)
        return self.readout(x)
