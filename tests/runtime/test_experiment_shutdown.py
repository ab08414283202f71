"""``run_experiment`` shuts its executor down when an exception escapes the run."""

from __future__ import annotations

import pytest

from protocols import DropoutError
from secure_fgl import experiment
from secure_fgl.config import RunConfig


def test_executor_is_shut_down_when_the_run_fails(monkeypatch):
    made = []

    def record(*args, **kw):
        made.append(experiment_make_executor(*args, **kw))
        return made[-1]

    experiment_make_executor = experiment.make_executor
    monkeypatch.setattr(experiment, "make_executor", record)
    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=3,
        mode="plain",
        rounds=1,
        simulate_dropouts="1@register",  # fatal in every mode: the run stops during its set-up
        synthetic={"num_nodes": 120, "num_features": 8},
    ).validate()
    with pytest.raises(DropoutError):
        experiment.run_experiment(cfg, progress=False)
    assert len(made) == 1
    assert made[0].runtimes == {}, "the client runtimes outlived the failed run"
