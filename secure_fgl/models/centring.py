"""First-layer input centring without a centred copy of the input.

A model whose first layer starts with a linear map ``X W`` (``GCNConv``'s ``lin``, before it
propagates; FedGCN's first ``Linear``; an MLP's first ``Linear``) sees the centred input
``X - 1 mu^T`` through the identity

    ``(X - 1 mu^T) W = X W - 1 (mu^T W)``

applied as a forward hook on that linear map: the input ``X`` stays as it is (sparse rows stay
mostly zero, so the dropout before the layer keeps its sparse path, and no dense ``n x d`` copy
is made), the hook subtracts the ``1 x h`` row ``mu^T W``.  Outputs and gradients of ``W`` are
those of the centred input (``dL/dW = X^T G - mu 1^T G = (X - 1 mu^T)^T G``); ``mu`` is a
constant of the data, not a parameter (it is neither trained nor averaged).

Dropout before the layer acts on ``X``, not on ``X - 1 mu^T``: the mean is a property of the
client's data and is never dropped.  In expectation the input is the same (``E[drop(X)] - mu =
X - mu``); in evaluation (no dropout) the outputs are the centred model's.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError


def first_linear(model: nn.Module) -> nn.Module:
    """The linear map that starts ``model``'s first layer (weight ``[out, in]``)."""
    if isinstance(getattr(model, "lin", None), nn.Module) and hasattr(model.lin, "weight"):
        return model.lin                                  # FedGCNNet
    layers = getattr(model, "layers", None)
    if layers is not None and len(layers):
        first = layers[0]
        if isinstance(first, nn.Linear):                  # MLP
            return first
        lin = getattr(first, "lin", None)                 # GCNConv: lin, then propagation
        if lin is not None and hasattr(lin, "weight") and getattr(lin, "bias", None) is None:
            return lin
    raise ConfigError(f"input centring needs a first layer that starts with a linear map (gcn, mlp, FedGCN's "
                      f"model); {type(model).__name__} has none: drop --center or use --model gcn")


def centre_first_layer(model: nn.Module, mu: torch.Tensor) -> None:
    """Make ``model`` see ``X - 1 mu^T`` for any input ``X`` (module docstring); a second call
    replaces the first."""
    lin = first_linear(model)
    old = getattr(model, "_centring_hook", None)
    if old is not None:
        old.remove()
    mu = mu.detach().reshape(1, -1)

    def subtract_mean_row(module, inputs, out):
        return out - (mu.to(out.dtype) @ module.weight.t())

    model._centring_hook = lin.register_forward_hook(subtract_mean_row)


def own_mean(z: torch.Tensor, num_own: int) -> torch.Tensor:
    """``mean(Z[own rows])``, the ``1 x d`` row a client centres its first-layer input by."""
    return z[:num_own].mean(0, keepdim=True)
