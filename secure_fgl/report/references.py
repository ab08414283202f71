"""Reference curves of an accuracy-vs-epsilon panel: central GAP, the feature-only MLP and non-private models.

A run is a reference when its sweep file named it (``references = ["dp-gap-central-cora.toml"]``: those files' runs
are marked in ``sweep.json``) or when its algorithm is one of :data:`REFERENCE_ALGORITHMS` (the feature-only
``fedavg`` MLP of a trade-off sweep).  A reference group -- one (algorithm, model) on one dataset -- is drawn

* as a **curve** over epsilon with its seed band (mean ± sample std) when it has DP runs, its no-DP point set apart
  (central GAP: one party holding the whole graph, ``--algorithm gap``);
* as a **horizontal line** with its band when it has only no-DP runs (the non-private model; the feature-only MLP,
  which reads no edge and so is edge-private at every epsilon).

A reference's DP runs are drawn only when their DP unit and delta equal the panel's curves'; those that differ are
left out and counted in the caption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import style

#: algorithms whose runs are references in any report (the feature-only MLP of a trade-off sweep)
REFERENCE_ALGORITHMS = ("fedavg",)
#: colour and line style of each reference kind (greys and black: the modes keep the colours)
REFERENCE_STYLE = {"central": ("black", "-"), "features": ("0.45", "--"), "other": ("0.3", "-.")}


def is_reference(r: dict) -> bool:
    """Whether run ``r`` is a reference (marked by its sweep, or of a reference algorithm)."""
    return bool(r.get("_reference")) or r["config"]["algorithm"] in REFERENCE_ALGORITHMS


def common(values) -> object:
    """The one value of ``values`` (None when they differ or there is none)."""
    distinct = {v for v in values if v is not None}
    return distinct.pop() if len(distinct) == 1 else None


def dp_unit(r: dict) -> str | None:
    """The DP unit(s) of a run, e.g. ``edge`` or ``edge+sample``; None without DP."""
    p = r.get("privacy")
    if not p or r["config"].get("dp_epsilon") is None:
        return None
    return "+".join(p.get("units") or [p["unit"]])


def dp_delta(r: dict) -> float | None:
    """The delta of a DP run; None without DP."""
    if r["config"].get("dp_epsilon") is None:
        return None
    return (r.get("privacy") or {}).get("delta", r["config"].get("dp_delta"))


def _kind(algorithm: str, model: str | None) -> str:
    if algorithm == "gap":
        return "central"
    if model == "mlp" and algorithm == "fedavg":
        return "features"
    return "other"


def _name(algorithm: str, model: str | None) -> str:
    kind = _kind(algorithm, model)
    if kind == "central":
        return "central GAP"
    if kind == "features":
        return "MLP, features only"
    return f"{algorithm} {model}" if model else algorithm


@dataclass
class Reference:
    """One reference group of a panel: its label, kind, and points eps -> (mean, sd, seeds)."""

    label: str
    kind: str
    shape: str  # "curve" | "line"
    algorithm: str
    unit: str | None
    points: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The group as the figure's JSON holds it (epsilon ``inf`` = no DP)."""
        return {
            "label": self.label,
            "kind": self.kind,
            "shape": self.shape,
            "algorithm": self.algorithm,
            "unit": self.unit,
            "points": {
                ("inf" if e is None else f"{e:g}"): {"mean": m, "std": s, "seeds": n}
                for e, (m, s, n) in self.points.items()
            },
        }


def reference_groups(refs: list[dict], value, unit: str | None, delta: float | None) -> tuple[list[Reference], int]:
    """The reference groups of one panel's reference runs, and how many DP runs were left out for another unit/delta.

    Args:
        refs: The panel's reference runs (one dataset).
        value: The panel's value of a run (test accuracy).
        unit: The DP unit of the panel's curves (None: any unit is drawn).
        delta: The delta of the panel's curves (None: any delta is drawn).
    """
    groups: dict[tuple, list[dict]] = {}
    left_out = 0
    for r in refs:
        c = r["config"]
        if c.get("dp_epsilon") is not None and (
            (unit is not None and dp_unit(r) != unit) or (delta is not None and dp_delta(r) != delta)
        ):
            left_out += 1
            continue
        groups.setdefault((c["algorithm"], c.get("model")), []).append(r)
    out = []
    for (algorithm, model), runs in sorted(groups.items(), key=lambda kv: [str(k) for k in kv[0]]):
        by_eps: dict = {}
        for r in runs:
            by_eps.setdefault(r["config"].get("dp_epsilon"), []).append(value(r))
        points = {}
        for e, vals in by_eps.items():
            m, s = style.mean_sd(vals)
            if m is not None:
                points[e] = (m, s, sum(v is not None for v in vals))
        if not points:
            continue
        dp = any(e is not None for e in points)
        units = sorted({u for r in runs if (u := dp_unit(r))})
        label = _name(algorithm, model) + (f" ({'/'.join(units)} DP)" if dp else " (no DP)")
        shape = "curve" if dp else "line"
        out.append(Reference(label, _kind(algorithm, model), shape, algorithm, "/".join(units) or None, points))
    order = list(REFERENCE_STYLE)
    return sorted(out, key=lambda g: order.index(g.kind)), left_out


def draw(ax, pos: dict, groups: list[Reference]) -> None:
    """Draw each group on ``ax``: a curve with its seed band, or a horizontal line with its band."""
    import numpy as np

    for g in groups:
        color, ls = REFERENCE_STYLE[g.kind]
        if g.shape == "line":
            m, s, _ = g.points[None]
            ax.axhline(m, color=color, ls=ls, lw=0.9, label=g.label, zorder=1)
            ax.axhspan(m - s, m + s, color=color, alpha=0.08, lw=0, zorder=0)
            continue
        finite = sorted((pos[e], m, s) for e, (m, s, _) in g.points.items() if e is not None and e in pos)
        if finite:
            xs, ms, ss = (np.array(v) for v in zip(*finite))
            ax.errorbar(
                xs, ms, yerr=ss, color=color, ls=ls, lw=0.9, marker="x", capsize=1.5, elinewidth=0.6, label=g.label
            )
            ax.fill_between(xs, ms - ss, ms + ss, color=color, alpha=0.12, lw=0, zorder=0)
        if None in g.points and None in pos:
            m, s, _ = g.points[None]
            ax.errorbar([pos[None]], [m], yerr=[s], color=color, marker="x", ls="none", capsize=1.5, elinewidth=0.6)


def caption(unit: str | None, delta: float | None, groups: list[Reference], left_out: int, seeds: str) -> str:
    """The panel's caption: the DP unit and delta, the statistic, and what each reference is."""
    parts = ([f"{unit}-level DP"] if unit else []) + ([f"δ = {delta:g}"] if delta is not None else [])
    dp = ", ".join(parts) or "the curves share no DP unit and δ"
    text = f"Test accuracy vs total DP ε ({dp}); mean ± sample std over seeds ({seeds} seed(s) a point)."
    if groups:
        parts = []
        for g in groups:
            how = "curve with seed band" if g.shape == "curve" else "horizontal line with seed band"
            parts.append(f"{g.label}: {how}")
        text += " References: " + "; ".join(parts) + "."
    if left_out:
        text += f" {left_out} reference run(s) of another DP unit or delta left out."
    return text
