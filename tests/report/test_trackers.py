"""The ``--log wandb`` and ``--log mlflow`` trackers.

``--log wandb`` and ``--log mlflow`` record the rounds, the config and the final result of a run
(offline: W&B's offline mode, MLflow's file store in the run folder); skipped without the extra.
"""

from __future__ import annotations

import json

import pytest

from secure_fgl.cli.main import main
from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment

SYNTH = dict(num_nodes=150, num_features=16, num_classes=2)


def _run(tmp_path, log):
    cfg = RunConfig(
        algorithm="fedavg",
        mode="plain",
        clients=3,
        rounds=2,
        partition="iid",
        synthetic=SYNTH,
        out=str(tmp_path / "run"),
        log=log,
    )
    return run_experiment(cfg, progress=False)


def test_mlflow_logs_rounds_config_and_result(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = _run(tmp_path, "mlflow")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'run' / 'mlflow.db').resolve()}")
    (run,) = client.search_runs([client.get_experiment_by_name("secure-fgl").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    history = client.get_metric_history(run.info.run_id, "test_acc")
    assert [m.step for m in history] == [r["round"] for r in result["rounds"]]
    assert [m.value for m in history] == pytest.approx([r["test_acc"] for r in result["rounds"]])
    assert run.data.metrics["final.test_acc"] == pytest.approx(result["final"]["test_acc"])
    assert run.data.params["config.algorithm"] == "fedavg" and run.data.params["config.rounds"] == "2"
    stored = json.loads((tmp_path / "run" / "mlartifacts" / run.info.run_id / "artifacts" / "result.json").read_text())
    assert stored["final"] == result["final"]


def test_wandb_offline_logs_rounds_config_and_result(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = _run(tmp_path, "wandb")
    (log,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    data = log.read_bytes()  # the offline transaction log (protobuf records; wandb ships no Python reader)
    for row in result["rounds"]:  # each round's value, JSON-encoded as W&B stores it
        assert json.dumps(row["test_acc"]).encode() in data
    for needle in ("final.test_acc", json.dumps(result["final"]["test_acc"]), "complete", "fedavg"):
        assert needle.encode() in data, needle


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_missing_tracker_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch, name):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == name else real(mod, *a))
    assert main(["run", "--algorithm", "fedavg", "--rounds", "1", "--log", name, "--out", str(tmp_path / "r")]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"pip install 'secure-fgl[{name}]'" in lines[0], lines
