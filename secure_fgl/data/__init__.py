"""Data layer: datasets, synthetic graphs, partitioners, splits and federated containers.

Typical use::

    from secure_fgl.data import make_federated
    fg = make_federated("sbm", num_clients=10, partition="dirichlet", beta=1.0)
    fg.clients[0].x, fg.clients[0].cross_edges

Every user-facing problem raises :class:`DataError` (a ``ValueError``) whose message names
the fix.
"""

from importlib import import_module

from .errors import DataError

#: public name -> submodule; imported on first use, so that the registry (``dataset_status``,
#: ``DATASETS``, ``GCFL_GROUPS``) answers without torch (``secure-fgl datasets``)
_WHERE = {
    **dict.fromkeys(("ClientSubgraph", "FederatedGraph"), "federated"),
    **dict.fromkeys(
        ("coalesce_undirected", "contextual_sbm", "contextual_sbm_federated", "random_masks", "sbm_binary"), "synthetic"
    ),
    **dict.fromkeys(
        (
            "DATASETS",
            "DatasetInfo",
            "dataset_status",
            "get_dataset_info",
            "load_graph_dataset",
            "load_node_dataset",
            "resolve_cache_dir",
            "resolve_data_root",
            "GCFL_GROUPS",
        ),
        "datasets",
    ),
    **dict.fromkeys(
        ("dirichlet_partition", "iid_partition", "louvain_partition", "partition_label_distribution"), "partition"
    ),
    **dict.fromkeys(("SPLITS", "apply_split", "parse_split"), "splits"),
    **dict.fromkeys(("PARTITIONS", "build_federated", "make_federated"), "build"),
    **dict.fromkeys(
        ("FederatedGraphDataset", "GraphClient", "chunk_partition", "multi_dataset_partition"), "graph_classification"
    ),
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DataError",
    "ClientSubgraph",
    "FederatedGraph",
    "sbm_binary",
    "contextual_sbm",
    "contextual_sbm_federated",
    "coalesce_undirected",
    "random_masks",
    "DATASETS",
    "DatasetInfo",
    "get_dataset_info",
    "resolve_data_root",
    "resolve_cache_dir",
    "load_node_dataset",
    "load_graph_dataset",
    "dataset_status",
    "dirichlet_partition",
    "louvain_partition",
    "iid_partition",
    "partition_label_distribution",
    "SPLITS",
    "parse_split",
    "apply_split",
    "PARTITIONS",
    "build_federated",
    "make_federated",
    "GCFL_GROUPS",
    "GraphClient",
    "FederatedGraphDataset",
    "chunk_partition",
    "multi_dataset_partition",
]
