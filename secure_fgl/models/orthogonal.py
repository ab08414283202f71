"""FedOMD's local model: a GCN with orthogonal hidden layers (FedOMD, Table 1, eq. 6-9).

FedOMD ("Federated Graph Learning with Center Moment Constraints", sec. 4.3) builds on
Ortho-GCN (Guo et al., "Orthogonal Graph Neural Networks", AAAI 2022)::

    Z^1     = ReLU(S~ X W^0)                          (eq. 7)   GCNConv  d_in -> d_h
    Z^l     = ReLU(Q~ Z^(l-1)),  l = 2..L-1           (eq. 8)   OrthoConv d_h -> d_h
    Z^L     = softmax(S~ Z^(L-1) W^(L-1))             (eq. 9)   GCNConv  d_h -> d_out
    S~      = D^-1/2 (A + I) D^-1/2
    L_ortho = sum_k || W^k W^k^T - I ||_F             (eq. 6, over the OrthoConv layers)

Reading of the orthogonal layer (the paper is terse; no reference code exists):

* In sec. 4.3 the projection ``Q`` stands for "graph convolution with weight ``W``"
  (``S~ X W = Q X``), Table 1 calls the layer *OrthoConv*, and the text says the features
  are "orthogonally projected by U via graph convolution".  So an OrthoConv is a graph
  convolution ``ReLU(S~ Z W~^T + bias)`` whose weight ``W~`` is an orthogonalised version
  of the parameter ``W`` (``ortho_propagate=False`` drops ``S~``: eq. 8 read literally).
* ``Q~ = Q / ||Q||_F`` is the "spectral bounding normalisation" of ONI (Huang et al.,
  CVPR 2020), the orthogonal transformation Ortho-GCN uses; the paper says the equation is
  "approximately solved by Newton iteration as [11] did".  With ``newton_steps = T > 0``::

      S = W W^T + eps I,   S_n = S / ||S||_F,   B_0 = I,
      B_{t+1} = 1.5 B_t - 0.5 B_t^3 S_n,   W~ = B_T W / sqrt(||S||_F)  ~=  (W W^T)^-1/2 W

  (computed in the equivalent, numerically stable coupled Newton-Schulz form),

  which is (approximately) orthogonal for any full-rank ``W``.  With ``newton_steps = 0``
  the layer uses the literal eq. 8 normalisation ``W~ = W / ||W||_F``.
* Eq. 6 is applied to the *parameter* ``W`` (the quantity FedAvg averages).  It is then
  exactly zero for an orthogonal ``W``; it also keeps ``W W^T`` well conditioned so that
  the T-step Newton iteration is accurate.  ``W`` is initialised orthogonal.

``forward(x, edge_index, return_hidden=True)`` also returns ``[Z^1, ..., Z^(L-1)]``,
the hidden features whose moments FedOMD exchanges (eq. 10-11).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import GCNConv, MessagePassing
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from .node import dropout


def newton_orthogonalize(weight: torch.Tensor, steps: int = 5, eps: float = 1e-5) -> torch.Tensor:
    """ONI's orthogonalisation of a ``[m, n]`` weight (``m <= n``): ``~ (W W^T)^-1/2 W``.

    ``steps = 0`` returns the Frobenius-normalised ``W / ||W||_F`` (FedOMD eq. 8 literally).
    Differentiable; ``steps`` Newton iterations of ``B <- 1.5 B - 0.5 B^3 S_n`` on the
    Frobenius-normalised Gram matrix (whose eigenvalues lie in (0, 1], where it converges;
    slowly for tiny eigenvalues, so an ill-conditioned ``W`` is only roughly orthogonalised
    in few steps).
    """
    if steps < 0:
        raise ValueError(f"newton_steps must be >= 0, got {steps}")
    if steps == 0:
        return weight / weight.norm().clamp_min(1e-12)
    eye = torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
    gram = weight @ weight.T + eps * eye
    norm = gram.norm()
    s = gram / norm
    # Coupled form (Higham 2008, eq. 6.35): the iterates Z_t equal ONI's B_t in exact
    # arithmetic, but unlike B <- 1.5B - 0.5B^3 S it stays stable when S is ill-conditioned.
    y, z = s, eye
    for _ in range(steps):
        t = 1.5 * eye - 0.5 * (z @ y)
        y, z = y @ t, t @ z
    return (z @ weight) / norm.sqrt()


def orthogonality_loss(weights) -> torch.Tensor:
    """Eq. 6: ``sum_k || W_k W_k^T - I ||_F`` over an iterable of square (or wide) matrices."""
    total = None
    for w in weights:
        eye = torch.eye(w.shape[0], dtype=w.dtype, device=w.device)
        term = torch.linalg.matrix_norm(w @ w.T - eye)
        total = term if total is None else total + term
    return total if total is not None else torch.zeros(())


class OrthoConv(MessagePassing):
    """Pre-activation of an orthogonal layer: ``S~ Z W~^T + bias`` (or ``Z W~^T + bias``).

    ``W~ = newton_orthogonalize(W, newton_steps)``; see the module docstring.
    """

    def __init__(self, channels: int, newton_steps: int = 5, propagate: bool = True, bias: bool = True):
        super().__init__(aggr="add")
        self.channels = channels
        self.newton_steps = int(newton_steps)
        self.use_graph = bool(propagate)
        self.weight = nn.Parameter(torch.empty(channels, channels))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Orthogonal initial weight, zero bias."""
        super().reset_parameters()
        nn.init.orthogonal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def effective_weight(self) -> torch.Tensor:
        """``W~``, the (approximately) orthogonal weight used in the forward pass."""
        return newton_orthogonalize(self.weight, self.newton_steps)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """S~ Z W~^T + bias, with S~ the GCN-normalised adjacency with self loops (Z W~^T + bias without the graph)."""
        h = x @ self.effective_weight().T
        if self.use_graph:
            ei, ew = gcn_norm(edge_index, None, x.size(0), add_self_loops=True, dtype=x.dtype)
            h = self.propagate(ei, x=h, edge_weight=ew)
        return h if self.bias is None else h + self.bias

    def message(self, x_j: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
        """Neighbour message: its features scaled by the edge weight."""
        return edge_weight.view(-1, 1) * x_j

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, newton_steps={self.newton_steps}, propagate={self.use_graph})"
        )


