"""Per-round hooks of the round loop: ``hook(row, state, algo)`` after every evaluated round.

* :class:`BestModelSaver` -- ``best_model.pt``, the weights at the best-validation round;
* :class:`CSVLogger` -- ``rounds.csv``, one line per round;
* :class:`TensorBoardLogger` -- scalars for TensorBoard (``pip install secure-fgl[tensorboard]``);
* :mod:`.trackers` -- Weights & Biases and MLflow runs (``--log wandb``, ``--log mlflow``).

A hook may also have ``finish(result)``, called with the final ``result.json`` content.

``best_model.pt`` holds plain tensors only (``{"<attribute>.<k>.<parameter>": tensor}``, one
entry per parameter of every model the algorithm holds; ``k`` indexes clients for per-client
models), so it loads with ``torch.load(path, weights_only=True)``; see :func:`load_best_model`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from torch import nn

from ..config import ConfigError
from .files import save_torch_atomic

BEST_MODEL = "best_model.pt"


def model_weights(algo) -> dict[str, torch.Tensor]:
    """Every ``nn.Module`` (or list of them) the algorithm holds, flattened to plain CPU tensors."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for attr, value in vars(algo).items():
        modules = (
            [(attr, value)]
            if isinstance(value, nn.Module)
            else (
                [(f"{attr}.{i}", m) for i, m in enumerate(value)]
                if isinstance(value, (list, tuple)) and value and all(isinstance(m, nn.Module) for m in value)
                else []
            )
        )
        for prefix, module in modules:
            if id(module) in seen:
                continue
            seen.add(id(module))
            for key, tensor in module.state_dict().items():
                out[f"{prefix}.{key}"] = tensor.detach().cpu().clone()
    return out


def load_best_model(path: str | Path, module: nn.Module, prefix: str = "models.0") -> nn.Module:
    """Load the weights saved under ``prefix`` into ``module``.

    Load the weights saved under ``prefix`` (e.g. ``models.0``: the global model of a
    model-averaging algorithm; ``models.3``/``gnns.3``: client 3's) into ``module``.
    """
    weights = torch.load(path, weights_only=True, map_location="cpu")
    state = {k[len(prefix) + 1 :]: v for k, v in weights.items() if k.startswith(prefix + ".")}
    if not state:
        prefixes = sorted({".".join(k.split(".")[:2]) for k in weights})
        raise KeyError(f"no weights under {prefix!r} in {path}; it holds {', '.join(prefixes)}")
    module.load_state_dict(state)
    return module


class BestModelSaver:
    """Writes ``best_model.pt`` whenever the round just evaluated is the best so far."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / BEST_MODEL

    def __call__(self, row: dict, state, algo) -> None:
        """Save the deployed weights when this round is the best so far."""
        if state.best_round == row["round"]:
            deployed = getattr(algo, "deployed_weights", None)  # client runtimes: asked of each client
            weights = deployed() if deployed is not None else model_weights(algo)
            if weights:
                save_torch_atomic(self.path, weights, private=False)


class CSVLogger:
    """``rounds.csv``: the scalar metrics of each round (columns from the first round)."""

    def __init__(self, out_dir: Path, resume: bool = False):
        self.path = Path(out_dir) / "rounds.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] | None = None
        if not resume and self.path.exists():
            self.path.unlink()

    def __call__(self, row: dict, state, algo) -> None:
        """Append the round's scalar metrics as one row."""
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float))}
        new = not self.path.exists()
        if self.columns is None:
            self.columns = list(scalars)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(scalars)


class TensorBoardLogger:
    """Scalars of each round under ``OUT/tensorboard`` (``tensorboard --logdir OUT``)."""

    def __init__(self, out_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--log tensorboard needs the tensorboard package: "
                "pip install 'secure-fgl[tensorboard]' (or use --log csv)"
            ) from None
        self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def __call__(self, row: dict, state, algo) -> None:
        """Write the round's scalar metrics at step ``round``."""
        for key, value in row.items():
            if key != "round" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, row["round"])
        self.writer.flush()


def make_hooks(
    out_dir: Path | None,
    *,
    log: tuple[str, ...] = (),
    save_best: bool = True,
    resume: bool = False,
    config: dict | None = None,
) -> list:
    """The hooks a run asked for (none without a run folder); ``config`` goes to the trackers."""
    from .trackers import MLflowLogger, WandbLogger

    if out_dir is None:
        return []
    hooks: list = [BestModelSaver(out_dir)] if save_best else []
    make = {
        "csv": lambda: CSVLogger(out_dir, resume),
        "tensorboard": lambda: TensorBoardLogger(out_dir),
        "wandb": lambda: WandbLogger(out_dir, config or {}),
        "mlflow": lambda: MLflowLogger(out_dir, config or {}),
    }
    for name in log:
        hooks.append(make[name]())
    return hooks


def finish_hooks(hooks: list, result: dict) -> None:
    """Hand the final result to the hooks that record it (the trackers)."""
    for hook in hooks:
        if hasattr(hook, "finish"):
            hook.finish(result)
