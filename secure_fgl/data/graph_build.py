"""``--dataset`` for graph-level algorithms.

a TU dataset chunked across ``--clients`` (GCFL's single-dataset setting), a GCFL group (one dataset per client), or the
synthetic two-task federation.
"""

from __future__ import annotations

import os

from .errors import DataError
from .graph_classification import GCFL_GROUPS, FederatedGraphDataset, chunk_partition, multi_dataset_partition
from .synthetic_graphs import SYNTHETIC_GRAPHS, two_task_graphs

__all__ = ["is_graph_dataset", "make_graph_federated"]


def is_graph_dataset(name: str) -> bool:
    """True for a TU graph-classification dataset, a GCFL group or ``synthetic-graphs``."""
    from .datasets import get_dataset_info

    key = name.lower()
    if key in GCFL_GROUPS or key == SYNTHETIC_GRAPHS:
        return True
    try:
        return get_dataset_info(name).task == "graph"
    except DataError:
        return False


def make_graph_federated(
    dataset: str,
    num_clients: int,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    chunk_order: str = "shuffled",
    **synthetic_kwargs,
) -> FederatedGraphDataset:
    """``chunk_order``: ``'shuffled'`` or ``'file'`` (GCFL's reference chunking), one TU dataset only."""
    key = dataset.lower()
    if chunk_order != "shuffled" and (key == SYNTHETIC_GRAPHS or key in GCFL_GROUPS):
        raise DataError(f"--partition file-order chunks one TU dataset; {dataset} is not one: drop it")
    if key == SYNTHETIC_GRAPHS:
        return two_task_graphs(num_clients, seed=seed, **synthetic_kwargs)
    if synthetic_kwargs:
        raise DataError(f"{dataset} takes no generator options ({', '.join(synthetic_kwargs)})")
    if key in GCFL_GROUPS:
        size = len(GCFL_GROUPS[key])
        if num_clients != size:
            raise DataError(f"group {key} has one client per dataset: pass --clients {size}")
        return multi_dataset_partition(key, data_root, seed)
    return chunk_partition(dataset, num_clients, seed, data_root=data_root, order=chunk_order)
