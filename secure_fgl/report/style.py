"""The look every report figure shares, so that a figure can go into a paper as it is.

* **Fonts**: TrueType (Type 42) in PDF (``pdf.fonttype = 42``; IEEE/ACM camera-ready checks
  reject Type 3 fonts), 7 pt text.
* **Size**: ``column`` = 3.5 in wide, ``page`` = 7 in (two-column paper); panels in a grid of at
  most :data:`MAX_PANELS` per figure (2 columns of panels in a column figure, 3 in a page one).
* **One colour and marker per mode** in every figure (:data:`MODE_STYLE`); one line style per
  algorithm.
* **DP epsilon is categorical**: the budgets in increasing order, evenly spaced, then "no DP" set
  apart after a separator; lines join finite budgets only.  Series of several modes are dodged
  sideways so that equal values stay visible.
* **Error bars**: mean ± sample standard deviation (ddof = 1) over seeds -- the tables' statistic.
* Every figure is written as PNG (300 dpi), PDF and SVG.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from protocols.registry import colours, modes  # noqa: E402

#: figure widths (inches) of ``--figure-size``
WIDTH = {"column": 3.5, "page": 7.0}
#: panel columns per figure of each size, and the most panels one figure holds
PANEL_COLUMNS = {"column": 2, "page": 3}
MAX_PANELS = {"column": 4, "page": 6}
#: height of one row of panels (inches)
ROW_HEIGHT = {"column": 1.75, "page": 2.1}
RC = {
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
FORMATS = (".png", ".pdf", ".svg")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
#: every registered mode's fixed (colour, marker); an unknown mode is grey crosses
MODE_STYLE = {m: (colours().get(m, "tab:gray"), _MARKERS[i % len(_MARKERS)]) for i, m in enumerate(modes())}
LINESTYLES = ("-", "--", ":", "-.")
STATISTIC = "mean ± sample std over seeds"


def styled(draw):
    """Run a drawing function under :data:`RC` (fonts and sizes apply to every artist it makes)."""
    import functools

    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return draw(*args, **kwargs)

    return wrapper


def mode_style(mode: str) -> tuple[str, str]:
    """``(colour, marker)`` of a mode (grey x for an unknown one)."""
    return MODE_STYLE.get(mode, ("tab:gray", "x"))


def mode_rank(mode: str) -> int:
    """A mode's position in the report order (unknown modes last)."""
    return list(MODE_STYLE).index(mode) if mode in MODE_STYLE else len(MODE_STYLE)


def new_figure(panels: int, size: str, legend_rows: int = 1):
    """A figure of ``size`` with ``panels`` axes in a grid and room for a legend below.

    The layout is constrained; the legend has ``legend_rows`` lines.

    Returns:
        ``(fig, axes)``.
    """
    if size not in WIDTH:
        raise ValueError(f"figure size {size!r} is not one of {', '.join(WIDTH)}")
    if panels > MAX_PANELS[size]:
        raise ValueError(f"{panels} panels exceed the {MAX_PANELS[size]} of a {size} figure; split it")
    ncol = min(PANEL_COLUMNS[size], panels)
    nrow = math.ceil(panels / ncol)
    fig, axes = plt.subplots(
        nrow,
        ncol,
        figsize=(WIDTH[size], ROW_HEIGHT[size] * nrow + 0.35 + 0.1 * legend_rows),
        squeeze=False,
        layout="constrained",
    )
    flat = [ax for row in axes for ax in row]
    for ax in flat[panels:]:
        ax.axis("off")
    return fig, flat[:panels]


def title(fig, text: str, size: str) -> None:
    """The figure's title, wrapped to its width (a title never runs past the page)."""
    import textwrap

    fig.suptitle(textwrap.fill(text, width=int(WIDTH[size] * 15)))


def numbered(path: Path, index: int) -> Path:
    """``path`` for the first figure of a series, ``<stem>_2``, ``_3`` ... for the next ones."""
    return path if index == 0 else path.with_name(f"{path.stem}_{index + 1}{path.suffix}")


def chunks(items: list, size: str) -> list[list]:
    """``items`` in groups of at most one figure's panels."""
    n = MAX_PANELS[size]
    return [items[i : i + n] for i in range(0, len(items), n)] or [[]]


