"""The headline figure.

Test accuracy vs DP epsilon, one series per (algorithm, mode), then one panel per attack with its chance line, for each
dataset.

Reads ``result.json`` dicts.  Each point is the mean over seeds with ± 1 sample std error bars
(the DP noise is fresh in every run, so the bar includes its variance); the non-DP run of the
same algorithm and mode is the "no DP" point, set apart.  Accuracy panels carry the reference
runs (:mod:`.references`: central GAP as a curve with its seed band, the feature-only MLP and
non-private models as horizontal lines with their bands) and chance (1 / number of classes); the
caption (``<stem>.json``, rendered under the figure) names the DP unit and delta.  Colour and marker say the mode, the line
style the algorithm (:mod:`.style`).  At most a few panels a figure: more datasets or attacks
give more figures (``_2``, ``_3``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from . import references, style

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


def _curves(ax, curves: list[dict], pos: dict, value: Value, algorithms: list[str]) -> tuple[list, dict]:
    """Mean ± sample std of ``value`` vs epsilon for each (algorithm, mode) with DP runs.

    Returns the pairs of equal series and each series' points {(algorithm, mode): {eps: (mean, sd)}}.
    """
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
        mine = [r for r in curves if (r["config"]["algorithm"], r["config"]["mode"]) == key]
        style.series(
            ax,
            pos,
            named[key],
            offset=style.dodge(i, len(keys)),
            color=color,
            marker=marker,
            ls=ls,
            label=f"{key[0]} {key[1]} ({_unit(mine)} DP)",
        )
    return style.equal_series(named), named


def _points_json(points: dict) -> dict:
    return {("inf" if e is None else f"{e:g}"): {"mean": m, "std": s} for e, (m, s) in points.items()}


@style.styled
def accuracy_vs_epsilon(results: list[dict], path: str | Path, size: str = "column") -> list[Path]:
    """Draw the figure(s) for ``results``; returns the PNG, PDF and SVG paths of each figure.

    Reference runs (:func:`.references.is_reference`) are drawn on the accuracy panels as reference curves and lines.
    Beside each figure, ``<stem>.json`` holds what it draws (every series' points, the references, the caption).
    """
    from matplotlib.lines import Line2D

    def is_ref(r: dict) -> bool:  # a sweep of reference runs only draws them as its curves
        return references.is_reference(r) and not every_ref

    every_ref = all(references.is_reference(r) for r in results)
    datasets = sorted({r["config"]["dataset"] for r in results if not is_ref(r)})
    attacks = _attack_names([r for r in results if not is_ref(r)])
    algorithms = sorted({r["config"]["algorithm"] for r in results if not is_ref(r)})
    panels = [(ds, name) for ds in datasets for name in [None] + attacks]
    out: list[Path] = []
    for index, chunk in enumerate(style.chunks(panels, size)):
        legend_rows = len(
            {(r["config"]["algorithm"], r["config"]["mode"]) for r in results if r["config"]["algorithm"] in algorithms}
        ) + len({(r["config"]["algorithm"], r["config"].get("model")) for r in results if is_ref(r)})
        fig, axes = style.new_figure(len(chunk), size, legend_rows=legend_rows + 1)
        handles: dict[str, Line2D] = {}
        equal_all: set | None = None  # pairs of series equal in every panel
        data: list[dict] = []
        captions: list[str] = []
        all_groups: list = []
        for ax, (ds, name) in zip(axes, chunk):
            runs = [r for r in results if r["config"]["dataset"] == ds]
            curves = [r for r in runs if not is_ref(r)]
            dp_runs = [r for r in curves if r["config"]["dp_epsilon"] is not None]
            unit = references.common(references.dp_unit(r) for r in dp_runs)
            delta = references.common(references.dp_delta(r) for r in dp_runs)
            value = _accuracy if name is None else _attack(name)
            groups: list = []
            left_out = 0
            if name is None:
                groups, left_out = references.reference_groups([r for r in runs if is_ref(r)], value, unit, delta)
            eps = [r["config"]["dp_epsilon"] for r in curves] + [e for g in groups for e in g.points]
            pos = style.eps_positions(eps)
            equal, named = _curves(ax, curves, pos, value, algorithms)
            equal_all = set(equal) if equal_all is None else equal_all & set(equal)
            panel = {
                "dataset": ds,
                "panel": "accuracy" if name is None else name,
                "unit": unit,
                "delta": delta,
                "series": [
                    {"algorithm": a, "mode": m, "points": _points_json(points)} for (a, m), points in named.items()
                ],
            }
            if name is None:
                references.draw(ax, pos, groups)
                all_groups += groups
                k = next((r.get("num_classes") for r in runs if r.get("num_classes")), None)
                if k:
                    ax.axhline(1.0 / k, color="black", ls=":", lw=0.8, label=f"chance (1/{k})")
                ax.set_ylabel("test accuracy")
                ax.set_title(f"{ds}: accuracy ({_seeds_per_point(runs)} seed(s) a point)")
                panel["references"] = [g.to_dict() for g in groups]
                panel["caption"] = references.caption(unit, delta, groups, left_out, _seeds_per_point(runs))
                captions.append(f"{ds}: {panel['caption']}")
            else:
                entries = [
                    a for r in curves for a in (r.get("attacks") or []) if a["name"] == name and a.get("applicable")
                ]
                chance = next((a.get("chance") for a in entries if a.get("chance") is not None), None)
                if chance is not None:
                    ax.axhline(chance, color="black", ls=":", lw=0.8, label=f"chance ({chance:.3g})")
                ax.set_ylabel(next((a.get("metric") for a in entries if a.get("metric")), "value"))
                ax.set_title(f"{ds}: {name.replace('_', ' ')}")
            if pos:
                label = "total DP ε" + (f" (δ = {delta:g})" if delta is not None else "")
                style.eps_axis(ax, pos, label)
            data.append(panel)
            for h, label in zip(*ax.get_legend_handles_labels()):
                if not label.startswith("chance"):  # series and references: one figure legend
                    handles.setdefault(label, h)
            chance_line = [(h, l) for h, l in zip(*ax.get_legend_handles_labels()) if l.startswith("chance")]
            if chance_line:
                ax.legend(*zip(*chance_line), loc="best", fontsize=5)
        kinds = list(references.REFERENCE_STYLE)
        order = sorted(
            handles,
            key=lambda l: (
                _key(l, algorithms) is None,
                next((kinds.index(g.kind) for g in all_groups if g.label == l), 0),
            ),
        )
        handles = {l: handles[l] for l in order}  # the series first, then the references
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
        target = style.numbered(Path(path), index)
        for p in style.save(fig, target):
            out.append(p)
        caption = " ".join(captions)
        target.with_suffix(".json").write_text(json.dumps({"caption": caption, "panels": data}, indent=1))
    return out


def _key(label: str, algorithms: list[str]) -> tuple[str, str] | None:
    """(algorithm, mode) of a series label ``"algo mode (unit DP)"``; None for a reference or chance line."""
    words = label.split(" (")[0].split(" ")
    return (words[0], words[1]) if len(words) >= 2 and words[0] in algorithms else None
