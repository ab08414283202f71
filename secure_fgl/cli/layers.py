"""The run's settings from the command line: preset < config file < flags, merged and checked."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from ..algorithms import get_spec
from ..config import ConfigError, RunConfig, load_config_file
from ..validation import RENAMED_SETTINGS, renamed_setting_error


class UsageError(Exception):
    """Bad command line (argparse's complaints, made one line)."""


def _extra_options(extra: list[str]) -> dict:
    """``--name value`` / ``--name=value`` / bare ``--flag`` left over by argparse: algorithm options."""
    out, i = {}, 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--") or token == "--":
            raise UsageError(f"unexpected argument {token!r}")
        name, eq, value = token[2:].partition("=")
        if name.replace("-", "_") in RENAMED_SETTINGS:
            raise renamed_setting_error(name.replace("-", "_"))
        if not eq:
            if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
                value, i = extra[i + 1], i + 1
            else:
                value = "true"
        out[name.replace("-", "_")] = value
        i += 1
    return out


def _split_layer(layer: dict, options_fields: set[str]) -> tuple[dict, dict]:
    """A preset/config file's settings and its algorithm options.

    The options are a table, or top-level keys that are options of the algorithm.
    """
    layer = dict(layer)
    options = layer.pop("options", None) or {}
    if not isinstance(options, dict):
        raise ConfigError(
            f"options must be a table of algorithm options ([options] in TOML), got "
            f"{type(options).__name__} {options!r}"
        )
    options = dict(options)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    for key in [k for k in layer if k not in known and k in options_fields]:
        options[key] = layer.pop(key)
    return layer, options


def config_from_args(args: argparse.Namespace, extra: Sequence[str] = ()) -> RunConfig:
    """Preset < config file < flags, merged and checked (types, ranges, names)."""
    layers = []
    if getattr(args, "preset", None):
        from ..presets import load_preset

        layers.append(load_preset(args.preset))
    if getattr(args, "config", None):
        layers.append(load_config_file(args.config))
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig) if hasattr(args, f.name)}
    algorithm = flags.get("algorithm") or next(
        (l["algorithm"] for l in reversed(layers) if "algorithm" in l), RunConfig.algorithm
    )
    option_fields = {f.name for f in dataclasses.fields(get_spec(str(algorithm)).options)}
    values, options = {}, {}
    for layer in layers:
        settings, opts = _split_layer(layer, option_fields)
        values.update(settings)
        options.update(opts)
    values.update(flags)
    options.update({k[4:]: v for k, v in vars(args).items() if k.startswith("opt_")})
    options.update(_extra_options(list(extra)))
    values["options"] = options
    return RunConfig.from_dict(values).validate()