class OrthoGCN(nn.Module):
    """Table 1: GCNConv(d_in -> d_h), ``ortho_layers`` x OrthoConv(d_h -> d_h), GCNConv(d_h -> d_out).

    Dropout precedes every layer (as in :class:`secure_fgl.models.node.GCN`, with its keyed
    :func:`~secure_fgl.models.node.dropout`).
    ``orthogonal=False`` replaces the OrthoConv layers by plain ``GCNConv(d_h, d_h)``
    (Table 6's "without orthogonalisation"); :meth:`orthogonality_loss` is then 0.
    The model returns logits; eq. 9's softmax is inside the cross-entropy.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        ortho_layers: int = 1,
        dropout: float = 0.5,
        newton_steps: int = 5,
        ortho_propagate: bool = True,
        orthogonal: bool = True,
    ):
        super().__init__()
        if ortho_layers < 0:
            raise ValueError(f"ortho_layers must be >= 0, got {ortho_layers}")
        self.dropout = dropout
        self.orthogonal = orthogonal
        self.first = GCNConv(in_dim, hidden)
        self.hidden_layers = nn.ModuleList(
            [
                OrthoConv(hidden, newton_steps, ortho_propagate) if orthogonal else GCNConv(hidden, hidden)
                for _ in range(ortho_layers)
            ]
        )
        self.last = GCNConv(hidden, out_dim)

    @property
    def num_hidden(self) -> int:
        """``L - 1``: how many hidden feature matrices ``forward(..., return_hidden=True)`` gives."""
        return 1 + len(self.hidden_layers)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, return_hidden: bool = False):
        """Logits, and the hidden layers' activations when ``return_hidden``."""
        hidden = []
        h = F.relu(self.first(dropout(x, self.dropout, self.training), edge_index))
        hidden.append(h)
        for layer in self.hidden_layers:
            h = F.relu(layer(dropout(h, self.dropout, self.training), edge_index))
            hidden.append(h)
        out = self.last(dropout(h, self.dropout, self.training), edge_index)
        return (out, hidden) if return_hidden else out

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Hidden representation entering the last layer (``Z^(L-1)``)."""
        return self.forward(x, edge_index, return_hidden=True)[1][-1]

    def orthogonality_loss(self) -> torch.Tensor:
        """Eq. 6 over the OrthoConv parameters (0 without orthogonal layers)."""
        ws = [m.weight for m in self.hidden_layers if isinstance(m, OrthoConv)]
        return orthogonality_loss(ws) if ws else self.first.lin.weight.new_zeros(())


__all__ = ["OrthoConv", "OrthoGCN", "newton_orthogonalize", "orthogonality_loss"]
