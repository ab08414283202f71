"""Why our Local baseline is ~25 points above FGSSL's Table 1: evaluate each Local client's model
on its own test nodes and on the whole graph's test nodes.

FGSSL (Huang et al., IJCAI 2023, sec. 4.1) defines Local as "each client train[s] their model
locally" and reports "the node classification accuracy on the testing nodes" without saying whose
test nodes.  Our ``Local (GAT)`` row evaluates client k's model on client k's own test nodes (the
personalised reading).  This script loads the best-validation weights of finished Local runs of
``examples/fgssl_table1.py`` (``best_model.pt``: ``models.<k>`` = client k's model) and measures,
for every client k,

* ``own``:    accuracy of model k on client k's test nodes, on client k's subgraph (what the
  table reports, node-weighted over clients);
* ``global``: accuracy of model k on *all* test nodes of the whole graph (every client's, with
  the edges between clients) -- the reading in which one client's model is judged on the
  federation's test set.

Usage (after the Local runs of fgssl_table1.py)::

    python examples/fgssl_local_gap.py --runs runs/fgssl runs/fgssl_m7 runs/fgssl_m10 \\
        --data-root ../shared/datasets --out runs/fgssl/local_gap

writes ``<out>/local_gap.jsonl`` (one record per run and client) and ``<out>/local_gap.md``
(regenerate with ``--table-only``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from secure_fgl.config import RunConfig
from secure_fgl.engine.hooks import load_best_model
from secure_fgl.experiment import load_federation
from secure_fgl.models import build_model
from secure_fgl.report.tables import fmt_stats
from fgssl_table1 import paper_accuracy


@torch.no_grad()
def accuracy(model: torch.nn.Module, x, edge_index, y, mask) -> float:
    return float((model(x, edge_index).argmax(-1)[mask] == y[mask]).float().mean())


def evaluate_run(run_dir: Path, data_root: str | None) -> list[dict]:
    """One record per client of the Local run in ``run_dir``."""
    result = json.loads((run_dir / "result.json").read_text())
    cfg = RunConfig.from_dict({**result["config"], "data_root": data_root or result["config"]["data_root"]})
    fed = load_federation(cfg)
    g = fed.graph
    records = []
    for k, c in enumerate(fed.clients):
        model = build_model(cfg.model, fed.num_features, cfg.hidden, fed.num_classes, num_layers=cfg.num_layers,
                            dropout=cfg.dropout, heads=cfg.heads)
        load_best_model(run_dir / "best_model.pt", model, prefix=f"models.{k}").eval()
        records.append({"dataset": cfg.dataset, "clients": cfg.clients, "seed": cfg.seed, "client": k,
                        "own_test_nodes": int(c.test_mask.sum()),
                        "own": 100 * accuracy(model, c.x, c.edge_index, c.y, c.test_mask),
                        "global": 100 * accuracy(model, g.x, g.edge_index, g.y, g.test_mask)})
    return records


def write_table(records: list[dict], out: Path) -> str:
    lines = ["# Local (GAT): each client's model on its own vs on the whole graph's test nodes", "",
             "Accuracy (%) of the weights saved at the run's best-validation round (`best_model.pt`); `own` node-weighted over clients (= the "
             "table's Local row), `global` the mean over clients of one client's model on all test nodes; "
             "mean ± std over seeds (n).", "",
             "| dataset | M | n | seeds | own test nodes | whole-graph test nodes (min-max client) | paper Local |",
             "|---|---|---|---|---|---|---|"]
    for dataset, clients in sorted({(r["dataset"], r["clients"]) for r in records}):
        sel = [r for r in records if (r["dataset"], r["clients"]) == (dataset, clients)]
        seeds = sorted({r["seed"] for r in sel})
        own = [sum(r["own"] * r["own_test_nodes"] for r in sel if r["seed"] == s)
               / sum(r["own_test_nodes"] for r in sel if r["seed"] == s) for s in seeds]
        glob = [statistics.mean(r["global"] for r in sel if r["seed"] == s) for s in seeds]
        lo, hi = min(r["global"] for r in sel), max(r["global"] for r in sel)
        lines.append(f"| {dataset} | {clients} | {len(seeds)} | {', '.join(map(str, seeds))} | {_ms(own)} | "
                     f"{_ms(glob)} ({lo:.1f}-{hi:.1f}) | {paper_accuracy(dataset, 'Local (GAT)', clients)} |")
    text = "\n".join(lines) + "\n"
    (out / "local_gap.md").write_text(text)
    return text


def _ms(values: list[float]) -> str:
    return fmt_stats(values, digits=2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", default=["runs/fgssl"], help="--out folders of fgssl_table1.py")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default="runs/fgssl/local_gap")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "local_gap.jsonl"
    if not args.table_only:
        run_dirs = sorted(d for root in args.runs for d in Path(root).glob("table/*/local_gat-plain/seed*")
                          if (d / "best_model.pt").exists())
        with jsonl.open("w") as f:
            for d in run_dirs:
                for record in evaluate_run(d, args.data_root):
                    f.write(json.dumps(record) + "\n")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    print(write_table(records, out))


if __name__ == "__main__":
    main()
