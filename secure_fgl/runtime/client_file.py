r"""A client's own data file: what a site holding only its own clients' parts loads.

``secure-fgl partition export`` partitions a node-classification dataset as every run does
(:func:`secure_fgl.data.load.load_federation`) and writes one file per client
(:func:`export_clients`).  A site started with ``--client-data FILE`` (:mod:`.flower_site`)
loads that file and never reads the dataset: it reports its own client's counts and the facts
every part shares, and its runtime starts from the file's arrays.

A file is a numpy ``.npz`` archive, read with ``allow_pickle=False`` (nothing is unpickled):

* the client's data fields as the set-up frame carries them (:data:`.partition.DATA_FIELDS`:
  its owned nodes' global ids, features, labels and split masks, its local edges, its
  cross-client edges with both ends' global ids; and ``far_owner``, the client holding the
  far end of each cross edge, which FedGCN's neighbour exchanges address);
* ``meta``: a JSON document (as ``uint8``) with the format name, the client id, the partition
  settings (:data:`.partition.SPEC_FIELDS` without ``data_root``), the SHA-256 of the data
  fields (:func:`.partition.data_digest`), the partition's fingerprint (SHA-256 over every
  client's digest: every file of one export carries the same), the facts every client shares
  (:data:`SHARED`) and the client's own counts (:data:`SUMS`).

The driver sums the own counts over the clients (:func:`summed_facts`)::

    n_train = sum_k n_train_k,   n_owned = sum_k n_owned_k,   n_trainers = sum_k [n_train_k > 0]

and requires every site to report the same shared facts and partition fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError
from .partition import DATA_FIELDS, SPEC_FIELDS, data_digest, data_fields, far_owners

FORMAT = "secure-fgl/client-data/v1"
#: the partition settings a file records and a run must match (the data folder is the exporter's own)
FILE_SPEC = tuple(f for f in SPEC_FIELDS if f != "data_root")
#: public facts every client's file holds the same value of (:class:`~.facts.PublicFacts`)
SHARED = ("num_nodes", "num_features", "num_classes", "num_clients", "binary_features", "count_features")
#: public facts a file holds its own client's count of; the driver sums them
SUMS = ("num_train", "num_owned", "num_trainers")
#: the arrays of a file
ARRAYS = (*DATA_FIELDS, "far_owner")


class ClientFileError(ValueError):
    """A client data file that is malformed, altered, or not the run's partition."""


def file_name(client: int) -> str:
    """The name :func:`export_clients` gives client ``client``'s file."""
    return f"client{client}.npz"


def export_clients(cfg, out: Path) -> list[Path]:
    """Partition ``cfg``'s dataset and write each client's part to ``out/client<k>.npz`` (mode 0600).

    Node classification only (a graph-classification client's data is its own dataset already).
    """
    from ..data.graph_build import is_graph_dataset
    from ..data.load import load_federation
    from .facts import PublicFacts

    if is_graph_dataset(cfg.dataset):
        raise ConfigError(
            f"secure-fgl partition export: {cfg.dataset} is a graph-classification dataset; export "
            "partitions node-classification graphs"
        )
    fed = load_federation(cfg)
    facts = PublicFacts.of(fed).to_dict()
    parts = {c.client_id: data_fields(c, far_owners(fed, c)) for c in fed.clients}
    digests = {k: data_digest(fields) for k, fields in parts.items()}
    fingerprint = hashlib.sha256(json.dumps([digests[k] for k in sorted(digests)]).encode()).hexdigest()
    spec = {f: getattr(cfg, f) for f in FILE_SPEC}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for k, fields in sorted(parts.items()):
        meta = {
            "format": FORMAT,
            "client": k,
            "spec": spec,
            "digest": digests[k],
            "partition": fingerprint,
            "shared": {f: facts[f] for f in SHARED},
            "own": own_counts(fields),
        }
        arrays: dict[str, Any] = {name: value.cpu().numpy() for name, value in fields.items()}
        path = out / file_name(k)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            np.savez_compressed(fh, meta=np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8), **arrays)
        written.append(path)
    return written


