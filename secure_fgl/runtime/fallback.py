"""Settings the client runtimes cannot run yet, and what the default executor does with them.

``--executor local`` is the default.  For the few settings an algorithm's runtime does not
implement yet, a run that asked for ``local`` runs ``inline`` instead (one printed line saying
why; ``result.json["config"]["executor"]`` records ``inline``), so the default never refuses a
setting that worked before; ``--executor ray`` refuses them in one line naming the fix.
"""
from __future__ import annotations

from ..config import ConfigError
from .registry import strategy_class


def inline_only_reason(cfg, options) -> str | None:
    """Why ``cfg`` cannot run on the client runtimes yet (``None`` when it can)."""
    if cfg.dp_epsilon is not None and not strategy_class(cfg.algorithm).dp_on_runtimes:
        return f"--dp-epsilon: {cfg.algorithm}'s exchanges are not privatised on the client runtimes yet"
    if getattr(options, "dpsgd", False):
        return f"{cfg.algorithm} --dpsgd trains with DP-SGD in the in-process algorithm only"
    return None


def resolve_executor(cfg, options) -> None:
    """Run ``local`` settings the runtimes lack ``inline`` (printed); refuse them on ``ray``."""
    if cfg.executor == "inline":
        return
    why = inline_only_reason(cfg, options)
    if why is None:
        return
    if cfg.executor == "ray":
        raise ConfigError(f"{why}: use --executor inline")
    print(f"executor: running inline ({why}; docs/runtime.md)")
    cfg.executor = "inline"
