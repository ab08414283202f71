"""``--executor local`` is the default; settings the client runtimes lack run inline (one printed
line) on ``local`` and are refused on ``ray`` (docs/runtime.md, "The default executor")."""
from __future__ import annotations

import pytest

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.preflight import preflight

TINY = {"num_nodes": 120, "num_features": 8, "num_classes": 3}


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{"mode": "plain", "clients": 3, "rounds": 1, "synthetic": dict(TINY), **kw})


def test_local_is_the_default():
    assert RunConfig().executor == "local"


@pytest.mark.parametrize("kw", [dict(algorithm="fedavg", dp_epsilon=4.0), dict(algorithm="fedgcn", dp_epsilon=4.0),
                                dict(algorithm="fedomd", dp_epsilon=8.0), dict(algorithm="fedspray", dp_epsilon=8.0)])
def test_runtime_settings_stay_local(kw, capsys):
    cfg = _cfg(**kw)
    preflight(cfg, check_data=False)
    assert cfg.executor == "local" and "executor:" not in capsys.readouterr().out


def _dp_not_on_runtimes(monkeypatch):
    """A strategy whose exchanges are not privatised on the clients (none registered now)."""
    from secure_fgl.runtime.fedomd import FedOMDStrategy
    monkeypatch.setattr(FedOMDStrategy, "dp_on_runtimes", False)
    return dict(algorithm="fedomd", dp_epsilon=8.0)


@pytest.mark.parametrize("setting,why", [
    (lambda mp: dict(algorithm="fedgcn-gap", dp_epsilon=4.0, options={"dpsgd": True}), "fedgcn-gap --dpsgd"),
    (_dp_not_on_runtimes, "fedomd's exchanges are not privatised on the client runtimes"),
])
def test_inline_only_settings_run_inline_on_local_and_are_refused_on_ray(setting, why, capsys, monkeypatch):
    kw = setting(monkeypatch)
    cfg = _cfg(**kw)
    preflight(cfg, check_data=False)
    printed = capsys.readouterr().out.splitlines()
    assert cfg.executor == "inline"                     # what runs, and what result.json records
    assert len(printed) == 1 and printed[0].startswith("executor: running inline") and why in printed[0]
    with pytest.raises(ConfigError, match="use --executor inline") as err:
        preflight(_cfg(executor="ray", **kw), check_data=False)
    assert why in str(err.value)
