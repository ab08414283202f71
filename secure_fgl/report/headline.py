"""The headline figure: test accuracy vs DP epsilon, one curve per (algorithm, mode, DP unit).

Reads ``result.json`` dicts.  Each curve is the mean over seeds with a +-1 std band (the DP
noise is fresh in every run, so the band includes its variance); the non-DP run of the same
algorithm is the point at "inf".  Reference lines: every non-DP run of ``references``
algorithms (e.g. the feature-only ``fedavg`` MLP) as a horizontal band, and chance
(1 / number of classes).  One panel per dataset, a legend on each; written as PNG, PDF and
SVG at 300 dpi.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _label(r: dict) -> str:
    c = r["config"]
    unit = (r.get("privacy") or {}).get("unit") or c.get("dp_unit") or "edge"
    return f"{c['algorithm']} ({c['mode']}, {unit}-level)"


def accuracy_vs_epsilon(results: list[dict], path: str | Path, references: tuple[str, ...] = ("fedavg",)) -> list[Path]:
    """Draw the figure for ``results``; returns the PNG, PDF and SVG paths."""
    datasets = sorted({r["config"]["dataset"] for r in results})
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.0 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        runs = [r for r in results if r["config"]["dataset"] == ds]
        finite = sorted({r["config"]["dp_epsilon"] for r in runs if r["config"]["dp_epsilon"] is not None})
        inf_x = (finite[-1] * 4) if finite else 1.0
        curves = [r for r in runs if r["config"]["algorithm"] not in references]
        for label in sorted({_label(r) for r in curves if r["config"]["dp_epsilon"] is not None}):
            algo, mode = label.split(" (")[0], label.split(" (")[1].split(",")[0]
            xs, means, stds = [], [], []
            for e in finite + [None]:
                accs = [r["final"]["test_acc"] for r in curves if r["config"]["dp_epsilon"] == e
                        and r["config"]["algorithm"] == algo and r["config"]["mode"] == mode
                        and (e is None or _label(r) == label)]
                if accs:
                    xs.append(inf_x if e is None else e)
                    means.append(float(np.mean(accs)))
                    stds.append(float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0)
            m, s = np.array(means), np.array(stds)
            line, = ax.plot(xs, m, "-o", ms=4, label=label)
            ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.15)
        for ref in references:
            accs = [r["final"]["test_acc"] for r in runs if r["config"]["algorithm"] == ref
                    and r["config"]["dp_epsilon"] is None]
            if accs:
                mu, sd = float(np.mean(accs)), float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
                model = next(r["config"].get("model") for r in runs if r["config"]["algorithm"] == ref)
                ax.axhline(mu, color="gray", ls="--", lw=1, label=f"{ref} {model} (feature-only, no DP)")
                ax.axhspan(mu - sd, mu + sd, color="gray", alpha=0.12)
        k = next((r.get("num_classes") for r in runs if r.get("num_classes")), None)
        if k:
            ax.axhline(1.0 / k, color="black", ls=":", lw=1, label=f"chance (1/{k})")
        ax.set_xscale("log")
        ticks = finite + [inf_x]
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{e:g}" for e in finite] + ["∞"])
        ax.minorticks_off()
        ax.set_xlabel("total DP ε (δ = 1e-5; ∞ = no DP)")
        ax.set_ylabel("test accuracy")
        seeds = len({r["config"]["seed"] for r in runs})
        ax.set_title(f"{ds}: accuracy vs ε ({seeds} seeds, ±1 std)", fontsize=9)
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    path = Path(path)
    out = []
    for ext in (".png", ".pdf", ".svg"):
        p = path.with_suffix(ext)
        fig.savefig(p, dpi=300)
        out.append(p)
    plt.close(fig)
    return out

