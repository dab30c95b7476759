#!/usr/bin/env bash
# Create .venv (if missing) and install toolscout with everything its tests and servers need.
# torch is installed first, pinned, so pip takes the CPU build instead of a multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.toolscout-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet torch==2.13.0
  python -m pip install --quiet -e ".[all]"
  touch "$stamp"
fi
