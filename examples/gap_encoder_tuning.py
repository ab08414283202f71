"""Tune the central feature-only MLP (GAP's encoder) on validation: learning rate, weight decay, dropout, epochs.

One process, one graph, the dataset's public split, full batch: the run's MLP
(:class:`secure_fgl.models.node.MLP`, ``--hidden`` wide, 2 layers) trained by Adam for ``--epochs``
epochs, the epoch with the best validation accuracy kept -- what ``--algorithm gap --clients 1``
does for its encoder, one epoch a round.  For every setting of the grid it prints the mean ± std
over ``--seeds`` of the validation accuracy at that epoch, its test accuracy and the epoch, best
validation first; the setting is chosen by validation only::

    python examples/gap_encoder_tuning.py --dataset citeseer --hidden 64
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import torch
from torch.nn import functional as F

from secure_fgl.data.datasets import load_node_dataset
from secure_fgl.models.node import MLP


def fit(data, hidden: int, lr: float, weight_decay: float, dropout: float, epochs: int, seed: int):
    """(validation accuracy, test accuracy, epoch) at the best validation epoch."""
    torch.manual_seed(seed)
    model = MLP(data.num_features, hidden, data.num_classes, dropout=dropout)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    x_train, y_train = data.x[data.train_mask], data.y[data.train_mask]
    x_eval, y_eval = data.x[data.val_mask | data.test_mask], data.y[data.val_mask | data.test_mask]
    is_val = data.val_mask[data.val_mask | data.test_mask]  # an MLP reads each row alone: no other row is needed
    best = (-1.0, 0.0, 0)
    for epoch in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(x_train, None), y_train).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            hit = model(x_eval, None).argmax(1) == y_eval
        val, test = hit[is_val].float().mean().item(), hit[~is_val].float().mean().item()
        if val > best[0]:
            best = (val, test, epoch)
    return best


def band(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="citeseer")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=floats, default=floats("0.01,0.003,0.001"))
    ap.add_argument("--weight-decay", type=floats, default=floats("5e-4,5e-3,2e-2"))
    ap.add_argument("--dropout", type=floats, default=floats("0.5,0.8"))
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    data = load_node_dataset(args.dataset)
    rows = []
    for lr, wd, p in itertools.product(args.lr, args.weight_decay, args.dropout):
        runs = [fit(data, args.hidden, lr, wd, p, args.epochs, s) for s in range(args.seeds)]
        rows.append((statistics.mean(r[0] for r in runs), lr, wd, p, runs))
    print(f"{args.dataset}, hidden {args.hidden}, {args.epochs} epochs, seeds 0-{args.seeds - 1}")
    print("| lr | weight decay | dropout | val (best epoch) | test | best epoch |\n|---|---|---|---|---|---|")
    for _, lr, wd, p, runs in sorted(rows, key=lambda row: -row[0]):
        epochs = ", ".join(str(r[2]) for r in runs)
        print(f"| {lr:g} | {wd:g} | {p:g} | {band([r[0] for r in runs])} | {band([r[1] for r in runs])} | {epochs} |")


if __name__ == "__main__":
    main()