def own_counts(fields: dict) -> dict:
    """A client's own counts of the summed facts (:data:`SUMS`) from its data fields."""
    num_train = int(np.asarray(fields["train_mask"]).sum())
    return {"num_train": num_train, "num_owned": int(len(fields["global_ids"])), "num_trainers": int(num_train > 0)}


@dataclass(frozen=True)
class ClientFile:
    """One client's exported part: its data fields and the file's ``meta`` (module docstring)."""

    client: int
    spec: dict
    digest: str
    partition: str
    shared: dict
    own: dict
    fields: dict

    @classmethod
    def load(cls, path: Path) -> ClientFile:
        """Read ``path`` (no pickles); :class:`ClientFileError` if it is malformed or its data is not its digest's."""
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
            meta = json.loads(arrays.pop("meta").tobytes())
        except OSError as exc:
            raise ClientFileError(f"cannot read the client data file {path}: {exc}") from None
        except (
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
        ):  # numpy's own message would suggest loading pickles: never
            raise ClientFileError(
                f"{path} is not a client data file (secure-fgl partition export writes them; pickles and "
                "object arrays are refused)"
            ) from None
        keys = {"format", "client", "spec", "digest", "partition", "shared", "own"}
        if (
            not isinstance(meta, dict)
            or meta.get("format") != FORMAT
            or set(meta) != keys
            or set(arrays) != set(ARRAYS)
        ):
            raise ClientFileError(f"{path} is not a {FORMAT} file (secure-fgl partition export)")
        fields = {name: arrays[name] for name in ARRAYS}
        if data_digest(fields) != meta["digest"] or own_counts(fields) != meta["own"]:
            raise ClientFileError(f"{path}: its data is not the data it was exported with (altered or corrupt)")
        return cls(
            int(meta["client"]), meta["spec"], meta["digest"], meta["partition"], meta["shared"], meta["own"], fields
        )

    def check_run(self, cfg) -> None:
        """:class:`ClientFileError` naming the fix unless run ``cfg`` is the partition this file holds a part of."""
        if cfg.algorithm == "centralized":
            raise ClientFileError(
                "centralized needs the whole graph in one runtime; this site holds only its own clients' "
                "data files (--client-data): run centralized with --executor local"
            )
        differ = {f: (self.spec[f], getattr(cfg, f)) for f in FILE_SPEC if self.spec[f] != getattr(cfg, f)}
        if differ:
            named = ", ".join(f"{f} {file!r} (run: {run!r})" for f, (file, run) in differ.items())
            raise ClientFileError(
                f"client {self.client}'s data file is another partition than the run's: {named}; export the "
                "run's partition (secure-fgl partition export with the run's settings)"
            )

    def statement(self) -> dict:
        """What the site reports before set-up: the shared facts, its own counts, the partition and its digest."""
        return {
            "task": "node",
            "facts": {**self.shared, **self.own},
            "sums": list(SUMS),
            "partition": self.partition,
            "digest": self.digest,
        }


def summed_facts(statements: dict) -> dict:
    """The federation's public facts from sites that report their own counts (:meth:`ClientFile.statement`).

    The :data:`SUMS` summed over the clients, the :data:`SHARED` facts and the partition
    fingerprint required equal; :class:`~secure_fgl.config.ConfigError` naming the fix otherwise
    (also when some sites load the whole dataset and others their own files).
    """
    if not all("sums" in s for s in statements.values()):
        raise ConfigError(
            "--executor flower: some sites load the whole dataset and others their own client data files "
            "(--client-data): start every site the same way"
        )
    shared = {json.dumps([s["partition"], {f: s["facts"][f] for f in SHARED}]) for s in statements.values()}
    if len(shared) != 1:
        raise ConfigError(
            "--executor flower: the sites' client data files are parts of different partitions: give every "
            "site its file from one secure-fgl partition export"
        )
    first = next(iter(statements.values()))["facts"]
    counts = {f: sum(int(s["facts"][f]) for s in statements.values()) for f in SUMS}
    if len(statements) != first["num_clients"]:
        raise ConfigError(
            f"--executor flower: {len(statements)} sites' clients reported, the partition has {first['num_clients']}"
        )
    return {**{f: first[f] for f in SHARED}, **counts}
