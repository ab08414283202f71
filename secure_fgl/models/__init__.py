"""GNN models.  ``build_model(name, in_dim, hidden, out_dim, ...)`` picks one by name."""

from __future__ import annotations

from torch import nn

from .graph import GIN
from .node import GAT, GCN, MLP, SAGE, SGC

MODELS: dict[str, type[nn.Module]] = {"gcn": GCN, "sage": SAGE, "gat": GAT, "sgc": SGC, "mlp": MLP, "gin": GIN}


def build_model(
    name: str, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5, heads: int = 8
) -> nn.Module:
    """``heads`` applies to GAT only (attention heads of its hidden layers)."""
    try:
        cls = MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    extra = {"heads": heads} if cls is GAT else {}
    return cls(in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout, **extra)


__all__ = ["build_model", "MODELS", "GCN", "SAGE", "GAT", "SGC", "MLP", "GIN"]
