"""Reading runs back: ``load_runs(DIR...) -> pandas.DataFrame`` and the ``result.json`` schema.

Schema policy (``schema_version = "MAJOR.MINOR"``, file ``secure_fgl/schemas/result.schema.json``):
the **major** number goes up when a key is removed or renamed or changes meaning or unit; the
**minor** number when a key is added.  Readers accept any minor version of a major they know.

>>> from secure_fgl.results import load_runs
>>> df = load_runs("runs/sweep")            # one row per result.json below the folder
>>> df.groupby(["config.mode"])["final.test_acc"].mean()
"""
from __future__ import annotations

import json
from pathlib import Path

#: version of the result.json layout written by this package (policy in the module docstring)
SCHEMA_VERSION = "1.1"
SCHEMA_PATH = Path(__file__).parent / "schemas" / "result.schema.json"


def schema() -> dict:
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
    """One flat row: ``config.*``, ``options.*``, scalar ``final.*``, ``comm.*`` totals, ``time.*``,
    ``privacy.total_epsilon``, ``attack.<name>`` (its value) and the provenance keys."""
    row: dict = {}
    for key in ("schema_version", "secure_fgl_version", "git_commit", "started_at", "status", "device",
                "num_clients"):
        row[key] = result.get(key)
    for key, value in (result.get("config") or {}).items():
        if key == "options":
            continue
        row[f"config.{key}"] = ",".join(map(str, value)) if isinstance(value, list) else (
            json.dumps(value) if isinstance(value, dict) else value)
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


def load_runs(*paths: str | Path):
    """A pandas DataFrame with one row per run found under ``paths`` (``pip install secure-fgl[analysis]``)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("load_runs needs pandas: pip install 'secure-fgl[analysis]'") from None
    rows = []
    for path in find_results(*paths):
        row = flatten(json.loads(path.read_text()))
        row["run"] = str(path.parent)
        rows.append(row)
    df = pd.DataFrame(rows)
    if "run" in df:
        df = df[["run"] + [c for c in df.columns if c != "run"]]
    return df
