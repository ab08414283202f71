"""Run configuration: one dataclass mirrored by the CLI flags and by config files.

Algorithm-specific settings live in each algorithm's ``Options`` dataclass; they are
given on the command line as ``--<field>`` flags and stored under ``options``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from protocols.registry import modes

from .algorithms import algorithm_name
from .runtime.dropouts import parse_dropouts
from .validation import (
    RENAMED_SETTINGS,
    ConfigError,
    check_settings,
    did_you_mean,
    match_choice,
    renamed_setting_error,
    setting,
)

#: optimiser names accepted by ``--optimizer``
OPTIMIZERS = ("adam", "sgd")
#: ``secure_fgl.models.MODELS`` (kept here so that ``--help`` needs no torch; a test checks they agree)
MODEL_NAMES = ("gcn", "sage", "gat", "sgc", "mlp", "gin")
#: the answer to ``--executor inline``, the in-process executor that was removed
INLINE_REMOVED = (
    "--executor inline was removed: use --executor local (the default; one runtime per client in this "
    "process, the same results)"
)


@dataclass
class RunConfig:
    # data
    """Every setting of a run, one field per setting.

    Each field is a command-line flag ``--<name>`` and a config-file key; its group, bounds and help text are in its
    ``setting``. Algorithm-specific settings are in ``options``.
    """

    dataset: str = setting("sbm", group="data", help="dataset name (list: secure-fgl datasets)")
    data_root: str | None = setting(
        None,
        group="data",
        unit="path",
        help="dataset folder (default $SECURE_FGL_DATA, else ~/.cache/secure_fgl/datasets)",
    )
    split: str = setting(
        "public", group="data", help="train/val/test split: public | fedspray | fgssl | fedomd | random:a/b/c"
    )
    synthetic: dict[str, Any] = setting(
        group="data", default_factory=dict, help="keyword arguments of the synthetic generator (config files only)"
    )
    # federation
    algorithm: str = setting("fedgcn", group="federation", help="algorithm (list: secure-fgl algorithms)")
    clients: int = setting(10, group="federation", min=1, unit="parties", help="number of clients")
    partition: str = setting(
        "dirichlet",
        group="federation",
        choices=("dirichlet", "louvain", "iid", "native", "file-order"),
        help="how nodes are split over clients (native: csbm-fed's own clients); "
        "graph classification: graphs shuffled before chunking, file-order: "
        "GCFL's reference chunking in file order",
    )
    beta: float = setting(
        10000.0,
        group="federation",
        min=0,
        min_exclusive=True,
        help="Dirichlet concentration (FedGCN: 1, 100, 10000; large = iid-like)",
    )
    resolution: float = setting(1.0, group="federation", min=0, min_exclusive=True, help="Louvain resolution")
    keep_largest: bool = setting(
        False, group="federation", help="Louvain: keep the K largest communities as clients (FedSpray)"
    )
    client_fraction: float = setting(
        1.0,
        group="federation",
        min=0,
        max=1,
        min_exclusive=True,
        unit="fraction",
        help="share of clients sampled each round",
    )
    # model
    model: str = setting("gcn", group="model", choices=MODEL_NAMES, help="GNN architecture")
    hidden: int = setting(16, group="model", min=1, unit="units", help="hidden layer width")
    num_layers: int = setting(2, group="model", min=1, unit="layers", help="number of GNN layers")
    dropout: float = setting(0.5, group="model", min=0, max=0.99, unit="probability", help="dropout rate")
    heads: int = setting(8, group="model", min=1, unit="heads", help="GAT: attention heads of the hidden layers")
    # training
    optimizer: str = setting(
        "adam", group="training", choices=OPTIMIZERS, help="clients' optimiser (FedGCN's released code: sgd, lr 0.5)"
    )
    lr: float = setting(0.01, group="training", min=0, min_exclusive=True, help="learning rate")
    momentum: float = setting(0.0, group="training", min=0, max=0.999, help="SGD momentum (FGSSL: 0.9)")
    weight_decay: float = setting(5e-4, group="training", min=0, help="L2 weight decay")
    rounds: int = setting(50, group="training", min=1, unit="rounds", help="communication rounds")
    local_epochs: int = setting(1, group="training", min=1, unit="epochs", help="local steps per round")
    patience: int | None = setting(
        None,
        group="training",
        min=1,
        unit="rounds",
        help="stop after this many rounds without a better mean validation accuracy",
    )
    seed: int = setting(0, group="training", min=0, help="seed of data, partition and model (not of keys/noise)")
    device: str = setting("auto", group="training", help="auto | cpu | cuda | cuda:N | mps")
    # privacy
    dp_epsilon: float | None = setting(
        None, group="privacy", min=0, min_exclusive=True, help="total DP budget of the run (omit: no DP)"
    )
    dp_delta: float = setting(1e-5, group="privacy", min=0, max=1, min_exclusive=True, help="DP delta")
    dp_placement: str = setting(
        "auto",
        group="privacy",
        choices=("auto", "local", "distributed"),
        help="who adds the noise: each client all of it (local) or a share each "
        "(distributed); auto: distributed in ckks/mask/ckks-mp, local in plain",
    )
    dp_dropouts: int = setting(
        0,
        group="privacy",
        min=0,
        unit="clients",
        help="distributed noise: over-provision for this many dropouts after noising (more are refused)",
    )
    dp_colluders: int = setting(
        1,
        group="privacy",
        min=0,
        unit="clients",
        help="distributed noise: over-provision against this many colluding clients",
    )
    dp_clip: float = setting(
        1.0, group="privacy", min=0, min_exclusive=True, unit="L2 norm", help="clip of each DP-protected contribution"
    )
    dp_exchanges: str = setting(
        "all",
        group="privacy",
        help="'all' or comma-separated exchange tag prefixes to privatise (e.g. fedgcn/neighbour_sums)",
    )
    dp_unit: str | None = setting(
        None,
        group="privacy",
        choices=("edge", "node", "client", "sample"),
        help="what one DP guarantee protects (default: edge for algorithms with a "
        "neighbour-sum exchange, sample for --dpsgd alone, else client; docs/dp.md)",
    )
    dp_budget_share: str | None = setting(
        None,
        group="privacy",
        help="'tag=share,...': each exchange's relative share of --dp-epsilon (default: equal shares)",
    )
    dp_accountant: str = setting(
        "exact",
        group="privacy",
        choices=("exact", "prv", "rdp"),
        help="composition: exact Gaussian (default), PRV or RDP",
    )
    # secure mode
    mode: str = setting("ckks", group="secure mode", choices=modes(), help="exchange protocol (list: secure-fgl modes)")
    fixed_point_bits: int | None = setting(
        None,
        group="secure mode",
        min=2,
        max=52,
        unit="bits",
        help="ckks: float exchanges as packed fixed point, fields of at least "
        "this many bits, 2 per slot half at 20 (omit: one float per slot; "
        "docs/performance.md)",
    )
    ckks_real_slots: bool = setting(
        False,
        group="secure mode",
        help="ckks: real slots only (default: integer exchanges and "
        "those on a public grid travel as exact signed fields in both halves of each "
        "complex slot: the same sums in fewer ciphertexts)",
    )
    grid_model_mean: bool | None = setting(
        None,
        group="secure mode",
        help="FedAvg-style model mean on a public grid (--update-bound sizes it): "
        "every mode returns the same mean bit for bit; ckks carries it as exact "
        "integer fields (default: on, except ckks with --ckks-real-slots or "
        "--fixed-point-bits; false: plain's float32 mean; "
        "docs/performance.md)",
    )
    update_bound: float | None = setting(
        None,
        group="secure mode",
        min=0,
        min_exclusive=True,
        help="public bound on |model update entry| that model exchanges are "
        "planned for (default 100); clients refuse larger updates",
    )
    max_colluders: int = setting(
        0,
        group="secure mode",
        min=0,
        unit="clients",
        help="c: clients that may collude with the server; every client refuses a sum with "
        "fewer than --min-contributors contributors (docs/security.md)",
    )
    min_contributors: int | None = setting(
        None,
        group="secure mode",
        min=2,
        unit="clients",
        help="contributors every client requires in each sum it joins "
        "(default max-colluders + 2: at least two honest ones)",
    )
    threshold: int | None = setting(
        None,
        group="secure mode",
        min=2,
        unit="clients",
        help="ckks-mp: t-out-of-n key switching, any t clients decrypt (so t clients together hold "
        "the key: the collusion bound drops from n - 1 to t - 1) and up to n - t may drop out; "
        "needs 2t > n + max-colluders (default n: n-out-of-n; docs/ckks_mp.md)",
    )
    keyswitch_batch_mb: int | None = setting(
        None,
        group="secure mode",
        min=1,
        unit="MiB",
        help="ckks-mp: the most key-switching share bytes (all clients' together) the server asks for in "
        "one call, which bounds the key switch's memory (default 256; docs/ckks_mp.md)",
    )
    manifest: str | None = setting(
        None,
        group="secure mode",
        unit="path",
        help="run manifest built from the sites' own identity keys (secure-fgl manifest new; "
        "--executor flower, with --identity-key; docs/deployment.md)",
    )
    identity_key: str | None = setting(
        None,
        group="secure mode",
        unit="path",
        help="the aggregator's identity key (secure-fgl keys new), listed as 'server' in --manifest",
    )
    # runtime (docs/runtime.md)
    executor: str = setting(
        "local",
        group="runtime",
        choices=("local", "ray", "flower"),
        help="where clients run: local (default: one runtime per client, this process), "
        "ray (Ray actors; pip install -e '.[ray]') or "
        "flower (one site per organisation behind a Flower SuperNode; pip install -e "
        "'.[flower]', docs/deployment.md); docs/runtime.md",
    )
    ray_address: str | None = setting(
        None, group="runtime", help="Ray cluster to join: auto or HOST:PORT (default: start a local one)"
    )
    ray_num_cpus: int | None = setting(
        None, group="runtime", min=1, unit="CPUs", help="CPUs of the local Ray cluster (default: all)"
    )
    ray_workers: int | None = setting(
        None,
        group="runtime",
        min=1,
        unit="actors",
        help="Ray actors hosting the clients (default: one per CPU of the cluster)",
    )
    ray_client_resources: str | None = setting(
        None,
        group="runtime",
        unit="RESOURCE:CLIENTS;...",
        help="pin clients to the Ray nodes declaring a custom resource, e.g. site_a:0-4;site_b:5,6 (docs/runtime.md)",
    )
    round_timeout: float = setting(
        600.0,
        group="runtime",
        min=0,
        min_exclusive=True,
        unit="seconds",
        help="how long one call to the clients may take before the silent ones count as dropouts",
    )
    simulate_dropouts: str | None = setting(
        None,
        group="runtime",
        unit="WHO@STAGE[:rROUND];...",
        help="clients that stop answering at a protocol stage, e.g. 2@upload, "
        "2@upload:r3 or 1,4@unmask (docs/runtime.md)",
    )
    # output
    out: str | None = setting(
        None, group="output", unit="path", help="run folder (CLI default runs/<algorithm>-<dataset>-<mode>-<time>)"
    )
    resume: bool = setting(False, group="output", help="continue from OUT/checkpoint.pt")
    save_best_model: bool = setting(True, group="output", help="write OUT/best_model.pt (best-validation weights)")
    log: str = setting("", group="output", help="per-round logs: csv, tensorboard, wandb, mlflow (comma-separated)")
    # attacks
    attacks: list[str] = setting(
        group="attacks", default_factory=list, help="'all' or comma-separated attack names (list: secure-fgl attacks)"
    )
    options: dict[str, Any] = setting(
        group="algorithm", default_factory=dict, help="the algorithm's own options (see secure-fgl algorithms NAME)"
    )

    @property
    def model_mean_on_grid(self) -> bool:
        """Whether the model mean is taken on the public grid (``--grid-model-mean``).

        ``--grid-model-mean``, or its default: on in every mode, so plain, mask, ckks and ckks-mp
        average the model on the same public grid and return the same mean bit for bit (plain then
        carries it as float64 where float32 cannot hold the grid's sums); off for ckks with real slots
        or packed fixed point, the codecs chosen instead of the grid.  ``False`` keeps plain's float32 mean.
        """
        if self.grid_model_mean is not None:
            return self.grid_model_mean
        return not (self.mode == "ckks" and (self.ckks_real_slots or self.fixed_point_bits is not None))

    def validate(self) -> RunConfig:
        """Check every field and the cross-field rules.

        Every field against its type, range and choices (names matched case-insensitively and
        replaced by their canonical spelling), then the cross-field rules.  Raises ConfigError.
        """
        self.algorithm = algorithm_name(str(self.algorithm))
        if str(self.executor).strip().lower() == "inline":
            raise ConfigError(INLINE_REMOVED)
        if str(self.dp_epsilon).strip().lower() in ("inf", "infinity", "none", "no-dp", "nodp", "∞"):
            self.dp_epsilon = None  # "inf" = no DP, as in secure-fgl report --dp-epsilons
        values = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("synthetic", "options", "attacks")
        }
        for name, value in check_settings(type(self), values).items():
            setattr(self, name, value)
        if not isinstance(self.synthetic, dict):
            raise ConfigError(f"synthetic must be a table of generator arguments, got {self.synthetic!r}")
        if not isinstance(self.options, dict):
            raise ConfigError(f"options must be a table of algorithm options, got {self.options!r}")
        if isinstance(self.attacks, str):
            self.attacks = [a.strip() for a in self.attacks.split(",") if a.strip()]
        if not isinstance(self.attacks, list) or not all(isinstance(a, str) for a in self.attacks):
            raise ConfigError(f"attacks must be a list of names, got {self.attacks!r}")
        if self.split not in ("public", "fedspray", "fgssl", "fedomd") and not self.split.startswith("random:"):
            raise ConfigError(
                f"--split {self.split!r} is not one of public, fedspray, fgssl, fedomd, random:a/b/c"
                + did_you_mean(self.split, ("public", "fedspray", "fgssl", "fedomd"))
            )
        self.log = ",".join(
            match_choice("--log", x.strip(), ("csv", "tensorboard", "wandb", "mlflow"))
            for x in self.log.split(",")
            if x.strip()
        )
        if self.dp_exchanges != "all" and self.dp_epsilon is None:
            raise ConfigError("--dp-exchanges selects what DP protects; give --dp-epsilon too")
        if self.dp_epsilon is None and (self.dp_unit is not None or self.dp_budget_share is not None):
            raise ConfigError("--dp-unit / --dp-budget-share need --dp-epsilon (the run's total DP budget)")
        if self.fixed_point_bits is not None and self.mode != "ckks":
            raise ConfigError("--fixed-point-bits packs the ckks exchanges; use --mode ckks or omit it")
        if self.ckks_real_slots and (self.mode != "ckks" or self.fixed_point_bits is not None):
            raise ConfigError(
                "--ckks-real-slots keeps every ckks exchange in real slots; use --mode ckks without "
                "--fixed-point-bits, or omit it"
            )
        if self.threshold is not None:
            if self.mode != "ckks-mp":
                raise ConfigError("--threshold sets ckks-mp's t-out-of-n key switching; use --mode ckks-mp or omit it")
            if self.threshold > self.clients:
                raise ConfigError(f"--threshold {self.threshold} exceeds --clients {self.clients}: choose t <= n")
            if self.max_colluders >= self.threshold:
                raise ConfigError(
                    f"--max-colluders {self.max_colluders} with --threshold {self.threshold}: any t clients "
                    "hold the key together, so the threshold must exceed the colluders (raise --threshold)"
                )
            if self.threshold < self.clients and 2 * self.threshold <= self.clients + self.max_colluders:
                raise ConfigError(
                    f"--threshold {self.threshold} with --clients {self.clients} and --max-colluders "
                    f"{self.max_colluders}: t-out-of-n needs 2t > n + c, i.e. --threshold >= "
                    f"{(self.clients + self.max_colluders) // 2 + 1} (docs/ckks_mp.md)"
                )
        if self.keyswitch_batch_mb is not None and self.mode != "ckks-mp":
            raise ConfigError("--keyswitch-batch-mb bounds ckks-mp's key-switch batches; use --mode ckks-mp or omit it")
        if self.simulate_dropouts is not None:
            parse_dropouts(self.simulate_dropouts, self.clients, self.mode, self.rounds)
        if (self.manifest is None) != (self.identity_key is None):
            raise ConfigError("--manifest and --identity-key go together: the sites' manifest and the server's key")
        if self.manifest is not None and self.executor != "flower":
            raise ConfigError(
                "--manifest pins identity keys the sites hold: use --executor flower (the other "
                "executors draw every party's key in this one trust domain)"
            )
        if self.momentum and self.optimizer != "sgd":
            raise ConfigError("--momentum applies to --optimizer sgd only (Adam keeps its own moments)")
        return self

    def to_dict(self) -> dict:
        """The settings as a plain dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Build a config from a dict of settings.

        Raises:
            ConfigError: a key is not a setting (the error suggests the nearest one) or was renamed (the error names
                the current name; a stored config goes through
                :func:`~secure_fgl.validation.current_names` first).
        """
        known = {f.name for f in fields(cls)}
        renamed = sorted(set(d) & set(RENAMED_SETTINGS))
        if renamed:
            raise renamed_setting_error(renamed[0])
        unknown = set(d) - known
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(
                f"unknown setting {name!r}" + (did_you_mean(name, known) or f"; known: {', '.join(sorted(known))}")
            )
        return cls(**d)


def load_config_file(path: str | Path) -> dict:
    """Read a TOML, YAML or JSON file whose keys mirror the CLI flags (``-`` or ``_``)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {path} does not exist" if not path.exists() else f"config file {path} is not a file"
        )
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"config file {path} must end in .toml, .yaml/.yml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"
        ) from None
    try:
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
        else:
            raw = json.loads(text)
    except ConfigError:
        raise
    except Exception as e:  # each parser has its own error type; all mean "not valid syntax"
        detail = " ".join(str(e).split())
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:].upper()}: {detail}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a table of settings, got {type(raw).__name__}")
    return {str(k).replace("-", "_"): v for k, v in raw.items()}
