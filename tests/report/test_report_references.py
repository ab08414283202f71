"""A sweep file naming reference sweeps: their runs are made with it and the report draws them.

The accuracy-vs-epsilon panel shows central GAP as a curve with its seed band, the feature-only MLP
and the non-private model as lines, with the DP unit and delta in the caption.  Read from the
figure's JSON and report.md, not from pixels.
"""

from __future__ import annotations

import json
import statistics

import pytest

from secure_fgl.report.cli import main as report_main
from secure_fgl.report.sweep import load_runs, spec_from_file

SMALL = """
rounds = 1
local_epochs = 1
model = "mlp"
synthetic = {num_nodes = 120, num_features = 12}
"""

MAIN = (
    SMALL
    + """
clients = 3
references = ["central.toml"]

[grid]
algorithms = ["fedavg", "fedgcn-gap"]
datasets = ["sbm"]
modes = ["plain"]
dp_epsilons = ["inf", 2]
seeds = 2
attacks = []

[grid.fedavg]
dp_epsilons = ["inf"]

[grid.fedgcn-gap.options]
hops = 1
encoder_rounds = 1
"""
)

CENTRAL = (
    SMALL
    + """
clients = 1

[grid]
algorithms = ["gap", "centralized"]
datasets = ["sbm"]
modes = ["plain"]
dp_epsilons = ["inf", 2]
seeds = 2
attacks = []

[grid.gap.options]
hops = 1
encoder_rounds = 1

[grid.centralized]
dp_epsilons = ["inf"]
"""
)


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values)


def test_reference_sweep_is_run_and_drawn_with_unit_and_delta_in_the_caption(tmp_path, capsys):
    (tmp_path / "central.toml").write_text(CENTRAL)
    main = tmp_path / "tradeoff.toml"
    main.write_text(MAIN)
    assert [r.algorithms for r in spec_from_file(main).references] == [["gap", "centralized"]]
    out = tmp_path / "out"
    assert report_main(["--config", str(main), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert (
        "plan: 6 run(s) = 2 algorithm(s)" in printed and "plan: + 6 reference run(s) of 1 reference sweep(s)" in printed
    )

    sweep = json.loads((out / "sweep.json").read_text())
    assert sorted(sweep["references"]) == sorted(
        f"{a}_sbm_plain_eps-{e}_s{s}"
        for a, es in (("gap", ("inf", "2")), ("centralized", ("inf",)))
        for e in es
        for s in (0, 1)
    )
    results, errors = load_runs(out)
    assert not errors and len(results) == 2 * 3 + 2 * 3

    def accs(algorithm, eps):
        return [
            r["final"]["test_acc"]
            for r in results
            if (r["config"]["algorithm"], r["config"]["dp_epsilon"]) == (algorithm, eps)
        ]

    figure = json.loads((out / "figures" / "accuracy_vs_epsilon.json").read_text())
    (panel,) = [p for p in figure["panels"] if p["panel"] == "accuracy"]
    assert (panel["unit"], panel["delta"]) == ("edge", 1e-5)
    assert [(s["algorithm"], s["mode"]) for s in panel["series"]] == [("fedgcn-gap", "plain")]
    refs = {g["label"]: g for g in panel["references"]}
    assert set(refs) == {"central GAP (edge DP)", "MLP, features only (no DP)", "centralized mlp (no DP)"}

    gap = refs["central GAP (edge DP)"]
    assert gap["shape"] == "curve" and set(gap["points"]) == {"2", "inf"}
    for label, eps in (("2", 2.0), ("inf", None)):
        mean, sd = _mean_sd(accs("gap", eps))
        assert abs(gap["points"][label]["mean"] - mean) < 1e-12 and abs(gap["points"][label]["std"] - sd) < 1e-12
        assert gap["points"][label]["seeds"] == 2
    for label, algorithm in (("MLP, features only (no DP)", "fedavg"), ("centralized mlp (no DP)", "centralized")):
        line = refs[label]
        assert line["shape"] == "line" and set(line["points"]) == {"inf"}
        assert abs(line["points"]["inf"]["mean"] - _mean_sd(accs(algorithm, None))[0]) < 1e-12

    assert "edge-level DP, δ = 1e-05" in panel["caption"]
    assert "central GAP (edge DP): curve with seed band" in panel["caption"]
    assert panel["caption"] in (out / "report.md").read_text()
    for ext in ("png", "pdf", "svg"):
        assert (out / "figures" / f"accuracy_vs_epsilon.{ext}").stat().st_size > 0


@pytest.mark.usefixtures("png_figures")
def test_reference_runs_of_another_delta_are_left_out_and_counted(tmp_path):
    (tmp_path / "central.toml").write_text(CENTRAL.replace("clients = 1", "clients = 1\ndp_delta = 1e-6"))
    main = tmp_path / "tradeoff.toml"
    main.write_text(
        MAIN.replace('algorithms = ["fedavg", "fedgcn-gap"]', 'algorithms = ["fedgcn-gap"]').replace(
            "seeds = 2", "seeds = 1"
        )
    )
    out = tmp_path / "out"
    assert report_main(["--config", str(main), "--out", str(out), "--quiet"]) == 0
    figure = json.loads((out / "figures" / "accuracy_vs_epsilon.json").read_text())
    (panel,) = [p for p in figure["panels"] if p["panel"] == "accuracy"]
    gap = next(g for g in panel["references"] if g["label"].startswith("central GAP"))
    assert set(gap["points"]) == {"inf"}  # its no-DP runs hold no delta: drawn; its DP runs are left out
    assert "2 reference run(s) of another DP unit or delta left out" in panel["caption"]
