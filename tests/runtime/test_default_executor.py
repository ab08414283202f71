"""``--executor local`` is the default and runs every setting (fedgcn-gap --dpsgd included); a
strategy not privatised on the clients would be refused in one line naming ``--executor inline``
(docs/runtime.md, "The default executor")."""

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
        dict(algorithm="fedgcn", dp_epsilon=4.0),
        dict(algorithm="fedomd", dp_epsilon=8.0),
        dict(algorithm="fedspray", dp_epsilon=8.0),
        dict(algorithm="fedgcn-gap", dp_epsilon=4.0, options={"dpsgd": True}),
    ],
)
def test_runtime_settings_stay_local(kw, capsys):
    cfg = _cfg(**kw)
    preflight(cfg, check_data=False)
    assert cfg.executor == "local" and "executor:" not in capsys.readouterr().out


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_dp_with_a_strategy_not_privatised_on_the_clients_is_refused_naming_inline(executor, monkeypatch):
    """(None is registered now: every strategy privatises on the clients.)"""
    from secure_fgl.algorithms.fedomd.server import FedOMDStrategy

    monkeypatch.setattr(FedOMDStrategy, "dp_on_runtimes", False)
    with pytest.raises(
        ConfigError, match="fedomd's exchanges are not privatised on the client runtimes yet; use --executor inline"
    ):
        preflight(_cfg(algorithm="fedomd", dp_epsilon=8.0, executor=executor), check_data=False)
