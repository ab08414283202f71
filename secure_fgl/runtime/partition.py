"""A pinned client loads its own partition on the machine that holds it.

A client pinned to a Ray node (``--ray-client-resources``, :mod:`.placement`) gets a set-up frame
without data (:func:`spec_frame`): the run's settings (dataset, partition, seed: a public data
spec), the public facts and the SHA-256 of the data the run planned for it.  Its runtime, on
that node, loads the dataset from its own ``--data-root`` / ``$SECURE_FGL_DATA`` (or generates the
synthetic graph from its seed), partitions it as every run does
(:func:`secure_fgl.data.load.load_federation`: deterministic given the settings) and keeps
only its own subgraph (:func:`own_fields`).  The digest check refuses a partition that differs
from the driver's (another dataset file, another version of the code): one error naming the
fix, not a silently different run.

On Ray the driver still partitions the data to learn the public facts and the digests (a
simulation: one organisation holds every partition), but a pinned client's data never crosses
from the driver to its machine.  On Flower the sites report both (:func:`own_facts`)
and the driver loads no data.  Clients of one process share one load
(:func:`forget` drops it once their runtimes are built).
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np

from ..config import RunConfig
from ..data.load import load_federation
from . import wire

#: RunConfig fields that decide a client's partition (:func:`secure_fgl.data.load.load_federation`)
SPEC_FIELDS = (
    "dataset",
    "clients",
    "partition",
    "beta",
    "resolution",
    "keep_largest",
    "split",
    "seed",
    "data_root",
    "synthetic",
)


#: a client subgraph's tensors, as its set-up frame carries them
DATA_FIELDS = ("global_ids", "x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "cross_edges")


def data_fields(c, far_owner) -> dict:
    """Client ``c``'s data as set-up frame fields.

    Its subgraph and the owner of the far end of each of its cross edges.
    """
    return {**{f: getattr(c, f) for f in DATA_FIELDS}, "far_owner": far_owner}


def data_digest(fields: dict) -> str:
    """SHA-256 of the data fields as the wire carries them (:mod:`.wire`)."""
    return hashlib.sha256(wire.pack(fields)).hexdigest()


def far_owners(fed, c):
    """The owner of the far end of each of ``c``'s cross edges."""
    return fed.owner[c.cross_edges[1]] if c.cross_edges.numel() else c.cross_edges[1].new_empty(0)


@functools.lru_cache(maxsize=1)
def _federation(spec: str):
    return load_federation(RunConfig(**json.loads(spec)))


def _loaded(cfg: RunConfig):
    """The federation of ``cfg``'s data spec, loaded and partitioned in this process (once per spec)."""
    return _federation(json.dumps({f: getattr(cfg, f) for f in SPEC_FIELDS}, sort_keys=True))


def _client_fields(fed, client_id: int) -> dict:
    c = fed.clients[int(client_id)]
    if hasattr(fed, "graph"):  # node classification: the client's subgraph
        return data_fields(c, far_owners(fed, c))
    from .graph_data import graph_fields  # graph classification: the client's own graphs

    return graph_fields(c)


def own_facts(cfg: RunConfig, client_id: int) -> dict:
    """What a site tells the aggregator before set-up: the public facts and its client's data digest.

    The federation's public facts (:class:`~.facts.PublicFacts` or :class:`~.facts.GraphFacts`) and
    the digest of client ``client_id``'s data fields, from the partition this process loads; JSON values.
    """
    from .facts import GraphFacts, PublicFacts

    fed = _loaded(cfg)
    task = "node" if hasattr(fed, "graph") else "graph"
    facts = PublicFacts.of(fed) if task == "node" else GraphFacts.of(fed)
    return {"task": task, "facts": facts.to_dict(), "digest": data_digest(_client_fields(fed, client_id))}


def own_fields(cfg: RunConfig, client_id: int, digest: str) -> dict:
    """Client ``client_id``'s data fields, loaded and partitioned in this process.

    As numpy arrays (a frame's fields); ``ValueError`` if they are not the data the run planned (``digest``).
    """
    fields = _client_fields(_loaded(cfg), client_id)
    if data_digest(fields) != digest:
        raise ValueError(
            f"client {client_id}: the partition of {cfg.dataset} loaded on this machine differs from "
            "the driver's (digest mismatch); give every machine the same dataset files "
            "(--data-root / $SECURE_FGL_DATA) and the same secure_fgl version"
        )
    return {name: value if isinstance(value, np.ndarray) else value.cpu().numpy() for name, value in fields.items()}


def forget() -> None:
    """Drop the loaded federation (the clients of this process have taken their subgraphs)."""
    _federation.cache_clear()
