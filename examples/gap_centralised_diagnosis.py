"""GAP's pipeline without federation: where its accuracy on a node-classification graph comes from.

One process, one graph, the dataset's public split: the feature-only MLP (the encoder), then
``H_0 = E(x)/||E(x)||`` and ``H_h = rownorm(Ã H_{h-1} + N(0, sigma^2 I))`` (GAP, Sajadmanesh et al.
2023, sec. 4; sigma for edge-level ``(epsilon, 1e-5)``-DP over ``--hops`` releases, sensitivity
sqrt(2), times ``--noise-factor`` -- about 2 stands for plain mode's local noise, where a row's sum
carries the noise of every client uploading to it), and an MLP head on ``[H_0, ..., H_K]`` or on
``[H_1, ..., H_K]``.  Test accuracy at the best validation epoch, mean over ``--repeats`` noise
draws.  It isolates the pipeline from FedAvg (see docs/dp.md, "Diagnosis")::

    python examples/gap_centralised_diagnosis.py --dataset cora
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.nn import functional as F

from protocols.accountant import gaussian_mu_for
from secure_fgl.data.datasets import load_node_dataset


def mlp(inputs: int, hidden: int, classes: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Dropout(0.5),
        torch.nn.Linear(inputs, hidden),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.5),
        torch.nn.Linear(hidden, classes),
    )


def fit(model, inputs, data, epochs: int) -> float:
    """Adam lr 0.01, weight decay 5e-4, full batch; test accuracy at the best validation epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test = -1.0, 0.0
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        F.cross_entropy(model(inputs[data.train_mask]), data.y[data.train_mask]).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(inputs).argmax(1)
        val = (pred[data.val_mask] == data.y[data.val_mask]).float().mean().item()
        if val > best_val:
            best_val, test = val, (pred[data.test_mask] == data.y[data.test_mask]).float().mean().item()
    return test


def rownorm(h: torch.Tensor) -> torch.Tensor:
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="cora")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--hops", type=int, default=2)
    ap.add_argument("--epsilons", default="2,8,16,inf")
    ap.add_argument("--noise-factor", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=200)
    args = ap.parse_args()
    torch.manual_seed(0)
    data = load_node_dataset(args.dataset)
    n, classes = data.num_nodes, int(data.y.max()) + 1
    loops = torch.arange(n).repeat(2, 1)
    adj = torch.sparse_coo_tensor(
        torch.cat([data.edge_index, loops], 1), torch.ones(data.edge_index.size(1) + n), (n, n)
    ).coalesce()
    encoder = mlp(data.num_features, args.hidden, classes)
    print(f"feature-only MLP (encoder): test {fit(encoder, data.x, data, args.epochs):.3f}")
    encoder.eval()
    with torch.no_grad():
        h0 = rownorm(encoder[:-1](data.x))  # its last hidden layer
    print("| epsilon | sigma | head on [H_0..H_K] | head on [H_1..H_K] |\n|---|---|---|---|")
    for label in args.epsilons.split(","):
        eps = float(label)
        sigma = 0.0 if eps == float("inf") else args.noise_factor * args.hops**0.5 / gaussian_mu_for(eps, 1e-5) * 2**0.5
        with_h0, hops_only = [], []
        for _ in range(args.repeats):
            hs = [h0]
            for _ in range(args.hops):
                s = torch.sparse.mm(adj, hs[-1])
                hs.append(rownorm(s + sigma * torch.randn_like(s)))
            for cols, out in ((hs, with_h0), (hs[1:], hops_only)):
                inputs = torch.cat(cols, 1)
                out.append(fit(mlp(inputs.size(1), args.hidden, classes), inputs, data, args.epochs))
        print(f"| {label} | {sigma:.2f} | {statistics.mean(with_h0):.3f} | {statistics.mean(hops_only):.3f} |")


if __name__ == "__main__":
    main()
