"""Graph views for contrastive learning: edge removing and feature masking.

Zhu et al., "Deep Graph Contrastive Representation Learning" (GRACE), 2020, sec. 3.2, used by
FGSSL (Huang et al., IJCAI 2023, sec. 4.1, "Graph Augmentation Strategy"):

* removing edges (RE): each (directed) column of ``edge_index`` is kept with probability ``1 - p_e``;
* masking node features (MF): each feature *dimension* is zeroed for all nodes with probability
  ``p_f`` (``x * m`` with ``m_d ~ Bernoulli(1 - p_f)``).

Every draw comes from the ``torch.Generator`` passed in and depends only on the shapes, never on the
values: a run with the same seed draws the same views in every protocol mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class AugmentRates:
    """Edge-removal and feature-masking probabilities of one view."""

    edge_drop: float
    feature_mask: float

    def __post_init__(self):
        for name in ("edge_drop", "feature_mask"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


def view_generator(*key: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from integers (e.g. run seed, round, client, epoch, view)."""
    seed = int(np.random.SeedSequence(list(key)).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator(device=device).manual_seed(seed)


def drop_edges(edge_index: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Keep each column of ``edge_index`` with probability ``1 - p`` (RE)."""
    keep = torch.rand(edge_index.size(1), generator=generator, device=edge_index.device) >= p
    return edge_index[:, keep]


def mask_features(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Zero each feature dimension (a column of ``x``) with probability ``p`` (MF)."""
    keep = torch.rand(x.size(1), generator=generator, device=x.device) >= p
    return x * keep.to(x.dtype)


def augment(
    x: torch.Tensor, edge_index: torch.Tensor, rates: AugmentRates, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One view ``(MF(x), RE(edge_index))``."""
    return mask_features(x, rates.feature_mask, generator), drop_edges(edge_index, rates.edge_drop, generator)
