"""Graph-classification GIN with a sum readout.

Xu et al., ICLR 2019, eq. 4.1; the model of GCFL (Xie et al., NeurIPS 2021, sec. 5: 3 GIN layers, hidden 64).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import GINConv, global_add_pool


class GIN(nn.Module):
    """GIN layers h' = MLP((1 + eps) h + sum_{u in N(v)} h_u), a sum readout and an MLP head (Xu et al., ICLR 2019)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 3, dropout: float = 0.5):
        super().__init__()
        self.convs = nn.ModuleList()
        for i in range(num_layers):
            mlp = nn.Sequential(nn.Linear(in_dim if i == 0 else hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
            self.convs.append(GINConv(mlp))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))
        self.dropout = dropout

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """Sum-pooled node embeddings of each graph."""
        for conv in self.convs:
            x = F.relu(conv(x, edge_index))
        return global_add_pool(x, batch)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        """Class logits of each graph of ``batch``."""
        h = F.dropout(self.embed(x, edge_index, batch), self.dropout, self.training)
        return self.head(h)
