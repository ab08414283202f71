"""Checks that need the registries, made once before any data is loaded.

Checks that need the registries (datasets, algorithms, attacks, the run folder), made once
before any data is loaded: a bad name or a bad folder is a one-line ConfigError, not a
traceback after training.  :func:`preflight` returns the algorithm's filled Options.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import zipfile
from pathlib import Path

from protocols.errors import ConfigurationError
from protocols.plan_policy import CollusionBound

from .algorithms import SPECS, get_spec
from .config import RunConfig
from .runtime.placement import client_resources
from .validation import ConfigError, check_settings, did_you_mean, flag_name, match_choice

#: accepted ``--device`` spellings
DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def dataset_tasks() -> dict[str, str]:
    """Every ``--dataset`` name -> ``'node'`` or ``'graph'`` (registry, GCFL groups, generators)."""
    from .data.datasets import DATASETS
    from .data.graph_classification import GCFL_GROUPS

    tasks = {name: info.task for name, info in DATASETS.items()}
    tasks.update({group: "graph" for group in GCFL_GROUPS})
    try:  # the graph-level generator, where this build has it
        from .data.synthetic_graphs import SYNTHETIC_GRAPHS

        tasks[SYNTHETIC_GRAPHS] = "graph"
    except ImportError:
        pass
    return tasks


def check_dataset(cfg: RunConfig, spec) -> None:
    """Check the dataset exists, suits the algorithm's task, and the data root is a folder; lower-case its name.

    Raises:
        ConfigError: an unknown dataset, the wrong task, or a data root that is not a folder.
    """
    tasks = dataset_tasks()
    task = tasks[match_choice("--dataset", cfg.dataset, tuple(tasks))]
    cfg.dataset = cfg.dataset.lower()  # one spelling in results (the data layer ignores case)
    if task != spec.task:
        raise ConfigError(
            f"--dataset {cfg.dataset} is a {task}-classification dataset and --algorithm "
            f"{cfg.algorithm} trains {spec.task} classification; pick a {spec.task}-classification "
            "dataset (list: secure-fgl datasets)"
        )
    if cfg.data_root is not None and not Path(cfg.data_root).is_dir():
        raise ConfigError(
            f"--data-root {cfg.data_root} is not a folder; give the folder holding the datasets (e.g. $SECURE_FGL_DATA)"
        )


def check_mode(cfg: RunConfig, spec) -> None:
    """The modes the spec lists; any other is refused before any data is loaded."""
    if cfg.mode not in spec.modes:
        raise ConfigError(spec.mode_refusal(cfg.mode))


def check_collusion(cfg: RunConfig) -> None:
    """Secure modes: check the collusion bound and the per-round sample size.

    Secure modes: the run's collusion bound is valid and every round samples at least the
    minimum number of contributors each client requires (:mod:`protocols.plan_policy`).
    """
    if cfg.mode == "plain":
        return
    try:
        bound = CollusionBound.of(cfg.max_colluders, cfg.min_contributors)
    except ConfigurationError as exc:
        raise ConfigError(str(exc)) from None
    sampled = cfg.clients if cfg.client_fraction >= 1 else max(1, int(round(cfg.client_fraction * cfg.clients)))
    if sampled < bound.min_contributors:
        raise ConfigError(
            f"--mode {cfg.mode}: every client refuses a sum over fewer than {bound.min_contributors} "
            f"contributors (--min-contributors, default --max-colluders + 2), but a round samples "
            f"{sampled}; raise --clients or --client-fraction, or lower --max-colluders"
        )


def check_attacks(cfg: RunConfig) -> None:
    """Resolve the ``--attacks`` names to their canonical spelling."""
    if not cfg.attacks:
        return
    from attacks.runner import ATTACKS

    names = []
    for name in cfg.attacks:
        names.append("all" if name.lower() == "all" else match_choice("--attacks", name, tuple(ATTACKS)))
    cfg.attacks = names


def check_out(cfg: RunConfig) -> None:
    """Check the output folder can be written, and for ``--resume`` that it holds a readable checkpoint.

    Raises:
        ConfigError: the folder is a file or not writable, or there is no valid checkpoint to resume.
    """
    if cfg.out is None:
        if cfg.resume:
            raise ConfigError("--resume needs --out DIR, the folder of the interrupted run")
        return
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder for the run's files")
    parent = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"--out {out}: {parent} is not writable; choose another folder")
    if cfg.resume:
        ckpt = out / "checkpoint.pt"
        if not ckpt.is_file():
            if (out / "dp_ledger.json").is_file():  # a DP run that crashed before its first checkpoint
                return
            raise ConfigError(f"--resume: no checkpoint at {ckpt}; drop --resume to start afresh")
        if not zipfile.is_zipfile(ckpt):
            raise ConfigError(f"--resume: {ckpt} is corrupt (not a torch checkpoint); delete it and drop --resume")


def check_logs(cfg: RunConfig) -> None:
    """Every --log target's package is installed (a one-line error naming its extra, before the run)."""
    for name in cfg.log.split(","):
        if name in ("tensorboard", "wandb", "mlflow") and importlib.util.find_spec(name) is None:
            raise ConfigError(
                f"--log {name} needs the {name} package: pip install 'secure-fgl[{name}]' (or use --log csv)"
            )