def save(fig, path: str | Path) -> list[Path]:
    """Write ``fig`` as PNG, PDF and SVG beside ``path`` (its suffix replaced) at its own size; close it."""
    path = Path(path)
    out = []
    for ext in FORMATS:
        p = path.with_suffix(ext)
        fig.savefig(p, dpi=300)
        out.append(p)
    plt.close(fig)
    return out


def eps_positions(eps_values) -> dict:
    """X position of each budget: finite ones 0, 1, 2, ... in increasing order, None (no DP) set apart."""
    finite = sorted(e for e in set(eps_values) if e is not None)
    pos = {e: float(i) for i, e in enumerate(finite)}
    if None in set(eps_values):
        pos[None] = len(finite) + (0.6 if finite else 0.0)
    return pos


def eps_axis(ax, pos: dict, label: str = "DP ε") -> None:
    """Categorical epsilon ticks, a separator before "no DP"."""
    keys = sorted(pos, key=lambda e: pos[e])
    ax.set_xticks([pos[e] for e in keys])
    ax.set_xticklabels(["no DP" if e is None else f"{e:g}" for e in keys])
    if None in pos and len(pos) > 1:
        ax.axvline(pos[None] - 0.8, color="0.75", lw=0.6, ls="-")
    ax.set_xlim(min(pos.values()) - 0.5, max(pos.values()) + 0.5)
    ax.set_xlabel(label)


def mean_sd(values) -> tuple[float | None, float]:
    """Mean and sample standard deviation (0 for one value) of the finite ``values``."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not vals:
        return None, 0.0
    return float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0


def dodge(index: int, count: int, width: float = 0.1) -> float:
    """Sideways offset of series ``index`` of ``count`` at one x (equal values stay visible)."""
    return (index - (count - 1) / 2) * width


def series(
    ax, pos: dict, points: dict, *, offset: float, color: str, marker: str, ls: str = "-", label: str | None = None
) -> None:
    """``points``: eps -> (mean, sd).  Error bars at every point; a line joins finite budgets only."""
    finite = [
        (pos[e] + offset, m, s)
        for e, (m, s) in sorted(points.items(), key=lambda kv: pos[kv[0]])
        if e is not None and m is not None
    ]
    if finite:
        xs, ms, ss = zip(*finite)
        ax.errorbar(xs, ms, yerr=ss, color=color, marker=marker, ls=ls, capsize=1.5, elinewidth=0.7, label=label)
        label = None
    if None in points and points[None][0] is not None:
        m, s = points[None]
        ax.errorbar(
            [pos[None] + offset],
            [m],
            yerr=[s],
            color=color,
            marker=marker,
            ls="none",
            capsize=1.5,
            elinewidth=0.7,
            label=label,
        )


def equal_series(named: dict[str, dict]) -> list[tuple[str, str]]:
    """Pairs of series (name -> {eps: (mean, sd)}) whose every point is equal: drawn dodged, and noted."""
    names = list(named)
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pa, pb = named[a], named[b]
            if (
                pa
                and pa.keys() == pb.keys()
                and all(pa[k][0] is not None and pb[k][0] is not None and abs(pa[k][0] - pb[k][0]) < 1e-9 for k in pa)
            ):
                pairs.append((a, b))
    return pairs


def place_labels(ax, points: list[tuple[float, float, str, str]]) -> list[str]:
    """Label each (x, y, text, colour) beside its point where it overlaps no other label and stays inside the axes.

    Returns the texts that found no free place (the caller counts them in a note).
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    taken, dropped = [], []
    for x, y, text, color in points:
        for dx, dy in ((3, 3), (3, -8), (-3, 3), (-3, -8), (3, 10), (-3, 10), (3, -15), (-3, -15)):
            t = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                fontsize=5.5,
                ha="left" if dx > 0 else "right",
                color=color,
            )
            box = t.get_window_extent(renderer)
            fits = (
                box.x0 >= inside.x0
                and box.x1 <= inside.x1
                and box.y0 >= inside.y0
                and box.y1 <= inside.y1
                and not any(box.overlaps(o) for o in taken)
            )
            if fits:
                taken.append(box)
                break
            t.remove()
        else:
            dropped.append(text)
    return dropped
