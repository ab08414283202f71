"""FedSpray's global feature-structure encoder and structure proxies.

Fu et al., "Federated Graph Learning with Structure Proxy Alignment", KDD 2024, sec. 4.2:

* embedding layer ``e_i = g_e(x_i; w_e)`` (one linear layer + ReLU, ``d_x -> d_s``);
* classifier ``p_i = g_p(Combine(e_i, s_i); w_p)`` (eq. 9; one linear layer ``d_s -> C``);
* projector ``q_i = g_q(e_i; w_q)`` (eq. 10; same shape as ``g_p``, features only);
* structure proxy of a node: ``s_i = S[y_i]`` for a labelled node (sec. 4.2.1) and the
  *soft proxy* ``s_i = <q_i, S> = softmax(g_q(e_i)) S`` for an unlabelled node (sec. 4.2.2),
  a convex combination of the rows of ``S``.

``Combine`` is element-wise addition, ``e_i + s_i`` (the paper's example, and the only
variant active in the reference code, ``xbfu/FedSpray`` ``model.py``: concatenation is
commented out there); it needs ``d_s`` equal to the embedding size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def soft_proxy_weights(q_logits: torch.Tensor) -> torch.Tensor:
    """``q_i = softmax(g_q(e_i))``: non-negative rows summing to one (eq. 10)."""
    return F.softmax(q_logits, dim=-1)


def soft_proxies(q_logits: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """``s_i = <q_i, S>`` for every row of ``q_logits`` (``[n, C] x [C, d_s] -> [n, d_s]``)."""
    return soft_proxy_weights(q_logits) @ proxies


def node_proxies(
    q_logits: torch.Tensor, proxies: torch.Tensor, y: torch.Tensor, labelled: torch.Tensor
) -> torch.Tensor:
    """Structure proxy of every node: its class proxy if labelled, else its soft proxy."""
    s = soft_proxies(q_logits, proxies)
    return torch.where(labelled[:, None], proxies[y.clamp(min=0)], s)


def initial_proxies(num_classes: int, dim: int) -> torch.Tensor:
    """The initial class proxies ``S_0[c] = 0.01 * c * 1``.

    ``S_0[c] = 0.01 * c * 1`` — the reference code's initialisation (``server.py``);
    the paper leaves ``S_0`` unspecified.
    """
    return 0.01 * torch.arange(num_classes, dtype=torch.float32)[:, None].expand(num_classes, dim).clone()


class FeatureStructureEncoder(nn.Module):
    """``g = (g_e, g_p, g_q)``; every component is one layer (FedSpray sec. 5.1.3)."""

    def __init__(self, in_dim: int, proxy_dim: int, num_classes: int):
        super().__init__()
        self.embed = nn.Linear(in_dim, proxy_dim)  # g_e
        self.classifier = nn.Linear(proxy_dim, num_classes)  # g_p
        self.projector = nn.Linear(proxy_dim, num_classes)  # g_q

    def embedding(self, x: torch.Tensor) -> torch.Tensor:
        """``e = g_e(x)``."""
        return F.relu(self.embed(x))

    def classify(self, e: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Logits of ``p = g_p(Combine(e, s))`` with ``Combine`` = addition (eq. 9)."""
        return self.classifier(e + s)

    def project(self, e: torch.Tensor) -> torch.Tensor:
        """Logits of ``q = g_q(e)`` (eq. 10)."""
        return self.projector(e)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p_logits, q_logits)`` for features ``x`` and node proxies ``s``."""
        e = self.embedding(x)
        return self.classify(e, s), self.project(e)
