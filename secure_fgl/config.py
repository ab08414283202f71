"""Run configuration: one dataclass mirrored by the CLI flags and by config files.

Algorithm-specific settings live in each algorithm's ``Options`` dataclass; they are
given on the command line as ``--<field>`` flags and stored under ``options``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


#: optimiser names accepted by ``--optimizer``
OPTIMIZERS = ("adam", "sgd")


class ConfigError(ValueError):
    """A run setting is invalid; the message names the setting and the fix."""


@dataclass
class RunConfig:
    algorithm: str = "fedgcn"
    dataset: str = "sbm"
    clients: int = 10
    mode: str = "ckks"                  # plain | ckks | mask
    partition: str = "dirichlet"        # dirichlet | louvain | iid | native (csbm-fed: the generator's clients)
    beta: float = 10000.0               # Dirichlet concentration (FedGCN: 1, 100, 10000)
    resolution: float = 1.0             # Louvain resolution
    keep_largest: bool = False          # Louvain: keep the K largest communities as clients (FedSpray)
    split: str = "public"               # public | fedspray | fgssl | fedomd | random:a/b/c
    model: str = "gcn"
    hidden: int = 16
    num_layers: int = 2
    dropout: float = 0.5
    optimizer: str = "adam"             # adam | sgd (FedGCN's released code: SGD, lr 0.5)
    lr: float = 0.01
    weight_decay: float = 5e-4
    rounds: int = 50
    local_epochs: int = 1
    client_fraction: float = 1.0        # share of clients sampled each round
    patience: int | None = None         # early stopping on mean validation accuracy
    dp_epsilon: float | None = None     # total DP budget of the run (None: no DP)
    dp_delta: float = 1e-5
    dp_placement: str = "local"         # local | distributed
    dp_clip: float = 1.0                # L2 clip of each DP-protected contribution
    dp_exchanges: str = "all"           # 'all' or comma-separated tag prefixes to privatise (e.g. fedgcn/neighbour_sums)
    dp_unit: str | None = None          # edge | node | client: what one DP guarantee protects (None: edge for
                                        # algorithms with a neighbour-sum exchange, else client); secure_fgl/privacy.py
    dp_split: str | None = None         # 'tag=share,...': relative shares of the budget (default: even)
    dp_accountant: str = "exact"        # exact (Gaussian composition) | prv | rdp
    device: str = "auto"
    data_root: str | None = None
    seed: int = 0
    out: str | None = None
    resume: bool = False
    attacks: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    synthetic: dict[str, Any] = field(default_factory=dict)   # kwargs of the synthetic generator

    def validate(self) -> "RunConfig":
        from protocols import MODES
        if self.clients < 1:
            raise ConfigError(f"--clients must be >= 1, got {self.clients}")
        if self.rounds < 1:
            raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")
        if self.beta <= 0:
            raise ConfigError(f"--beta must be > 0 (Dirichlet concentration), got {self.beta}")
        if self.mode not in MODES:
            raise ConfigError(f"unknown --mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if not 0 < self.client_fraction <= 1:
            raise ConfigError(f"--client-fraction must be in (0, 1], got {self.client_fraction}")
        if self.dp_epsilon is not None and self.dp_epsilon <= 0:
            raise ConfigError(f"--dp-epsilon must be > 0 (omit it for no DP), got {self.dp_epsilon}")
        if self.dp_placement not in ("local", "distributed"):
            raise ConfigError(f"--dp-placement must be 'local' or 'distributed', got {self.dp_placement!r}")
        if self.dp_unit is not None and self.dp_unit not in ("edge", "node", "client"):
            raise ConfigError(f"--dp-unit must be edge, node or client, got {self.dp_unit!r}")
        if self.dp_accountant not in ("exact", "prv", "rdp"):
            raise ConfigError(f"--dp-accountant must be exact, prv or rdp, got {self.dp_accountant!r}")
        if self.dp_epsilon is None and (self.dp_unit is not None or self.dp_split is not None):
            raise ConfigError("--dp-unit / --dp-split need --dp-epsilon (the run's total DP budget)")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown --optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
        if self.local_epochs < 1:
            raise ConfigError(f"--local-epochs must be >= 1, got {self.local_epochs}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
        return cls(**d)


def load_config_file(path: str | Path) -> dict:
    """Read a TOML, YAML or JSON file whose keys mirror the CLI flags (``-`` or ``_``)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        raw = tomllib.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ModuleNotFoundError:
            raise ConfigError("YAML config files need PyYAML: pip install pyyaml (or use TOML)") from None
        raw = yaml.safe_load(text) or {}
    elif path.suffix == ".json":
        raw = json.loads(text)
    else:
        raise ConfigError(f"config file {path} must end in .toml, .yaml/.yml or .json")
    return {k.replace("-", "_"): v for k, v in raw.items()}
