"""Rewrite the golden numbers (``tests/golden/*.json``) from the current code.

Runs every test whose name contains ``golden`` (slow ones included) with ``SECURE_FGL_REGEN_GOLDEN=1``,
so each ``assert_golden`` call stores what the run gave instead of comparing. Run it only after a change
that is meant to move the numbers, with one thread (bit-for-bit floats depend on it):

    OMP_NUM_THREADS=1 python tests/golden/regenerate.py [pytest arguments, e.g. tests/runtime/test_runtime.py]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    env = {**os.environ, "SECURE_FGL_REGEN_GOLDEN": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    targets = sys.argv[1:] or [str(TESTS)]
    sys.exit(
        subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-m", "", "-k", "golden", *targets], cwd=TESTS.parent, env=env
        )
    )
