"""The "Adding an algorithm" example of docs/design.md is complete.

docs/design.md's "Adding an algorithm" example (examples/minimal_fedavg.py) is complete: a client
logic, a server strategy and a spec run as an algorithm of their own, and train as the built-in fedavg.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import minimal_fedavg  # noqa: E402
from support.golden import GOLDEN  # noqa: E402


def test_the_minimal_fedavg_trains_as_the_built_in_fedavg():
    cfg = RunConfig(
        algorithm=minimal_fedavg.NAME,
        dataset="sbm",
        clients=3,
        mode="mask",
        rounds=3,
        synthetic={"num_nodes": 300, "num_features": 40},
    )
    run = run_experiment(cfg, progress=False)
    # the golden run of the built-in fedavg on the same settings (tests/runtime/test_runtime.py)
    fedavg = json.loads((GOLDEN / "runtime.json").read_text())["cases"][
        "test_local_executor_gives_the_golden_run[fedavg-options0]"
    ]["observed"]
    assert [r["train_loss"] for r in run["rounds"]] == pytest.approx(fedavg["train_loss"], abs=1e-6)
    assert run["final"]["test_acc"] == fedavg["test_acc"]
    # the same messages (each one's bytes differ by the longer tag it names)
    assert run["comm"]["per_tag"][minimal_fedavg.TAG]["messages"] == fedavg["per_tag"]["fedavg/model"]["messages"]


def test_the_spec_is_what_the_cli_lists(capsys):
    from secure_fgl.cli.discover import algorithms_command

    assert algorithms_command(minimal_fedavg.NAME) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{minimal_fedavg.NAME}: FedAvg in one short file")
    assert "modes: plain, mask, ckks, ckks-mp" in out
