"""What a run leaves behind.

Result.json (schema, provenance, written before attacks), file modes, best_model.pt, per-round logs, the default run
folder, load_runs / compare / plot.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from secure_fgl.cli.main import main
from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.results import SCHEMA_VERSION, load_runs, schema, validate_result

SYNTH = dict(num_nodes=200, num_features=32, num_classes=3)


def _cfg(out, **kw):
    base = dict(algorithm="fedavg", mode="plain", clients=3, rounds=3, partition="iid", synthetic=SYNTH, out=str(out))
    return RunConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two small runs (seeds 0 and 1) under one folder, written with umask 022."""
    root = tmp_path_factory.mktemp("sweep")
    old = os.umask(0o022)
    try:
        for seed in (0, 1):
            run_experiment(_cfg(root / f"seed{seed}", seed=seed, log="csv"), progress=False)
    finally:
        os.umask(old)
    return root


def test_result_follows_the_shipped_schema_with_provenance(sweep):
    res = json.loads((sweep / "seed0" / "result.json").read_text())
    validate_result(res)
    assert res["schema_version"] == SCHEMA_VERSION and schema()["properties"]["schema_version"]
    assert res["library_versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert res["started_at"] <= res["finished_at"] and res["device"] == "cpu" and res["status"] == "complete"
    assert res["config"]["options"] == res["options"] == {}


def test_results_are_group_readable_and_checkpoints_private(sweep):
    mode = lambda name: stat.S_IMODE(os.stat(sweep / "seed0" / name).st_mode)  # noqa: E731
    assert mode("result.json") == 0o644 and mode("best_model.pt") == 0o644 and mode("rounds.csv") == 0o644
    assert mode("checkpoint.pt") == 0o600 and mode("clients/client0.0.pt") == 0o600  # each runtime's own


def test_best_model_loads_with_weights_only(sweep):
    from secure_fgl.engine.hooks import load_best_model

    weights = torch.load(sweep / "seed0" / "best_model.pt", weights_only=True)
    assert weights and all(torch.is_tensor(v) for v in weights.values())
    res = json.loads((sweep / "seed0" / "result.json").read_text())
    from secure_fgl.models import build_model

    model = build_model("gcn", SYNTH["num_features"], 16, SYNTH["num_classes"])
    load_best_model(sweep / "seed0" / "best_model.pt", model, prefix="models.0")
    first = next(iter(model.state_dict()))
    assert torch.equal(model.state_dict()[first], weights[f"models.0.{first}"])
    assert res["files"]["best_model.pt"]


def test_csv_log_has_one_line_per_round(sweep):
    lines = (sweep / "seed0" / "rounds.csv").read_text().splitlines()
    assert lines[0].startswith("round,") and len(lines) == 1 + 3


def test_load_runs_gives_one_flat_row_per_run(sweep):
    df = load_runs(sweep)
    assert len(df) == 2 and sorted(df["config.seed"]) == [0, 1]
    assert df["final.test_acc"].between(0, 1).all() and (df["comm.bytes_up"] > 0).all()


def test_compare_and_plot(sweep, capsys):
    assert main(["compare", str(sweep)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["run", "algorithm", "dataset", "mode"] and len(out) == 3
    assert main(["plot", str(sweep / "seed1")]) == 0
    assert (sweep / "seed1" / "curves.png").stat().st_size > 0


def test_result_is_written_before_attacks_and_attack_failures_are_recorded(tmp_path, monkeypatch):
    import attacks.runner

    seen = {}

    def failing(names, **kw):
        seen["before"] = json.loads((tmp_path / "result.json").read_text())
        raise RuntimeError("boom")

    monkeypatch.setattr(attacks.runner, "run_attacks", failing)
    res = run_experiment(_cfg(tmp_path, attacks=["membership"]), progress=False)
    assert seen["before"]["status"] == "attacks_running" and seen["before"]["final"]["test_acc"] is not None
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["status"] == "complete" and "boom" in on_disk["attacks"][0]["error"]
    assert res["attacks"] == on_disk["attacks"]


def test_default_run_folder_is_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "run",
                "--algorithm",
                "local",
                "--mode",
                "plain",
                "--clients",
                "2",
                "--rounds",
                "1",
                "--partition",
                "iid",
                "--config",
                str(_small_toml(tmp_path)),
                "--log-file",
                "progress.log",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "[data] done" in (tmp_path / "progress.log").read_text() and "[setup]" in captured.err
    (folder,) = list((tmp_path / "runs").iterdir())
    assert folder.name.startswith("local-sbm-plain-") and (folder / "result.json").is_file()
    assert f"run folder: runs/{folder.name}" in captured.err and f"runs/{folder.name}/result.json" in captured.out


def test_tensorboard_log(tmp_path):
    pytest.importorskip("tensorboard")
    run_experiment(_cfg(tmp_path, log="tensorboard", rounds=2), progress=False)
    assert any((tmp_path / "tensorboard").iterdir())


def _small_toml(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text("[synthetic]\nnum_nodes = 150\nnum_features = 16\nnum_classes = 2\n")
    return path


def test_summary_formats_privacy(tmp_path, capsys):
    assert (
        main(
            [
                "run",
                "--algorithm",
                "fedavg",
                "--mode",
                "plain",
                "--clients",
                "3",
                "--rounds",
                "2",
                "--partition",
                "iid",
                "--dp-epsilon",
                "4",
                "--quiet",
                "--out",
                str(tmp_path / "dp"),
                "--config",
                str(_small_toml(tmp_path)),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("privacy:"))
    assert "spent of 4 (delta 1e-05" in line and "None" not in out