def _algorithms_with_option(name: str) -> list[str]:
    """The algorithms that have the option ``name`` (``-`` or ``_``)."""
    key = name.replace("-", "_")
    return [a for a, spec in SPECS.items() if key in {f.name for f in dataclasses.fields(spec.options)}]


def check_options(cfg: RunConfig, options_cls) -> object:
    """Check and fill in the algorithm's options; returns its ``Options`` instance.

    Raises:
        ConfigError: an option the algorithm does not have, a bad value, or ``--act-low >= --act-high``.
    """
    own = [flag_name(f.name) for f in dataclasses.fields(options_cls)]
    for key in cfg.options:
        flag = flag_name(str(key))
        if flag not in own:
            run_flags = [
                flag_name(f.name) for f in dataclasses.fields(RunConfig) if f.name not in ("options", "synthetic")
            ]
            known = f"its options: {', '.join(own)}" if own else "it has no options"
            owners = _algorithms_with_option(str(key))
            raise ConfigError(
                f"{flag} is not a run flag nor an option of --algorithm {cfg.algorithm} ({known})"
                + (
                    f"; {flag} is an option of --algorithm {' | '.join(owners)}"
                    if owners
                    else did_you_mean(flag, own + run_flags)
                )
            )
    values = check_settings(options_cls, cfg.options, what=f"an option of --algorithm {cfg.algorithm}")
    cfg.options = values
    opts = options_cls(**values)
    lo, hi = getattr(opts, "act_low", 0.0), getattr(opts, "act_high", 1.0)
    if lo >= hi:
        raise ConfigError(f"--act-low must be below --act-high, got {lo} and {hi}")
    return opts


def preflight(cfg: RunConfig, *, check_data: bool = True):
    """Validate ``cfg`` in place (canonical names); returns the algorithm's Options instance.

    ``check_data=False`` when the caller brings its own federation (no dataset lookup).
    """
    spec = get_spec(cfg.algorithm)
    cfg.algorithm = spec.name
    cfg.validate()
    if not DEVICE_PATTERN.match(cfg.device.lower()):
        raise ConfigError(
            f"--device {cfg.device!r} is not one of auto, cpu, cuda, cuda:N, mps"
            + did_you_mean(cfg.device, ("auto", "cpu", "cuda", "mps"))
        )
    cfg.device = cfg.device.lower()
    options = check_options(cfg, spec.options)
    check_out(cfg)
    check_logs(cfg)
    if spec.check is not None:  # the algorithm's own cross-field rules
        spec.check(options, cfg)
    check_mode(cfg, spec)
    check_collusion(cfg)
    if check_data:
        check_dataset(cfg, spec)
    check_attacks(cfg)
    client_resources(cfg)  # --ray-client-resources
    return options
