"""Render ``report.md`` and a self-contained ``report.html`` from the run files of a sweep folder.

PNGs are embedded as base64.  Every number comes from a ``result.json``; nothing is recomputed from data or
models.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
from pathlib import Path

from . import figures, tables
from .headline import accuracy_vs_epsilon
from .sweep import load_runs

CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}caption{text-align:left;font-weight:600;padding:4px 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f3f3f3}.note{font-size:12px;color:#555}img{max-width:100%;border:1px solid #eee}
code{background:#f5f5f5;padding:1px 4px}"""


def _pairs(results: list[dict]) -> list[tuple[str, str]]:
    return sorted({(r["config"]["algorithm"], r["config"]["dataset"]) for r in results})


def _left_out_line(left: dict) -> str | None:
    parts = [
        f"{left['unfinished']} unfinished run(s)" if left.get("unfinished") else "",
        f"{left['not_in_sweep']} run folder(s) of other sweeps" if left.get("not_in_sweep") else "",
        f"{left['other_settings']} run(s) whose settings changed since the sweep" if left.get("other_settings") else "",
    ]
    parts = [p for p in parts if p]
    return f"Left out: {', '.join(parts)}." if parts else None


def render_report(
    out_dir: str | Path, *, title: str = "secure_fgl privacy/utility report", figure_size: str = "column"
) -> dict[str, Path]:
    """Write ``report.md``, ``report.html``, ``tables.tex`` and ``figures/*.{png,pdf,svg}`` into ``out_dir``.

    They are made from the finished runs of its latest sweep (``sweep.json``; every run folder when there is
    none).

    Args:
        out_dir: The sweep folder (its run folders hold ``result.json``).
        title: The report's title.
        figure_size: ``column`` or ``page`` width of the figures.

    Returns:
        The written files by kind.
    """
    out = Path(out_dir)
    sweep = json.loads((out / "sweep.json").read_text()) if (out / "sweep.json").exists() else {}
    left: dict = {}
    results, errors = load_runs(out, run_ids=sweep.get("runs"), fingerprints=sweep.get("fingerprints"), left_out=left)
    marked = set(sweep.get("references") or ())  # the runs of the sweep file's reference sweeps
    for r in results:
        r["_reference"] = r["_run_id"] in marked
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    spec = sweep.get("spec")

    sections: list[tuple[str, list]] = []  # (heading, [Table | Path | str])
    summary = (
        f"{len(results)} finished run(s) read from `{out}`"
        + (f", {len(errors)} failed" if errors else "")
        + f"; generated {_dt.datetime.now().isoformat(timespec='seconds')}."
    )
    intro: list = [summary]
    if _left_out_line(left):
        intro.append(_left_out_line(left))
    if spec:
        intro.append("Grid: " + ", ".join(f"{k}={v}" for k, v in spec.items() if k not in ("config", "options") and v))
    common, per_cell = tables.settings_of_runs(results)
    if common:
        intro.append(
            tables.Table(
                "Settings of every run (their resolved configs)",
                ["setting", "value"],
                [[k, v] for k, v in common.items()],
            )
        )
    if per_cell.rows:
        intro.append(per_cell)
    stale = tables.code_table(results)
    if stale.rows:
        intro.append(stale)
    sections.append(("Overview", intro))
    figs: dict[str, Path] = {}
    for old in fig_dir.glob("*.*"):  # figures of an earlier rendering would be read as this one's
        if old.suffix in (".png", ".pdf", ".svg"):
            old.unlink()
    if any(r["config"].get("dp_epsilon") is not None for r in results):
        headline: list = []
        for p in accuracy_vs_epsilon(results, fig_dir / "accuracy_vs_epsilon", size=figure_size):
            if p.suffix == ".png":
                figs[p.name] = p
                headline += [p, json.loads(p.with_suffix(".json").read_text())["caption"]]
        sections.append(("Accuracy vs ε (headline)", headline))
    for algo, ds in _pairs(results):
        items: list = [tables.leakage_matrix(results, algo, ds)]
        for p in figures.epsilon_curves(
            results, algo, ds, fig_dir / f"eps_{algo}_{ds}.png", size=figure_size
        ) + figures.frontier(results, algo, ds, fig_dir / f"frontier_{algo}_{ds}.png", size=figure_size):
            items.append(p)
            figs[p.name] = p
        sections.append((f"{algo} on {ds}", items))
    pngs = figures.exposure_by_degree(results, fig_dir / "exposure_by_degree.png", size=figure_size)
    if pngs:
        figs.update((p.name, p) for p in pngs)
        sections.append(("Per-node exposure (FedGCN)", pngs))
    sections.append(("Utility and cost", [tables.utility_table(results)]))
    sections.append(("Transcript audit", [tables.audit_exchange_table(results), tables.audit_table(results)]))
    sections.append(("Attacks", [tables.attack_table(results), tables.skipped_attacks(results)]))
    if errors:
        sections.append(("Failed runs", [tables.error_table(errors)]))

    sections.append(
        (
            "Files",
            [
                f"Every figure is in `figures/` as PNG, PDF (TrueType fonts) and SVG, {figure_size} "
                "wide; every table is in `tables.tex` (LaTeX, booktabs). Error bars and table "
                "cells: mean ± sample std over seeds."
            ],
        )
    )
    md = [f"# {title}", ""]
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, items in sections:
        md += [f"## {heading}", ""]
        body.append(f"<h2>{html.escape(heading)}</h2>")
        for it in items:
            if isinstance(it, tables.Table):
                md.append(it.to_markdown())
                body.append(it.to_html())
            elif isinstance(it, Path):
                rel = it.relative_to(out).as_posix()
                md += [f"![{it.stem}]({rel})", ""]
                data = base64.b64encode(it.read_bytes()).decode()
                body.append(f"<p><img alt='{html.escape(it.stem)}' src='data:image/png;base64,{data}'></p>")
            else:
                md += [str(it), ""]
                body.append(f"<p>{html.escape(str(it))}</p>")
    md_path, html_path, tex_path = out / "report.md", out / "report.html", out / "tables.tex"
    md_path.write_text("\n".join(md))
    tex_path.write_text(
        "% \\usepackage{booktabs}\n"
        + "\n".join(it.to_latex() for _, items in sections for it in items if isinstance(it, tables.Table))
    )
    html_path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
    return {"md": md_path, "html": html_path, "tex": tex_path, **figs}
