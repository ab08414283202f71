"""Experiment trackers beside TensorBoard: ``--log wandb`` and ``--log mlflow`` (optional extras).

Each is a round hook (``hook(row, state, algo)``: the scalar metrics of each round at step
``round``) with ``finish(result)``: the final metrics as the run's summary and the whole
``result.json`` as a file of the tracked run.  The resolved config is logged when the run starts.

* :class:`WandbLogger` -- ``pip install 'secure-fgl[wandb]'``; project ``$WANDB_PROJECT``
  (default ``secure-fgl``), files under ``OUT/wandb``; ``WANDB_MODE=offline`` logs without an
  account (``wandb sync OUT/wandb/offline-run-*`` uploads later).
* :class:`MLflowLogger` -- ``pip install 'secure-fgl[mlflow]'``; tracking store
  ``$MLFLOW_TRACKING_URI``, else a local store in the run folder, ``OUT/mlflow.db`` with artifacts in
  ``OUT/mlartifacts`` (``mlflow ui --backend-store-uri sqlite:///OUT/mlflow.db``); experiment
  ``$MLFLOW_EXPERIMENT_NAME`` (default ``secure-fgl``).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..config import ConfigError
from ..results import flatten

#: --log name -> (module it needs, extra that installs it)
TRACKERS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
MLFLOW_DB, MLFLOW_ARTIFACTS = "mlflow.db", "mlartifacts"  # MLflow's local store in the run folder


def require(name: str):
    """The tracker's package, or a one-line error naming the extra to install."""
    module, extra = TRACKERS[name]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"--log {name} needs the {module} package: pip install 'secure-fgl[{extra}]' (or use --log csv)"
        ) from None


def scalars(row: dict) -> dict[str, float]:
    """The numeric entries of a round row or a flattened result (``round`` is the step, not a metric)."""
    return {k: v for k, v in row.items() if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def outcome(result: dict) -> dict[str, float]:
    """The result's numbers as ``final.*``, ``comm.*``, ``time.*``, ``attack.*``, ... (not the config)."""
    return {k: v for k, v in scalars(flatten(result)).items() if not k.startswith(("config.", "options."))}


class WandbLogger:
    """One Weights & Biases run per secure-fgl run, named after the run folder."""

    def __init__(self, out_dir: Path, config: dict):
        wandb = require("wandb")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "secure-fgl"),
            name=Path(out_dir).name,
            dir=str(out_dir),
            config=config,
            reinit="create_new",
        )

    def __call__(self, row: dict, state, algo) -> None:
        """Log the round's scalar metrics at step ``round``."""
        self.run.log(scalars(row), step=row["round"])

    def finish(self, result: dict) -> None:
        """Put the run's outcome in the summary and close the run."""
        self.run.summary.update({**outcome(result), "status": result.get("status")})
        self.run.finish()
        require("wandb").teardown()  # waits for W&B's service to write the run out (finish alone may not)


class MLflowLogger:
    """One MLflow run per secure-fgl run: config as params, rounds as metrics, result.json as an artifact."""

    def __init__(self, out_dir: Path, config: dict):
        mlflow = require("mlflow")
        from mlflow.entities import Param

        out = Path(out_dir).resolve()
        self.client = mlflow.MlflowClient(
            tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / MLFLOW_DB}"
        )
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "secure-fgl")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment(name, artifact_location=(out / MLFLOW_ARTIFACTS).as_uri())
        )
        self.run_id = self.client.create_run(experiment_id, run_name=Path(out_dir).name).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in flatten({"config": config}).items() if v is not None]
        self.client.log_batch(self.run_id, params=params)  # 6000: MLflow's limit on a value

    def __call__(self, row: dict, state, algo) -> None:
        """Log the round's scalar metrics at step ``round``."""
        for key, value in scalars(row).items():
            self.client.log_metric(self.run_id, key, float(value), step=row["round"])

    def finish(self, result: dict) -> None:
        """Log the run's outcome, attach result.json and end the run (FINISHED or FAILED)."""
        for key, value in outcome(result).items():
            self.client.log_metric(self.run_id, key, float(value))
        self.client.log_dict(self.run_id, result, "result.json")
        self.client.set_terminated(self.run_id, "FINISHED" if result.get("status") == "complete" else "FAILED")
