"""The report's figures are fit for a paper.

PNG, PDF and SVG of each; TrueType fonts in every PDF (no Type 3); the chosen --figure-size; one colour and marker
per mode in every figure; epsilon categorical with "no DP" set apart; equal series noted; tables also in LaTeX.
"""

from __future__ import annotations

import struct

import matplotlib.figure
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from secure_fgl.report import style
from secure_fgl.report.render import render_report


def _result(mode, eps, seed, acc, leak):
    attacks = [
        {"name": "transcript_audit", "observer": "server", "applicable": True, "value": 1.0},
        {
            "name": "link_posterior",
            "observer": "server",
            "metric": "auc",
            "applicable": True,
            "value": leak,
            "chance": 0.5,
            "higher_is_leakier": True,
        },
        {
            "name": "fedgcn_readout",
            "observer": "server",
            "metric": "exposure_rate",
            "applicable": True,
            "value": leak - 0.4,
            "chance": 0.0,
            "higher_is_leakier": True,
            "by_cross_degree": {"0": [1, 4], "1": [2, 4], "2+": [3, 4]},
        },
    ]
    config = {
        "algorithm": "fedgcn",
        "dataset": "sbm",
        "mode": mode,
        "dp_epsilon": eps,
        "seed": seed,
        "rounds": 2,
        "clients": 3,
        "attacks": ["all"],
        "options": {"hops": 1},
    }
    return {
        "config": config,
        "final": {"test_acc": acc},
        "num_classes": 5,
        "status": "complete",
        "attacks": attacks,
        "comm": {"bytes_up": 1e6, "bytes_down": 1e6},
        "time": {"total": 1.0},
        "privacy": {"unit": "edge", "total_epsilon": eps} if eps else None,
    }


def _sweep(out):
    import json

    for mode in ("plain", "ckks", "mask"):
        for eps in (None, 2.0, 8.0):
            for seed in (0, 1):
                acc = 0.8 - (0.3 / eps if eps else 0) + 0.01 * seed  # ckks = mask = plain, seed by seed
                d = out / f"fedgcn_sbm_{mode}_eps-{eps or 'inf'}_s{seed}"
                d.mkdir(parents=True)
                (d / "result.json").write_text(
                    json.dumps(_result(mode, eps, seed, acc, 0.9 if mode == "plain" else 0.5))
                )


def _png_size(path):
    w, h = struct.unpack(">II", path.read_bytes()[16:24])
    return w / 300, h / 300  # inches at the saved 300 dpi


def test_every_figure_in_three_formats_truetype_sized_one_colour_per_mode(tmp_path, monkeypatch):
    size = "column"
    out = tmp_path / "rep"
    _sweep(out)
    drawn = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda fig, *a, **kw: (drawn.append(fig), real(fig, *a, **kw))[1]
    )
    paths = render_report(out, figure_size=size)
    pngs = sorted((out / "figures").glob("*.png"))
    assert {p.stem for p in pngs} >= {
        "accuracy_vs_epsilon",
        "eps_fedgcn_sbm",
        "frontier_fedgcn_sbm",
        "exposure_by_degree",
    }
    for png in pngs:
        for ext in (".pdf", ".svg"):
            assert png.with_suffix(ext).stat().st_size > 0
        assert b"/Subtype /Type3" not in png.with_suffix(".pdf").read_bytes()
        assert b"/FontFile2" in png.with_suffix(".pdf").read_bytes()  # embedded TrueType
        width, height = _png_size(png)
        assert width == pytest.approx(style.WIDTH[size], abs=0.02) and height <= 9.0
    colours = {}  # mode -> the colours it is drawn in, all figures
    for fig in {id(f): f for f in drawn}.values():
        assert len([ax for ax in fig.axes if ax.axison]) <= style.MAX_PANELS[size]
        ink = fig.get_tightbbox(FigureCanvasAgg(fig).get_renderer())  # inches: nothing cut at an edge
        assert ink.x0 >= -0.02 and ink.x1 <= fig.get_figwidth() + 0.02 and ink.y1 <= fig.get_figheight() + 0.02
        for text in fig.legends[0].get_texts() if fig.legends else []:
            mode = (
                text.get_text().split()[0]
                if text.get_text().split()[0] in style.MODE_STYLE
                else (text.get_text().split()[1] if len(text.get_text().split()) > 1 else None)
            )
            if mode in style.MODE_STYLE:
                handle = fig.legends[0].legend_handles[fig.legends[0].get_texts().index(text)]
                colours.setdefault(mode, set()).add(matplotlib.colors.to_hex(handle.get_color()))
    assert set(colours) == {"plain", "ckks", "mask"} and all(len(c) == 1 for c in colours.values())
    assert len({next(iter(c)) for c in colours.values()}) == 3
    legend = [t.get_text() for f in drawn for lg in f.legends for t in lg.get_texts()]
    assert "mask (= ckks)" in legend  # equal series noted
    eps_ax = next(ax for f in drawn for ax in f.axes if ax.get_xlabel() == "DP ε")
    assert [t.get_text() for t in eps_ax.get_xticklabels()] == ["2", "8", "no DP"]
    ticks = eps_ax.get_xticks()
    assert ticks[1] - ticks[0] == 1 and ticks[2] - ticks[1] > 1  # categorical, "no DP" set apart
    frontier = next(f for f in drawn if "frontier" in f.axes[0].get_title())
    renderer = FigureCanvasAgg(frontier).get_renderer()
    boxes = [t.get_window_extent(renderer) for t in frontier.axes[0].texts if t.get_text().startswith(("ε", "no DP"))]
    assert boxes and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])  # no overprint
    tex = paths["tex"].read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "$\\pm$" in tex


def test_page_size_figure(tmp_path):
    import json

    from secure_fgl.report.headline import accuracy_vs_epsilon

    out = tmp_path / "rep"
    _sweep(out)
    results = [json.loads(p.read_text()) for p in out.glob("*/result.json")]
    png = accuracy_vs_epsilon(results, tmp_path / "fig", size="page")[0]
    assert _png_size(png)[0] == pytest.approx(style.WIDTH["page"], abs=0.02)


def test_attack_intervals_and_chance_are_rendered_when_present():
    from secure_fgl.report.tables import leakage_matrix

    runs = [_result("plain", None, 0, 0.8, 0.7), _result("mask", None, 0, 0.8, 0.3)]
    runs[0]["attacks"][1]["ci"] = [0.62, 0.78]
    runs[1]["attacks"][1]["ci"] = [0.22, 0.38]  # wholly below chance 0.5: suspicious
    rows = {r[0].split(" (")[0]: r for r in leakage_matrix(runs, "fedgcn", "sbm").rows}
    assert rows["link_posterior"][1] == "0.700 [0.620, 0.780]"
    assert rows["link_posterior"][2] == "0.300 [0.220, 0.380] (below chance?)"
    assert rows["fedgcn_readout"][1] == "0.300"  # no interval: none shown
