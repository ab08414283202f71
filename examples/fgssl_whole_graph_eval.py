r"""Evaluate the saved models of ``examples/fgssl_table1.py`` on the whole graph's test nodes.

Evaluate the saved models of ``examples/fgssl_table1.py`` on the whole graph's test nodes, the
way FGSSL's released configuration evaluates (and the reading that explains its Local row).

Our tables score every client's deployed model on that client's test nodes, on the client's
subgraph (the edges between clients are missing).  FGSSL's released configurations
(``wgc-research/fgssl``, ``gfl/baseline/example.yaml``: ``make_global_eval: True``) evaluate on
the server, on the whole graph's test nodes with every edge.  The paper (sec. 4.1) defines Local
as "each client train[s] their model locally" and reports "the node classification accuracy on
the testing nodes", without saying whose.  This script loads the best-validation weights of
finished runs (``best_model.pt``: ``models.<k>`` = client k's deployed model, the global model for
the federated methods) and measures, per run,

* ``subgraphs``: each client's model on its own test nodes, on its subgraph, node-weighted over
  clients (what the tables report; recomputed here as a check);
* ``whole graph``: each client's model on *all* test nodes of the whole graph (with the edges
  between clients), mean over clients.  For FedAvg / FedProx / FGSSL every client deploys the
  global model, so this is the global model's accuracy; for Local it is the accuracy of one
  client's model on the federation's test set.

Usage (after fgssl_table1.py's runs; every ``--out`` folder of that script can be given)::

    python examples/fgssl_whole_graph_eval.py --runs runs/fgssl runs/fgssl_m7 runs/fgssl_m10 \
        --data-root ../shared/datasets --out runs/fgssl/whole_graph

writes ``<out>/whole_graph.jsonl`` (one record per run and client) and ``<out>/whole_graph.md``
(regenerate with ``--table-only``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from fgssl_table1 import METHODS, paper_accuracy

from secure_fgl.config import RunConfig
from secure_fgl.engine.hooks import load_best_model
from secure_fgl.experiment import load_federation
from secure_fgl.models import build_model
from secure_fgl.report.tables import fmt_stats
from secure_fgl.validation import current_names


@torch.no_grad()
def accuracy(model: torch.nn.Module, x, edge_index, y, mask) -> float:
    return float((model(x, edge_index).argmax(-1)[mask] == y[mask]).float().mean())


def evaluate_run(run_dir: Path, data_root: str | None) -> list[dict]:
    """One record per client of the plain run in ``run_dir``."""
    result = json.loads((run_dir / "result.json").read_text())
    method = json.loads((run_dir / "meta.json").read_text())["method"]
    config = current_names(result["config"])  # a result written before a setting was renamed
    cfg = RunConfig.from_dict({**config, "data_root": data_root or config["data_root"]})
    fed = load_federation(cfg)
    g = fed.graph
    records = []
    for k, c in enumerate(fed.clients):
        model = build_model(
            cfg.model,
            fed.num_features,
            cfg.hidden,
            fed.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            heads=cfg.heads,
        )
        load_best_model(run_dir / "best_model.pt", model, prefix=f"models.{k}").eval()
        records.append(
            {
                "dataset": cfg.dataset,
                "clients": cfg.clients,
                "method": method,
                "seed": cfg.seed,
                "rounds": cfg.rounds,
                "client": k,
                "test_nodes": int(c.test_mask.sum()),
                "subgraph": 100 * accuracy(model, c.x, c.edge_index, c.y, c.test_mask),
                "whole_graph": 100 * accuracy(model, g.x, g.edge_index, g.y, g.test_mask),
            }
        )
    return records


def write_table(records: list[dict], out: Path) -> str:
    lines = [
        "# Saved models on their clients' subgraphs vs on the whole graph",
        "",
        "Test accuracy (%) of the weights saved at each run's best-validation round (`best_model.pt`). "
        "`subgraphs`: each client's model on its own test nodes and subgraph, node-weighted over clients "
        "(= the tables); `whole graph`: each client's model on all test nodes of the whole graph, with "
        "the edges between clients, mean over clients (federated methods: the global model; brackets: "
        "the lowest and highest client). Mean ± std over seeds (n).",
        "",
        "| dataset | M | method | n | rounds | subgraphs | whole graph | paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    order = list(METHODS)
    keys = sorted(
        {(r["dataset"], r["clients"], r["method"]) for r in records},
        key=lambda key: (key[0], key[1], order.index(key[2])),
    )
    for dataset, clients, method in keys:
        sel = [r for r in records if (r["dataset"], r["clients"], r["method"]) == (dataset, clients, method)]
        seeds = sorted({r["seed"] for r in sel})
        sub = [
            sum(r["subgraph"] * r["test_nodes"] for r in sel if r["seed"] == s)
            / sum(r["test_nodes"] for r in sel if r["seed"] == s)
            for s in seeds
        ]
        whole = [statistics.mean(r["whole_graph"] for r in sel if r["seed"] == s) for s in seeds]
        spread = (
            f" ({min(r['whole_graph'] for r in sel):.1f}-{max(r['whole_graph'] for r in sel):.1f})"
            if method == "Local (GAT)"
            else ""
        )
        lines.append(
            f"| {dataset} | {clients} | {method} | {len(seeds)} | {sel[0]['rounds']} | "
            f"{fmt_stats(sub, digits=2)} | {fmt_stats(whole, digits=2)}{spread} | "
            f"{paper_accuracy(dataset, method, clients)} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "whole_graph.md").write_text(text)
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", default=["runs/fgssl"], help="--out folders of fgssl_table1.py")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default="runs/fgssl/whole_graph")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "whole_graph.jsonl"
    if not args.table_only:
        run_dirs = sorted(
            d
            for root in args.runs
            for d in Path(root).glob("table/*/*-plain/seed*")
            if (d / "best_model.pt").exists() and (d / "result.json").exists()
        )
        with jsonl.open("w") as f:
            for d in run_dirs:
                for record in evaluate_run(d, args.data_root):
                    f.write(json.dumps(record) + "\n")
    print(write_table([json.loads(line) for line in jsonl.read_text().splitlines()], out))


if __name__ == "__main__":
    main()
