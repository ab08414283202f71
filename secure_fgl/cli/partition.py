"""``secure-fgl partition export``: each client's part of a partitioned dataset, one file per client.

    secure-fgl partition export --dataset cora --clients 3 --seed 0 --out DIR
                                DIR/client<k>.npz for every client k; a site started with
                                --client-data DIR/client<k>.npz holds only that part

The partition is the one a run with the same settings makes (:mod:`secure_fgl.runtime.client_file`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

from ..config import RunConfig
from .layers import config_from_args

#: the run settings that decide a partition, as flags (``synthetic``: config files only); listed here so that
#: building the parser imports no torch (:data:`secure_fgl.runtime.client_file.FILE_SPEC`)
PARTITION_FLAGS = (
    "dataset",
    "clients",
    "partition",
    "beta",
    "resolution",
    "keep_largest",
    "split",
    "seed",
    "data_root",
)


def add_partition_parser(sub, add_setting: Callable) -> None:
    """Register ``partition export`` under the ``secure-fgl`` subcommands ``sub``.

    ``add_setting(group, cls, field, dest)`` adds one run setting's flag, as ``run`` has it.
    """
    part = sub.add_parser("partition", help="a partitioned dataset's client parts (export)", allow_abbrev=False)
    ps = part.add_subparsers(dest="partition_command", metavar="ACTION", required=True)
    export = ps.add_parser(
        "export",
        help="write each client's part of a partitioned dataset to its own file",
        allow_abbrev=False,
        description="Partition a node-classification dataset as a run with the same settings does and write "
        "each client's part (its nodes' global ids, features, labels and splits, its local and cross-client "
        "edges, the public facts) to OUT/client<k>.npz, mode 0600. Give each site its own file "
        "(python -m secure_fgl.runtime.flower_site --client-data FILE).",
    )
    export.add_argument("--config", metavar="FILE", help="a run's config file (its partition settings are used)")
    export.add_argument("--preset", metavar="NAME", default=None, help="a preset the config file and flags override")
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for name in PARTITION_FLAGS:
        add_setting(export, RunConfig, fields[name], name)
    export.add_argument("--out", dest="export_out", required=True, metavar="DIR", help="folder for the files")


def partition_command(args: argparse.Namespace) -> int:
    """``secure-fgl partition export``: write the files and print each one's path."""
    from ..runtime.client_file import export_clients

    cfg = config_from_args(args)
    for path in export_clients(cfg, Path(args.export_out)):
        print(path)
    return 0
