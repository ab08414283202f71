"""The driver killed mid-run, then resumed.

The driver killed mid-run (SIGKILL of the ``secure-fgl run`` process, nothing flushed), then
``--resume``: the run continues from its last checkpoint and ends as the uninterrupted run does --
the same rounds, losses and accuracies in plain, mask and ckks-mp (their model means are exact),
within the exchange tolerance in ckks.  Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from secure_fgl.cli.main import main

SMALL = "dataset = 'sbm'\npartition = 'iid'\n[synthetic]\nnum_nodes = 200\nnum_features = 16\n"
ROUNDS = 12
WAIT_S = 300.0  # the crashed driver's first checkpoint must appear within this


def args(mode: str, out: Path, config: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--algorithm",
        "fedavg",
        "--mode",
        mode,
        "--clients",
        "3",
        "--rounds",
        str(ROUNDS),
        "--out",
        str(out),
        "--quiet",
        "--config",
        str(config),
        *extra,
    ]


def crash_after_first_checkpoint(argv: list[str], out: Path) -> None:
    """Run the CLI in a new interpreter and SIGKILL it as soon as its first checkpoint is on disk.

    A new interpreter rather than a fork of the pytest worker: a fork copies whatever threads and
    locks earlier tests left in the worker (Ray, OpenMP) and can hang before its first round.
    """
    driver = subprocess.Popen(
        [sys.executable, "-c", "import sys; from secure_fgl.cli.main import main; sys.exit(main(sys.argv[1:]))", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not (out / "checkpoint.pt").exists():
            assert driver.poll() is None, "the driver exited before its first checkpoint"
            assert time.monotonic() < deadline, f"no checkpoint within {WAIT_S:g} s"
            time.sleep(0.01)
    finally:  # the crash (or the cleanup of a failed wait)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=WAIT_S)
    assert not (out / "result.json").exists(), "the run finished before the crash"


@pytest.mark.parametrize("mode", ["plain", "mask", "ckks", "ckks-mp"])
def test_resume_after_a_driver_crash_equals_the_uninterrupted_run(mode, tmp_path):
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    crash_after_first_checkpoint(args(mode, tmp_path / "crashed", config), tmp_path / "crashed")
    assert main(args(mode, tmp_path / "crashed", config, "--resume")) == 0
    assert main(args(mode, tmp_path / "full", config)) == 0
    full, resumed = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("full", "crashed"))
    assert [r["round"] for r in resumed["rounds"]] == list(range(ROUNDS))
    keys = "auth/keys"  # two sessions: the crashed one and the resumed one registered keys
    assert resumed["comm"]["per_tag"][keys]["messages"] == 2 * full["comm"]["per_tag"][keys]["messages"]
    for key in ("train_loss", "test_acc", "val_acc"):
        got, want = [r[key] for r in resumed["rounds"]], [r[key] for r in full["rounds"]]
        assert got == (pytest.approx(want, abs=1e-6) if mode == "ckks" else want), key
    assert resumed["final"]["test_acc"] == pytest.approx(full["final"]["test_acc"], abs=1e-6 if mode == "ckks" else 0)


def test_a_crash_between_the_client_files_and_the_driver_checkpoint_still_resumes(tmp_path):
    """A crash between the client files and the driver checkpoint still resumes.

    The clients write the slot the last driver checkpoint does not name: a crash after their
    writes (here: that slot overwritten with another state) leaves the named files intact.
    """
    config = tmp_path / "small.toml"
    config.write_text(SMALL)
    out = tmp_path / "run"
    crash_after_first_checkpoint(args("plain", out, config), out)
    slot = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]["slot"]
    for k in range(3):  # the next save's half-finished writes land in the other slot, never in the named one
        assert (out / "clients" / f"client{k}.{slot}.pt").exists()
        (out / "clients" / f"client{k}.{1 - slot}.pt").write_bytes(b"a later, unfinished save")
    assert main(args("plain", out, config, "--resume")) == 0
    assert len(json.loads((out / "result.json").read_text())["rounds"]) == ROUNDS
