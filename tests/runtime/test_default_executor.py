"""The local executor is the default and runs every setting.

``--executor local`` is the default and runs every setting (fedgcn-gap --dpsgd included); the
removed ``--executor inline`` answers in one line naming ``local`` (docs/runtime.md, "The default
executor").
"""

from __future__ import annotations

import pytest

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.preflight import preflight

TINY = {"num_nodes": 120, "num_features": 8, "num_classes": 3}


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{"mode": "plain", "clients": 3, "rounds": 1, "synthetic": dict(TINY), **kw})


def test_local_is_the_default():
    assert RunConfig().executor == "local"


@pytest.mark.parametrize(
    "kw",
    [
        dict(algorithm="fedavg", dp_epsilon=4.0),
        dict(algorithm="fedgcn", dp_epsilon=4.0, dp_exchanges="fedgcn/neighbour_sums"),
        dict(algorithm="fedomd", dp_epsilon=8.0),
        dict(algorithm="fedspray", dp_epsilon=8.0),
        dict(algorithm="fedgcn-gap", dp_epsilon=4.0, options={"dpsgd": True}),
    ],
)
def test_runtime_settings_stay_local(kw, capsys):
    cfg = _cfg(**kw)
    preflight(cfg, check_data=False)
    assert cfg.executor == "local" and "executor:" not in capsys.readouterr().out


def test_the_removed_inline_executor_answers_in_one_line_naming_local(capsys):
    from secure_fgl.cli.main import main

    with pytest.raises(ConfigError, match="--executor local") as err:
        _cfg(algorithm="fedavg", executor="inline").validate()
    assert "\n" not in str(err.value) and "removed" in str(err.value)
    assert main(["run", "--executor", "inline", "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--executor local" in lines[0]


def test_a_checkpoint_of_the_inline_executor_is_refused_in_one_line(tmp_path):
    """A run folder an older version wrote with ``--executor inline`` cannot be resumed."""
    from secure_fgl.engine.checkpoint import config_fingerprint, load_checkpoint
    from secure_fgl.engine.files import save_torch_atomic

    cfg = _cfg(algorithm="fedavg").validate()
    path = tmp_path / "checkpoint.pt"
    old = {**config_fingerprint(cfg), "executor": "inline"}
    save_torch_atomic(path, {"format": "secure_fgl-checkpoint/1", "fingerprint": old})
    with pytest.raises(ConfigError, match="--executor inline, which was removed") as err:
        load_checkpoint(path, cfg)
    assert "\n" not in str(err.value)
