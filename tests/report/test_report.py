"""The privacy/utility report.

A tiny sweep produces report.md, report.html and PNG figures, resumes without rerunning, and every number comes from
the run files.
"""

from __future__ import annotations

import math

import pytest

from secure_fgl.report import tables
from secure_fgl.report.cli import main as report_main
from secure_fgl.report.sweep import load_runs, parse_epsilon, run_id, run_sweep, spec_from_file


def test_parse_epsilon_and_run_ids():
    assert parse_epsilon("inf") is None and parse_epsilon(None) is None and parse_epsilon(math.inf) is None
    assert parse_epsilon("2") == 2.0
    with pytest.raises(ValueError):
        parse_epsilon("-1")
    assert run_id("fedgcn", "sbm", "mask", None, 0) == "fedgcn_sbm_mask_eps-inf_s0"
    assert run_id("fedgcn", "sbm", "mask", 0.5, 2) == "fedgcn_sbm_mask_eps-0.5_s2"


def _fake_result(mode, eps, value, applicable=True, at_chance=None, acc=0.8, seed=0):
    entry = {
        "name": "fedgcn_readout",
        "observer": "server",
        "exchange": "fedgcn/*",
        "metric": "exposure_rate",
        "value": value if applicable else None,
        "chance": 0.0,
        "applicable": applicable,
        "higher_is_leakier": True,
        "knowledge": ["public"],
    }
    if at_chance is not None:
        entry["at_chance"] = at_chance
    audit = {
        "name": "transcript_audit",
        "observer": "server",
        "metric": "passed",
        "value": 0.0 if mode == "plain" else (1.0 if at_chance else 0.0),
        "applicable": True,
        "failures": [],
    }
    return {
        "config": {"algorithm": "fedgcn", "dataset": "sbm", "mode": mode, "dp_epsilon": eps, "seed": seed},
        "final": {"test_acc": acc},
        "attacks": [audit, entry],
        "comm": {"bytes_up": 1e6, "bytes_down": 2e6},
        "time": {"total": 1.0, "setup": 0.1, "train": 0.5},
        "privacy": None,
    }


def test_leakage_matrix_cells():
    res = [
        _fake_result("plain", None, 0.8),
        _fake_result("plain", None, 0.6, seed=1),
        _fake_result("mask", None, None, applicable=False, at_chance=True),
        _fake_result("ckks", None, None, applicable=False, at_chance=False),
        _fake_result("plain", 1.0, 0.1, acc=0.5),
    ]
    t = tables.leakage_matrix(res, "fedgcn", "sbm")
    assert t.header[1:] == ["plain", "plain ε=1", "ckks", "mask", "chance"]
    row = t.rows[0]
    assert row[1] == "0.700 ± 0.141" and row[2] == "0.100"
    assert row[3] == "n/a" and row[4] == "n/a (chance)"  # at chance only when the audit passed
    assert t.rows[-1][0] == "test accuracy" and t.rows[-1][2] == "0.500"
    md = t.to_markdown()
    assert "| fedgcn_readout (server): exposure_rate |" in md
    u = tables.utility_table(res)
    assert u.rows and u.rows[0][9] == "1.000 ± 0.000" and u.rows[1][9] == "1.000"


@pytest.mark.usefixtures("png_figures")
def test_tiny_report_sweep(tmp_path):
    """Tiny report sweep.

    FedGCN without DP (its exposure by degree) and fedgcn-gap at eps 2 (FedGCN's own edge-level DP
    is refused), from a sweep file.
    """
    out = tmp_path / "rep"
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'rounds = 2\nclients = 3\npartition = "iid"\n'
        "synthetic = {num_nodes = 150, num_features = 30, avg_degree = 4}\n"
        '[grid]\nalgorithms = ["fedgcn", "fedgcn-gap"]\ndatasets = ["sbm"]\n'
        'modes = ["mask"]\ndp_epsilons = ["inf", 2]\nseeds = 1\n'
        '[grid.fedgcn]\ndp_epsilons = ["inf"]\n'
    )
    argv = ["--config", str(sweep), "--out", str(out), "--quiet"]
    assert report_main(argv) == 0
    results, errors = load_runs(out)
    assert not errors and len(results) == 3
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert "eps_fedgcn-gap_sbm.png" in pngs and "frontier_fedgcn-gap_sbm.png" in pngs
    assert "exposure_by_degree.png" in pngs
    assert "Leakage matrix — fedgcn on sbm" in md and "test accuracy" in md
    assert html.count("data:image/png;base64,") == len(pngs) and "<table>" in html
    # every accuracy printed comes from a result.json
    accs = {f"{r['final']['test_acc']:.3f}" for r in results}
    acc_row = [line for line in md.splitlines() if line.startswith("| test accuracy")][0]
    cells = [c.strip() for c in acc_row.strip("|").split("|")[1:-1]]
    assert all(c in accs or c == "—" for c in cells)
    # resumable: a second sweep skips every finished run
    spec = spec_from_file(sweep)
    status = run_sweep(
        spec, out, progress=False, runner=lambda cfg: (_ for _ in ()).throw(AssertionError("should not rerun"))
    )
    assert sum(s["status"] == "skipped" for s in status) == len(results)


def test_report_render_only_on_empty_folder(tmp_path):
    assert report_main(["--no-run", "--out", str(tmp_path), "--quiet"]) == 0
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()
