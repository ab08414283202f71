"""Settings described once, checked before any work: type, range, choices, "did you mean".

A setting is a dataclass field made with :func:`setting`; its ``metadata`` carries the
help line, unit, choices and range that the CLI shows in ``--help`` and that
:func:`check_settings` enforces.  :class:`~secure_fgl.config.RunConfig` and every
algorithm's ``Options`` dataclass are described this way, so a new algorithm's options get
help, validation and suggestions without touching the CLI.  No torch import here: the CLI's
``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A run setting is invalid; the message names the setting and the fix."""


#: settings renamed since they were introduced: old name -> current name.  A flag or config-file key with the old
#: name is refused in one line naming the current one; a stored config (``result.json``, ``run.json``) is read under
#: the current names (:func:`current_names`).
RENAMED_SETTINGS = {"dp_split": "dp_budget_share"}


def renamed_setting_error(old: str) -> ConfigError:
    """The one-line answer to the renamed setting ``old`` (its flag and config key)."""
    new = RENAMED_SETTINGS[old]
    return ConfigError(
        f"--{old.replace('_', '-')} (config key {old}) was renamed --{new.replace('_', '-')} (config key {new}); "
        "same value"
    )


def current_names(stored: dict) -> dict:
    """A stored config with every renamed setting under its current name (old ``result.json`` files still load)."""
    return {RENAMED_SETTINGS.get(k, k): v for k, v in stored.items()}


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    unit: str | None = None,
    choices: tuple | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    group: str | None = None,
    default_factory: Any = dataclasses.MISSING,
):
    """A dataclass field with the metadata :func:`check_settings` and the CLI read.

    ``min``/``max`` bound numbers (``min_exclusive``: strictly above ``min``); ``choices`` are
    matched case-insensitively; ``group`` places a RunConfig flag in a ``--help`` section.
    """
    meta = {
        "help": help,
        "unit": unit,
        "choices": choices,
        "min": min,
        "max": max,
        "min_exclusive": min_exclusive,
        "group": group,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def flag_name(name: str) -> str:
    """The command-line flag of setting ``name`` (``dp_epsilon`` -> ``--dp-epsilon``)."""
    return "--" + name.replace("_", "-")


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean X?)`` for the closest candidate, else an empty string."""
    cands = [str(c) for c in candidates]
    lowered = {c.lower(): c for c in cands}
    close = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]}?)" if close else ""


def match_choice(flag: str, value: Any, choices) -> str:
    """``value`` matched case-insensitively against ``choices``; the canonical spelling returned."""
    for c in choices:
        if str(value).lower() == str(c).lower():
            return c
    raise ConfigError(
        f"{flag} {value!r} is not one of {', '.join(map(str, choices))}" + did_you_mean(str(value), choices)
    )


def _base_type(tp) -> tuple[type, bool]:
    """(scalar type, optional?) of an annotation such as ``int | None``."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])[0], True
    return (tp if isinstance(tp, type) else object), False


def field_type(cls, name: str) -> tuple[type, bool]:
    """The base type of a dataclass field and whether it is optional."""
    return _base_type(_type_hints(cls)[name])


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class (it compiles every annotation string)."""
    return typing.get_type_hints(cls)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def coerce(flag: str, value: Any, tp: type, optional: bool) -> Any:
    """``value`` (a CLI string or a config-file value) as ``tp``; a one-line ConfigError otherwise."""
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{flag} needs a value")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in _TRUE:
            return True
        if str(value).lower() in _FALSE:
            return False
        raise ConfigError(f"{flag} expects true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{flag} expects a whole number, got {value!r}")
        try:
            return int(value) if not isinstance(value, str) else int(value.strip())
        except ValueError:
            raise ConfigError(f"{flag} expects a whole number, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{flag} expects a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{flag} expects a number, got {value!r}") from None
        if not math.isfinite(out):
            raise ConfigError(f"{flag} expects a finite number, got {value!r}")
        return out
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{flag} expects a single value, got {value!r}")
        return str(value)
    return value


def check_value(flag: str, value: Any, meta: typing.Mapping) -> Any:
    """Range and choices of one (already typed) value."""
    if value is None:
        return None
    if meta.get("choices"):
        value = match_choice(flag, value, meta["choices"])
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
        raise ConfigError(f"{flag} must be {'>' if meta.get('min_exclusive') else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{flag} must be <= {hi}, got {value}")
    return value


def check_settings(cls, values: dict, *, what: str = "a setting", skip=()) -> dict:
    """``values`` (name -> raw value) checked and typed against dataclass ``cls``.

    Unknown names are refused with the closest known one; the result holds only given names.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for name, raw in values.items():
        key = str(name).replace("-", "_")
        if key not in fields or key in skip:
            known = [flag_name(n) for n in fields if n not in skip]
            hint = did_you_mean(flag_name(key), known)
            raise ConfigError(
                f"{flag_name(key)} is not {what}"
                + (hint or (f" (known: {', '.join(known)})" if known else " (there are none)"))
            )
        f = fields[key]
        tp, optional = field_type(cls, key)
        if tp in (bool, int, float, str):
            out[key] = check_value(flag_name(key), coerce(flag_name(key), raw, tp, optional), f.metadata)
        else:
            out[key] = raw
    return out


def describe(f: dataclasses.Field, tp: type | None = None) -> str:
    """One ``--help`` line: help text, unit, choices, range and default."""
    meta = f.metadata
    parts = [meta.get("help") or ""]
    if meta.get("unit"):
        parts.append(f"[{meta['unit']}]")
    if meta.get("choices"):
        parts.append("{" + "|".join(map(str, meta["choices"])) + "}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and hi is not None:
        parts.append(f"range {'(' if meta.get('min_exclusive') else '['}{lo}, {hi}]")
    elif lo is not None:
        parts.append(f"{'>' if meta.get('min_exclusive') else '>='} {lo}")
    elif hi is not None:
        parts.append(f"<= {hi}")
    default = (
        f.default
        if f.default is not dataclasses.MISSING
        else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    )
    if default not in (None, "", [], {}):
        parts.append(f"(default: {default})")
    elif "default" not in (meta.get("help") or ""):  # a help text that explains its own default keeps it
        parts.append("(default: none)")
    return " ".join(p for p in parts if p)
