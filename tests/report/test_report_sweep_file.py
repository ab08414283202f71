"""The ``secure-fgl report --config FILE`` sweep file.

`secure-fgl report --config FILE`: a sweep file (run-config keys + [grid]) runs its grid and the
report carries the headline accuracy-vs-epsilon figure (PNG, PDF, SVG).
"""

from __future__ import annotations

import pytest

from secure_fgl.report.cli import main as report_main
from secure_fgl.report.sweep import load_runs, spec_from_file

SWEEP = """
clients = 3
rounds = 2
model = "mlp"
synthetic = {num_nodes = 120, num_features = 12}

[grid]
algorithms = ["fedavg", "fedgcn-gap"]
datasets = ["sbm"]
modes = ["plain"]
dp_epsilons = ["inf", 2]
seeds = 1
attacks = []

[grid.fedavg]
dp_epsilons = ["inf"]

[grid.fedgcn-gap.options]
hops = 1
"""


def test_sweep_file_runs_its_grid_and_the_report_has_the_headline_figure(tmp_path):
    f = tmp_path / "sweep.toml"
    f.write_text(SWEEP)
    spec = spec_from_file(f)
    assert [rid for rid, _ in spec.runs(tmp_path)] == [
        "fedavg_sbm_plain_eps-inf_s0",
        "fedgcn-gap_sbm_plain_eps-inf_s0",
        "fedgcn-gap_sbm_plain_eps-2_s0",
    ]
    out = tmp_path / "out"
    assert report_main(["--config", str(f), "--out", str(out), "--quiet"]) == 0
    results, errors = load_runs(out)
    assert len(results) == 3 and not errors
    assert all(r["config"]["options"]["hops"] == 1 for r in results if r["config"]["algorithm"] == "fedgcn-gap")
    for ext in ("png", "pdf", "svg"):
        assert (out / "figures" / f"accuracy_vs_epsilon.{ext}").stat().st_size > 0
    assert "figures/accuracy_vs_epsilon.png" in (out / "report.md").read_text()


def test_sweep_file_refuses_grid_flags_and_run_only_keys(tmp_path, capsys):
    f = tmp_path / "sweep.toml"
    f.write_text(SWEEP)
    assert report_main(["--config", str(f), "--seeds", "3", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "--config sets the grid; drop --seeds" in capsys.readouterr().err
    f.write_text(SWEEP.replace("rounds = 2", 'rounds = 2\ndataset = "cora"'))
    with pytest.raises(ValueError, match="'dataset' is set by the \\[grid\\] table"):
        spec_from_file(f)
    f.write_text("rounds = 2\n")
    with pytest.raises(ValueError, match="needs a \\[grid\\] table"):
        spec_from_file(f)


@pytest.mark.parametrize("name", ["dp-gap-tradeoff.toml", "dp-gap-tradeoff-cora-large-eps.toml"])
def test_shipped_dp_sweep_files_run_every_mode_with_attacks_in_the_central_references_setting(name, tmp_path):
    """The trade-off files: every mode with attacks, on the schedule and modules of their central reference.

    Their fedgcn-gap runs have the central GAP sweep's encoder and head rounds, local epochs, width and
    module settings (one noisy hop, FedProx encoder, centred embeddings), so the reference curve drawn on
    each panel differs from them only by the federation; every planned run passes preflight.
    """
    from pathlib import Path

    import secure_fgl
    from secure_fgl.algorithms.options import GAPOptions
    from secure_fgl.preflight import preflight

    spec = spec_from_file(Path(secure_fgl.__file__).parent / "configs" / name)
    assert set(spec.modes) == {"plain", "mask", "ckks"} and spec.attacks and len(spec.seeds) == 5
    assert spec.algorithm_epsilons["fedavg"] == [None]
    (central,) = spec.references

    def schedule(runs: list) -> set[tuple]:
        options = [GAPOptions(**c.options) for c in runs]
        return {
            (o.encoder_rounds or c.rounds, c.rounds, c.local_epochs, c.hidden)
            + (o.hops, o.encoder_mu, o.center_embeddings)
            for o, c in zip(options, runs)
        }

    runs = [cfg for _, cfg in spec.own_runs(tmp_path)]
    for cfg in runs:
        preflight(cfg, check_data=False)
    gap = [cfg for cfg in runs if cfg.algorithm == "fedgcn-gap"]
    assert gap and schedule(gap) == schedule([cfg for _, cfg in central.runs(tmp_path) if cfg.algorithm == "gap"])
