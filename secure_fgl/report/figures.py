"""Figures of the report, computed only from run files.

Every one in the shared look of :mod:`.style` (PNG, PDF with TrueType fonts, SVG; ``column`` or ``page`` wide; one
colour and marker per mode; epsilon categorical with "no DP" set apart; mean ± sample std over seeds).

* :func:`epsilon_curves` -- test accuracy (with the report's reference curves, :mod:`.references`),
  then each attack's primary metric (its chance level dotted), against DP epsilon; one series per
  mode, dodged sideways; at most a few panels per figure (more attacks: more figures, ``_2``, ``_3`` ...).
* :func:`frontier` -- privacy-utility frontier: mean normalised leakage over the run's attacks
  vs accuracy, one point per (mode, epsilon), the Pareto front drawn; labels never overprint
  (those with no free place are listed under the plot).
* :func:`exposure_by_degree` -- FedGCN per-node exposure against the node's number of
  cross-client neighbours (explains why single-contributor rows exist).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import references, style
from .tables import attack_entries, final_acc, run_eps


def normalised_leakage(entry: dict) -> float | None:
    """(m - chance) / (max - chance) in [0, 1] (1 = full leakage).

    0 for a not-applicable attack whose audit passed; None when undefined.
    """
    if not entry.get("applicable"):
        return 0.0 if entry.get("at_chance") else None
    v, c = entry.get("value"), entry.get("chance")
    if v is None or c is None:
        return None
    if entry.get("higher_is_leakier", True):
        top = 1.0
        return float(np.clip((v - c) / (top - c), 0, 1)) if top > c else None
    return float(np.clip((c - v) / c, 0, 1)) if c > 0 else None


def _attack_value(name: str):
    def value(r: dict):
        e = attack_entries(r).get(name)
        if not e:
            return None
        if e.get("applicable"):
            return e.get("value")
        return e.get("chance") if e.get("at_chance") else None  # at chance (audit passed)

    return value


def mode_legend(
    fig, axes, modes: list[str], equal: list[tuple[str, str]], chance: bool = False, extra: list | None = None
) -> None:
    """One legend for the figure.

    Each mode's colour and marker, "= other" where their series are equal, the ``extra`` handles (reference curves)
    and the chance line's style when a panel draws one.
    """
    from matplotlib.lines import Line2D

    same = {b: a for a, b in equal}
    handles = []
    for m in modes:
        color, marker = style.mode_style(m)
        label = m + (f" (= {same[m]})" if m in same else "")
        handles.append(Line2D([], [], color=color, marker=marker, label=label))
    handles += extra or []
    if chance:
        handles.append(Line2D([], [], color="0.4", ls=":", lw=0.8, label="chance"))
    ncol = 2 if extra else min(len(handles), 4)  # reference labels are long: two columns
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol)


@style.styled
def epsilon_curves(
    results: list[dict], algorithm: str, dataset: str, path: str | Path, size: str = "column"
) -> list[Path]:
    """Accuracy and attack metrics vs epsilon; returns the PNG of each figure (PDF, SVG beside it)."""
    runs = [r for r in results if r["config"]["algorithm"] == algorithm and r["config"]["dataset"] == dataset]
    if not runs:
        return []
    names = []
    for r in runs:  # run order of the suite, whatever mode was read first
        for a in r.get("attacks") or []:
            if a["name"] != "transcript_audit" and a.get("metric") and a["name"] not in names:
                names.append(a["name"])
    panels = [None] + names
    refs = [
        r
        for r in results
        if references.is_reference(r) and r["config"]["dataset"] == dataset and r["config"]["algorithm"] != algorithm
    ]
    dp_runs = [r for r in runs if run_eps(r) is not None]
    groups, _ = references.reference_groups(
        refs,
        final_acc,
        references.common(references.dp_unit(r) for r in dp_runs),
        references.common(references.dp_delta(r) for r in dp_runs),
    )
    pos = style.eps_positions([run_eps(r) for r in runs] + [e for g in groups for e in g.points])
    modes = sorted({r["config"]["mode"] for r in runs}, key=style.mode_rank)
    seeds = sorted({r["config"]["seed"] for r in runs})
    chance_acc = next((1.0 / r["num_classes"] for r in runs if r.get("num_classes")), None)
    out = []
    for index, chunk in enumerate(style.chunks(panels, size)):
        rows = -(-(len(modes) + len(groups) + 1) // 2) if groups and chunk[0] is None else 1
        fig, axes = style.new_figure(len(chunk), size, legend_rows=rows)
        equal_all: set | None = None  # pairs of modes equal in every panel
        for ax, name in zip(axes, chunk):
            value = final_acc if name is None else _attack_value(name)
            per_mode = {}
            for mode in modes:
                per_mode[mode] = {
                    e: style.mean_sd([value(r) for r in runs if r["config"]["mode"] == mode and run_eps(r) == e])
                    for e in pos
                }
                per_mode[mode] = {e: v for e, v in per_mode[mode].items() if v[0] is not None}
            equal = style.equal_series(per_mode)
            equal_all = set(equal) if equal_all is None else equal_all & set(equal)
            for i, mode in enumerate(modes):
                color, marker = style.mode_style(mode)
                style.series(ax, pos, per_mode[mode], offset=style.dodge(i, len(modes)), color=color, marker=marker)
            if name is None:
                references.draw(ax, pos, groups)
                ax.set_ylabel("test accuracy")
                ax.set_title("accuracy")
                chance = chance_acc
            else:
                entries = [attack_entries(r)[name] for r in runs if name in attack_entries(r)]
                metric = next((e.get("metric") for e in entries if e.get("metric")), "value")
                ax.set_ylabel(metric)
                ax.set_title(name.replace("_", " "))
                chance = next((e.get("chance") for e in entries if e.get("chance") is not None), None)
            if chance is not None:
                ax.axhline(chance, color="0.4", ls=":", lw=0.8)
            style.eps_axis(ax, pos)
        drawn = dict(zip(*axes[0].get_legend_handles_labels()[::-1])) if chunk[0] is None else {}
        extra = [drawn[g.label] for g in groups if g.label in drawn]
        mode_legend(fig, axes, modes, sorted(equal_all or ()), chance=True, extra=extra)
        style.title(fig, f"{algorithm} on {dataset}: mean ± sample std, {len(seeds)} seed(s)", size)
        out.append(style.save(fig, style.numbered(Path(path), index))[0])
    return out


@style.styled
def frontier(results: list[dict], algorithm: str, dataset: str, path: str | Path, size: str = "column") -> list[Path]:
    """Test accuracy against mean normalised leakage per setting of one algorithm and dataset, with the Pareto front.

    Returns:
        The files written (one per format).
    """
    runs = [r for r in results if r["config"]["algorithm"] == algorithm and r["config"]["dataset"] == dataset]
    pts = []
    keys = sorted(
        {(r["config"]["mode"], run_eps(r)) for r in runs},
        key=lambda k: (style.mode_rank(k[0]), k[1] is None, k[1] or 0),
    )
    for mode, e in keys:
        rs = [r for r in runs if r["config"]["mode"] == mode and run_eps(r) == e]
        leaks = []
        for r in rs:
            vals = [normalised_leakage(a) for n, a in attack_entries(r).items() if n != "transcript_audit"]
            vals = [v for v in vals if v is not None]
            if vals:
                leaks.append(float(np.mean(vals)))
        acc, _ = style.mean_sd([final_acc(r) for r in rs])
        lk, _ = style.mean_sd(leaks)
        if acc is not None and lk is not None:
            pts.append((lk, acc, mode, e))
    if not pts:
        return []
    fig, (ax,) = style.new_figure(1, size)
    for lk, acc, mode, e in pts:
        color, marker = style.mode_style(mode)
        ax.scatter(lk, acc, color=color, marker=marker, s=14, zorder=3)
    # Pareto front: no other point has both less leakage and more accuracy
    front = sorted(
        [p for p in pts if not any(q[0] <= p[0] and q[1] >= p[1] and (q[0], q[1]) != (p[0], p[1]) for q in pts)]
    )
    if len(front) > 1:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.7, label="Pareto front")
    ax.set_xlabel("mean normalised leakage (0 = chance, 1 = full)")
    ax.set_ylabel("test accuracy")
    ax.set_xlim(-0.05, 1.05)
    ax.margins(y=0.15)
    ax.set_title(f"{algorithm} on {dataset}: privacy-utility frontier")
    mode_legend(fig, [ax], sorted({p[2] for p in pts}, key=style.mode_rank), [])
    fig.canvas.draw()  # final layout before the labels look for free places
    fig.set_layout_engine("none")
    labels = [(lk, acc, "no DP" if e is None else f"ε={e:g}", style.mode_style(mode)[0]) for lk, acc, mode, e in pts]
    dropped = style.place_labels(ax, labels)
    if dropped:
        ax.text(
            0.0,
            -0.32,
            f"unlabelled (no free place): {len(dropped)} point(s)",
            transform=ax.transAxes,
            fontsize=5.5,
            color="0.4",
        )
    return style.save(fig, path)[:1]


@style.styled
def exposure_by_degree(results: list[dict], path: str | Path, size: str = "column") -> list[Path]:
    """The FedGCN attacks' exposure rate by a node's number of cross-client neighbours.

    Returns:
        The files written (one per format).
    """
    series = {}
    for r in results:
        for name, a in attack_entries(r).items():
            hist = a.get("by_cross_degree")
            if not hist or not a.get("applicable"):
                continue
            if run_eps(r) is not None:  # the no-DP runs show the structure; DP only blurs it
                continue
            key = (name, r["config"]["dataset"], r["config"]["mode"])
            acc = series.setdefault(key, {})
            for b, (ex, tot) in hist.items():
                s = acc.setdefault(b, [0, 0])
                s[0] += ex
                s[1] += tot
    if not series:
        return []
    fig, (ax,) = style.new_figure(1, size, legend_rows=len(series))
    names = sorted({k[0] for k in series})
    shares = {
        key: {b: (hist[b][0] / hist[b][1] if hist[b][1] else None, 0.0) for b in hist} for key, hist in series.items()
    }
    same = {b: a for a, b in style.equal_series(shares) if a[:2] == b[:2]}
    keys = sorted(series, key=lambda k: (k[0], k[1], style.mode_rank(k[2])))
    for i, key in enumerate(keys):
        name, ds, mode = key
        buckets = sorted(series[key], key=lambda b: int(b.rstrip("+")))
        xs = [int(b.rstrip("+")) for b in buckets]
        ys = [np.nan if shares[key][b][0] is None else shares[key][b][0] for b in buckets]
        color, marker = style.mode_style(mode)
        ax.plot(
            np.array(xs) + style.dodge(i % 3, 3),
            ys,
            marker=marker,
            color=color,
            ls=style.LINESTYLES[names.index(name) % len(style.LINESTYLES)],
            label=f"{name} ({ds}, {mode})" + (f" = {same[key][2]}" if key in same else ""),
        )
        ax.set_xticks(xs)
        ax.set_xticklabels(buckets)
    ax.set_xlabel("cross-client neighbours of the node")
    ax.set_ylabel("share exposed exactly")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("FedGCN: per-node exposure vs cross-client degree (no DP)")
    fig.legend(loc="outside lower center", ncol=1, fontsize=5.5)
    return style.save(fig, path)[:1]
