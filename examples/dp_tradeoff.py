"""Accuracy and leakage vs epsilon of edge-level DP FedGCN-GAP next to the MLP and central GAP: the tables.

Reads the ``result.json`` files of a sweep folder written by ``secure-fgl report --config``
(the grid: ``secure_fgl/configs/dp-gap-tradeoff.toml``) and prints, per dataset and mode, a
markdown table (mean ± std over seeds; the DP noise is fresh in every run, so the std includes
its variance) and whether each epsilon meets the target: not below the feature-only
FedAvg MLP by more than one standard deviation, ``mean_gap >= mean_mlp - max(std_gap, std_mlp)``.
Then, per dataset, one table with a column per mode (and central GAP, ``--algorithm gap``, when its
runs are in the folder: the sweep file's reference) and one per attack (its metric per mode).
Writes ``<out>/tradeoff.json``.  Example::

    secure-fgl report --config secure_fgl/configs/dp-gap-tradeoff.toml --out runs/dp-gap
    python examples/dp_tradeoff.py --out runs/dp-gap
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from secure_fgl.report.sweep import eps_label, load_runs


def band(vals: list[float]) -> tuple[float, float]:
    return statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def rows_for(results: list[dict], dataset: str, mode: str) -> list[dict]:
    def accs(algo: str, eps, in_mode: str) -> list[float]:
        return [
            r["final"]["test_acc"]
            for r in results
            if r["config"]["algorithm"] == algo
            and r["config"]["dataset"] == dataset
            and r["config"]["mode"] == in_mode
            and r["config"]["dp_epsilon"] == eps
        ]

    ref = accs("fedavg", None, mode) or accs("fedavg", None, "plain")  # the reference, same mode if run
    if not ref:
        return []
    mlp_mean, mlp_std = band(ref)
    out = [{"setting": "feature-only MLP (fedavg, no DP)", "mean": mlp_mean, "std": mlp_std, "accs": ref}]
    epsilons = sorted(
        {
            r["config"]["dp_epsilon"]
            for r in results
            if r["config"]["algorithm"] == "fedgcn-gap" and r["config"]["dp_epsilon"] is not None
        }
    ) + [None]
    for eps in epsilons:
        vals = accs("fedgcn-gap", eps, mode)
        if not vals:
            continue
        mean, std = band(vals)
        spread = max(std, mlp_std)
        heads = sum(
            bool(r["final"].get("uses_head"))
            for r in results
            if r["config"]["algorithm"] == "fedgcn-gap"
            and r["config"]["dataset"] == dataset
            and r["config"]["mode"] == mode
            and r["config"]["dp_epsilon"] == eps
        )
        out.append(
            {
                "setting": f"fedgcn-gap ε={eps_label(eps)}",
                "eps": eps,
                "mean": mean,
                "std": std,
                "accs": vals,
                "head_chosen": heads,
                "minus_mlp_in_std": (mean - mlp_mean) / spread if spread else None,
                "target_met": mean >= mlp_mean - spread,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/dp-gap", help="sweep folder")
    args = ap.parse_args()
    results, _ = load_runs(args.out)
    table = {}
    for dataset in sorted({r["config"]["dataset"] for r in results}):
        for mode in sorted({r["config"]["mode"] for r in results if r["config"]["algorithm"] == "fedgcn-gap"}):
            rows = rows_for(results, dataset, mode)
            if not rows:
                continue
            table[f"{dataset}/{mode}"] = rows
            print(f"\n### {dataset}, {mode} mode\n")
            print(
                "| setting | test acc (mean ± std) | seeds | per seed | head chosen | (gap − MLP) / std | target |\n"
                "|---|---|---|---|---|---|---|"
            )
            for r in rows:
                d = r.get("minus_mlp_in_std")
                print(
                    f"| {r['setting']} | {r['mean']:.4f} ± {r['std']:.4f} | {len(r['accs'])} | "
                    f"{', '.join(f'{a:.3f}' for a in r['accs'])} | {r.get('head_chosen', '')} | {'' if d is None else f'{d:+.2f}'} | "
                    f"{'' if 'target_met' not in r else ('met' if r['target_met'] else 'NOT met')} |"
                )
    for dataset in sorted({key.split("/")[0] for key in table}):
        print(compact(table, dataset, central_rows(results, dataset)))
        print(leakage(results, dataset))
    Path(args.out, "tradeoff.json").write_text(json.dumps(table, indent=1, default=str))


def central_rows(results: list[dict], dataset: str) -> list[dict]:
    """Central GAP (``--algorithm gap``) per epsilon, named like the federated rows, when its runs are there."""
    by_eps: dict[float | None, list[dict]] = {}
    for r in results:
        if r["config"]["algorithm"] == "gap" and r["config"]["dataset"] == dataset:
            by_eps.setdefault(r["config"]["dp_epsilon"], []).append(r)
    out = []
    for eps, runs in by_eps.items():
        mean, std = band([r["final"]["test_acc"] for r in runs])
        heads = sum(bool(r["final"].get("uses_head")) for r in runs)
        setting = f"fedgcn-gap ε={eps_label(eps)}"
        out.append({"setting": setting, "eps": eps, "mean": mean, "std": std, "n": len(runs), "heads": heads})
    return out


def leakage(results: list[dict], dataset: str) -> str:
    """One table per attack: a row per epsilon of fedgcn-gap, a column per mode (its metric, mean ± std)."""
    runs = [r for r in results if r["config"]["algorithm"] == "fedgcn-gap" and r["config"]["dataset"] == dataset]
    modes = sorted({r["config"]["mode"] for r in runs})
    names = sorted({a["name"] for r in runs for a in r.get("attacks", []) if a.get("chance") is not None})
    lines = []
    for name in names:
        cells: dict[float | None, dict[str, list[float]]] = {}
        metric = chance = None
        for r in runs:
            for a in r.get("attacks", []):
                if a["name"] == name and a.get("value") is not None:
                    metric, chance = a["metric"], a["chance"]
                    cells.setdefault(r["config"]["dp_epsilon"], {}).setdefault(r["config"]["mode"], []).append(
                        a["value"]
                    )
        lines += [f"\n### {dataset}: {name} ({metric}, chance {chance})\n", "| ε | " + " | ".join(modes) + " |"]
        lines.append("|---|" + "---|" * len(modes))
        for eps in sorted(cells, key=lambda e: float("inf") if e is None else e):
            row = [
                f"{band(cells[eps][m])[0]:.3f} ± {band(cells[eps][m])[1]:.3f}" if m in cells[eps] else "" for m in modes
            ]
            lines.append(f"| {eps_label(eps)} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def compact(table: dict, dataset: str, central: list[dict] | None = None) -> str:
    """One table per dataset: a row per epsilon, a column per mode.

    One table per dataset: a row per epsilon, a column per mode (mean ± std, head chosen in how
    many seeds, the target), the MLP reference first; with ``central``, a first column for central
    GAP (mean ± std, seeds, head chosen).
    """
    modes = sorted(key.split("/")[1] for key in table if key.startswith(f"{dataset}/"))
    rows: dict[str, dict[str, dict]] = {}
    for mode in modes:
        for r in table[f"{dataset}/{mode}"]:
            rows.setdefault(r["setting"], {})[mode] = r
    centre = {r["setting"]: r for r in central or []}
    if centre:
        modes = ["central GAP", *modes]
        for setting, r in centre.items():
            rows.setdefault(setting, {})["central GAP"] = r
    lines = [f"\n### {dataset}: every mode\n", "| setting | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]

    def order(item) -> tuple:
        r = next(iter(item[1].values()))
        return ("eps" in r, float("inf") if r.get("eps") is None else r["eps"])

    for setting, cells in sorted(rows.items(), key=order):
        out = []
        for mode in modes:
            r = cells.get(mode)
            if r is None:
                out.append("")
                continue
            cell = f"{r['mean']:.3f} ± {r['std']:.3f}"
            if "heads" in r:
                cell += f" (n={r['n']}, {r['heads']}/{r['n']} head)"
            elif "head_chosen" in r:
                cell += f" ({r['head_chosen']}/{len(r['accs'])} head{'' if r['target_met'] else ', target NOT met'})"
            out.append(cell)
        lines.append(f"| {setting} | " + " | ".join(out) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
