"""The headline figure.

Test accuracy vs DP epsilon, one series per (algorithm, mode), then one panel per attack with its chance line, for each
dataset.

Reads ``result.json`` dicts.  Each point is the mean over seeds with ± 1 sample std error bars
(the DP noise is fresh in every run, so the bar includes its variance); the non-DP run of the
same algorithm and mode is the "no DP" point, set apart.  Accuracy panels carry reference lines:
every non-DP run of ``references`` algorithms (e.g. the feature-only ``fedavg`` MLP) as a
horizontal band, and chance (1 / number of classes).  Colour and marker say the mode, the line
style the algorithm (:mod:`.style`).  At most a few panels a figure: more datasets or attacks
give more figures (``_2``, ``_3``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import style

Value = Callable[[dict], "float | None"]


def _unit(runs: list[dict]) -> str:
    """The DP units of a curve's runs, e.g. ``edge`` or ``edge+sample`` (GAP with DP-SGD)."""
    p = next((r["privacy"] for r in runs if r.get("privacy")), None)
    return "+".join(p.get("units") or [p["unit"]]) if p else "no DP"


def _attack_names(results: list[dict]) -> list[str]:
    return sorted(
        {
            a["name"]
            for r in results
            for a in (r.get("attacks") or [])
            if a.get("applicable") and a.get("value") is not None and a["name"] != "transcript_audit"
        }
    )


def _attack(name: str) -> Value:
    def value(r: dict):
        entry = next((a for a in (r.get("attacks") or []) if a["name"] == name), None)
        return entry.get("value") if entry and entry.get("applicable") else None

    return value


def _accuracy(r: dict):
    return r["final"]["test_acc"]


def _seeds_per_point(runs: list[dict]) -> str:
    """How many seeds each plotted point averages ("3", or "1-3" where curves differ)."""
    points = {}
    for r in runs:
        c = r["config"]
        points.setdefault((c["algorithm"], c["mode"], c["dp_epsilon"]), set()).add(c["seed"])
    counts = sorted({len(seeds) for seeds in points.values()})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _curves(ax, runs: list[dict], value: Value, references: tuple[str, ...], algorithms: list[str]) -> list:
    """Mean ± sample std of ``value`` vs epsilon for each (algorithm, mode) with DP runs.

    Returns the pairs of equal series.
    """
    curves = [r for r in runs if r["config"]["algorithm"] not in references]
    pos = style.eps_positions([r["config"]["dp_epsilon"] for r in curves])
    keys = sorted(
        {(r["config"]["algorithm"], r["config"]["mode"]) for r in curves if r["config"]["dp_epsilon"] is not None},
        key=lambda k: (k[0], style.mode_rank(k[1])),
    )
    named = {}
    for key in keys:
        mine = [r for r in curves if (r["config"]["algorithm"], r["config"]["mode"]) == key]
        points = {e: style.mean_sd([value(r) for r in mine if r["config"]["dp_epsilon"] == e]) for e in pos}
        named[key] = {e: v for e, v in points.items() if v[0] is not None}
    for i, key in enumerate(keys):
        color, marker = style.mode_style(key[1])
        ls = style.LINESTYLES[algorithms.index(key[0]) % len(style.LINESTYLES)]
        style.series(
            ax,
            pos,
            named[key],
            offset=style.dodge(i, len(keys)),
            color=color,
            marker=marker,
            ls=ls,
            label=f"{key[0]} {key[1]} ({_unit([r for r in curves if (r['config']['algorithm'], r['config']['mode']) == key])} DP)",
        )
    if pos:
        style.eps_axis(ax, pos, "total DP ε (δ = 1e-5)")
    return style.equal_series(named)


@style.styled
def accuracy_vs_epsilon(
    results: list[dict], path: str | Path, references: tuple[str, ...] = ("fedavg",), size: str = "column"
) -> list[Path]:
    """Draw the figure(s) for ``results``; returns the PNG, PDF and SVG paths of each figure."""
    from matplotlib.lines import Line2D

    datasets = sorted({r["config"]["dataset"] for r in results})
    attacks = _attack_names(results)
    algorithms = sorted({r["config"]["algorithm"] for r in results if r["config"]["algorithm"] not in references})
    panels = [(ds, name) for ds in datasets for name in [None] + attacks]
    out: list[Path] = []
    for index, chunk in enumerate(style.chunks(panels, size)):
        fig, axes = style.new_figure(
            len(chunk),
            size,
            legend_rows=len(
                {
                    (r["config"]["algorithm"], r["config"]["mode"])
                    for r in results
                    if r["config"]["algorithm"] in algorithms
                }
            ),
        )
        handles: dict[str, Line2D] = {}
        equal_all: set | None = None  # pairs of series equal in every panel
        for ax, (ds, name) in zip(axes, chunk):
            runs = [r for r in results if r["config"]["dataset"] == ds]
            equal = set(_curves(ax, runs, _accuracy if name is None else _attack(name), references, algorithms))
            equal_all = equal if equal_all is None else equal_all & equal
            if name is None:
                for ref in references:
                    accs = [
                        r["final"]["test_acc"]
                        for r in runs
                        if r["config"]["algorithm"] == ref and r["config"]["dp_epsilon"] is None
                    ]
                    if accs:
                        mu, sd = style.mean_sd(accs)
                        model = next(r["config"].get("model") for r in runs if r["config"]["algorithm"] == ref)
                        ax.axhline(mu, color="0.5", ls="--", lw=0.8, label=f"{ref} {model} (no DP)")
                        ax.axhspan(mu - sd, mu + sd, color="0.5", alpha=0.12)
                k = next((r.get("num_classes") for r in runs if r.get("num_classes")), None)
                if k:
                    ax.axhline(1.0 / k, color="black", ls=":", lw=0.8, label=f"chance (1/{k})")
                ax.set_ylabel("test accuracy")
                ax.set_title(f"{ds}: accuracy ({_seeds_per_point(runs)} seed(s) a point)")
            else:
                entries = [
                    a for r in runs for a in (r.get("attacks") or []) if a["name"] == name and a.get("applicable")
                ]
                chance = next((a.get("chance") for a in entries if a.get("chance") is not None), None)
                if chance is not None:
                    ax.axhline(chance, color="black", ls=":", lw=0.8, label=f"chance ({chance:.3g})")
                ax.set_ylabel(next((a.get("metric") for a in entries if a.get("metric")), "value"))
                ax.set_title(f"{ds}: {name.replace('_', ' ')}")
            for h, label in zip(*ax.get_legend_handles_labels()):
                if label.startswith(tuple(algorithms)):  # series: one figure legend
                    handles.setdefault(label, h)
            refs = [(h, l) for h, l in zip(*ax.get_legend_handles_labels()) if not l.startswith(tuple(algorithms))]
            if refs:
                ax.legend(*zip(*refs), loc="best", fontsize=5)
        same = {b: a for a, b in equal_all or ()}
        labels = [
            l
            + (
                f" = {same[k][1] if same[k][0] == k[0] else ' '.join(same[k])}"
                if (k := _key(l, algorithms)) in same
                else ""
            )
            for l in handles
        ]
        if handles:
            fig.legend(list(handles.values()), labels, loc="outside lower center", ncol=1)
        style.title(fig, style.STATISTIC, size)
        for p in style.save(fig, style.numbered(Path(path), index)):
            out.append(p)
    return out


def _key(label: str, algorithms: list[str]) -> tuple[str, str] | None:
    """(algorithm, mode) of a series label ``"algo mode (unit DP)"``."""
    algo, mode = label.split(" (")[0].split(" ")[:2]
    return (algo, mode) if algo in algorithms else None
