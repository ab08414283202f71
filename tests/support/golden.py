"""Golden numbers: a run's losses, accuracies and bytes per tag, frozen in ``tests/golden/<group>.json``.

``assert_golden(group, case, observed, tolerance)`` compares ``observed`` (a JSON-able dict) with the stored
case field by field: integers and strings exactly, floats within the stored absolute tolerance of their
top-level field (0 = bit for bit). Floats are compared only under the torch version the numbers were
recorded with (another version rounds differently); integers (bytes, counts) always.

With ``SECURE_FGL_REGEN_GOLDEN=1`` the call writes ``observed`` and ``tolerance`` instead of comparing:
``python tests/golden/regenerate.py`` runs the golden tests that way (see that script).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGENERATE = "OMP_NUM_THREADS=1 python tests/golden/regenerate.py"


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def _jsonable(value):
    """Tuples as lists, numpy scalars as Python numbers, dict keys as strings (as JSON stores them)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _differences(want, got, tol: float, floats: bool, path: str) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return [f"{path}: keys {sorted(set(want) ^ set(got))} differ"]
        return [d for k in want for d in _differences(want[k], got[k], tol, floats, f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: length {len(got)} != golden {len(want)}"]
        return [d for i, (a, b) in enumerate(zip(want, got)) for d in _differences(a, b, tol, floats, f"{path}[{i}]")]
    if isinstance(want, float) or isinstance(got, float):
        if not isinstance(want, (int, float)) or not isinstance(got, (int, float)) or isinstance(got, bool):
            return [f"{path}: {got!r} != golden {want!r}"]
        if not floats or (math.isnan(want) and math.isnan(got)):
            return []
        return [] if abs(want - got) <= tol else [f"{path}: {got!r} != golden {want!r} (tolerance {tol})"]
    return [] if want == got else [f"{path}: {got!r} != golden {want!r}"]


def assert_golden(group: str, case: str, observed: dict, tolerance: dict[str, float] | None = None) -> None:
    """``observed`` equals the golden case (``tolerance``: absolute, per top-level field, default 0)."""
    file = GOLDEN / f"{group}.json"
    observed = _jsonable(observed)
    if os.environ.get("SECURE_FGL_REGEN_GOLDEN"):
        stored = json.loads(file.read_text()) if file.exists() else {}
        stored.update({"torch": _torch_version(), "regenerate": REGENERATE})
        stored.setdefault("cases", {})[case] = {
            "tolerance": {k: float(v) for k, v in (tolerance or {}).items()},
            "observed": observed,
        }
        stored["cases"] = dict(sorted(stored["cases"].items()))
        file.write_text(json.dumps(stored, indent=1) + "\n")
        return
    if not file.exists() or case not in json.loads(file.read_text())["cases"]:
        pytest.fail(f"no golden numbers for {group}/{case}: run `{REGENERATE}`")
    stored = json.loads(file.read_text())
    golden = stored["cases"][case]
    floats = stored["torch"] == _torch_version()
    if not floats:
        warnings.warn(
            f"golden numbers of {group} recorded with torch {stored['torch']}, running "
            f"{_torch_version()}: floats not compared (regenerate: `{REGENERATE}`)",
            stacklevel=2,
        )
    diffs = [
        d
        for field in sorted(set(golden["observed"]) | set(observed))
        for d in _differences(
            golden["observed"].get(field), observed.get(field), golden["tolerance"].get(field, 0.0), floats, field
        )
    ]
    assert not diffs, f"{group}/{case} differs from its golden numbers:\n" + "\n".join(diffs[:20])
