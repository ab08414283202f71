"""A run's federation from its settings: the one loader the driver and every pinned client use."""

from __future__ import annotations

from .build import make_federated
from .graph_build import is_graph_dataset, make_graph_federated


def load_federation(cfg):
    """``cfg``'s dataset partitioned over ``cfg.clients`` (deterministic given the settings)."""
    if is_graph_dataset(cfg.dataset):  # graph classification (GCFL's settings)
        order = "file" if cfg.partition == "file-order" else "shuffled"
        return make_graph_federated(cfg.dataset, cfg.clients, cfg.seed, cfg.data_root, order, **cfg.synthetic)
    return make_federated(
        dataset=cfg.dataset,
        num_clients=cfg.clients,
        partition=cfg.partition,
        beta=cfg.beta,
        resolution=cfg.resolution,
        keep_largest=cfg.keep_largest,
        split=cfg.split,
        seed=cfg.seed,
        data_root=cfg.data_root,
        **cfg.synthetic,
    )
