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

Dropout: an input denser than ``SPARSE_DROPOUT_DENSITY`` (dense bag-of-words rows, Amazon) makes
the dropout draw at every position anyway, so there the hook centres a copy for the call and the
dropout acts on ``X - 1 mu^T`` exactly as on a centred input.  A sparse input (Coauthor: <1 %
non-zero) keeps its zeros: the dropout acts on ``X`` and the mean, a constant of the client's
data, is not dropped (the same input in expectation, ``E[drop(X)] - mu = X - mu``; in evaluation
the outputs are the centred model's either way).  ``model.embed`` called on its own (not through
``model(...)``) always takes the sparse route, whose outputs are the same.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import ConfigError
from .node import SPARSE_DROPOUT_DENSITY


def first_linear(model: nn.Module) -> nn.Module:
    """The linear map that starts ``model``'s first layer (weight ``[out, in]``)."""
    if isinstance(getattr(model, "lin", None), nn.Module) and hasattr(model.lin, "weight"):
        return model.lin  # FedGCNNet
    layers = getattr(model, "layers", None)
    if layers is not None and len(layers):
        first = layers[0]
        if isinstance(first, nn.Linear):  # MLP
            return first
        lin = getattr(first, "lin", None)  # GCNConv: lin, then propagation
        if lin is not None and hasattr(lin, "weight") and getattr(lin, "bias", None) is None:
            return lin
    raise ConfigError(
        f"input centring needs a first layer that starts with a linear map (gcn, mlp, FedGCN's "
        f"model); {type(model).__name__} has none: drop --center or use --model gcn"
    )


def centre_first_layer(model: nn.Module, mu: torch.Tensor) -> None:
    """Make ``model`` see ``X - 1 mu^T`` for any input ``X`` (module docstring); a second call replaces the first.

    A dense input (the density at which :func:`~.node.dropout` draws at every
    position anyway) is centred as a copy for the call, so its dropout acts on ``X - 1 mu^T``
    exactly as before; a sparse one keeps its zeros and the hook subtracts ``mu^T W``.
    """
    lin = first_linear(model)
    for handle in getattr(model, "_centring_hooks", ()):
        handle.remove()
    mu = mu.detach().reshape(1, -1)
    copied = [False]  # the current forward call centred a copy of its input

    def centre_dense_input(module, args):
        x = args[0]
        copied[0] = bool(x.dim() == 2 and int(torch.count_nonzero(x)) > SPARSE_DROPOUT_DENSITY * x.numel())
        return (x - mu.to(x.dtype), *args[1:]) if copied[0] else None

    def subtract_mean_row(module, inputs, out):
        return None if copied[0] else out - (mu.to(out.dtype) @ module.weight.t())

    def end_of_call(module, args, out):
        copied[0] = False

    model._centring_hooks = (
        model.register_forward_pre_hook(centre_dense_input),
        lin.register_forward_hook(subtract_mean_row),
        model.register_forward_hook(end_of_call),
    )


def own_mean(z: torch.Tensor, num_own: int) -> torch.Tensor:
    """``mean(Z[own rows])``, the ``1 x d`` row a client centres its first-layer input by."""
    return z[:num_own].mean(0, keepdim=True)
