"""Files never run code.

Checkpoints load with ``weights_only=True`` and are bound to the run's settings; Planetoid pickles go through a
restricted unpickler; dataset checksums ship in the package: a crafted ``checkpoint.pt`` or ``ind.cora.y`` that
would run code is refused.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import stat
from pathlib import Path

import pytest
import torch

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.data import DataError, load_node_dataset
from secure_fgl.data.safe_files import canonical_checksums, load_pickle, verify_checksums
from secure_fgl.engine.trainer import CHECKPOINT
from secure_fgl.experiment import run_experiment

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("SECURE_FGL_DATA") or REPO.parent / "shared" / "datasets")
SMALL = {"num_nodes": 200, "num_features": 16, "num_classes": 3}


def cfg(out, **kw) -> RunConfig:
    base = dict(
        algorithm="fedavg",
        mode="plain",
        dataset="sbm",
        clients=3,
        rounds=2,
        synthetic=dict(SMALL),
        seed=0,
        out=str(out),
    )
    base.update(kw)
    return RunConfig(**base)


class RunsCode:
    """Unpickling this calls ``Path(marker).touch()``: the payload of the measured attack."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "PWNED"
    run_experiment(cfg(out), progress=False)
    torch.save({"algorithm": RunsCode(marker)}, out / CHECKPOINT)  # a pickle naming pathlib.Path.touch
    with pytest.raises(ConfigError, match="corrupt or not a plain-data") as err:
        run_experiment(cfg(out, rounds=3, resume=True), progress=False)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    torch.load(out / CHECKPOINT, weights_only=False)  # the file is a real attack:
    assert marker.exists()  # the old loader ran it


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04" + b"\x00" * 40])
def test_corrupt_checkpoint_one_line_error(tmp_path, content):
    out = tmp_path / "run"
    run_experiment(cfg(out), progress=False)
    (out / CHECKPOINT).write_bytes(content)
    with pytest.raises(ConfigError) as err:
        run_experiment(cfg(out, rounds=3, resume=True), progress=False)
    assert "\n" not in str(err.value) and "--resume" in str(err.value)


def test_resume_refuses_other_settings_naming_the_keys(tmp_path):
    out = tmp_path / "run"
    run_experiment(cfg(out), progress=False)
    with pytest.raises(ConfigError, match=r"other settings: mode .*seed ") as err:
        run_experiment(cfg(out, rounds=3, resume=True, seed=1, mode="mask"), progress=False)
    assert "\n" not in str(err.value) and "clients" not in str(err.value)
    resumed = run_experiment(cfg(out, rounds=3, resume=True), progress=False)  # same settings: fine
    assert resumed["final"]["rounds_run"] == 3


def test_checkpoint_is_plain_data_and_private(tmp_path):
    out = tmp_path / "run"
    run_experiment(cfg(out, dp_epsilon=4.0), progress=False)
    saved = torch.load(out / CHECKPOINT, weights_only=True)  # nothing but plain types
    assert saved["fingerprint"]["seed"] == 0 and saved["fingerprint"]["dp_epsilon"] == 4.0
    assert isinstance(saved["train"], dict) and set(saved["extra"]["transcript"]) == {"messages", "bytes", "sha256"}
    assert stat.S_IMODE((out / CHECKPOINT).stat().st_mode) == 0o600  # holds the clients' models


def test_cli_prints_one_line_for_a_refused_resume(tmp_path, capsys):
    from secure_fgl.cli.main import main

    out = tmp_path / "run"
    run_experiment(cfg(out), progress=False)
    rc = main(
        [
            "run",
            "--algorithm",
            "fedavg",
            "--mode",
            "plain",
            "--dataset",
            "sbm",
            "--clients",
            "3",
            "--rounds",
            "3",
            "--seed",
            "5",
            "--out",
            str(out),
            "--resume",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "seed" in err


# ----------------------------------------------------------------------------- Planetoid pickles
def test_restricted_unpickler_refuses_code_and_accepts_the_format(tmp_path):
    import collections

    import numpy as np
    import scipy.sparse as sp

    marker = tmp_path / "PWNED"
    with pytest.raises(DataError, match="pathlib") as err:
        load_pickle(io.BytesIO(pickle.dumps(RunsCode(marker))), path="ind.cora.y")
    assert "\n" not in str(err.value) and not marker.exists()
    for evil in (pickle.dumps(os.system), pickle.dumps(getattr), b"cbuiltins\neval\n(S'1'\ntR."):
        with pytest.raises(DataError):
            load_pickle(io.BytesIO(evil))
    with pytest.raises(DataError, match="not a valid"):
        load_pickle(io.BytesIO(b"\x80\x02}q\x00"))  # truncated
    graph = collections.defaultdict(list, {0: [1, 2], 1: [0]})
    ok = [np.arange(6, dtype=np.float32).reshape(2, 3), sp.csr_matrix(np.eye(3)), graph]
    for obj in ok:
        back = load_pickle(io.BytesIO(pickle.dumps(obj, protocol=2)))
        assert type(back) is type(obj)


needs_cora = pytest.mark.skipif(
    not (DATA / "Cora" / "raw" / "ind.cora.x").exists(), reason=f"Cora raw files not under {DATA}: set SECURE_FGL_DATA"
)


@needs_cora
def test_crafted_cora_file_raises_data_error_and_runs_nothing(tmp_path):
    root = tmp_path / "data"
    shutil.copytree(DATA / "Cora", root / "Cora")
    marker = tmp_path / "PWNED"
    (root / "Cora" / "raw" / "ind.cora.y").write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    with pytest.warns(UserWarning, match="ind.cora.y differ"), pytest.raises(DataError, match="refusing to load"):
        load_node_dataset("cora", data_root=root, cache_dir=tmp_path / "cache")
    assert not marker.exists()
    pickle.loads((root / "Cora" / "raw" / "ind.cora.y").read_bytes())  # the file is a real attack:
    assert marker.exists()  # a plain unpickler runs it


@needs_cora
def test_real_cora_loads_and_matches_shipped_checksums(tmp_path):
    assert verify_checksums("Cora", DATA / "Cora" / "raw") == []
    assert sum(k.startswith("Cora/raw/") for k in canonical_checksums()) == 8
    data = load_node_dataset("cora", data_root=DATA, cache_dir=tmp_path / "cache")
    assert data.num_nodes == 2708 and data.num_classes == 7


@pytest.mark.parametrize("damage", ["drop_train", "wrong_algorithm"])
def test_checkpoint_with_matching_settings_but_wrong_content_one_line(tmp_path, damage):
    """The fingerprint matches this run, the content does not: one line naming --resume, no traceback."""
    out = tmp_path / "run"
    run_experiment(cfg(out), progress=False)
    saved = torch.load(out / CHECKPOINT, weights_only=True)
    if damage == "drop_train":
        del saved["train"]
    else:
        saved["algorithm"] = {"not": "a state dict"}
    torch.save(saved, out / CHECKPOINT)
    with pytest.raises(ConfigError, match="content does not load") as err:
        run_experiment(cfg(out, rounds=3, resume=True), progress=False)
    assert "\n" not in str(err.value) and "--resume" in str(err.value)
