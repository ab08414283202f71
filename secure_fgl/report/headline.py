"""The headline figure: test accuracy vs DP epsilon, one curve per (algorithm, mode, DP unit),
and below it one panel per attack with its chance line.

Reads ``result.json`` dicts.  Each curve is the mean over seeds with a +-1 std band (the DP
noise is fresh in every run, so the band includes its variance); the non-DP run of the same
algorithm and mode is the point at "inf".  Accuracy panels carry reference lines: every non-DP
run of ``references`` algorithms (e.g. the feature-only ``fedavg`` MLP) as a horizontal band, and
chance (1 / number of classes).  Attack panels (one row per attack found in the runs, the
transcript audit excepted) plot the attack's primary metric the same way, with the attack's
chance level.  One column per dataset, a legend on every panel, no twin axes; written as PNG,
PDF and SVG at 300 dpi.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

Value = Callable[[dict], "float | None"]


def _curve_key(r: dict) -> tuple[str, str]:
    """(algorithm, mode) of a run; its DP unit labels the curve."""
    return r["config"]["algorithm"], r["config"]["mode"]


def _unit(runs: list[dict]) -> str:
    """The DP units of a curve's runs, e.g. ``edge`` or ``edge+sample`` (GAP with DP-SGD)."""
    p = next((r["privacy"] for r in runs if r.get("privacy")), None)
    return "+".join(p.get("units") or [p["unit"]]) if p else "no DP"


def _band(vals: list[float]) -> tuple[float, float]:
    return float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0


def _curves(ax, runs: list[dict], value: Value, references: tuple[str, ...]) -> None:
    """Mean +- std of ``value`` vs epsilon for each (algorithm, mode) with DP runs; log x, inf at the right."""
    finite = sorted({r["config"]["dp_epsilon"] for r in runs if r["config"]["dp_epsilon"] is not None})
    inf_x = finite[-1] * 4 if finite else 1.0
    curves = [r for r in runs if r["config"]["algorithm"] not in references]
    for key in sorted({_curve_key(r) for r in curves if r["config"]["dp_epsilon"] is not None}):
        mine = [r for r in curves if _curve_key(r) == key]
        xs, means, stds = [], [], []
        for e in finite + [None]:
            vals = [v for r in mine if r["config"]["dp_epsilon"] == e and (v := value(r)) is not None]
            if vals:
                xs.append(inf_x if e is None else e)
                m, s = _band(vals)
                means.append(m)
                stds.append(s)
        if not xs:
            continue
        m, s = np.array(means), np.array(stds)
        line, = ax.plot(xs, m, "-o", ms=4, label=f"{key[0]} ({key[1]}, {_unit(mine)}-level)")
        ax.fill_between(xs, m - s, m + s, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log")
    ax.set_xticks(finite + [inf_x])
    ax.set_xticklabels([f"{e:g}" for e in finite] + ["∞"])
    ax.minorticks_off()
    ax.set_xlabel("total DP ε (δ = 1e-5; ∞ = no DP)")


def _attack_names(results: list[dict]) -> list[str]:
    return sorted({a["name"] for r in results for a in (r.get("attacks") or [])
                   if a.get("applicable") and a.get("value") is not None and a["name"] != "transcript_audit"})


def _attack(name: str) -> Value:
    def value(r: dict):
        entry = next((a for a in (r.get("attacks") or []) if a["name"] == name), None)
        return entry.get("value") if entry and entry.get("applicable") else None
    return value


def _seeds_per_point(runs: list[dict]) -> str:
    """How many seeds each plotted point averages ("3", or "1-3" where curves differ)."""
    points = {}
    for r in runs:
        c = r["config"]
        points.setdefault((c["algorithm"], c["mode"], c["dp_epsilon"]), set()).add(c["seed"])
    counts = sorted({len(seeds) for seeds in points.values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def accuracy_vs_epsilon(results: list[dict], path: str | Path, references: tuple[str, ...] = ("fedavg",)) -> list[Path]:
    """Draw the figure for ``results``; returns the PNG, PDF and SVG paths."""
    datasets = sorted({r["config"]["dataset"] for r in results})
    attacks = _attack_names(results)
    fig, axes = plt.subplots(1 + len(attacks), len(datasets), figsize=(5.0 * len(datasets), 3.6 * (1 + len(attacks))),
                             squeeze=False)
    for col, ds in enumerate(datasets):
        runs = [r for r in results if r["config"]["dataset"] == ds]
        seeds = _seeds_per_point(runs)
        ax = axes[0][col]
        _curves(ax, runs, lambda r: r["final"]["test_acc"], references)
        for ref in references:
            accs = [r["final"]["test_acc"] for r in runs if r["config"]["algorithm"] == ref
                    and r["config"]["dp_epsilon"] is None]
            if accs:
                mu, sd = _band(accs)
                model = next(r["config"].get("model") for r in runs if r["config"]["algorithm"] == ref)
                ax.axhline(mu, color="gray", ls="--", lw=1, label=f"{ref} {model} (feature-only, no DP)")
                ax.axhspan(mu - sd, mu + sd, color="gray", alpha=0.12)
        k = next((r.get("num_classes") for r in runs if r.get("num_classes")), None)
        if k:
            ax.axhline(1.0 / k, color="black", ls=":", lw=1, label=f"chance (1/{k})")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{ds}: accuracy vs ε ({seeds} seed(s) a point, ±1 std)", fontsize=9)
        ax.legend(fontsize=6, loc="best")
        for row, name in enumerate(attacks, start=1):
            ax = axes[row][col]
            _curves(ax, runs, _attack(name), references)
            entries = [a for r in runs for a in (r.get("attacks") or []) if a["name"] == name and a.get("applicable")]
            chance = next((a.get("chance") for a in entries if a.get("chance") is not None), None)
            if chance is not None:
                ax.axhline(chance, color="black", ls=":", lw=1, label=f"chance ({chance:.3g})")
            metric = next((a.get("metric") for a in entries if a.get("metric")), "value")
            ax.set_ylabel(metric)
            ax.set_title(f"{ds}: attack {name} vs ε", fontsize=9)
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
