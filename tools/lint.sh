#!/usr/bin/env bash
# Lint, format check and type check; exits non-zero on the first failure. Needs the lint extra:
#   pip install -e ".[lint]"
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
mypy
