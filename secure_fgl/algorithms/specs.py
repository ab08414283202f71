"""Every algorithm's :class:`~.spec.AlgorithmSpec`, by ``--algorithm`` name.

No torch import. Each algorithm package's ``__init__`` holds its specs; this is the order ``secure-fgl algorithms``
lists them.

``secure-fgl algorithms [NAME]`` prints the catalogue text; presets (``secure_fgl/configs/*.toml``)
name their algorithm and are found by it.
"""

from __future__ import annotations

from . import centralized, fedavg, fedgcn, fedomd, fedspray, fgssl, gap, gcfl, graph_level
from .spec import AlgorithmSpec

SPECS: dict[str, AlgorithmSpec] = {
    s.name: s
    for s in [
        *fedavg.SPECS,
        *centralized.SPECS,
        *fedgcn.SPECS,
        *fedomd.SPECS,
        *fedspray.SPECS,
        *graph_level.SPECS,
        *gcfl.SPECS,
        *fgssl.SPECS,
        *gap.SPECS,
    ]
}
