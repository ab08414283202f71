"""Reading runs back: ``load_runs(DIR...) -> pandas.DataFrame`` and the ``result.json`` schema.

Schema policy (``schema_version = "MAJOR.MINOR"``, file ``secure_fgl/schemas/result.schema.json``):
the **major** number goes up when a key is removed or renamed or changes meaning or unit; the
**minor** number when a key is added.  Readers accept any minor version of a major they know; this package reads
1.x files too (2.0 renamed ``config.dp_split`` to ``config.dp_budget_share``; :func:`read_finished` and the run
identity read the old name as the new one).

>>> from secure_fgl.results import load_runs
>>> df = load_runs("runs/sweep")            # one row per result.json below the folder
>>> df.groupby(["config.mode"])["final.test_acc"].mean()
"""

from __future__ import annotations

import json
from pathlib import Path

#: version of the result.json layout written by this package (policy in the module docstring)
SCHEMA_VERSION = "2.0"
SCHEMA_PATH = Path(__file__).parent / "schemas" / "result.schema.json"


#: a run is "at chance" when its test accuracy is within this of 1 / number of classes
AT_CHANCE_MARGIN = 0.05


def accuracy_at_chance(test_acc: float | None, num_classes: int | None) -> bool | None:
    """Whether the model's test accuracy is at chance (``final.at_chance``).

    ``test_acc <= 1/num_classes + AT_CHANCE_MARGIN`` (``final.at_chance``): a model that learned
    nothing, whose privacy results mean nothing; None when either is unknown.
    """
    if test_acc is None or not num_classes:
        return None
    return bool(test_acc <= 1.0 / num_classes + AT_CHANCE_MARGIN)


def schema() -> dict:
    """The JSON schema of ``result.json``."""
    return json.loads(SCHEMA_PATH.read_text())


def validate_result(result: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``result`` does not follow the schema."""
    import jsonschema

    jsonschema.validate(result, schema())


def find_results(*paths: str | Path) -> list[Path]:
    """Every ``result.json`` given or found below the given folders, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif (p / "result.json").is_file():
            found.append(p / "result.json")
        else:
            found.extend(sorted(p.rglob("result.json")))
    return found


def flatten(result: dict) -> dict:
    """One flat row of a run's result.

    One flat row: ``config.*``, ``options.*``, scalar ``final.*``, ``comm.*`` totals, ``time.*``,
    ``privacy.total_epsilon``, ``attack.<name>`` (its value) and the provenance keys.
    """
    row: dict = {}
    for key in (
        "schema_version",
        "secure_fgl_version",
        "git_commit",
        "started_at",
        "status",
        "device",
        "num_clients",
        "config_fingerprint",
    ):
        row[key] = result.get(key)
    for key, value in (result.get("config") or {}).items():
        if key == "options":
            continue
        row[f"config.{key}"] = (
            ",".join(map(str, value))
            if isinstance(value, list)
            else (json.dumps(value) if isinstance(value, dict) else value)
        )
    for key, value in (result.get("options") or (result.get("config") or {}).get("options") or {}).items():
        row[f"options.{key}"] = value
    for key, value in (result.get("final") or {}).items():
        if isinstance(value, (int, float, str, bool)) or value is None:
            row[f"final.{key}"] = value
    comm = result.get("comm") or {}
    for key in ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up"):
        if key in comm:
            row[f"comm.{key}"] = comm[key]
    for key, value in (result.get("time") or {}).items():
        row[f"time.{key}"] = value
    row["privacy.total_epsilon"] = (result.get("privacy") or {}).get("total_epsilon")
    for attack in result.get("attacks") or []:
        if attack.get("observer") in (None, "server") or f"attack.{attack['name']}" not in row:
            row[f"attack.{attack['name']}"] = attack.get("value")
    return row


def read_finished(*paths: str | Path, include_unfinished: bool = False) -> tuple[list[tuple[Path, dict]], list[Path]]:
    """The finished runs under ``paths`` and the unfinished ones left out.

    ``([(result.json path, result)], [left-out paths])``: the finished runs under ``paths``
    and the unfinished ones (``status`` not ``complete``, e.g. interrupted during the attacks)
    left out unless ``include_unfinished``.
    """
    from .run_identity import is_finished
    from .validation import current_names

    kept, left = [], []
    for path in find_results(*paths):
        result = json.loads(path.read_text())
        if isinstance(result.get("config"), dict):  # a schema 1.x file: renamed settings under their current names
            result["config"] = current_names(result["config"])
        (kept if include_unfinished or is_finished(result) else left).append((path, result))
    return kept, [p for p, _ in left]


def load_runs(*paths: str | Path, include_unfinished: bool = False):
    """A pandas DataFrame with one row per finished run found under ``paths``.

    Needs ``pip install secure-fgl[analysis]``. Unfinished runs are left out, with a warning that counts them, unless
    ``include_unfinished=True``.

    Args:
        *paths: ``result.json`` files, or folders to search below for them.
        include_unfinished: Keep the runs whose ``status`` is not ``complete``.

    Returns:
        runs (pandas.DataFrame): One row per run, its fields flattened by ``flatten``.

    Raises:
        ImportError: pandas is not installed.
    """
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("load_runs needs pandas: pip install 'secure-fgl[analysis]'") from None
    import warnings

    kept, left = read_finished(*paths, include_unfinished=include_unfinished)
    if left:
        warnings.warn(
            f"load_runs: left out {len(left)} unfinished run(s) ({', '.join(str(p.parent) for p in left[:3])}"
            f"{', ...' if len(left) > 3 else ''}); include_unfinished=True to read them",
            stacklevel=2,
        )
    rows = []
    for path, result in kept:
        row = flatten(result)
        row["run"] = str(path.parent)
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["left_out_unfinished"] = len(left)
    if "run" in df:
        df = df[["run"] + [c for c in df.columns if c != "run"]]
    return df
